// Generators: each neuron generator owns a CPU Philox/MT engine that the CPU
// kernels draw from, so streams are reproducible, thread-safe (the engine's
// own mutex) and independent of torch's CPU default generator.
#include "device/generator.h"

#include <ATen/CPUGeneratorImpl.h>
#include <c10/util/Exception.h>

#include <mutex>
#include <vector>

#include "device/device.h"

namespace neuron {
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

at::Generator new_generator(c10::DeviceIndex device) {
  if (device < 0) device = current_device();
  check_device_index(device);
  return at::make_generator<NeuronGenerator>(device);
}

}  // namespace neuron
