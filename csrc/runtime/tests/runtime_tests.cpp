// Tests of the PyTorch-free runtime: size classes, environment parsing errors,
// the caching allocator's out-of-memory retry and cache release. Built and run
// by tests/core/test_runtime_cpp.py: g++ -Icsrc csrc/runtime/*.cpp this file.
#include <cstdio>
#include <cstdlib>
#include <string>

#include "runtime/block_cache.h"
#include "runtime/runtime.h"

using namespace neuron::rt;

namespace {

int g_failures = 0;

#define CHECK(cond)                                                                 \
  do {                                                                              \
    if (!(cond)) {                                                                  \
      std::fprintf(stderr, "%s:%d: CHECK(%s) failed\n", __FILE__, __LINE__, #cond); \
      ++g_failures;                                                                 \
    }                                                                               \
  } while (0)

constexpr uint64_t MiB = uint64_t{1} << 20;
constexpr uint64_t GiB = uint64_t{1} << 30;

const char* kVars[] = {"TORCH_NEURONX_INSTANCE_TYPE", "NEURON_LOGICAL_NC_CONFIG", "NEURON_RT_VISIBLE_CORES",
                       "NEURON_RT_NUM_CORES"};

void set_env(const char* itype, const char* lnc, const char* visible, const char* num) {
  const char* values[] = {itype, lnc, visible, num};
  for (int i = 0; i < 4; ++i) {
    if (values[i])
      setenv(kVars[i], values[i], 1);
    else
      unsetenv(kVars[i]);
  }
}

// describe_instance() fails with a message containing `needle`.
void expect_config_error(const char* needle) {
  try {
    describe_instance();
    std::fprintf(stderr, "expected ConfigError containing '%s', got none\n", needle);
    ++g_failures;
  } catch (const ConfigError& e) {
    if (std::string(e.what()).find(needle) == std::string::npos) {
      std::fprintf(stderr, "ConfigError '%s' lacks '%s'\n", e.what(), needle);
      ++g_failures;
    }
  }
}

void test_size_classes() {
  CHECK(size_class(1) == 0 && class_bytes(0) == 512);
  CHECK(block_bytes(512) == 512);
  CHECK(block_bytes(513) == 640);  // quarter steps above a power of two
  CHECK(block_bytes(1000) == 1024);
  CHECK(block_bytes(1025) == 1280);
  CHECK(block_bytes(kMaxCachedBlock) == kMaxCachedBlock);
  CHECK(block_bytes(kMaxCachedBlock + 1) == kMaxCachedBlock + 1);  // exact size, never cached
  CHECK(size_class(kMaxCachedBlock) == kNumClasses - 1);
  for (size_t n = 1; n <= (size_t{1} << 22); n = n * 5 / 4 + 1) {
    const size_t b = block_bytes(n);
    CHECK(b >= n);
    CHECK(n <= kMinBlock || b <= n + n / 4 + 1);  // at most a quarter of waste
    CHECK(block_bytes(b) == b);                   // a class size is its own class
  }
}

void test_env_parsing() {
  set_env("trn9.large", nullptr, nullptr, nullptr);
  expect_config_error("TORCH_NEURONX_INSTANCE_TYPE='trn9.large' is not a known instance type (known: trn1.2xlarge");
  set_env("trn1.2xlarge", "2", nullptr, nullptr);
  expect_config_error("NEURON_LOGICAL_NC_CONFIG='2' is not supported on trn1 (expected 1)");
  set_env(nullptr, "x", nullptr, nullptr);
  expect_config_error("NEURON_LOGICAL_NC_CONFIG='x' is invalid: expected a non-negative integer");
  set_env(nullptr, nullptr, "3-1", nullptr);
  expect_config_error("NEURON_RT_VISIBLE_CORES='3-1' is invalid: range '3-1' is decreasing");
  set_env(nullptr, nullptr, "0-9", nullptr);
  expect_config_error("names core 9, but trn2.3xlarge at LNC=2 has 4 logical cores (0-3)");
  // Bounds are checked before a range is expanded: no time or memory spent.
  set_env(nullptr, nullptr, "0-2147483647", nullptr);
  expect_config_error("names core 2147483647, but trn2.3xlarge at LNC=2 has 4 logical cores (0-3)");
  set_env(nullptr, nullptr, "0-99999999999999", nullptr);
  expect_config_error("NEURON_RT_VISIBLE_CORES='0-99999999999999' is out of range");
  set_env(nullptr, nullptr, "1,,2", nullptr);
  expect_config_error("NEURON_RT_VISIBLE_CORES='1,,2' is invalid: expected a non-negative integer, got ''");
  set_env(nullptr, nullptr, nullptr, "0");
  expect_config_error("NEURON_RT_NUM_CORES='0' is invalid: between 1 and 4 cores are available");

  set_env("trn2.48xlarge", "1", "9, 4-5", "2");
  InstanceInfo info = describe_instance();
  CHECK(info.chip.name == "trn2" && info.num_chips == 16 && info.lnc == 1);
  CHECK(info.logical_cores_total == 128);
  CHECK(info.visible.size() == 2);
  CHECK(info.visible[0].logical_id == 4 && info.visible[1].logical_id == 5);
  CHECK(info.visible[1].index == 1 && info.visible[1].chip == 0);
  CHECK(info.visible[1].physical_cores.size() == 1 && info.visible[1].physical_cores[0] == 5);
  CHECK(info.visible[0].hbm_capacity == 12 * GiB);
}

void test_allocator() {
  set_env("trn1.2xlarge", nullptr, nullptr, nullptr);  // 2 cores of 16 GiB
  Runtime& rt = Runtime::get();
  CHECK(rt.device_count() == 2);
  const uint64_t capacity = rt.memory(0).capacity;
  CHECK(capacity == 16 * GiB);

  // A freed block stays reserved (cached) and is reused by a request of its class.
  void* a = nullptr;
  CHECK(rt.allocate(0, 1000, &a) == AllocStatus::Ok && a);
  CHECK(rt.device_of(a) == 0 && rt.device_of(static_cast<char*>(a) + 10) == 0);
  CHECK(rt.free(a));
  CHECK(!rt.free(a));  // no longer device memory
  MemoryCounters c = rt.memory(0);
  CHECK(c.allocated_current == 0 && c.reserved_current == 1024 && c.segment_count == 1);
  void* b = nullptr;
  CHECK(rt.allocate(0, 900, &b) == AllocStatus::Ok && b == a);
  CHECK(rt.memory(0).reserved_current == 1024 && rt.memory(0).allocated_current == 900);
  rt.free(b);

  // Cache release returns the cached bytes to the host.
  rt.release_cached(0);
  c = rt.memory(0);
  CHECK(c.reserved_current == 0 && c.released_total == 1024 && c.segment_count == 0);

  // Fill the cache with 256 MiB; a request that fits only without the cache
  // releases it and retries.
  void* blocks[4];
  for (auto& p : blocks) CHECK(rt.allocate(0, 64 * MiB, &p) == AllocStatus::Ok);
  for (auto& p : blocks) rt.free(p);
  CHECK(rt.memory(0).reserved_current == 256 * MiB);
  void* big = nullptr;
  const size_t big_bytes = capacity - 128 * MiB;
  CHECK(rt.allocate(0, big_bytes, &big) == AllocStatus::Ok && big);
  c = rt.memory(0);
  CHECK(c.num_alloc_retries == 1 && c.reserved_current == big_bytes && c.num_ooms == 0);

  // No cache left to release: out of device memory, counters intact.
  void* more = nullptr;
  CHECK(rt.allocate(0, 256 * MiB, &more) == AllocStatus::OutOfDeviceMemory && more == nullptr);
  c = rt.memory(0);
  CHECK(c.num_ooms == 1 && c.reserved_current == big_bytes && c.allocated_current == big_bytes);
  // The other core has a budget of its own.
  CHECK(rt.allocate(1, 256 * MiB, &more) == AllocStatus::Ok && rt.device_of(more) == 1);
  rt.free(more);
  rt.free(big);
  c = rt.memory(0);
  CHECK(c.allocated_current == 0 && c.reserved_current == 0 && c.allocated_peak == big_bytes);
  rt.reset_peak(0);
  c = rt.memory(0);
  CHECK(c.allocated_peak == 0);
  // The high-water marks outlive the program's resets of its peaks; only their own reset drops them.
  CHECK(c.allocated_high_water >= big_bytes && c.reserved_high_water >= big_bytes);
  rt.reset_high_water(0);
  c = rt.memory(0);
  CHECK(c.allocated_high_water == 0 && c.reserved_high_water == 0);
  // A settled stretch (a host kernel's scratch) leaves no trace in either.
  void* kept = nullptr;
  CHECK(rt.allocate(0, 1 * MiB, &kept) == AllocStatus::Ok);
  c = rt.memory(0);
  const uint64_t peak = c.allocated_peak, high_water = c.allocated_high_water;
  void* scratch = nullptr;
  CHECK(rt.allocate(0, 64 * MiB, &scratch) == AllocStatus::Ok);
  rt.free(scratch);
  rt.settle_peak(0, peak, high_water);
  c = rt.memory(0);
  CHECK(c.allocated_peak == 1 * MiB && c.allocated_high_water == 1 * MiB);
  rt.free(kept);
}

}  // namespace

int main() {
  // The tables Python loads from neuronsim/hardware.py (the figures the
  // tests below rely on).
  set_hardware_tables({{"trn1", 2, 32 * GiB, {1}, 1}, {"trn2", 8, 96 * GiB, {1, 2}, 2}},
                      {{"trn1.2xlarge", "trn1", 1}, {"trn2.3xlarge", "trn2", 1}, {"trn2.48xlarge", "trn2", 16}});
  test_size_classes();
  test_env_parsing();
  test_allocator();
  if (g_failures) {
    std::fprintf(stderr, "%d check(s) failed\n", g_failures);
    return 1;
  }
  std::printf("runtime tests passed\n");
  return 0;
}
