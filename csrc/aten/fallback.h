// The boxed fallback: runs any ATen op on neuron tensors through its CPU
// kernel, on zero-copy CPU aliases of device memory.
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/util/SmallVector.h>

#include <string>

#include "aten/alias_table.h"
#include "aten/op_meta.h"

namespace neuron {

void cpu_fallback(const c10::OperatorHandle& op, c10::DispatchKeySet ks, torch::jit::Stack* stack);

// A neuron argument of one call, its CPU alias, and whether the op writes it.
struct Converted {
  at::Tensor neuron;
  at::Tensor cpu;
  bool mut;
};

// A CPU kernel's result as a neuron tensor (the argument it returns, a nested
// or dense result over device memory); quantized and sparse results refused.
at::Tensor result_to_neuron(AliasTable& table, const c10::SmallVector<Converted, 8>& conv, const OpMeta& meta,
                            const at::Tensor& r, c10::DeviceIndex dev);

// Sends the ops that have both a CPU kernel and a device-generic composite to
// the fallback (cpu_routes.cpp); returns how many. Idempotent.
int register_cpu_kernel_routes();

// Quantized tensors are refused where they would be made on neuron (a
// quantize op's result, an empty quantized tensor, a copy from CPU).
[[noreturn]] void reject_quantized(const std::string& op_name);

}  // namespace neuron
