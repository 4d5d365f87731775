// NeuronCore simulator: implements the runtime interface on host memory.
// Each logical core owns its allocations and has an HBM budget of its own, so
// capacity errors, per-core accounting and device-to-device copies behave as on
// a real instance while the bytes live in ordinary host RAM.
#include "runtime.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <sstream>
#include <vector>

// Header-only open-addressing map shipped with PyTorch; the runtime interface
// (runtime.h) itself stays free of PyTorch headers.
#include <c10/util/flat_hash_map.h>

namespace neuron::rt {
namespace {

constexpr uint64_t GiB = 1ull << 30;
constexpr uint64_t MiB = 1ull << 20;

ChipSpec chip_spec(const std::string& name) {
  if (name == "trn1")
    return {"trn1", 2, 32 * GiB, 820.0 * GiB, 190e12, 24 * MiB, 2 * MiB, {1}};
  if (name == "trn2")
    return {"trn2", 8, 96 * GiB, 2.9e12, 667e12, 28 * MiB, 2 * MiB, {1, 2}};
  return {"trn3", 8, 144 * GiB, 4.9e12, 671e12, 32 * MiB, 2 * MiB, {1, 2}};
}

struct InstanceType {
  const char* name;
  const char* chip;
  int chips;
};

// The instance types we model; one chip per "neuron device" as neuron-ls shows.
constexpr InstanceType kInstanceTypes[] = {
    {"trn1.2xlarge", "trn1", 1},   {"trn1.32xlarge", "trn1", 16},
    {"trn1n.32xlarge", "trn1", 16}, {"trn2.3xlarge", "trn2", 1},
    {"trn2.48xlarge", "trn2", 16}, {"trn2u.48xlarge", "trn2", 16},
    {"trn3.3xlarge", "trn3", 1},   {"trn3.48xlarge", "trn3", 16},
};

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v ? std::string(v) : std::string();
}

std::string trim(const std::string& s) {
  auto b = s.find_first_not_of(" \t");
  auto e = s.find_last_not_of(" \t");
  return b == std::string::npos ? std::string() : s.substr(b, e - b + 1);
}

int parse_int(const std::string& var, const std::string& text) {
  std::string t = trim(text);
  if (t.empty() || t.find_first_not_of("0123456789") != std::string::npos)
    throw ConfigError(var + "='" + env(var.c_str()) +
                      "' is invalid: expected a non-negative integer, got '" +
                      t + "'");
  try {
    return std::stoi(t);
  } catch (...) {
    throw ConfigError(var + "='" + env(var.c_str()) + "' is out of range");
  }
}

// "0-3", "1,3", "0-1,4" -> sorted unique ids.
std::vector<int> parse_core_list(const std::string& var, const std::string& text) {
  std::set<int> ids;
  std::stringstream ss(text);
  std::string part;
  while (std::getline(ss, part, ',')) {
    part = trim(part);
    auto dash = part.find('-');
    if (dash == std::string::npos) {
      ids.insert(parse_int(var, part));
    } else {
      int lo = parse_int(var, part.substr(0, dash));
      int hi = parse_int(var, part.substr(dash + 1));
      if (hi < lo)
        throw ConfigError(var + "='" + text + "' is invalid: range '" + part +
                          "' is decreasing");
      for (int i = lo; i <= hi; ++i) ids.insert(i);
    }
  }
  if (ids.empty())
    throw ConfigError(var + "='" + text + "' is invalid: no cores listed");
  return {ids.begin(), ids.end()};
}

}  // namespace

InstanceInfo describe_instance() {
  InstanceInfo info;
  std::string itype = trim(env("TORCH_NEURONX_INSTANCE_TYPE"));
  if (itype.empty()) itype = "trn2.3xlarge";
  const InstanceType* found = nullptr;
  for (const auto& t : kInstanceTypes)
    if (itype == t.name) found = &t;
  if (!found) {
    std::string known;
    for (const auto& t : kInstanceTypes) known += std::string(known.empty() ? "" : ", ") + t.name;
    throw ConfigError("TORCH_NEURONX_INSTANCE_TYPE='" + itype +
                      "' is not a known instance type (known: " + known + ")");
  }
  info.instance_type = itype;
  info.chip = chip_spec(found->chip);
  info.num_chips = found->chips;

  const std::string lnc_env = env("NEURON_LOGICAL_NC_CONFIG");
  info.lnc = lnc_env.empty() ? info.chip.lnc_allowed.back()
                             : parse_int("NEURON_LOGICAL_NC_CONFIG", lnc_env);
  if (std::find(info.chip.lnc_allowed.begin(), info.chip.lnc_allowed.end(), info.lnc) ==
      info.chip.lnc_allowed.end()) {
    std::string allowed;
    for (int v : info.chip.lnc_allowed) allowed += (allowed.empty() ? "" : " or ") + std::to_string(v);
    throw ConfigError("NEURON_LOGICAL_NC_CONFIG='" + lnc_env + "' is not supported on " +
                      info.chip.name + " (expected " + allowed + ")");
  }
  const int per_chip = info.chip.physical_cores / info.lnc;
  info.logical_cores_total = per_chip * info.num_chips;
  const uint64_t hbm_per_core = info.chip.hbm_bytes / per_chip;

  std::vector<int> ids;
  const std::string visible = env("NEURON_RT_VISIBLE_CORES");
  if (!visible.empty()) {
    ids = parse_core_list("NEURON_RT_VISIBLE_CORES", visible);
    if (ids.back() >= info.logical_cores_total)
      throw ConfigError("NEURON_RT_VISIBLE_CORES='" + visible + "' names core " +
                        std::to_string(ids.back()) + ", but " + itype + " at LNC=" +
                        std::to_string(info.lnc) + " has " +
                        std::to_string(info.logical_cores_total) +
                        " logical cores (0-" + std::to_string(info.logical_cores_total - 1) + ")");
  } else {
    for (int i = 0; i < info.logical_cores_total; ++i) ids.push_back(i);
  }
  const std::string num = env("NEURON_RT_NUM_CORES");
  if (!num.empty()) {
    int n = parse_int("NEURON_RT_NUM_CORES", num);
    if (n < 1 || n > static_cast<int>(ids.size()))
      throw ConfigError("NEURON_RT_NUM_CORES='" + num + "' is invalid: between 1 and " +
                        std::to_string(ids.size()) + " cores are available");
    ids.resize(n);
  }
  for (size_t i = 0; i < ids.size(); ++i) {
    CoreInfo c;
    c.index = static_cast<int>(i);
    c.logical_id = ids[i];
    c.chip = ids[i] / per_chip;
    for (int p = 0; p < info.lnc; ++p) c.physical_cores.push_back(ids[i] * info.lnc + p);
    c.hbm_capacity = hbm_per_core;
    info.visible.push_back(std::move(c));
  }
  return info;
}

namespace {

// Block sizes: requests up to 64 MiB are rounded up to one of a few size
// classes (four per power of two, at least 512 bytes) so freed blocks can be
// reused by requests of similar size. Reuse also spares the host the page
// faults of fresh memory, which cost more than the allocation itself for
// activation-sized blocks. Larger requests get a block of their exact size and
// are never cached.
constexpr int kMaxCachedLog2 = 26;
constexpr size_t kMinBlock = 512;
constexpr size_t kMaxCachedBlock = size_t{1} << kMaxCachedLog2;
constexpr int kNumClasses = 1 + 4 * (kMaxCachedLog2 - 9);  // 512, then (512, 64 MiB] in quarter steps
// Bound on what a core keeps cached, so the simulator's host memory stays
// close to what tensors use.
constexpr uint64_t kMaxCachedBytes = 256 * MiB;

int size_class(size_t nbytes) {
  if (nbytes <= kMinBlock) return 0;
  const int e = 63 - __builtin_clzll(nbytes - 1);  // 2^e < nbytes <= 2^(e+1)
  return 1 + (e - 9) * 4 + static_cast<int>(((nbytes - 1) >> (e - 2)) & 3);
}

size_t class_bytes(int cls) {
  if (cls == 0) return kMinBlock;
  const int e = 9 + (cls - 1) / 4;
  return (size_t{1} << e) + static_cast<size_t>((cls - 1) % 4 + 1) * (size_t{1} << (e - 2));
}

size_t block_bytes(size_t nbytes) {
  return nbytes <= kMaxCachedBlock ? class_bytes(size_class(nbytes)) : nbytes;
}

// Freed blocks of one core, one intrusive list per size class: a cached
// block's first word links to the next one.
struct BlockCache {
  std::array<void*, kNumClasses> heads{};
  uint64_t bytes = 0;

  void* pop(int cls) {
    void* p = heads[cls];
    if (p) {
      heads[cls] = *static_cast<void**>(p);
      bytes -= class_bytes(cls);
    }
    return p;
  }
  bool push(void* p, size_t block) {
    if (block > kMaxCachedBlock || bytes + block > kMaxCachedBytes) return false;
    const int cls = size_class(block);
    *static_cast<void**>(p) = heads[cls];
    heads[cls] = p;
    bytes += block;
    return true;
  }
  // Unlinks every block; the caller frees them outside the lock.
  uint64_t take_all(std::vector<void*>& out) {
    for (auto& head : heads)
      for (void* p = head; p; p = *static_cast<void**>(p)) out.push_back(p);
    heads.fill(nullptr);
    uint64_t n = bytes;
    bytes = 0;
    return n;
  }
};

struct Live {
  int device;
  size_t nbytes;
};

}  // namespace

struct Runtime::State {
  mutable std::mutex mu;
  std::vector<MemoryCounters> counters;
  std::vector<BlockCache> caches;
  ska::flat_hash_map<const void*, Live> live;

  // Under mu. Moves one core's cached blocks into `out`; returns their bytes.
  void uncache(int device, std::vector<void*>& out) {
    auto& c = counters[device];
    const size_t before = out.size();
    const uint64_t bytes = caches[device].take_all(out);
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
  state_->live.reserve(1 << 14);
  for (size_t i = 0; i < info_.visible.size(); ++i)
    state_->counters[i].capacity = info_.visible[i].hbm_capacity;
}

AllocStatus Runtime::allocate(int device, size_t nbytes, void** out) {
  *out = nullptr;
  auto& c = state_->counters.at(device);  // sized once at start-up
  const size_t block = block_bytes(nbytes);
  std::unique_lock<std::mutex> lock(state_->mu);
  void* p = nullptr;
  if (nbytes > 0) {
    if (block <= kMaxCachedBlock) p = state_->caches[device].pop(size_class(block));
    if (!p) {
      if (c.reserved_current + block > c.capacity && state_->caches[device].bytes > 0) {
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
      if (posix_memalign(&p, 64, block) != 0) p = nullptr;
      lock.lock();
      if (!p) {
        c.reserved_current -= block;
        ++c.num_ooms;
        return AllocStatus::OutOfHostMemory;
      }
      c.reserved_peak = std::max(c.reserved_peak, c.reserved_current);
      c.reserved_total += block;
      c.segment_count_peak = std::max(c.segment_count_peak, ++c.segment_count);
    }
    state_->live.emplace(p, Live{device, nbytes});
    c.live_count_peak = std::max(c.live_count_peak, ++c.live_count);
  }
  c.allocated_current += nbytes;
  c.allocated_peak = std::max(c.allocated_peak, c.allocated_current);
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
    state_->live.erase(it);
    auto& c = state_->counters[device];
    c.allocated_current -= nbytes;
    c.freed_total += nbytes;
    ++c.num_frees;
    --c.live_count;
    block = block_bytes(nbytes);
    if (state_->caches[device].push(ptr, block)) return true;
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
      for (void* p = state_->caches[d].heads[cls]; p; p = *static_cast<void**>(p))
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

void Runtime::reset_accumulated(int device) {
  std::lock_guard<std::mutex> lock(state_->mu);
  auto& c = state_->counters.at(device);
  c.allocated_total = c.freed_total = 0;
  c.reserved_total = c.released_total = 0;
  c.num_allocs = c.num_frees = c.num_ooms = c.num_alloc_retries = 0;
}

}  // namespace neuron::rt
