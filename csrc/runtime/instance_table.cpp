// The chips and instance types the simulator models: the one place the C++
// runtime keeps hardware numbers.
#include "runtime/instance.h"

namespace neuron::rt {
namespace {
constexpr uint64_t GiB = 1ull << 30;
}  // namespace

ChipSpec chip_spec(const std::string& name) {
  if (name == "trn1") return {"trn1", 2, 32 * GiB, {1}};
  if (name == "trn2") return {"trn2", 8, 96 * GiB, {1, 2}};
  return {"trn3", 8, 144 * GiB, {1, 2}};
}

// One chip per "neuron device", as neuron-ls shows.
const std::vector<InstanceType>& instance_types() {
  static const std::vector<InstanceType> types = {
      {"trn1.2xlarge", "trn1", 1}, {"trn1.32xlarge", "trn1", 16}, {"trn1n.32xlarge", "trn1", 16},
      {"trn2.3xlarge", "trn2", 1}, {"trn2.48xlarge", "trn2", 16}, {"trn2u.48xlarge", "trn2", 16},
      {"trn3.3xlarge", "trn3", 1}, {"trn3.48xlarge", "trn3", 16},
  };
  return types;
}

}  // namespace neuron::rt
