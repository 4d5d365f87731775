// Random number generators of the `neuron` device.
#pragma once

#include <ATen/core/Generator.h>
#include <c10/core/Device.h>

#include <cstdint>

namespace neuron {

// The device's default generator (device < 0: the current device).
const at::Generator& default_generator(c10::DeviceIndex device);
// A fresh generator of the device (device < 0: the current device).
at::Generator new_generator(c10::DeviceIndex device);
// A CPU generator for one random op that draws `count` values from `neuron_gen`:
// keyed by the generator's (seed, offset), whose offset then advances past them.
at::Generator cpu_engine_for(const at::Generator& neuron_gen, uint64_t count);

// The opt-in CPU-equal mode (torch_neuronx.cpu_equal_rng): random ops draw
// CPU's Mersenne Twister stream and states are CPU's 5,056 bytes. Returns the
// previous setting.
bool set_cpu_equal_rng(bool enabled);

}  // namespace neuron
