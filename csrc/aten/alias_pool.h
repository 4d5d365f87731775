// Zero-copy CPU aliases of device memory, and the per-thread pool that
// recycles them. Inline: the fallback paths build one per tensor argument.
#pragma once

#include <ATen/ATen.h>
#include <c10/util/SmallVector.h>

#include "device/allocator.h"
#include "device/device.h"

namespace neuron {

// CPU aliases of device memory. Tensors that share a neuron storage share one
// CPU storage, so PyTorch's overlap and aliasing checks see what they would
// see on CPU.
inline void release_storage(void* ctx) { c10::raw::intrusive_ptr::decref(static_cast<c10::StorageImpl*>(ctx)); }

inline c10::Storage cpu_storage_over(c10::StorageImpl* nimpl) {
  c10::raw::intrusive_ptr::incref(nimpl);
  c10::DataPtr dp(nimpl->mutable_data(), nimpl, &release_storage, c10::Device(c10::kCPU));
  return c10::Storage(c10::Storage::use_byte_size_t(), nimpl->nbytes(), std::move(dp), charging_cpu_allocator(),
                      /*resizable=*/true);
}

inline c10::Storage neuron_storage_over(c10::StorageImpl* cimpl, c10::DeviceIndex dev) {
  c10::raw::intrusive_ptr::incref(cimpl);
  c10::DataPtr dp(cimpl->mutable_data(), cimpl, &release_storage, c10::Device(kNeuron, dev));
  return c10::Storage(c10::Storage::use_byte_size_t(), cimpl->nbytes(), std::move(dp), device_allocator(),
                      /*resizable=*/true);
}

inline at::Tensor tensor_on(c10::Storage storage, c10::DispatchKey key, const at::Tensor& like) {
  auto t = at::detail::make_tensor<c10::TensorImpl>(std::move(storage), c10::DispatchKeySet(key), like.dtype());
  auto* impl = t.unsafeGetTensorImpl();
  impl->set_sizes_and_strides(like.sizes(), like.strides(), like.storage_offset());
  if (like.is_conj()) impl->_set_conj(true);
  if (like.is_neg()) impl->_set_neg(true);
  return t;
}

// The CPU alias objects are recycled per thread: building and destroying a
// StorageImpl and a TensorImpl per argument was most of the fallback's cost.
// Each pooled tensor keeps a storage of its own, which borrows the device
// memory (no reference, no deleter) only while the op runs; one a kernel kept
// hold of is given an owning pointer. Sizes and strides are only rewritten
// when they change, which also spares recomputing the contiguity flags.
struct AliasPool {
  c10::SmallVector<at::Tensor, 16> tensors;
  c10::DispatchKeySet keys;  // of a CPU alias; anything else is not reused

  at::Tensor tensor_over(c10::StorageImpl* nimpl, const at::Tensor& like) {
    if (tensors.empty()) {
      c10::Storage own(c10::Storage::use_byte_size_t(), 0, c10::DataPtr(nullptr, c10::Device(c10::kCPU)),
                       charging_cpu_allocator(), /*resizable=*/true);
      borrow(own.unsafeGetStorageImpl(), nimpl);
      at::Tensor t = tensor_on(std::move(own), c10::DispatchKey::CPU, like);
      keys = plain_keys(t.unsafeGetTensorImpl());
      return t;
    }
    at::Tensor t = std::move(tensors.back());
    tensors.pop_back();
    auto* impl = t.unsafeGetTensorImpl();
    borrow(impl->storage().unsafeGetStorageImpl(), nimpl);
    if (impl->dtype() != like.dtype()) impl->set_storage_and_dtype(impl->storage(), like.dtype());
    if (impl->sizes() != like.sizes() || impl->strides() != like.strides()) {
      impl->set_sizes_and_strides(like.sizes(), like.strides(), like.storage_offset());
    } else if (impl->storage_offset() != like.storage_offset()) {
      impl->set_storage_offset(like.storage_offset());
    }
    impl->_set_conj(like.is_conj());
    impl->_set_neg(like.is_neg());
    return t;
  }

  // tensor_over() sets the conj/neg bits per use.
  static c10::DispatchKeySet plain_keys(const c10::TensorImpl* impl) {
    return impl->key_set().remove(c10::DispatchKey::Conjugate).remove(c10::DispatchKey::Negative);
  }

  static void borrow(c10::StorageImpl* cpu, c10::StorageImpl* nimpl) {
    cpu->set_data_ptr_noswap(c10::DataPtr(nimpl->mutable_data(), c10::Device(c10::kCPU)));
    cpu->set_nbytes(nimpl->nbytes());
  }

  // Reused only when nothing but its table entry shares its storage.
  void give_back(at::Tensor&& t) {
    auto* impl = t.unsafeGetTensorImpl();
    if (tensors.size() < tensors.capacity() && t.use_count() == 1 && t.weak_use_count() == 1 &&
        impl->storage().use_count() == 2 && !impl->pyobj_slot()->load_pyobj() && !impl->is_wrapped_number() &&
        plain_keys(impl) == keys && impl->allow_tensor_metadata_change()) {
      auto* st = impl->storage().unsafeGetStorageImpl();
      st->set_data_ptr_noswap(c10::DataPtr(nullptr, c10::Device(c10::kCPU)));
      st->set_nbytes(0);
      tensors.push_back(std::move(t));
    }
    t.reset();
  }
};

// One pool per thread, shared by every translation unit.
inline AliasPool& alias_pool() {
  thread_local AliasPool pool;
  return pool;
}

// A CPU tensor sharing the memory of a neuron tensor (same sizes/strides),
// outside any pool.
inline at::Tensor cpu_view_of(const at::Tensor& t) {
  if (!t.defined() || t.device().type() != kNeuron) return t;
  return tensor_on(cpu_storage_over(t.storage().unsafeGetStorageImpl()), c10::DispatchKey::CPU, t);
}

}  // namespace neuron
