// Nested tensors: every op on a nested neuron tensor runs CPU's nested kernel
// on a nested CPU tensor that aliases the device buffer (no copy).
#include "aten/nested.h"

#include <ATen/NestedTensorImpl.h>

#include "aten/op_meta.h"
#include "device/allocator.h"
#include "device/device.h"

namespace neuron {

at::Tensor nested_to_neuron(AliasTable& table, const at::Tensor& cpu, c10::DeviceIndex dev) {
  auto* impl = at::native::get_nested_tensor_impl(cpu);
  at::Tensor buffer = tensor_on(table.neuron_storage_for(impl->storage(), dev), c10::DispatchKey::PrivateUse1,
                                impl->get_unsafe_storage_as_tensor());
  return at::detail::make_tensor<at::native::NestedTensorImpl>(buffer, impl->get_nested_sizes(),
                                                               impl->get_nested_strides(), impl->get_storage_offsets());
}

void nested_fallback(const c10::OperatorHandle& op, c10::DispatchKeySet, torch::jit::Stack* stack) {
  OpMeta& meta = meta_for(op);
  const auto& schema = op.schema();
  const size_t nargs = schema.arguments().size();
  const size_t base = stack->size() - nargs;
  AliasTable table;
  c10::DeviceIndex dev = -1;
  c10::SmallVector<std::pair<at::Tensor, at::Tensor>, 8> conv;  // neuron, cpu

  auto convert = [&](const at::Tensor& t) -> at::Tensor {
    if (!t.defined() || t.device().type() != kNeuron) return t;
    if (dev < 0) dev = t.device().index();
    TORCH_CHECK(t.device().index() == dev, "Expected all tensors to be on the same device, but found neuron:", dev,
                " and ", t.device(), " (when checking arguments of ", meta.name, ")");
    at::Tensor c;
    if (t.is_nested()) {
      auto* impl = at::native::get_nested_tensor_impl(t);
      c = at::detail::make_tensor<at::native::NestedTensorImpl>(table.alias(impl->get_unsafe_storage_as_tensor()),
                                                                impl->get_nested_sizes(), impl->get_nested_strides(),
                                                                impl->get_storage_offsets());
    } else {
      c = table.alias(t);
    }
    conv.push_back({t, c});
    return c;
  };

  for (size_t i = 0; i < nargs; ++i) {
    c10::IValue& v = (*stack)[base + i];
    if (v.isTensor()) {
      v = convert(v.toTensor());
    } else if (v.isTensorList()) {
      c10::List<at::Tensor> out;
      for (const at::Tensor& t : v.toTensorList()) out.push_back(convert(t));
      v = std::move(out);
    } else if (v.isList()) {
      auto list = v.toList();
      if (list.size() && (list.get(0).isTensor() || list.get(0).isNone())) {
        c10::List<std::optional<at::Tensor>> out;
        for (const c10::IValue& e : list)
          out.push_back(e.isTensor() ? std::optional<at::Tensor>(convert(e.toTensor())) : std::nullopt);
        v = std::move(out);
      }
    } else if (v.isDevice() && v.toDevice().type() == kNeuron) {
      if (dev < 0) dev = v.toDevice().has_index() ? v.toDevice().index() : current_device();
      v = c10::Device(c10::kCPU);
    }
  }
  if (dev < 0) dev = current_device();
  meta.executed.fetch_add(1, std::memory_order_relaxed);

  {
    ChargeCpuAllocationsTo charge(dev);
    op.callBoxed(stack);
  }
  table.sync_resized_storages(dev);

  auto wrap = [&](const at::Tensor& r) -> at::Tensor {
    if (!r.defined() || r.device().type() != c10::kCPU) return r;
    for (auto& c : conv)
      if (c.second.unsafeGetTensorImpl() == r.unsafeGetTensorImpl()) return c.first;
    if (r.is_nested()) return nested_to_neuron(table, r, dev);
    return table.neuron_result(r, dev);
  };
  const size_t nrets = schema.returns().size();
  for (size_t i = stack->size() - nrets; i < stack->size(); ++i) {
    c10::IValue& v = (*stack)[i];
    if (v.isTensor()) {
      v = wrap(v.toTensor());
    } else if (v.isTensorList()) {
      auto list = v.toTensorList();
      for (size_t j = 0; j < list.size(); ++j) list.set(j, wrap(list.get(j)));
    }
  }
}

}  // namespace neuron

TORCH_LIBRARY_IMPL(_, NestedTensorPrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&neuron::nested_fallback>());
}
