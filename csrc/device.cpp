// The `neuron` device in PyTorch: allocators, device guard (current device,
// streams, events), accelerator hooks and generators. Everything that talks
// to hardware goes through rt::Runtime.
#include "neuron.h"
#include "profiler/memory_history.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/CachingDeviceAllocator.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/util/Exception.h>

#include <pthread.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <unordered_set>

namespace neuron {
namespace {

std::atomic<bool> g_in_bad_fork{false};
// Set by the first use of a device (allocation, explicit init), not by merely
// reading the configuration: what "initialized" means for fork safety.
std::atomic<bool> g_initialized{false};

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

// Fork after the runtime is up: the child cannot own the parent's cores.
void mark_child_bad_fork() {
  if (g_initialized.load()) g_in_bad_fork.store(true);
}

}  // namespace

rt::Runtime& runtime() {
  try {
    return rt::Runtime::get();
  } catch (const rt::ConfigError& e) {
    TORCH_CHECK_VALUE(false, e.what());
  }
}

int device_count() { return runtime().device_count(); }

void check_device_index(c10::DeviceIndex index) {
  const int n = device_count();
  TORCH_CHECK_INDEX(index >= 0 && index < n, "Invalid device index neuron:", static_cast<int>(index),
                    ": this process sees ", n, " neuron device", n == 1 ? "" : "s",
                    " (valid indices 0..", n - 1, ")");
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

// ---------------------------------------------------------------------------
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

// ---------------------------------------------------------------------------
// Device memory.
namespace {

void free_device_memory(void* ptr) {
  if (profiler::memory_recording()) profiler::on_free(ptr);
  if (ptr) rt::Runtime::get().free(ptr);
}

[[noreturn]] void raise_oom(c10::DeviceIndex device, size_t nbytes, rt::AllocStatus status) {
  auto c = rt::Runtime::get().memory(device);
  const uint64_t free_bytes = c.capacity > c.reserved_current ? c.capacity - c.reserved_current : 0;
  if (profiler::memory_recording()) profiler::on_oom(device, nbytes, free_bytes);
  if (status == rt::AllocStatus::OutOfHostMemory) {
    TORCH_CHECK_WITH(OutOfMemoryError, false, "Neuron out of memory. Tried to allocate ",
                     format_bytes(nbytes), " on neuron:", static_cast<int>(device),
                     ": the simulator's host memory is exhausted (device has ",
                     format_bytes(free_bytes), " free of ", format_bytes(c.capacity), ").");
  }
  TORCH_CHECK_WITH(OutOfMemoryError, false, "Neuron out of memory. Tried to allocate ",
                   format_bytes(nbytes), " on neuron:", static_cast<int>(device), " (requested ",
                   nbytes, " bytes). The logical NeuronCore has a total capacity of ",
                   format_bytes(c.capacity), " of which ", format_bytes(free_bytes),
                   " is free. Of the reserved memory ", format_bytes(c.allocated_current),
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

bool is_device_memory(const c10::DataPtr& dp) {
  return dp.get_deleter() == &free_device_memory;
}

namespace {

void fill_stat(c10::CachingDeviceAllocator::StatArray& arr, int64_t cur, int64_t peak,
               int64_t allocated, int64_t freed) {
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
  void copy_data(void* dst, const void* src, std::size_t count) const override {
    std::memcpy(dst, src, count);
  }
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
      TORCH_CHECK_WITH(OutOfMemoryError, false, "could not allocate ", format_bytes(nbytes),
                       " of pinned host memory");
    }
    if (p) {
      std::lock_guard<std::mutex> lock(mu);
      live.insert(p);
    }
    return {p, p, &PinnedAllocator::free_pinned, c10::Device(c10::kCPU)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &PinnedAllocator::free_pinned; }
  void copy_data(void* dst, const void* src, std::size_t count) const override {
    std::memcpy(dst, src, count);
  }
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
}
ChargeCpuAllocationsTo::~ChargeCpuAllocationsTo() { tl_charge_device = prev_; }

// ---------------------------------------------------------------------------
// Generators: each neuron generator owns a CPU Philox/MT engine that the CPU
// kernels draw from, so streams are reproducible, thread-safe (the engine's
// own mutex) and independent of torch's CPU default generator.
namespace {

struct NeuronGenerator final : c10::GeneratorImpl {
  explicit NeuronGenerator(c10::DeviceIndex index, uint64_t seed = c10::default_rng_seed_val)
      : c10::GeneratorImpl(c10::Device(kNeuron, index), c10::DispatchKeySet(c10::DispatchKey::PrivateUse1)),
        engine(at::make_generator<at::CPUGeneratorImpl>(seed)) {}

  void set_current_seed(uint64_t seed) override {
    std::lock_guard<std::mutex> lock(engine.mutex());
    engine.set_current_seed(seed);
  }
  uint64_t current_seed() const override { return engine.current_seed(); }
  uint64_t seed() override {
    std::lock_guard<std::mutex> lock(engine.mutex());
    return engine.seed();
  }
  void set_offset(uint64_t) override {
    TORCH_CHECK(false, "neuron generators (Mersenne Twister engines) do not support offsets");
  }
  uint64_t get_offset() const override {
    TORCH_CHECK(false, "neuron generators (Mersenne Twister engines) do not support offsets");
  }
  void set_state(const c10::TensorImpl& state) override {
    std::lock_guard<std::mutex> lock(engine.mutex());
    engine.unsafeGetGeneratorImpl()->set_state(state);
  }
  c10::intrusive_ptr<c10::TensorImpl> get_state() const override {
    std::lock_guard<std::mutex> lock(engine.mutex());
    return engine.unsafeGetGeneratorImpl()->get_state();
  }
  static c10::DeviceType device_type() { return kNeuron; }

  mutable at::Generator engine;

 private:
  NeuronGenerator* clone_impl() const override {
    auto* g = new NeuronGenerator(device().index());
    std::lock_guard<std::mutex> lock(engine.mutex());
    g->engine = engine.clone();
    return g;
  }
};

std::once_flag g_gens_once;
std::vector<at::Generator> g_default_gens;

}  // namespace

const at::Generator& default_generator(c10::DeviceIndex device) {
  if (device < 0) device = current_device();
  check_device_index(device);
  std::call_once(g_gens_once, [] {
    for (int i = 0; i < device_count(); ++i)
      g_default_gens.push_back(at::make_generator<NeuronGenerator>(static_cast<c10::DeviceIndex>(i)));
  });
  return g_default_gens[device];
}

at::Generator cpu_engine_of(const at::Generator& gen) {
  TORCH_CHECK(gen.device().type() == kNeuron, "Expected a 'neuron' device type for generator but found '",
              gen.device().type(), "'");
  return static_cast<NeuronGenerator*>(gen.unsafeGetGeneratorImpl())->engine;
}

// ---------------------------------------------------------------------------
// Device guard: devices, streams and events. Execution is synchronous, so
// streams are identities and events are timestamps (elapsed_time is real).
namespace {

struct SimEvent {
  std::chrono::steady_clock::time_point time;
  c10::DeviceIndex device = -1;
  bool recorded = false;
};

constexpr int kMaxDevices = 256;
thread_local std::array<c10::StreamId, kMaxDevices> tl_stream{};
std::atomic<c10::StreamId> g_next_stream{1};

struct NeuronGuardImpl final : c10::impl::DeviceGuardImplInterface {
  c10::DeviceType type() const override { return kNeuron; }
  c10::Device exchangeDevice(c10::Device d) const override {
    auto old = getDevice();
    if (d.index() != old.index()) {
      check_device_index(d.index());
      tl_device = d.index();
    }
    return old;
  }
  c10::Device getDevice() const override { return {kNeuron, current_device()}; }
  void setDevice(c10::Device d) const override { set_device_process_wide(d.index()); }
  void uncheckedSetDevice(c10::Device d) const noexcept override { tl_device = d.index(); }
  c10::Stream getStream(c10::Device d) const override {
    auto idx = d.index() < 0 ? current_device() : d.index();
    return c10::Stream(c10::Stream::UNSAFE, c10::Device(kNeuron, idx), tl_stream[idx]);
  }
  c10::Stream getDefaultStream(c10::Device d) const override {
    return c10::Stream(c10::Stream::DEFAULT, c10::Device(kNeuron, d.index() < 0 ? current_device() : d.index()));
  }
  c10::Stream getStreamFromGlobalPool(c10::Device d, bool) const override { return getNewStream(d, 0); }
  c10::Stream getNewStream(c10::Device d, int) const override {
    auto idx = d.index() < 0 ? current_device() : d.index();
    return c10::Stream(c10::Stream::UNSAFE, c10::Device(kNeuron, idx), g_next_stream++);
  }
  c10::Stream exchangeStream(c10::Stream s) const override {
    auto idx = s.device_index();
    auto old = c10::Stream(c10::Stream::UNSAFE, s.device(), tl_stream[idx]);
    tl_stream[idx] = s.id();
    return old;
  }
  c10::DeviceIndex deviceCount() const noexcept override {
    try {
      return static_cast<c10::DeviceIndex>(device_count());
    } catch (...) {
      return 0;
    }
  }
  void record(void** event, const c10::Stream& stream, const c10::DeviceIndex device_index,
              const c10::EventFlag) const override {
    auto* e = static_cast<SimEvent*>(*event);
    if (!e) {
      e = new SimEvent();
      *event = e;
    }
    e->device = device_index >= 0 ? device_index : stream.device_index();
    e->time = std::chrono::steady_clock::now();
    e->recorded = true;
  }
  void block(void*, const c10::Stream&) const override {}
  bool queryEvent(void*) const override { return true; }
  void destroyEvent(void* event, const c10::DeviceIndex) const noexcept override {
    delete static_cast<SimEvent*>(event);
  }
  bool queryStream(const c10::Stream&) const override { return true; }
  void synchronizeStream(const c10::Stream& s) const override { runtime().synchronize(s.device_index()); }
  void synchronizeEvent(void*) const override {}
  void synchronizeDevice(const c10::DeviceIndex d) const override { runtime().synchronize(d); }
  void recordDataPtrOnStream(const c10::DataPtr&, const c10::Stream&) const override {}
  double elapsedTime(void* start, void* end, const c10::DeviceIndex) const override {
    auto* a = static_cast<SimEvent*>(start);
    auto* b = static_cast<SimEvent*>(end);
    TORCH_CHECK(a && b && a->recorded && b->recorded,
                "Both events must be recorded before calculating elapsed time.");
    return std::chrono::duration<double, std::milli>(b->time - a->time).count();
  }
};

C10_REGISTER_GUARD_IMPL(PrivateUse1, NeuronGuardImpl);

// ---------------------------------------------------------------------------
struct NeuronHooks final : at::PrivateUse1HooksInterface {
  bool isBuilt() const override { return true; }
  bool isAvailable() const override {
    try {
      return device_count() > 0;
    } catch (...) {
      return false;
    }
  }
  const at::Generator& getDefaultGenerator(c10::DeviceIndex device) const override {
    return default_generator(device);
  }
  at::Generator getNewGenerator(c10::DeviceIndex device) const override {
    if (device < 0) device = current_device();
    check_device_index(device);
    return at::make_generator<NeuronGenerator>(device);
  }
  at::Device getDeviceFromPtr(void* data) const override {
    int d = runtime().device_of(data);
    TORCH_CHECK(d >= 0, "pointer ", data, " is not neuron device memory");
    return {kNeuron, static_cast<c10::DeviceIndex>(d)};
  }
  bool isPinnedPtr(const void* data) const override { return g_pinned.contains(data); }
  c10::Allocator* getPinnedMemoryAllocator() const override { return &g_pinned; }
  bool hasPrimaryContext(c10::DeviceIndex) const override { return is_initialized(); }
  void init() const override { lazy_init(); }
  c10::DeviceIndex deviceCount() const override { return static_cast<c10::DeviceIndex>(device_count()); }
  void setCurrentDevice(c10::DeviceIndex device) const override { set_device_process_wide(device); }
  c10::DeviceIndex getCurrentDevice() const override { return current_device(); }
  c10::DeviceIndex exchangeDevice(c10::DeviceIndex device) const override {
    auto old = current_device();
    NeuronGuardImpl().exchangeDevice(c10::Device(kNeuron, device));
    return old;
  }
  c10::DeviceIndex maybeExchangeDevice(c10::DeviceIndex device) const override {
    return exchangeDevice(device);
  }
  void resizePrivateUse1Bytes(const c10::Storage& storage, size_t newsize) const override {
    auto* impl = storage.unsafeGetStorageImpl();
    TORCH_CHECK(impl->resizable(), "Trying to resize storage that is not resizable");
    c10::DataPtr fresh;
    if (newsize) fresh = allocate_on(storage.device().index(), newsize);
    const size_t keep = std::min(newsize, impl->nbytes());
    if (keep && impl->data()) rt::Runtime::get().copy(fresh.get(), impl->data(), keep);
    impl->set_data_ptr_noswap(std::move(fresh));
    impl->set_nbytes(newsize);
  }
};

struct Registration {
  Registration() {
    at::RegisterPrivateUse1HooksInterface(new NeuronHooks());
    c10::SetAllocator(kNeuron, &g_allocator);
    g_charging_cpu.base = c10::GetCPUAllocator();
    g_charging_cpu.base_raw_deleter = g_charging_cpu.base->raw_deleter();
    c10::SetCPUAllocator(&g_charging_cpu, /*priority=*/10);
    pthread_atfork(nullptr, nullptr, &mark_child_bad_fork);
  }
};
Registration g_registration;

}  // namespace
}  // namespace neuron
