// The instance a process runs on: chip, instance type, logical NeuronCore
// configuration and the cores this process may use, as described by the
// Neuron environment variables. Free of PyTorch headers.
#pragma once

#include <cstdint>
#include <exception>
#include <string>
#include <vector>

namespace neuron::rt {

// A validation error in the instance configuration (environment variables).
struct ConfigError : std::exception {
  explicit ConfigError(std::string msg) : msg_(std::move(msg)) {}
  const char* what() const noexcept override { return msg_.c_str(); }
  std::string msg_;
};

struct ChipSpec {
  std::string name;        // "trn1", "trn2", "trn3"
  int physical_cores = 0;  // NeuronCores per chip
  uint64_t hbm_bytes = 0;  // HBM per chip
  std::vector<int> lnc_allowed;
  int lnc_default = 1;
};

// One torch device: a logical NeuronCore.
struct CoreInfo {
  int index = 0;       // torch device index (position among visible cores)
  int logical_id = 0;  // instance-wide logical core id
  int chip = 0;        // chip ("neuron device") it lives on
  std::vector<int> physical_cores;
  uint64_t hbm_capacity = 0;
};

struct InstanceInfo {
  std::string instance_type;
  ChipSpec chip;
  int num_chips = 0;
  int lnc = 0;                    // physical cores per logical core
  int logical_cores_total = 0;    // on the whole instance
  std::vector<CoreInfo> visible;  // the cores this process may use
};

// An instance type we model: its chip and how many chips it has.
struct InstanceType {
  std::string name;
  std::string chip;
  int chips = 0;
};

// The hardware tables (instance_table.cpp), set once from Python's
// neuronsim/hardware.py, and the instance type assumed when
// TORCH_NEURONX_INSTANCE_TYPE is unset. Both getters throw ConfigError
// before the tables are set.
constexpr const char* kDefaultInstanceType = "trn2.3xlarge";
void set_hardware_tables(std::vector<ChipSpec> chips, std::vector<InstanceType> types);
std::vector<InstanceType> instance_types();
ChipSpec chip_spec(const std::string& name);

// Parses the environment (NEURON_LOGICAL_NC_CONFIG, NEURON_RT_VISIBLE_CORES,
// NEURON_RT_NUM_CORES, TORCH_NEURONX_INSTANCE_TYPE); throws ConfigError.
InstanceInfo describe_instance();

}  // namespace neuron::rt
