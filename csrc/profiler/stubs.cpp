// The legacy profiler's device hooks (ProfilerStubs) for neuron:
// torch.autograd.profiler.profile(use_device="neuron") without kineto
// (ProfilerState.KINETO_PRIVATEUSE1_FALLBACK) brackets every op with two device
// events and reports their elapsed time as the op's device time. Execution is
// synchronous, so an event is a timestamp. torch.profiler's activity-based
// profiling uses the kineto plugin instead (device_events.cpp).
#include "profiler/device_events.h"

#include <c10/core/DeviceGuard.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/csrc/profiler/stubs/base.h>

namespace neuron::profiler {
namespace {

// The device layer's guard (current device, device count): reached through c10
// so this layer stays below the device layer that calls its hooks.
const c10::impl::DeviceGuardImplInterface* guard_impl() {
  return c10::impl::getDeviceGuardImpl(c10::DeviceType::PrivateUse1);
}

struct NeuronStubs final : torch::profiler::impl::ProfilerStubs {
  void record(c10::DeviceIndex* device, torch::profiler::impl::ProfilerVoidEventStub* event,
              int64_t* cpu_ns) const override {
    if (device) *device = guard_impl()->getDevice().index();
    *event = std::make_shared<int64_t>(now_ns());
    if (cpu_ns) *cpu_ns = now_ns();
  }
  // Microseconds, as the CUDA stubs report.
  float elapsed(const torch::profiler::impl::ProfilerVoidEventStub* a,
                const torch::profiler::impl::ProfilerVoidEventStub* b) const override {
    const auto start = *static_cast<const int64_t*>(a->get());
    const auto end = *static_cast<const int64_t*>(b->get());
    return static_cast<float>(end - start) / 1000.0f;
  }
  void mark(const char*) const override {}
  void rangePush(const char*) const override {}
  void rangePop() const override {}
  bool enabled() const override { return true; }
  void onEachDevice(std::function<void(int)> op) const override {
    const int n = guard_impl()->deviceCount();
    for (int d = 0; d < n; ++d) {
      c10::DeviceGuard guard(c10::Device(c10::DeviceType::PrivateUse1, static_cast<c10::DeviceIndex>(d)));
      op(d);
    }
  }
  void synchronize() const override {}
};

struct Registration {
  Registration() {
    static NeuronStubs stubs;
    torch::profiler::impl::registerPrivateUse1Methods(&stubs);
  }
} g_registration;

}  // namespace
}  // namespace neuron::profiler
