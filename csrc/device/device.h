// The `neuron` device's state: the runtime, initialisation and fork safety,
// the current device, and the one device-index check with its message.
#pragma once

#include <c10/core/Device.h>

#include <cstdint>

#include "runtime/runtime.h"

namespace neuron {

constexpr c10::DeviceType kNeuron = c10::DeviceType::PrivateUse1;

// Runtime access that converts configuration errors into c10 errors.
rt::Runtime& runtime();
int device_count();
c10::DeviceIndex current_device();
// IndexError naming the valid range: the one check of a device index.
void check_device_index(int64_t index);
// Marks the runtime as used by this process (fork detection) and validates it.
void lazy_init();
bool is_initialized();
bool in_bad_fork();
// torch.neuron.set_device, torch.accelerator.set_device_index: the process-wide current
// device (threads inherit it); initialises the runtime.
void set_device_process_wide(c10::DeviceIndex index);
// The device guard's override for this thread only (index already checked).
void set_thread_device(c10::DeviceIndex index);

}  // namespace neuron
