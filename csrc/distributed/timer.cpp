// DDP's per-iteration time stats (DistributedDataParallel._get_ddp_logging_data:
// avg_forward_compute_time, avg_backward_compute_time, ...). The reducer looks
// up a Timer for its parameters' device type and, without one, warns that time
// stats are only collected for CPU and CUDA. A neuron op has completed when it
// returns (the simulator executes synchronously on the host), so host
// timestamps time it exactly, as CPU's timer does.
#include <torch/csrc/distributed/c10d/reducer_timer.hpp>

namespace neuron {
namespace {

class NeuronTimer : public c10d::Timer {
 public:
  explicit NeuronTimer(c10::Device /*device*/) {}

  std::optional<int64_t> measureDifference(Event start, Event end) override {
    const int64_t t0 = getTimeRef(start), t1 = getTimeRef(end);
    // An event not recorded in this iteration (e.g. backward not run yet) has
    // an older timestamp: no valid difference.
    if (t1 < t0) return std::nullopt;
    return t1 - t0;
  }
};

}  // namespace
}  // namespace neuron

namespace c10d {
C10_REGISTER_TYPED_CLASS(TimerRegistry, c10::kPrivateUse1, neuron::NeuronTimer);
}  // namespace c10d
