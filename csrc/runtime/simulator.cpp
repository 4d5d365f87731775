// NeuronCore simulator: implements the runtime interface on host memory.
// Each logical core owns its allocations and has an HBM budget of its own, so
// capacity errors, per-core accounting and device-to-device copies behave as on
// a real instance while the bytes live in ordinary host RAM.
#include "runtime.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <sstream>
#include <unordered_map>

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

struct Runtime::State {
  mutable std::mutex mu;
  std::vector<MemoryCounters> counters;
  std::unordered_map<const void*, std::pair<int, size_t>> live;  // ptr -> (device, bytes)
};

namespace {
std::atomic<bool> g_started{false};
}

bool Runtime::started() { return g_started.load(std::memory_order_acquire); }

Runtime& Runtime::get() {
  static Runtime* rt = new Runtime();  // leaked on purpose: outlives static tensors
  g_started.store(true, std::memory_order_release);
  return *rt;
}

Runtime::Runtime() : info_(describe_instance()), state_(new State) {
  state_->counters.resize(info_.visible.size());
  state_->live.reserve(1 << 14);
  for (size_t i = 0; i < info_.visible.size(); ++i)
    state_->counters[i].capacity = info_.visible[i].hbm_capacity;
}

AllocStatus Runtime::allocate(int device, size_t nbytes, void** out) {
  *out = nullptr;
  auto& c = state_->counters.at(device);  // sized once at start-up
  if (nbytes > c.capacity) {
    std::lock_guard<std::mutex> lock(state_->mu);
    ++c.num_ooms;
    return AllocStatus::OutOfDeviceMemory;
  }
  // Host memory first, then one critical section for the accounting: this
  // runs for every op result, so it takes the lock once.
  void* p = nullptr;
  if (nbytes > 0 && posix_memalign(&p, 64, nbytes) != 0) p = nullptr;
  std::unique_lock<std::mutex> lock(state_->mu);
  if (c.allocated_current + nbytes > c.capacity) {
    ++c.num_ooms;
    lock.unlock();
    std::free(p);
    return AllocStatus::OutOfDeviceMemory;
  }
  if (nbytes > 0 && p == nullptr) {
    ++c.num_ooms;
    return AllocStatus::OutOfHostMemory;
  }
  c.allocated_current += nbytes;
  c.allocated_peak = std::max(c.allocated_peak, c.allocated_current);
  c.allocated_total += nbytes;
  ++c.num_allocs;
  if (p) {
    state_->live.emplace(p, std::make_pair(device, nbytes));
    c.live_count_peak = std::max(c.live_count_peak, ++c.live_count);
  }
  *out = p;
  return AllocStatus::Ok;
}

bool Runtime::free(void* ptr) {
  if (!ptr) return false;
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    auto it = state_->live.find(ptr);
    if (it == state_->live.end()) return false;
    auto& c = state_->counters[it->second.first];
    const size_t nbytes = it->second.second;
    c.allocated_current -= nbytes;
    c.freed_total += nbytes;
    ++c.num_frees;
    --c.live_count;
    state_->live.erase(it);
  }
  std::free(ptr);
  return true;
}

int Runtime::device_of(const void* ptr) const {
  std::lock_guard<std::mutex> lock(state_->mu);
  auto it = state_->live.find(ptr);
  if (it != state_->live.end()) return it->second.first;
  // Interior pointers: the nearest allocation below ptr that still covers it.
  const char* p = static_cast<const char*>(ptr);
  for (const auto& [base, info] : state_->live) {
    const char* b = static_cast<const char*>(base);
    if (p >= b && p < b + info.second) return info.first;
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

void Runtime::reset_peak(int device) {
  std::lock_guard<std::mutex> lock(state_->mu);
  auto& c = state_->counters.at(device);
  c.allocated_peak = c.allocated_current;
  c.live_count_peak = c.live_count;
}

void Runtime::reset_accumulated(int device) {
  std::lock_guard<std::mutex> lock(state_->mu);
  auto& c = state_->counters.at(device);
  c.allocated_total = c.freed_total = 0;
  c.num_allocs = c.num_frees = c.num_ooms = 0;
}

}  // namespace neuron::rt
