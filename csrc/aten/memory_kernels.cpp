// Explicit kernels of the ops that define what device memory is: factories,
// views, copies, resizing, set_, and `param.data = t` across devices.
#include <ATen/ATen.h>
#include <ATen/EmptyTensor.h>
#include <ATen/MemoryOverlap.h>
#include <ATen/native/TensorFactories.h>
#include <ATen/ops/_local_scalar_dense_native.h>
#include <ATen/ops/_reshape_alias_native.h>
#include <ATen/ops/as_strided_native.h>
#include <ATen/ops/resize_native.h>
#include <ATen/ops/set_native.h>
#include <ATen/ops/view_native.h>
#include <c10/core/DeviceGuard.h>
#include <torch/library.h>

#include "aten/alias_table.h"
#include "device/allocator.h"
#include "device/device.h"

namespace neuron {
namespace {

c10::DeviceIndex index_of(std::optional<c10::Device> device) {
  auto idx = device && device->has_index() ? device->index() : current_device();
  check_device_index(idx);
  return idx;
}

void check_strided(std::optional<c10::Layout> layout) {
  TORCH_CHECK_NOT_IMPLEMENTED(!layout || *layout == c10::kStrided,
                              "neuron supports only strided (dense) tensors, got layout ", *layout,
                              ": Trainium has no sparse kernels");
}

at::Tensor neuron_empty(c10::IntArrayRef size, std::optional<at::ScalarType> dtype, std::optional<at::Layout> layout,
                        std::optional<at::Device> device, std::optional<bool>, std::optional<at::MemoryFormat> fmt) {
  check_strided(layout);
  c10::DeviceGuard guard(c10::Device(kNeuron, index_of(device)));
  return at::detail::empty_generic(size, device_allocator(), c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
                                   c10::dtype_or_default(dtype), fmt);
}

at::Tensor neuron_empty_strided(c10::IntArrayRef size, c10::IntArrayRef stride, std::optional<at::ScalarType> dtype,
                                std::optional<at::Layout> layout, std::optional<at::Device> device,
                                std::optional<bool>) {
  check_strided(layout);
  c10::DeviceGuard guard(c10::Device(kNeuron, index_of(device)));
  return at::detail::empty_strided_generic(size, stride, device_allocator(),
                                           c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
                                           c10::dtype_or_default(dtype));
}

at::Tensor neuron_efficientzerotensor(c10::IntArrayRef size, std::optional<at::ScalarType> dtype,
                                      std::optional<at::Layout>, std::optional<at::Device> device,
                                      std::optional<bool>) {
  const auto d = c10::Device(kNeuron, index_of(device));
  at::native::ZeroTensorAllocator allocator(d);
  auto ks = c10::DispatchKeySet(c10::DispatchKey::PrivateUse1) | c10::DispatchKeySet(c10::DispatchKey::ZeroTensor);
  return at::detail::empty_generic(size, &allocator, ks, c10::dtype_or_default(dtype), std::nullopt);
}

bool plain_same_layout(const at::Tensor& a, const at::Tensor& b) {
  return a.scalar_type() == b.scalar_type() && a.sizes() == b.sizes() && a.is_contiguous() && b.is_contiguous() &&
         !a.is_conj() && !b.is_conj() && !a.is_neg() && !b.is_neg();
}

// Host<->device and device<->device copies (copy_ routes them here).
at::Tensor neuron_copy_from(const at::Tensor& self, const at::Tensor& dst, bool) {
  if (self.numel() == 0 && dst.numel() == 0) return dst;
  // copy_ sends neuron copies here before the TensorIterator that makes CPU's
  // overlap checks: make them, with CPU's early return for the very same data.
  if (self.is_alias_of(dst) && self.storage_offset() == dst.storage_offset() && self.strides() == dst.strides() &&
      self.sizes() == dst.sizes() && self.scalar_type() == dst.scalar_type() && self.is_conj() == dst.is_conj() &&
      self.is_neg() == dst.is_neg())
    return dst;
  at::assert_no_internal_overlap(dst);
  at::assert_no_partial_overlap(dst, self);
  if (plain_same_layout(self, dst)) {
    runtime().copy(dst.data_ptr(), self.data_ptr(), dst.nbytes());
    return dst;
  }
  // Conversions, broadcasting and strided layouts: CPU's copy kernel on views.
  const auto dev = dst.device().type() == kNeuron ? dst.device().index() : self.device().index();
  AliasTable table;
  auto cdst = dst.device().type() == kNeuron ? table.alias(dst) : dst;
  auto csrc = self.device().type() == kNeuron ? table.alias(self) : self;
  ChargeCpuAllocationsTo charge(dev);
  cdst.copy_(csrc);
  return dst;
}

at::Tensor neuron_copy_from_and_resize(const at::Tensor& self, const at::Tensor& dst) {
  dst.resize_(self.sizes());
  return neuron_copy_from(self, dst, false);
}

const at::Tensor& neuron_resize_(const at::Tensor& self, c10::IntArrayRef size, std::optional<at::MemoryFormat> fmt) {
  c10::DeviceGuard guard(self.device());
  return at::native::resize_(self, size, fmt);
}

at::Tensor& neuron_set_storage_(at::Tensor& self, at::Storage source, int64_t offset, c10::IntArrayRef size,
                                c10::IntArrayRef stride) {
  c10::DeviceGuard guard(self.device());
  return at::native::set_storage_cpu_(self, std::move(source), offset, size, stride);
}

at::Tensor& neuron_set_empty_(at::Tensor& self) {
  c10::DeviceGuard guard(self.device());
  at::Storage storage(at::Storage::use_byte_size_t(), 0, device_allocator(), /*resizable=*/true);
  return self.set_(storage, 0, {0}, {});
}

bool neuron_has_compatible_shallow_copy_type(const at::Tensor& self, const at::Tensor& from) {
  // Dense CPU <-> neuron tensors are interchangeable under `param.data = t`,
  // as CPU <-> CUDA are; without this, module.to("neuron") unties weights.
  auto dense = [](const at::Tensor& t) {
    return t.layout() == c10::kStrided && !t.is_quantized() && !t.is_nested() &&
           (t.device().type() == kNeuron || t.device().type() == c10::kCPU);
  };
  if (dense(self) && dense(from)) return true;
  return self.unsafeGetTensorImpl()->has_compatible_shallow_copy_type(from.key_set());
}

void record_stream_noop(at::Tensor&, c10::Stream) {}

}  // namespace
}  // namespace neuron

using namespace neuron;

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("empty.memory_format", TORCH_FN(neuron_empty));
  m.impl("empty_strided", TORCH_FN(neuron_empty_strided));
  m.impl("_efficientzerotensor", TORCH_FN(neuron_efficientzerotensor));
  m.impl("_copy_from", TORCH_FN(neuron_copy_from));
  m.impl("_copy_from_and_resize", TORCH_FN(neuron_copy_from_and_resize));
  m.impl("resize_", TORCH_FN(neuron_resize_));
  m.impl("as_strided", TORCH_FN(at::native::as_strided_tensorimpl));
  m.impl("view", TORCH_FN(at::native::view));
  m.impl("_reshape_alias", TORCH_FN(at::native::_reshape_alias));
  m.impl("set_.source_Storage", TORCH_FN(at::native::set_));
  m.impl("set_.source_Storage_storage_offset", TORCH_FN(neuron_set_storage_));
  m.impl("set_.source_Tensor", TORCH_FN(at::native::set_tensor_));
  m.impl("set_", TORCH_FN(neuron_set_empty_));
  m.impl("_local_scalar_dense", TORCH_FN(at::native::_local_scalar_dense_cpu));
  m.impl("record_stream", TORCH_FN(record_stream_noop));
}

TORCH_LIBRARY_IMPL(aten, AutogradPrivateUse1, m) {
  m.impl("_has_compatible_shallow_copy_type", TORCH_FN(neuron_has_compatible_shallow_copy_type));
}

// copy_ between conjugate/negative views would otherwise re-enter copy_ from
// the Conjugate/Negative fallbacks forever.
TORCH_LIBRARY_IMPL(aten, Conjugate, m) {
  m.impl("_copy_from", torch::CppFunction::makeFallthrough());
  m.impl("_copy_from_and_resize", torch::CppFunction::makeFallthrough());
}
TORCH_LIBRARY_IMPL(aten, Negative, m) {
  m.impl("_copy_from", torch::CppFunction::makeFallthrough());
  m.impl("_copy_from_and_resize", torch::CppFunction::makeFallthrough());
}
