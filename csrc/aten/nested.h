// Nested (NestedTensorImpl) tensors on neuron: their buffer is device memory,
// their size/stride/offset metadata stays on CPU, as on CUDA.
#pragma once

#include <ATen/ATen.h>
#include <torch/library.h>

#include "aten/alias_table.h"

namespace neuron {

// A nested CPU result as a nested neuron tensor over the same memory.
at::Tensor nested_to_neuron(AliasTable& table, const at::Tensor& cpu, c10::DeviceIndex dev);

// The boxed fallback of the NestedTensorPrivateUse1 key: the op runs through
// CPU's nested kernels on zero-copy aliases.
void nested_fallback(const c10::OperatorHandle& op, c10::DispatchKeySet, torch::jit::Stack* stack);

}  // namespace neuron
