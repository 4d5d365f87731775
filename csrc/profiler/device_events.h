// Device-side events of the `neuron` device for torch.profiler.
//
// The simulator executes synchronously, so the device time of a kernel (an
// op's CPU kernel, a compiled graph, a collective) is the interval during
// which it ran on the simulated NeuronCore. The hooks below timestamp those
// intervals while a profiler session asked for ProfilerActivity.PrivateUse1;
// otherwise each costs one relaxed atomic load.
#pragma once

#include <c10/core/Device.h>

#include <atomic>
#include <cstdint>
#include <string>

namespace neuron::profiler {

// What ran on the device; each kind is a row ("stream") of the device in the
// trace viewer.
enum class SpanKind : int { Op = 1, Graph = 2, Collective = 3 };

namespace detail {
extern std::atomic<bool> g_tracing;
}

inline bool device_tracing() { return detail::g_tracing.load(std::memory_order_relaxed); }

// The profiler's correlation id of the CPU op running on this thread (0 if none).
uint64_t current_correlation();
// Nanoseconds on the profiler's clock (c10::getTime).
int64_t now_ns();

// Records a finished span; `correlation` links it to the CPU op that launched it.
void record_span(SpanKind kind, std::string name, c10::DeviceIndex device, int64_t start_ns, int64_t end_ns,
                 uint64_t correlation);

// Times its scope as one device span of `kind`. Spans nested in another span of
// this thread (the ops a compiled graph runs) are not recorded separately: the
// outer span already covers their device time.
class DeviceSpan {
 public:
  DeviceSpan(SpanKind kind, const char* name, c10::DeviceIndex device) {
    if (device_tracing()) begin(kind, name, device);
  }
  ~DeviceSpan() {
    if (active_) end();
  }
  DeviceSpan(const DeviceSpan&) = delete;
  DeviceSpan& operator=(const DeviceSpan&) = delete;

 private:
  void begin(SpanKind kind, const char* name, c10::DeviceIndex device);
  void end();
  bool active_ = false;
  SpanKind kind_ = SpanKind::Op;
  const char* name_ = nullptr;
  c10::DeviceIndex device_ = 0;
  int64_t start_ = 0;
  uint64_t correlation_ = 0;
};

// A span that ends on another call, possibly on another thread (a collective
// runs from its launch until its completion is observed).
struct AsyncSpan {
  void begin(SpanKind kind, std::string name, c10::DeviceIndex device) {
    if (!device_tracing()) return;
    kind_ = kind;
    name_ = std::move(name);
    device_ = device;
    correlation_ = current_correlation();
    start_ = now_ns();
  }
  void end() {
    if (start_) record_span(kind_, std::move(name_), device_, start_, now_ns(), correlation_);
    start_ = 0;
  }

 private:
  SpanKind kind_ = SpanKind::Collective;
  std::string name_;
  c10::DeviceIndex device_ = 0;
  int64_t start_ = 0;
  uint64_t correlation_ = 0;
};

}  // namespace neuron::profiler
