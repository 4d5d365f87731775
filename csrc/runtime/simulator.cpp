// NeuronCore simulator: implements the runtime interface on host memory.
// Each logical core owns its allocations and has an HBM budget of its own, so
// capacity errors, per-core accounting and device-to-device copies behave as on
// a real instance while the bytes live in ordinary host RAM.
#include "runtime/runtime.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <vector>

// Header-only open-addressing map shipped with PyTorch; the runtime interface
// (runtime.h) itself stays free of PyTorch headers.
#include <c10/util/flat_hash_map.h>

#include "runtime/block_cache.h"

namespace neuron::rt {
namespace {

struct Live {
  int device;
  size_t nbytes;
  bool backed;
};

// An unbacked block's token is a small host chunk: unique while live, and it
// holds the free-list link when the block is cached (BlockCache is intrusive).
constexpr size_t kTokenBytes = 64;

}  // namespace

struct Runtime::State {
  mutable std::mutex mu;
  std::vector<MemoryCounters> counters;
  std::vector<BlockCache> caches;
  std::vector<BlockCache> token_caches;  // freed unbacked blocks, kept apart from real ones
  ska::flat_hash_map<const void*, Live> live;

  // Under mu. Moves one core's cached blocks into `out`; returns their bytes.
  void uncache(int device, std::vector<void*>& out) {
    auto& c = counters[device];
    const size_t before = out.size();
    const uint64_t bytes = caches[device].take_all(out) + token_caches[device].take_all(out);
    c.reserved_current -= bytes;
    c.released_total += bytes;
    c.segment_count -= out.size() - before;
  }
};

namespace {
std::atomic<bool> g_started{false};

void free_all(const std::vector<void*>& blocks) {
  for (void* p : blocks) std::free(p);
}
}  // namespace

bool Runtime::started() { return g_started.load(std::memory_order_acquire); }

Runtime& Runtime::get() {
  static Runtime* rt = new Runtime();  // leaked on purpose: outlives static tensors
  g_started.store(true, std::memory_order_release);
  return *rt;
}

Runtime::Runtime() : info_(describe_instance()), state_(new State) {
  state_->counters.resize(info_.visible.size());
  state_->caches.resize(info_.visible.size());
  state_->token_caches.resize(info_.visible.size());
  state_->live.reserve(1 << 14);
  for (size_t i = 0; i < info_.visible.size(); ++i) state_->counters[i].capacity = info_.visible[i].hbm_capacity;
}

AllocStatus Runtime::allocate(int device, size_t nbytes, void** out) { return obtain(device, nbytes, out, true); }

AllocStatus Runtime::reserve(int device, size_t nbytes, void** out) { return obtain(device, nbytes, out, false); }

AllocStatus Runtime::obtain(int device, size_t nbytes, void** out, bool backed) {
  *out = nullptr;
  auto& c = state_->counters.at(device);  // sized once at start-up
  const size_t block = block_bytes(nbytes);
  std::unique_lock<std::mutex> lock(state_->mu);
  void* p = nullptr;
  if (nbytes > 0) {
    auto& cache = backed ? state_->caches[device] : state_->token_caches[device];
    if (block <= kMaxCachedBlock) p = cache.pop(size_class(block));
    if (!p) {
      if (c.reserved_current + block > c.capacity &&
          state_->caches[device].bytes + state_->token_caches[device].bytes > 0) {
        // As a caching allocator does before giving up: release the cache, retry.
        std::vector<void*> cached;
        state_->uncache(device, cached);
        ++c.num_alloc_retries;
        lock.unlock();
        free_all(cached);
        lock.lock();
      }
      if (c.reserved_current + block > c.capacity) {
        ++c.num_ooms;
        return AllocStatus::OutOfDeviceMemory;
      }
      // Reserve first so concurrent requests see the capacity taken, then
      // get the host memory outside the lock.
      c.reserved_current += block;
      lock.unlock();
      if (posix_memalign(&p, 64, backed ? block : kTokenBytes) != 0) p = nullptr;
      lock.lock();
      if (!p) {
        c.reserved_current -= block;
        ++c.num_ooms;
        return AllocStatus::OutOfHostMemory;
      }
      c.reserved_peak = std::max(c.reserved_peak, c.reserved_current);
      c.reserved_high_water = std::max(c.reserved_high_water, c.reserved_current);
      c.reserved_total += block;
      c.segment_count_peak = std::max(c.segment_count_peak, ++c.segment_count);
    }
    state_->live.emplace(p, Live{device, nbytes, backed});
    c.live_count_peak = std::max(c.live_count_peak, ++c.live_count);
  }
  c.allocated_current += nbytes;
  c.allocated_peak = std::max(c.allocated_peak, c.allocated_current);
  c.allocated_high_water = std::max(c.allocated_high_water, c.allocated_current);
  c.allocated_total += nbytes;
  ++c.num_allocs;
  *out = p;
  return AllocStatus::Ok;
}

bool Runtime::free(void* ptr) {
  if (!ptr) return false;
  size_t block = 0;
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    auto it = state_->live.find(ptr);
    if (it == state_->live.end()) return false;
    const int device = it->second.device;
    const size_t nbytes = it->second.nbytes;
    const bool backed = it->second.backed;
    state_->live.erase(it);
    auto& c = state_->counters[device];
    c.allocated_current -= nbytes;
    c.freed_total += nbytes;
    ++c.num_frees;
    --c.live_count;
    block = block_bytes(nbytes);
    if ((backed ? state_->caches : state_->token_caches)[device].push(ptr, block)) return true;
    c.reserved_current -= block;
    c.released_total += block;
    --c.segment_count;
  }
  std::free(ptr);
  return true;
}

void Runtime::release_cached(int device) {
  std::vector<void*> cached;
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    if (device >= 0) {
      state_->uncache(device, cached);
    } else {
      for (int d = 0; d < device_count(); ++d) state_->uncache(d, cached);
    }
  }
  free_all(cached);
}

int Runtime::device_of(const void* ptr) const {
  std::lock_guard<std::mutex> lock(state_->mu);
  auto it = state_->live.find(ptr);
  if (it != state_->live.end()) return it->second.device;
  // Interior pointers (rare: from_blob on a view): the live block covering it.
  const char* p = static_cast<const char*>(ptr);
  for (const auto& [base, info] : state_->live) {
    const char* b = static_cast<const char*>(base);
    if (p >= b && p < b + info.nbytes) return info.device;
  }
  return -1;
}

void Runtime::copy(void* dst, const void* src, size_t nbytes) {
  if (nbytes && dst != src) std::memmove(dst, src, nbytes);
}

void Runtime::synchronize(int) {}

MemoryCounters Runtime::memory(int device) const {
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->counters.at(device);
}

std::vector<BlockInfo> Runtime::blocks() const {
  std::lock_guard<std::mutex> lock(state_->mu);
  std::vector<BlockInfo> out;
  out.reserve(state_->live.size());
  for (const auto& [p, l] : state_->live) out.push_back({l.device, p, l.nbytes, block_bytes(l.nbytes), false});
  for (int d = 0; d < device_count(); ++d)
    for (int cls = 0; cls < kNumClasses; ++cls)
      for (const BlockCache* cache : {&state_->caches[d], &state_->token_caches[d]})
        for (void* p = cache->heads[cls]; p; p = *static_cast<void**>(p))
          out.push_back({d, p, 0, class_bytes(cls), true});
  return out;
}

bool Runtime::live_block(const void* ptr, BlockInfo* out) const {
  std::lock_guard<std::mutex> lock(state_->mu);
  auto it = state_->live.find(ptr);
  if (it == state_->live.end()) return false;
  *out = {it->second.device, ptr, it->second.nbytes, block_bytes(it->second.nbytes), false};
  return true;
}

void Runtime::reset_peak(int device) {
  std::lock_guard<std::mutex> lock(state_->mu);
  auto& c = state_->counters.at(device);
  c.allocated_peak = c.allocated_current;
  c.reserved_peak = c.reserved_current;
  c.live_count_peak = c.live_count;
  c.segment_count_peak = c.segment_count;
}

void Runtime::reset_high_water(int device) {
  std::lock_guard<std::mutex> lock(state_->mu);
  auto& c = state_->counters.at(device);
  c.allocated_high_water = c.allocated_current;
  c.reserved_high_water = c.reserved_current;
}

void Runtime::settle_peak(int device, uint64_t peak, uint64_t high_water) {
  std::lock_guard<std::mutex> lock(state_->mu);
  auto& c = state_->counters.at(device);
  c.allocated_peak = std::min(c.allocated_peak, std::max(peak, c.allocated_current));
  c.allocated_high_water = std::min(c.allocated_high_water, std::max(high_water, c.allocated_current));
}

void Runtime::reset_accumulated(int device) {
  std::lock_guard<std::mutex> lock(state_->mu);
  auto& c = state_->counters.at(device);
  c.allocated_total = c.freed_total = 0;
  c.reserved_total = c.released_total = 0;
  c.num_allocs = c.num_frees = c.num_ooms = c.num_alloc_retries = 0;
}

}  // namespace neuron::rt
