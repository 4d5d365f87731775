// The device's state: runtime access, initialisation and fork safety, the
// current device (process-wide default plus a per-thread override).
#include "device/device.h"

#include <c10/util/Exception.h>

#include <pthread.h>

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <string>

namespace neuron {
namespace {

std::atomic<bool> g_in_bad_fork{false};
// Set by the first use of a device (allocation, explicit init), not by merely
// reading the configuration: what "initialized" means for fork safety.
std::atomic<bool> g_initialized{false};

// Fork after the runtime is up: the child cannot own the parent's cores.
void mark_child_bad_fork() {
  if (g_initialized.load()) g_in_bad_fork.store(true);
}

struct ForkHandler {
  ForkHandler() { pthread_atfork(nullptr, nullptr, &mark_child_bad_fork); }
} g_fork_handler;

}  // namespace

rt::Runtime& runtime() {
  try {
    return rt::Runtime::get();
  } catch (const rt::ConfigError& e) {
    TORCH_CHECK_VALUE(false, e.what());
  }
}

int device_count() { return runtime().device_count(); }

void check_device_index(int64_t index) {
  const int n = device_count();
  TORCH_CHECK_INDEX(index >= 0 && index < n, "Invalid device index neuron:", index, ": this process sees ", n,
                    " neuron device", n == 1 ? "" : "s", " (valid indices 0..", n - 1, ")");
}

void lazy_init() {
  TORCH_CHECK(!g_in_bad_fork.load(),
              "Cannot re-initialize Neuron runtime in forked subprocess. To use Neuron with "
              "multiprocessing, use the 'spawn' start method");
  if (g_initialized.load(std::memory_order_acquire)) return;
  runtime();
  // A rank without a core fails at its first device use, not later.
  (void)current_device();
  g_initialized.store(true, std::memory_order_release);
}

bool is_initialized() { return g_initialized.load(std::memory_order_acquire); }

bool in_bad_fork() { return g_in_bad_fork.load(); }

// Current device: a process-wide default (set_device, torch.accelerator) that
// worker threads inherit, plus a per-thread override used by DeviceGuard.
namespace {
std::atomic<int> g_device{-1};
thread_local int tl_device = -1;

// Under torchrun each rank owns neuron:LOCAL_RANK from start-up. A rank
// without a core of its own is refused, as the real runtime refuses a second
// process on a core: silently sharing neuron:0 would hide a launch error.
int initial_device() {
  const char* lr = std::getenv("LOCAL_RANK");
  if (lr == nullptr) return 0;
  char* end = nullptr;
  errno = 0;
  const long r = std::strtol(lr, &end, 10);
  TORCH_CHECK_VALUE(end != lr && *end == '\0' && errno == 0 && r >= 0 && r <= INT32_MAX, "LOCAL_RANK='", lr,
                    "' is not a non-negative integer. torchrun sets LOCAL_RANK to the process's rank on its node, "
                    "which selects its NeuronCore (neuron:LOCAL_RANK); unset LOCAL_RANK or set it to an integer.");
  const int n = device_count();
  if (r < n) return static_cast<int>(r);
  const char* share = std::getenv("TORCH_NEURONX_ALLOW_CORE_SHARING");
  if (share != nullptr && std::string(share) == "1") return static_cast<int>(r % n);
  const auto& info = runtime().instance();
  std::string cores;
  for (const auto& c : info.visible) cores += (cores.empty() ? "" : ",") + std::to_string(c.logical_id);
  TORCH_CHECK(false, "LOCAL_RANK=", r, " has no NeuronCore: this process sees ", n, " NeuronCore", n == 1 ? "" : "s",
              " (logical cores ", cores, ") of ", info.instance_type,
              ", and each rank on a node owns one core (neuron:LOCAL_RANK). Launch at most ", n,
              " processes per node (torchrun --nproc_per_node=", n,
              "), or make more cores visible (NEURON_RT_VISIBLE_CORES, NEURON_RT_NUM_CORES, "
              "NEURON_LOGICAL_NC_CONFIG, TORCH_NEURONX_INSTANCE_TYPE), or set TORCH_NEURONX_ALLOW_CORE_SHARING=1 to "
              "let ranks share cores (rank r uses neuron:r % ",
              n, "; the simulator only, real hardware refuses).");
}
}  // namespace

c10::DeviceIndex current_device() {
  if (tl_device >= 0) return static_cast<c10::DeviceIndex>(tl_device);
  int g = g_device.load();
  if (g < 0) {
    int expected = -1;
    g_device.compare_exchange_strong(expected, initial_device());
    g = g_device.load();
  }
  return static_cast<c10::DeviceIndex>(g);
}

// Choosing a device initialises the runtime, as torch.cuda.set_device and CUDA's
// torch.accelerator.set_device_index do: DeviceMesh binds a rank to its device only while the
// runtime is not initialised, and FakeTensor resolves a device-less "neuron" to the current
// device only once it is.
void set_device_process_wide(c10::DeviceIndex index) {
  check_device_index(index);
  lazy_init();
  g_device.store(index);
  tl_device = index;
}

void set_thread_device(c10::DeviceIndex index) { tl_device = index; }

}  // namespace neuron
