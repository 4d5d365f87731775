// NCCL's argument rules where gloo's differ, applied to a c10d op's stack
// before it runs on gloo (the collectives layer calls these). Rules only: what
// gloo lacks is built in gloo_gaps.h.
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>

#include <cstdint>
#include <string>

#include "distributed/work.h"

namespace neuron {

// NCCL checks only element counts where gloo checks shapes: tensors whose
// counts match are given gloo as views of the shapes it expects (recorded in
// `map`, so results map back to the caller's tensors). Raises on a dtype or
// element-count mismatch.
void match_shapes(const std::string& opname, torch::jit::Stack* stack, size_t base, int64_t world, ViewMap& map);

}  // namespace neuron
