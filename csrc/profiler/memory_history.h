// Allocation history of neuron device memory, in the format of CUDA's memory
// snapshots (torch.cuda.memory._snapshot), so PyTorch's memory visualizer
// reads it. The allocator calls the hooks below only while recording is on:
// otherwise the cost is one relaxed atomic load per allocation and free.
#pragma once

#include <c10/core/Device.h>

#include <atomic>
#include <cstddef>

namespace neuron::profiler {

namespace detail {
extern std::atomic<bool> g_mem_recording;
}

inline bool memory_recording() { return detail::g_mem_recording.load(std::memory_order_relaxed); }

// After a successful allocation of nbytes at ptr on device.
void on_alloc(c10::DeviceIndex device, const void* ptr, size_t nbytes);
// Before the live device block at ptr is released.
void on_free(const void* ptr);
// A request the core could not satisfy.
void on_oom(c10::DeviceIndex device, size_t nbytes, size_t device_free);

}  // namespace neuron::profiler
