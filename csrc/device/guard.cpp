// Device guard: devices, streams and events. Execution is synchronous, so
// streams are identities and events are timestamps (elapsed_time is real).
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/util/Exception.h>

#include <array>
#include <atomic>
#include <chrono>

#include "device/device.h"

namespace neuron {
namespace {

struct SimEvent {
  std::chrono::steady_clock::time_point time;
  c10::DeviceIndex device = -1;
  bool recorded = false;
};

constexpr int kMaxDevices = 256;
thread_local std::array<c10::StreamId, kMaxDevices> tl_stream{};
std::atomic<c10::StreamId> g_next_stream{1};

struct NeuronGuardImpl final : c10::impl::DeviceGuardImplInterface {
  c10::DeviceType type() const override { return kNeuron; }
  c10::Device exchangeDevice(c10::Device d) const override {
    auto old = getDevice();
    if (d.index() != old.index()) {
      check_device_index(d.index());
      set_thread_device(d.index());
    }
    return old;
  }
  c10::Device getDevice() const override { return {kNeuron, current_device()}; }
  void setDevice(c10::Device d) const override { set_device_process_wide(d.index()); }
  void uncheckedSetDevice(c10::Device d) const noexcept override { set_thread_device(d.index()); }
  c10::Stream getStream(c10::Device d) const override {
    auto idx = d.index() < 0 ? current_device() : d.index();
    return c10::Stream(c10::Stream::UNSAFE, c10::Device(kNeuron, idx), tl_stream[idx]);
  }
  c10::Stream getDefaultStream(c10::Device d) const override {
    return c10::Stream(c10::Stream::DEFAULT, c10::Device(kNeuron, d.index() < 0 ? current_device() : d.index()));
  }
  c10::Stream getStreamFromGlobalPool(c10::Device d, bool) const override { return getNewStream(d, 0); }
  c10::Stream getNewStream(c10::Device d, int) const override {
    auto idx = d.index() < 0 ? current_device() : d.index();
    return c10::Stream(c10::Stream::UNSAFE, c10::Device(kNeuron, idx), g_next_stream++);
  }
  c10::Stream exchangeStream(c10::Stream s) const override {
    auto idx = s.device_index();
    auto old = c10::Stream(c10::Stream::UNSAFE, s.device(), tl_stream[idx]);
    tl_stream[idx] = s.id();
    return old;
  }
  c10::DeviceIndex deviceCount() const noexcept override {
    try {
      return static_cast<c10::DeviceIndex>(device_count());
    } catch (...) {
      return 0;
    }
  }
  void record(void** event, const c10::Stream& stream, const c10::DeviceIndex device_index,
              const c10::EventFlag) const override {
    auto* e = static_cast<SimEvent*>(*event);
    if (!e) {
      e = new SimEvent();
      *event = e;
    }
    e->device = device_index >= 0 ? device_index : stream.device_index();
    e->time = std::chrono::steady_clock::now();
    e->recorded = true;
  }
  void block(void*, const c10::Stream&) const override {}
  bool queryEvent(void*) const override { return true; }
  void destroyEvent(void* event, const c10::DeviceIndex) const noexcept override {
    delete static_cast<SimEvent*>(event);
  }
  bool queryStream(const c10::Stream&) const override { return true; }
  void synchronizeStream(const c10::Stream& s) const override { runtime().synchronize(s.device_index()); }
  void synchronizeEvent(void*) const override {}
  void synchronizeDevice(const c10::DeviceIndex d) const override { runtime().synchronize(d); }
  void recordDataPtrOnStream(const c10::DataPtr&, const c10::Stream&) const override {}
  double elapsedTime(void* start, void* end, const c10::DeviceIndex) const override {
    auto* a = static_cast<SimEvent*>(start);
    auto* b = static_cast<SimEvent*>(end);
    TORCH_CHECK(a && b && a->recorded && b->recorded, "Both events must be recorded before calculating elapsed time.");
    return std::chrono::duration<double, std::milli>(b->time - a->time).count();
  }
};

C10_REGISTER_GUARD_IMPL(PrivateUse1, NeuronGuardImpl);

}  // namespace
}  // namespace neuron
