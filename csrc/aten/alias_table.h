// The aliases of one op call: CPU aliases of its neuron arguments, and the
// neuron tensors its CPU kernel's results become. Inline: once per op.
#pragma once

#include "aten/alias_pool.h"
#include "device/allocator.h"
#include "device/device.h"

namespace neuron {

// A kernel's fresh result, owned by nobody else and already device memory
// (the charging allocator), becomes a neuron tensor in place: no new
// TensorImpl or StorageImpl.
inline bool adopt_in_place(const at::Tensor& r, c10::DeviceIndex dev) {
  auto* impl = r.unsafeGetTensorImpl();
  if (r.use_count() != 1 || r.weak_use_count() != 1 || impl->pyobj_slot()->load_pyobj()) return false;
  if (!impl->has_storage() || !impl->allow_tensor_metadata_change()) return false;
  const c10::Storage& st = impl->storage();
  if (st.use_count() != 1) return false;
  auto* cimpl = st.unsafeGetStorageImpl();
  if (!is_device_memory(cimpl->data_ptr()) || !cimpl->resizable()) return false;
  cimpl->mutable_data_ptr().unsafe_set_device(c10::Device(kNeuron, dev));
  cimpl->set_allocator(device_allocator());
  impl->set_storage_keep_dtype(st);
  impl->_change_backend_component_keys(c10::Device(kNeuron, dev));
  return true;
}

struct AliasTable {
  struct Entry {
    c10::StorageImpl* neuron;
    c10::Storage cpu;
    const void* data;
    size_t nbytes;
  };
  c10::SmallVector<Entry, 8> entries;
  c10::SmallVector<std::pair<c10::StorageImpl*, c10::Storage>, 4> adopted;  // cpu -> neuron
  c10::SmallVector<at::Tensor, 8> aliases;
  AliasPool& pool = alias_pool();

  AliasTable() = default;
  AliasTable(const AliasTable&) = delete;
  AliasTable& operator=(const AliasTable&) = delete;

  ~AliasTable() {
    // Latest first: an alias sharing an earlier one's storage lets go of it
    // before the earlier one is considered for reuse.
    for (auto it = aliases.rbegin(); it != aliases.rend(); ++it) pool.give_back(std::move(*it));
    for (auto& e : entries) {
      auto* impl = e.cpu.unsafeGetStorageImpl();
      if (e.cpu.use_count() > 1 && impl->data_ptr().get_deleter() == nullptr && impl->data() != nullptr) {
        // A kernel kept the alias: it must keep the device memory alive too.
        c10::raw::intrusive_ptr::incref(e.neuron);
        impl->set_data_ptr_noswap(
            c10::DataPtr(impl->mutable_data(), e.neuron, &release_storage, c10::Device(c10::kCPU)));
      }
    }
  }

  const at::Tensor& alias(const at::Tensor& t) {
    aliases.push_back(alias_only(t));
    return aliases.back();
  }

  // An alias the caller gives back to the pool (see AliasList).
  at::Tensor alias_only(const at::Tensor& t) {
    auto* nimpl = t.storage().unsafeGetStorageImpl();
    for (auto& e : entries)
      if (e.neuron == nimpl) return tensor_on(e.cpu, c10::DispatchKey::CPU, t);
    at::Tensor a = pool.tensor_over(nimpl, t);
    entries.push_back({nimpl, a.storage(), nimpl->data(), nimpl->nbytes()});
    return a;
  }

  // The neuron storage that holds the memory of a CPU storage produced by a kernel.
  c10::Storage neuron_storage_for(const c10::Storage& cpu, c10::DeviceIndex dev) {
    auto* cimpl = cpu.unsafeGetStorageImpl();
    for (auto& e : entries)
      if (e.cpu.unsafeGetStorageImpl() == cimpl)
        return c10::Storage(c10::intrusive_ptr<c10::StorageImpl>::reclaim_copy(e.neuron));
    for (auto& a : adopted)
      if (a.first == cimpl) return a.second;
    c10::Storage out;
    if (is_device_memory(cimpl->data_ptr())) {
      // Allocated on this device by the CPU kernel: adopt without copying.
      out = neuron_storage_over(cimpl, dev);
    } else {
      out = c10::Storage(c10::Storage::use_byte_size_t(), cimpl->nbytes(), allocate_on(dev, cimpl->nbytes()),
                         device_allocator(), true);
      if (cimpl->nbytes()) runtime().copy(out.mutable_data(), cimpl->data(), cimpl->nbytes());
    }
    adopted.emplace_back(cimpl, out);
    return out;
  }

  // A CPU kernel's result as a neuron tensor: a fresh result of its own is
  // adopted in place; one over an alias's storage (or anything else) is
  // wrapped over the neuron storage that holds its memory.
  at::Tensor neuron_result(const at::Tensor& r, c10::DeviceIndex dev) {
    if (adopt_in_place(r, dev)) return r;
    return tensor_on(neuron_storage_for(r.storage(), dev), c10::DispatchKey::PrivateUse1, r);
  }

  // A kernel resized an aliased storage: the new buffer came from the device
  // (charging allocator); move it into the neuron storage all views share.
  void sync_resized_storages(c10::DeviceIndex dev) {
    for (auto& e : entries) {
      auto* cimpl = e.cpu.unsafeGetStorageImpl();
      if (cimpl->data() == e.data && cimpl->nbytes() == e.nbytes) continue;
      c10::DataPtr moved = cimpl->set_data_ptr(c10::DataPtr(nullptr, c10::Device(c10::kCPU)));
      const size_t nbytes = cimpl->nbytes();
      if (!is_device_memory(moved)) {
        c10::DataPtr fresh = allocate_on(dev, nbytes);
        if (nbytes) runtime().copy(fresh.get(), moved.get(), nbytes);
        moved = std::move(fresh);
      }
      moved.unsafe_set_device(c10::Device(kNeuron, dev));
      e.neuron->set_data_ptr_noswap(std::move(moved));
      e.neuron->set_nbytes(nbytes);
      // Keep the (dying) alias consistent for any later lookup in this call.
      c10::raw::intrusive_ptr::incref(e.neuron);
      cimpl->set_data_ptr_noswap(
          c10::DataPtr(e.neuron->mutable_data(), e.neuron, &release_storage, c10::Device(c10::kCPU)));
      e.data = e.neuron->data();
      e.nbytes = nbytes;
    }
  }
};

}  // namespace neuron
