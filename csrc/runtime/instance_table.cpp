// The chips and instance types the simulator models. No figure is kept here:
// neuronsim/hardware.py is their one source (the NKI cost model and the
// readiness estimates read it too) and hands the tables over when the package
// is imported, before the runtime starts.
#include <mutex>

#include "runtime/instance.h"

namespace neuron::rt {
namespace {
std::mutex g_mu;
std::vector<ChipSpec> g_chips;
std::vector<InstanceType> g_types;
}  // namespace

void set_hardware_tables(std::vector<ChipSpec> chips, std::vector<InstanceType> types) {
  std::lock_guard<std::mutex> lock(g_mu);
  g_chips = std::move(chips);
  g_types = std::move(types);
}

std::vector<InstanceType> instance_types() {
  std::lock_guard<std::mutex> lock(g_mu);
  if (g_types.empty())
    throw ConfigError(
        "the hardware tables are not loaded: import torch_neuronx (it loads them from neuronsim/hardware.py)");
  return g_types;
}

ChipSpec chip_spec(const std::string& name) {
  std::lock_guard<std::mutex> lock(g_mu);
  for (const auto& c : g_chips)
    if (c.name == name) return c;
  throw ConfigError("no hardware figures for chip '" + name + "'");
}

}  // namespace neuron::rt
