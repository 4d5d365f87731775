// Random number generators of the `neuron` device.
#pragma once

#include <ATen/core/Generator.h>
#include <c10/core/Device.h>

namespace neuron {

// The device's default generator (device < 0: the current device).
const at::Generator& default_generator(c10::DeviceIndex device);
// A fresh generator of the device (device < 0: the current device).
at::Generator new_generator(c10::DeviceIndex device);
// The generator's CPU engine that the CPU kernels draw from.
at::Generator cpu_engine_of(const at::Generator& neuron_gen);

}  // namespace neuron
