// The boxed fallback: runs any ATen op on neuron tensors through its CPU
// kernel, on zero-copy CPU aliases of device memory.
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>

#include <string>

namespace neuron {

void cpu_fallback(const c10::OperatorHandle& op, c10::DispatchKeySet ks, torch::jit::Stack* stack);

// Sends the ops that have both a CPU kernel and a device-generic composite to
// the fallback (cpu_routes.cpp); returns how many. Idempotent.
int register_cpu_kernel_routes();

// Quantized tensors are refused where they would be made on neuron (a
// quantize op's result, an empty quantized tensor, a copy from CPU).
[[noreturn]] void reject_quantized(const std::string& op_name);

}  // namespace neuron
