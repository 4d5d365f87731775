// The runtime interface: the only surface the PyTorch layer uses to reach a
// NeuronCore. The simulator (simulator.cpp) implements it on host memory; a
// hardware runtime would implement the same calls on the device driver.
// Deliberately free of PyTorch headers so it can be swapped without touching
// the registration code.
#pragma once

#include <cstddef>
#include <cstdint>

#include "runtime/instance.h"

namespace neuron::rt {

// allocated: bytes of live allocations as requested. reserved: what the
// core's allocator holds, i.e. live blocks (rounded to their size class) plus
// freed blocks it keeps for reuse; the HBM capacity limit applies to it.
struct MemoryCounters {
  uint64_t allocated_current = 0, allocated_peak = 0;
  uint64_t allocated_total = 0, freed_total = 0;
  uint64_t reserved_current = 0, reserved_peak = 0;
  uint64_t reserved_total = 0, released_total = 0;
  uint64_t num_allocs = 0, num_frees = 0, num_ooms = 0, num_alloc_retries = 0;
  uint64_t live_count = 0, live_count_peak = 0;
  uint64_t segment_count = 0, segment_count_peak = 0;
  // The peaks a tool reads (a dry run's recording): raised with the peaks
  // above, but reset only by reset_high_water, so a program's own reset of its
  // peak statistics does not hide its peak from the tool.
  uint64_t allocated_high_water = 0, reserved_high_water = 0;
  uint64_t capacity = 0;
};

// One block the core's allocator holds: a live allocation (nbytes as
// requested, in a block of `block` bytes) or a freed block kept for reuse.
struct BlockInfo {
  int device = -1;
  const void* ptr = nullptr;
  size_t nbytes = 0;
  size_t block = 0;
  bool cached = false;
};

enum class AllocStatus { Ok, OutOfDeviceMemory, OutOfHostMemory };

// The process-wide runtime. Cheap to call; built on first use.
class Runtime {
 public:
  static Runtime& get();

  // True once get() has built the runtime in this process.
  static bool started();

  const InstanceInfo& instance() const { return info_; }
  int device_count() const { return static_cast<int>(info_.visible.size()); }

  // Device memory. allocate() never throws; it reports why it failed. Freed
  // small blocks are kept per core and reused, as a device caching allocator
  // does; when a request would exceed the capacity, the cache is released
  // first and the request retried.
  AllocStatus allocate(int device, size_t nbytes, void** out);
  // The same accounting without memory behind it (a dry run): counters, size
  // classes, the cache of freed blocks and the capacity limit apply exactly as
  // for allocate(), so a dry run's peaks and out-of-memory errors are the real
  // ones, but *out is only a unique token for free(): never read or write it.
  AllocStatus reserve(int device, size_t nbytes, void** out);
  // Returns false (and does nothing) when ptr is not device memory.
  bool free(void* ptr);
  // Returns the cached blocks of one core (or all with -1) to the host.
  void release_cached(int device);
  // Which device owns ptr (or -1): for pointers handed in from outside.
  int device_of(const void* ptr) const;

  // DMA between any two buffers (host or device).
  void copy(void* dst, const void* src, size_t nbytes);
  // Execution is synchronous in the simulator; kept for the interface.
  void synchronize(int device);

  MemoryCounters memory(int device) const;
  // Every block of every core (memory snapshots); and the live block at ptr.
  std::vector<BlockInfo> blocks() const;
  bool live_block(const void* ptr, BlockInfo* out) const;
  void reset_peak(int device);
  void reset_high_water(int device);
  // Lowers the allocated peak to max(`peak`, allocated now) if above it, and the
  // allocated high-water mark likewise to max(`high_water`, allocated now), so
  // what a stretch of work allocated and freed again leaves no trace in either
  // (a host kernel's scratch is not device memory; see ChargeCpuAllocationsTo).
  void settle_peak(int device, uint64_t peak, uint64_t high_water);
  void reset_accumulated(int device);

 private:
  Runtime();
  AllocStatus obtain(int device, size_t nbytes, void** out, bool backed);
  InstanceInfo info_;
  struct State;
  State* state_;
};

}  // namespace neuron::rt
