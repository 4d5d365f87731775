// Shared declarations of the PyTorch registration layer (device.cpp, ops.cpp).
#pragma once

#include <ATen/ATen.h>
#include <ATen/core/Generator.h>
#include <c10/core/Allocator.h>
#include <c10/core/Device.h>

#include "runtime/runtime.h"

namespace neuron {

constexpr c10::DeviceType kNeuron = c10::DeviceType::PrivateUse1;

// Runtime access that converts configuration errors into c10 errors.
rt::Runtime& runtime();
int device_count();
c10::DeviceIndex current_device();
void check_device_index(c10::DeviceIndex index);
// Marks the runtime as used by this process (fork detection) and validates it.
void lazy_init();
bool is_initialized();
bool in_bad_fork();
// torch.neuron.set_device: the process-wide current device (threads inherit it).
void set_device_process_wide(c10::DeviceIndex index);

// The allocator of device memory (c10::GetAllocator(PrivateUse1)).
c10::Allocator* device_allocator();
c10::DataPtr allocate_on(c10::DeviceIndex device, size_t nbytes);

// While alive, CPU allocations made by this thread (the CPU kernels run by the
// fallback) are charged to `device` and may be adopted as device memory.
struct ChargeCpuAllocationsTo {
  explicit ChargeCpuAllocationsTo(c10::DeviceIndex device);
  ~ChargeCpuAllocationsTo();
  c10::DeviceIndex prev_;
};
// True when dp is host memory that the device's accounting already owns.
bool is_device_memory(const c10::DataPtr& dp);
// The allocator installed as CPU allocator (charges to the device when asked).
c10::Allocator* charging_cpu_allocator();

// RNG: the generator's CPU engine that the CPU kernels draw from.
const at::Generator& default_generator(c10::DeviceIndex device);
at::Generator cpu_engine_of(const at::Generator& neuron_gen);

// Runs any ATen op on neuron tensors through its CPU kernel (zero copy).
void cpu_fallback(const c10::OperatorHandle& op, c10::DispatchKeySet ks,
                  torch::jit::Stack* stack);
// A CPU tensor sharing the memory of a neuron tensor (same sizes/strides).
at::Tensor cpu_view_of(const at::Tensor& t);

}  // namespace neuron
