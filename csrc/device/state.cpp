// The device's state: runtime access, initialisation and fork safety, the
// current device (process-wide default plus a per-thread override).
#include "device/device.h"

#include <c10/util/Exception.h>

#include <pthread.h>

#include <atomic>
#include <cstdlib>

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
  g_initialized.store(true, std::memory_order_release);
}

bool is_initialized() { return g_initialized.load(std::memory_order_acquire); }

bool in_bad_fork() { return g_in_bad_fork.load(); }

// Current device: a process-wide default (set_device, torch.accelerator) that
// worker threads inherit, plus a per-thread override used by DeviceGuard.
namespace {
std::atomic<int> g_device{-1};
thread_local int tl_device = -1;

int initial_device() {
  // Under torchrun each rank owns neuron:LOCAL_RANK from start-up.
  if (const char* lr = std::getenv("LOCAL_RANK")) {
    char* end = nullptr;
    long r = std::strtol(lr, &end, 10);
    if (end != lr && r >= 0 && r < device_count()) return static_cast<int>(r);
  }
  return 0;
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

void set_device_process_wide(c10::DeviceIndex index) {
  check_device_index(index);
  g_device.store(index);
  tl_device = index;
}

void set_thread_device(c10::DeviceIndex index) { tl_device = index; }

}  // namespace neuron
