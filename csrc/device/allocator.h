// Memory of the `neuron` device as PyTorch sees it: the device allocator, the
// CPU allocator that charges kernels' allocations to a device, and pinned
// host memory.
#pragma once

#include <c10/core/Allocator.h>
#include <c10/core/Device.h>

#include <cstdint>

namespace neuron {

// The allocator of device memory (c10::GetAllocator(PrivateUse1)).
c10::Allocator* device_allocator();
c10::DataPtr allocate_on(c10::DeviceIndex device, size_t nbytes);

// The dry run's accounting of a tensor storage that holds no data: the core's
// allocator counts it (peaks, cache, OutOfMemoryError at the capacity) as it
// would count a real allocation. Returns a token for release_reservation().
uintptr_t reserve_on(c10::DeviceIndex device, size_t nbytes);
void release_reservation(uintptr_t token);

// While alive, CPU allocations made by this thread (the CPU kernels run by the
// fallback) are charged to `device` and may be adopted as device memory. What
// the kernels allocate and free before the outermost scope ends (a host
// library's scratch: oneDNN's reordered weights for a bf16 matmul on a host
// with AVX512-BF16) is left out of the device's peak, as a dry run leaves it
// out: it depends on the host's CPU, and a NeuronCore's kernel has none.
struct ChargeCpuAllocationsTo {
  explicit ChargeCpuAllocationsTo(c10::DeviceIndex device);
  ~ChargeCpuAllocationsTo();
  c10::DeviceIndex prev_;
  uint64_t peak_ = 0;        // the device's allocated peak at the outermost scope's start
  uint64_t high_water_ = 0;  // and its allocated high-water mark
};
// True when dp is host memory that the device's accounting already owns.
bool is_device_memory(const c10::DataPtr& dp);
// The allocator installed as CPU allocator (charges to the device when asked).
c10::Allocator* charging_cpu_allocator();

// Pinned host memory (DataLoader(pin_memory=True)).
c10::Allocator* pinned_allocator();
bool is_pinned(const void* ptr);

}  // namespace neuron
