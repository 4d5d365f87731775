// Device memory in PyTorch: the device allocator (with the CUDA-style
// DeviceStats that torch.accelerator and torch.neuron read), the charging CPU
// allocator the fallback's kernels allocate from, and pinned host memory.
#include "device/allocator.h"

#include <c10/core/CPUAllocator.h>
#include <c10/core/CachingDeviceAllocator.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <unordered_set>

#include "device/device.h"
#include "profiler/memory_history.h"

namespace neuron {
namespace {

std::string format_bytes(uint64_t n) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(n);
  int u = 0;
  while (v >= 1024.0 && u < 4) {
    v /= 1024.0;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof(buf), u == 0 ? "%.0f %s" : "%.2f %s", v, units[u]);
  return buf;
}

void free_device_memory(void* ptr) {
  if (profiler::memory_recording()) profiler::on_free(ptr);
  if (ptr) rt::Runtime::get().free(ptr);
}

[[noreturn]] void raise_oom(c10::DeviceIndex device, size_t nbytes, rt::AllocStatus status) {
  auto c = rt::Runtime::get().memory(device);
  const uint64_t free_bytes = c.capacity > c.reserved_current ? c.capacity - c.reserved_current : 0;
  if (profiler::memory_recording()) profiler::on_oom(device, nbytes, free_bytes);
  if (status == rt::AllocStatus::OutOfHostMemory) {
    TORCH_CHECK_WITH(OutOfMemoryError, false, "Neuron out of memory. Tried to allocate ", format_bytes(nbytes),
                     " on neuron:", static_cast<int>(device), ": the simulator's host memory is exhausted (device has ",
                     format_bytes(free_bytes), " free of ", format_bytes(c.capacity), ").");
  }
  TORCH_CHECK_WITH(OutOfMemoryError, false, "Neuron out of memory. Tried to allocate ", format_bytes(nbytes),
                   " on neuron:", static_cast<int>(device), " (requested ", nbytes,
                   " bytes). The logical NeuronCore has a total capacity of ", format_bytes(c.capacity), " of which ",
                   format_bytes(free_bytes), " is free. Of the reserved memory ", format_bytes(c.allocated_current),
                   " is allocated by PyTorch, and ",
                   format_bytes(c.reserved_current - std::min(c.reserved_current, c.allocated_current)),
                   " is reserved by PyTorch but unallocated. Free tensors, reduce the batch size, "
                   "or shard the model across more NeuronCores.");
}

}  // namespace

c10::DataPtr allocate_on(c10::DeviceIndex device, size_t nbytes) {
  lazy_init();
  check_device_index(device);
  void* ptr = nullptr;
  auto status = rt::Runtime::get().allocate(device, nbytes, &ptr);
  if (status != rt::AllocStatus::Ok) raise_oom(device, nbytes, status);
  if (profiler::memory_recording()) profiler::on_alloc(device, ptr, nbytes);
  return {ptr, ptr, &free_device_memory, c10::Device(kNeuron, device)};
}

uintptr_t reserve_on(c10::DeviceIndex device, size_t nbytes) {
  lazy_init();
  check_device_index(device);
  void* token = nullptr;
  auto status = rt::Runtime::get().reserve(device, nbytes, &token);
  if (status != rt::AllocStatus::Ok) raise_oom(device, nbytes, status);
  return reinterpret_cast<uintptr_t>(token);
}

void release_reservation(uintptr_t token) { rt::Runtime::get().free(reinterpret_cast<void*>(token)); }

bool is_device_memory(const c10::DataPtr& dp) { return dp.get_deleter() == &free_device_memory; }

namespace {

void fill_stat(c10::CachingDeviceAllocator::StatArray& arr, int64_t cur, int64_t peak, int64_t allocated,
               int64_t freed) {
  for (auto& s : arr) {
    s.current = cur;
    s.peak = peak;
    s.allocated = allocated;
    s.freed = freed;
  }
  // Only the aggregate pool is meaningful: the simulator has no small/large pools.
  for (size_t i = 1; i < arr.size(); ++i) arr[i] = c10::CachingDeviceAllocator::Stat();
}

struct NeuronAllocator final : c10::DeviceAllocator {
  c10::DataPtr allocate(size_t nbytes) override { return allocate_on(current_device(), nbytes); }
  c10::DeleterFnPtr raw_deleter() const override { return &free_device_memory; }
  void copy_data(void* dst, const void* src, std::size_t count) const override {
    rt::Runtime::get().copy(dst, src, count);
  }
  bool initialized() override { return is_initialized(); }
  void emptyCache(c10::MempoolId_t) override { runtime().release_cached(-1); }
  void recordStream(const c10::DataPtr&, c10::Stream) override {}
  c10::CachingDeviceAllocator::DeviceStats getDeviceStats(c10::DeviceIndex device) override {
    check_device_index(device);
    auto c = runtime().memory(device);
    c10::CachingDeviceAllocator::DeviceStats s;
    fill_stat(s.allocated_bytes, c.allocated_current, c.allocated_peak, c.allocated_total, c.freed_total);
    fill_stat(s.reserved_bytes, c.reserved_current, c.reserved_peak, c.reserved_total, c.released_total);
    s.active_bytes = s.allocated_bytes;
    s.requested_bytes = s.allocated_bytes;
    fill_stat(s.allocation, c.live_count, c.live_count_peak, c.num_allocs, c.num_frees);
    fill_stat(s.segment, c.segment_count, c.segment_count_peak, 0, 0);
    s.active = s.allocation;
    s.num_alloc_retries = c.num_alloc_retries;
    s.num_ooms = c.num_ooms;
    s.num_device_alloc = c.num_allocs;
    s.num_device_free = c.num_frees;
    return s;
  }
  void resetAccumulatedStats(c10::DeviceIndex device) override {
    check_device_index(device);
    runtime().reset_accumulated(device);
  }
  void resetPeakStats(c10::DeviceIndex device) override {
    check_device_index(device);
    runtime().reset_peak(device);
  }
  std::pair<size_t, size_t> getMemoryInfo(c10::DeviceIndex device) override {
    check_device_index(device);
    auto c = runtime().memory(device);
    return {c.capacity - c.reserved_current, c.capacity};
  }
};

NeuronAllocator g_allocator;

// CPU allocator that, inside the fallback, takes memory from the device the op
// runs on: results of CPU kernels are then device memory already (adopted
// without a copy) and the core's capacity limit applies to them.
thread_local c10::DeviceIndex tl_charge_device = -1;

struct ChargingCpuAllocator final : c10::Allocator {
  c10::Allocator* base = nullptr;
  c10::DeleterFnPtr base_raw_deleter = nullptr;

  c10::DataPtr allocate(size_t nbytes) override {
    if (tl_charge_device < 0) return base->allocate(nbytes);
    auto dp = allocate_on(tl_charge_device, nbytes);
    dp.unsafe_set_device(c10::Device(c10::kCPU));
    return dp;
  }
  static void raw_free(void* ptr);
  c10::DeleterFnPtr raw_deleter() const override { return &ChargingCpuAllocator::raw_free; }
  void copy_data(void* dst, const void* src, std::size_t count) const override { std::memcpy(dst, src, count); }
};

ChargingCpuAllocator g_charging_cpu;

void ChargingCpuAllocator::raw_free(void* ptr) {
  if (profiler::memory_recording() && rt::Runtime::started()) profiler::on_free(ptr);
  if (rt::Runtime::started() && rt::Runtime::get().free(ptr)) return;
  if (g_charging_cpu.base_raw_deleter) g_charging_cpu.base_raw_deleter(ptr);
}

// Pinned host memory: ordinary host memory, remembered so is_pinned() works
// (DataLoader(pin_memory=True) pins for the current accelerator).
struct PinnedAllocator final : c10::Allocator {
  std::mutex mu;
  std::unordered_set<const void*> live;

  static void free_pinned(void* ptr);
  c10::DataPtr allocate(size_t nbytes) override {
    void* p = nullptr;
    if (nbytes && posix_memalign(&p, 64, nbytes) != 0) {
      TORCH_CHECK_WITH(OutOfMemoryError, false, "could not allocate ", format_bytes(nbytes), " of pinned host memory");
    }
    if (p) {
      std::lock_guard<std::mutex> lock(mu);
      live.insert(p);
    }
    return {p, p, &PinnedAllocator::free_pinned, c10::Device(c10::kCPU)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &PinnedAllocator::free_pinned; }
  void copy_data(void* dst, const void* src, std::size_t count) const override { std::memcpy(dst, src, count); }
  bool contains(const void* p) {
    std::lock_guard<std::mutex> lock(mu);
    return live.count(p) > 0;
  }
};

PinnedAllocator g_pinned;

void PinnedAllocator::free_pinned(void* ptr) {
  if (!ptr) return;
  {
    std::lock_guard<std::mutex> lock(g_pinned.mu);
    g_pinned.live.erase(ptr);
  }
  std::free(ptr);
}

}  // namespace

c10::Allocator* device_allocator() { return &g_allocator; }
c10::Allocator* charging_cpu_allocator() { return &g_charging_cpu; }

ChargeCpuAllocationsTo::ChargeCpuAllocationsTo(c10::DeviceIndex device) : prev_(tl_charge_device) {
  tl_charge_device = device;
  if (prev_ < 0 && device >= 0) {
    auto c = runtime().memory(device);
    peak_ = c.allocated_peak;
    high_water_ = c.allocated_high_water;
  }
}
ChargeCpuAllocationsTo::~ChargeCpuAllocationsTo() {
  if (prev_ < 0 && tl_charge_device >= 0) runtime().settle_peak(tl_charge_device, peak_, high_water_);
  tl_charge_device = prev_;
}

c10::Allocator* pinned_allocator() { return &g_pinned; }
bool is_pinned(const void* ptr) { return g_pinned.contains(ptr); }

namespace {
struct Registration {
  Registration() {
    c10::SetAllocator(kNeuron, &g_allocator);
    g_charging_cpu.base = c10::GetCPUAllocator();
    g_charging_cpu.base_raw_deleter = g_charging_cpu.base->raw_deleter();
    c10::SetCPUAllocator(&g_charging_cpu, /*priority=*/10);
  }
};
Registration g_registration;
}  // namespace

}  // namespace neuron
