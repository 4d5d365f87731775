// Nested tensors: every op on a nested neuron tensor runs CPU's nested kernel
// on a nested CPU tensor that aliases the device buffer (no copy); random ops
// run their nested kernel on the device buffer itself.
#include "aten/nested.h"

#include <ATen/NestedTensorImpl.h>
#include <ATen/ops/native_dropout_native.h>
#include <ATen/ops/normal_native.h>

#include "aten/arg_walk.h"
#include "aten/fallback.h"
#include "aten/op_meta.h"
#include "device/device.h"

namespace neuron {

at::Tensor nested_to_neuron(AliasTable& table, const at::Tensor& cpu, c10::DeviceIndex dev) {
  auto* impl = at::native::get_nested_tensor_impl(cpu);
  at::Tensor buffer = tensor_on(table.neuron_storage_for(impl->storage(), dev), c10::DispatchKey::PrivateUse1,
                                impl->get_unsafe_storage_as_tensor());
  return at::detail::make_tensor<at::native::NestedTensorImpl>(buffer, impl->get_nested_sizes(),
                                                               impl->get_nested_strides(), impl->get_storage_offsets());
}

namespace {

// The nested tensor's CPU twin: the same metadata over a CPU alias of its buffer.
at::Tensor nested_alias(AliasTable& table, const at::Tensor& t) {
  if (!t.is_nested()) return table.alias(t);
  auto* impl = at::native::get_nested_tensor_impl(t);
  return at::detail::make_tensor<at::native::NestedTensorImpl>(table.alias(impl->get_unsafe_storage_as_tensor()),
                                                               impl->get_nested_sizes(), impl->get_nested_strides(),
                                                               impl->get_storage_offsets());
}

// Copies between devices take a CPU tensor by design (nested_cpu.to('neuron'),
// copy_ from CPU). Dense ones have kernels of their own (memory_kernels.cpp);
// nested ones run here.
bool copies_between_devices(const OpMeta& meta) {
  return meta.name == "aten::_to_copy" || meta.name == "aten::copy_" || meta.name == "aten::_copy_from" ||
         meta.name == "aten::_copy_from_and_resize";
}

// A copy whose result belongs on the host, as on CUDA: one asked for CPU
// (.cpu(), .to('cpu')), or one into a CPU tensor (cpu_nt.copy_(neuron_nt)),
// whose result is that tensor. Read before the walk turns device=neuron into cpu.
bool copies_to_host(const c10::FunctionSchema& schema, const torch::jit::Stack& stack) {
  const size_t nargs = schema.arguments().size();
  const size_t base = stack.size() - nargs;
  for (size_t i = 0; i < nargs; ++i) {
    const c10::IValue& v = stack[base + i];
    if (v.isDevice() && v.toDevice().type() == c10::kCPU) return true;
    const auto& arg = schema.arguments()[i];
    const bool dest = arg.name() == "dst" || (arg.alias_info() != nullptr && arg.alias_info()->isWrite());
    if (dest && v.isTensor() && v.toTensor().device().type() == c10::kCPU) return true;
  }
  return false;
}

}  // namespace

void nested_fallback(const c10::OperatorHandle& op, c10::DispatchKeySet, torch::jit::Stack* stack) {
  OpMeta& meta = meta_for(op);
  const auto& schema = op.schema();
  AliasTable table;
  c10::SmallVector<Converted, 8> conv;
  ArgCheck check(meta, schema);
  const bool copy = copies_between_devices(meta);
  if (copy) check.allow_cpu_tensors();
  const bool to_host = copy && copies_to_host(schema, *stack);
  walk_args(check, *stack, schema.arguments().size(), [&](const at::Tensor& t, size_t i) -> at::Tensor {
    at::Tensor c = nested_alias(table, t);
    conv.push_back({t, c, static_cast<bool>(meta.arg_mutable[i])});
    return c;
  });
  const c10::DeviceIndex dev = check.finish();

  // The CPU aliases carry NestedTensorCPU: the dispatcher picks CPU's nested kernel.
  if (to_host) {  // the result is a CPU tensor in host memory
    run_on_host(meta, dev, [&] { op.callBoxed(stack); });
    return;
  }
  run_on_device(meta, dev, [&] { op.callBoxed(stack); });
  table.sync_resized_storages(dev);
  walk_returns(*stack, schema.returns().size(),
               [&](const at::Tensor& r) { return result_to_neuron(table, conv, meta, r, dev); });
}

}  // namespace neuron

TORCH_LIBRARY_IMPL(_, NestedTensorPrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&neuron::nested_fallback>());
}

// The random ops with nested kernels of their own (dropout, normal_; CUDA's are
// the same backend-generic kernels): the dense op runs on the device buffer and
// draws from the device's generator, as dense neuron ops do. Through the
// fallback, CPU's nested kernel would draw from CPU's generator.
TORCH_LIBRARY_IMPL(aten, NestedTensorPrivateUse1, m) {
  m.impl("native_dropout", TORCH_FN(at::native::native_dropout_nested));
  m.impl("normal_", TORCH_FN(at::native::normal_nested_));
}
