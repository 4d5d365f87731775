// The dispatch-key-wide registrations: every op without a kernel of its own
// goes to the boxed fallback; sparse and quantized neuron tensors are
// rejected.
#include <c10/core/Layout.h>
#include <c10/util/StringUtil.h>
#include <torch/library.h>

#include <string>

#include "aten/fallback.h"

namespace neuron {
namespace {
void reject_sparse(const c10::OperatorHandle& op, c10::DispatchKeySet, torch::jit::Stack*) {
  TORCH_CHECK_NOT_IMPLEMENTED(false, "'", op.schema().name(),
                              "' on a sparse neuron tensor: Trainium has no sparse "
                              "kernels, so neuron supports only strided (dense) tensors. Keep sparse tensors on "
                              "CPU and move dense results with .to('neuron').");
}

// Ops that make a CSR/CSC/BSR/BSC tensor on neuron: .to('neuron') of one, the
// sparse_*_tensor factories and empty/zeros with a compressed layout. Their
// composite kernels would build it without reaching the fallback above, and it
// would fail only later, misleadingly (e.g. on .cpu()); refuse it at creation.
void reject_sparse_compressed(const c10::OperatorHandle& op, c10::DispatchKeySet, torch::jit::Stack* stack) {
  std::string layout = "sparse compressed";
  const auto& args = op.schema().arguments();
  for (size_t i = 0; i < args.size(); ++i) {
    const c10::IValue& v = (*stack)[stack->size() - args.size() + i];
    if (args[i].name() == "layout" && v.isInt()) layout = c10::str(static_cast<c10::Layout>(v.toInt()));
    if (v.isTensor() && v.toTensor().layout() != c10::kStrided) layout = c10::str(v.toTensor().layout());
  }
  TORCH_CHECK_NOT_IMPLEMENTED(false, "'", op.schema().name(), "' would make a ", layout,
                              " tensor on neuron: Trainium has no sparse kernels, so neuron supports only strided "
                              "(dense) tensors. Keep sparse tensors on CPU, or call .to_dense() before "
                              ".to('neuron').");
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

TORCH_LIBRARY_IMPL(aten, SparseCsrPrivateUse1, m) {
  for (const char* op :
       {"_to_copy", "empty.memory_format", "_sparse_compressed_tensor_unsafe", "_sparse_compressed_tensor_with_dims",
        "sparse_compressed_tensor.comp_plain_value_size", "sparse_compressed_tensor.comp_plain_value"})
    m.impl(op, torch::CppFunction::makeFromBoxedFunction<&neuron::reject_sparse_compressed>());
}

TORCH_LIBRARY_IMPL(_, QuantizedPrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&neuron::reject_quantized_op>());
}
