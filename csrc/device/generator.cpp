// Generators: AWS's TorchNeuron documents a neuron generator's state as 16
// bytes, an 8-byte seed then an 8-byte offset (CUDA's Philox layout, which
// PyTorch's DTensor RNG tracker reads and writes). Ops run as CPU kernels, so
// each random op gets a CPU engine keyed by (seed, offset) and reserves its
// values by advancing the offset: the same seed and op sequence reproduce,
// and ranks that DTensor gives different offsets draw different numbers.
#include "device/generator.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/EmptyTensor.h>
#include <ATen/core/MT19937RNGEngine.h>
#include <c10/util/Exception.h>

#include <atomic>
#include <cstring>
#include <mutex>
#include <optional>
#include <vector>

#include "device/device.h"

namespace neuron {
namespace {

constexpr int64_t kStateBytes = 16;

// splitmix64's finalizer: a bijection that scatters nearby inputs.
uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

uint64_t splitmix64(uint64_t& x) { return mix64(x += 0x9e3779b97f4a7c15ULL); }

// Fills all 624 words of the Mersenne Twister from (seed, offset): seeding it
// with one integer would keep only 32 bits, and ops would share streams after
// about 2^16 draws.
at::Generator keyed_cpu_engine(uint64_t seed, uint64_t offset) {
  // Scattered, so the splitmix64 streams of nearby offsets do not overlap.
  uint64_t x = mix64(mix64(seed) ^ offset);
  at::mt19937_data_pod pod;
  pod.seed_ = x;
  pod.seeded_ = true;
  pod.left_ = 1;  // the first draw twists the state
  pod.next_ = 0;
  for (size_t i = 0; i < pod.state_.size(); i += 2) {
    const uint64_t r = splitmix64(x);
    pod.state_[i] = static_cast<uint32_t>(r);
    if (i + 1 < pod.state_.size()) pod.state_[i + 1] = static_cast<uint32_t>(r >> 32);
  }
  at::mt19937 engine;
  engine.set_data(pod);
  auto gen = at::make_generator<at::CPUGeneratorImpl>();
  gen.get<at::CPUGeneratorImpl>()->set_engine(engine);
  return gen;
}

std::atomic<bool> g_cpu_equal{false};

struct NeuronGenerator final : c10::GeneratorImpl {
  // AWS: an unseeded generator starts from a nondeterministic seed.
  explicit NeuronGenerator(c10::DeviceIndex index, uint64_t seed = c10::detail::getNonDeterministicRandom())
      : c10::GeneratorImpl(c10::Device(kNeuron, index), c10::DispatchKeySet(c10::DispatchKey::PrivateUse1)),
        seed_(seed) {}

  void set_current_seed(uint64_t seed) override {
    std::lock_guard<std::mutex> lock(state_mutex_);
    seed_ = seed;
    offset_ = 0;
    cpu_equal_ = std::nullopt;  // re-seeded from seed_ when the CPU-equal mode next draws
  }
  uint64_t current_seed() const override {
    std::lock_guard<std::mutex> lock(state_mutex_);
    return seed_;
  }
  uint64_t seed() override {
    const uint64_t s = c10::detail::getNonDeterministicRandom();
    set_current_seed(s);
    return s;
  }
  void set_offset(uint64_t offset) override {
    std::lock_guard<std::mutex> lock(state_mutex_);
    offset_ = offset;
  }
  uint64_t get_offset() const override {
    std::lock_guard<std::mutex> lock(state_mutex_);
    return offset_;
  }
  void set_state(const c10::TensorImpl& state) override {
    at::detail::check_rng_state(state);
    if (g_cpu_equal.load() && state.numel() != kStateBytes) {
      auto engine = cpu_equal_engine();
      std::lock_guard<std::mutex> lock(engine.mutex());
      engine.unsafeGetGeneratorImpl()->set_state(state);
      return;
    }
    TORCH_CHECK(state.numel() == kStateBytes, "a neuron generator's state is ", kStateBytes,
                " bytes (an 8-byte seed, then an 8-byte offset), got ", state.numel(),
                " bytes. Pass a state that torch.neuron.get_rng_state() or Generator.get_state() on a "
                "neuron generator returned; a CPU generator's state (5,056 bytes) fits only inside "
                "torch_neuronx.cpu_equal_rng(), which saved it.");
    uint64_t s, o;
    const auto* bytes = static_cast<const uint8_t*>(state.data());
    std::memcpy(&s, bytes, 8);
    std::memcpy(&o, bytes + 8, 8);
    std::lock_guard<std::mutex> lock(state_mutex_);
    seed_ = s;
    offset_ = o;
    cpu_equal_ = std::nullopt;  // a 16-byte state holds no Mersenne Twister: restart it from the seed
  }
  c10::intrusive_ptr<c10::TensorImpl> get_state() const override {
    if (g_cpu_equal.load()) {
      auto engine = const_cast<NeuronGenerator*>(this)->cpu_equal_engine();
      std::lock_guard<std::mutex> lock(engine.mutex());
      return engine.unsafeGetGeneratorImpl()->get_state();
    }
    // empty_cpu bypasses the dispatcher, so FakeTensorMode and LocalTensorMode
    // get a real state, as from CPU's and CUDA's generators.
    auto state = at::detail::empty_cpu({kStateBytes}, c10::ScalarType::Byte, std::nullopt, std::nullopt, std::nullopt,
                                       std::nullopt);
    auto* bytes = static_cast<uint8_t*>(state.data_ptr());
    std::lock_guard<std::mutex> lock(state_mutex_);
    std::memcpy(bytes, &seed_, 8);
    std::memcpy(bytes + 8, &offset_, 8);
    return state.getIntrusivePtr();
  }
  static c10::DeviceType device_type() { return kNeuron; }

  // Reserves `count` values, rounded up to a multiple of 4 as CUDA's Philox
  // offsets are (DTensor's tracker assumes it).
  std::pair<uint64_t, uint64_t> reserve(uint64_t count) {
    std::lock_guard<std::mutex> lock(state_mutex_);
    const uint64_t at = offset_;
    offset_ += (count + 3) / 4 * 4;
    return {seed_, at};
  }

  // The opt-in CPU-equal mode: one Mersenne Twister seeded like CPU's default
  // generator, drawn from op after op, so a seeded run equals CPU's.
  at::Generator cpu_equal_engine() {
    std::lock_guard<std::mutex> lock(state_mutex_);
    if (!cpu_equal_) cpu_equal_ = at::make_generator<at::CPUGeneratorImpl>(seed_);
    return *cpu_equal_;
  }

 private:
  NeuronGenerator* clone_impl() const override {
    std::lock_guard<std::mutex> lock(state_mutex_);
    auto* g = new NeuronGenerator(device().index(), seed_);
    g->offset_ = offset_;
    if (cpu_equal_) g->cpu_equal_ = cpu_equal_->clone();
    return g;
  }

  // Not GeneratorImpl::mutex_: torch.Generator's Python methods hold that one
  // while they call in here.
  mutable std::mutex state_mutex_;
  uint64_t seed_;
  uint64_t offset_ = 0;
  std::optional<at::Generator> cpu_equal_;
};

std::once_flag g_gens_once;
std::vector<at::Generator> g_default_gens;

}  // namespace

const at::Generator& default_generator(c10::DeviceIndex device) {
  if (device < 0) device = current_device();
  check_device_index(device);
  // AWS: the set of per-device generators is fixed when first accessed.
  std::call_once(g_gens_once, [] {
    for (int i = 0; i < device_count(); ++i)
      g_default_gens.push_back(at::make_generator<NeuronGenerator>(static_cast<c10::DeviceIndex>(i)));
  });
  TORCH_CHECK_INDEX(device < static_cast<c10::DeviceIndex>(g_default_gens.size()), "neuron:", device,
                    " has no default generator: the ", g_default_gens.size(),
                    " per-device generators were fixed when the first one was accessed.");
  return g_default_gens[device];
}

at::Generator cpu_engine_for(const at::Generator& gen, uint64_t count) {
  TORCH_CHECK(gen.device().type() == kNeuron, "Expected a 'neuron' device type for generator but found '",
              gen.device().type(), "'");
  auto* impl = static_cast<NeuronGenerator*>(gen.unsafeGetGeneratorImpl());
  auto [seed, offset] = impl->reserve(count);
  if (g_cpu_equal.load()) return impl->cpu_equal_engine();
  return keyed_cpu_engine(seed, offset);
}

bool set_cpu_equal_rng(bool enabled) { return g_cpu_equal.exchange(enabled); }

at::Generator new_generator(c10::DeviceIndex device) {
  if (device < 0) device = current_device();
  check_device_index(device);
  return at::make_generator<NeuronGenerator>(device);
}

}  // namespace neuron
