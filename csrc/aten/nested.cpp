// Nested tensors: every op on a nested neuron tensor runs CPU's nested kernel
// on a nested CPU tensor that aliases the device buffer (no copy).
#include "aten/nested.h"

#include <ATen/NestedTensorImpl.h>

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

}  // namespace

void nested_fallback(const c10::OperatorHandle& op, c10::DispatchKeySet, torch::jit::Stack* stack) {
  OpMeta& meta = meta_for(op);
  const auto& schema = op.schema();
  AliasTable table;
  c10::SmallVector<Converted, 8> conv;
  ArgCheck check(meta, schema);
  if (copies_between_devices(meta)) check.allow_cpu_tensors();
  walk_args(check, *stack, schema.arguments().size(), [&](const at::Tensor& t, size_t i) -> at::Tensor {
    at::Tensor c = nested_alias(table, t);
    conv.push_back({t, c, static_cast<bool>(meta.arg_mutable[i])});
    return c;
  });
  const c10::DeviceIndex dev = check.finish();

  // The CPU aliases carry NestedTensorCPU: the dispatcher picks CPU's nested kernel.
  run_on_device(meta, dev, [&] { op.callBoxed(stack); });
  table.sync_resized_storages(dev);
  walk_returns(*stack, schema.returns().size(),
               [&](const at::Tensor& r) { return result_to_neuron(table, conv, meta, r, dev); });
}

}  // namespace neuron

TORCH_LIBRARY_IMPL(_, NestedTensorPrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&neuron::nested_fallback>());
}
