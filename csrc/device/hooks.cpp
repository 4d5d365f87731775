// The accelerator hooks of the `neuron` device (at::PrivateUse1HooksInterface):
// what torch.accelerator, generators, pinned memory and storage resizing ask.
#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/util/Exception.h>

#include <algorithm>

#include "device/allocator.h"
#include "device/device.h"
#include "device/generator.h"

namespace neuron {
namespace {

struct NeuronHooks final : at::PrivateUse1HooksInterface {
  bool isBuilt() const override { return true; }
  bool isAvailable() const override {
    try {
      return device_count() > 0;
    } catch (...) {
      return false;
    }
  }
  const at::Generator& getDefaultGenerator(c10::DeviceIndex device) const override { return default_generator(device); }
  at::Generator getNewGenerator(c10::DeviceIndex device) const override { return new_generator(device); }
  at::Device getDeviceFromPtr(void* data) const override {
    int d = runtime().device_of(data);
    TORCH_CHECK(d >= 0, "pointer ", data, " is not neuron device memory");
    return {kNeuron, static_cast<c10::DeviceIndex>(d)};
  }
  bool isPinnedPtr(const void* data) const override { return is_pinned(data); }
  c10::Allocator* getPinnedMemoryAllocator() const override { return pinned_allocator(); }
  bool hasPrimaryContext(c10::DeviceIndex) const override { return is_initialized(); }
  void init() const override { lazy_init(); }
  c10::DeviceIndex deviceCount() const override { return static_cast<c10::DeviceIndex>(device_count()); }
  void setCurrentDevice(c10::DeviceIndex device) const override { set_device_process_wide(device); }
  c10::DeviceIndex getCurrentDevice() const override { return current_device(); }
  c10::DeviceIndex exchangeDevice(c10::DeviceIndex device) const override {
    auto old = current_device();
    c10::impl::getDeviceGuardImpl(kNeuron)->exchangeDevice(c10::Device(kNeuron, device));
    return old;
  }
  c10::DeviceIndex maybeExchangeDevice(c10::DeviceIndex device) const override { return exchangeDevice(device); }
  void resizePrivateUse1Bytes(const c10::Storage& storage, size_t newsize) const override {
    auto* impl = storage.unsafeGetStorageImpl();
    TORCH_CHECK(impl->resizable(), "Trying to resize storage that is not resizable");
    const auto device = storage.device();
    // An empty buffer still belongs to the device: a storage's device is its
    // DataPtr's, and FSDP frees parameters by resizing them to 0 and back.
    c10::DataPtr fresh = newsize ? allocate_on(device.index(), newsize) : c10::DataPtr(nullptr, device);
    const size_t keep = std::min(newsize, impl->nbytes());
    if (keep && impl->data()) rt::Runtime::get().copy(fresh.get(), impl->data(), keep);
    impl->set_data_ptr_noswap(std::move(fresh));
    impl->set_nbytes(newsize);
  }
};

struct Registration {
  Registration() { at::RegisterPrivateUse1HooksInterface(new NeuronHooks()); }
};
Registration g_registration;

}  // namespace
}  // namespace neuron
