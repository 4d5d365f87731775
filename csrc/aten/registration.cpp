// The dispatch-key-wide registrations: every op without a kernel of its own
// goes to the boxed fallback; sparse and quantized neuron tensors are
// rejected.
#include <torch/library.h>

#include "aten/fallback.h"

namespace neuron {
namespace {
void reject_sparse(const c10::OperatorHandle& op, c10::DispatchKeySet, torch::jit::Stack*) {
  TORCH_CHECK_NOT_IMPLEMENTED(false, "'", op.schema().name(),
                              "' on a sparse neuron tensor: Trainium has no sparse "
                              "kernels, so neuron supports only strided (dense) tensors. Keep sparse tensors on "
                              "CPU and move dense results with .to('neuron').");
}

void reject_quantized_op(const c10::OperatorHandle& op, c10::DispatchKeySet, torch::jit::Stack*) {
  reject_quantized(op.schema().name());
}
}  // namespace

void reject_quantized(const std::string& op_name) {
  TORCH_CHECK_NOT_IMPLEMENTED(false, "'", op_name,
                              "' would make a quantized neuron tensor: neuron does not support quantized "
                              "tensors (torch.qint8, torch.quint8, torch.qint32, ...). Quantize on CPU, or keep "
                              "the model in a floating-point dtype (torch.bfloat16) on neuron.");
}
}  // namespace neuron

TORCH_LIBRARY_IMPL(_, PrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&neuron::cpu_fallback>());
}

TORCH_LIBRARY_IMPL(_, SparsePrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&neuron::reject_sparse>());
}
TORCH_LIBRARY_IMPL(_, SparseCsrPrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&neuron::reject_sparse>());
}

TORCH_LIBRARY_IMPL(_, QuantizedPrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&neuron::reject_quantized_op>());
}
