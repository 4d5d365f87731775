// NCCL's argument rules where gloo's differ, applied to a c10d op's stack
// before it runs on gloo (the collectives layer calls these).
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include <cstdint>
#include <memory>
#include <string>

#include "distributed/work.h"

namespace neuron {

// NCCL checks only element counts where gloo checks shapes: tensors whose
// counts match are given gloo as views of the shapes it expects (recorded in
// `map`, so results map back to the caller's tensors). Raises on a dtype or
// element-count mismatch.
void match_shapes(const std::string& opname, torch::jit::Stack* stack, size_t base, int64_t world, ViewMap& map);

// all_to_all with tensors of different sizes, which gloo's list all_to_all
// refuses. Returns false (stack untouched) when the sizes are even; otherwise
// issues the collective and leaves its (outputs, Work) on the stack.
bool uneven_all_to_all(const c10::OperatorHandle& op, torch::jit::Stack* stack,
                       const c10::intrusive_ptr<c10d::ProcessGroup>& pg, const std::shared_ptr<ViewMap>& map,
                       const std::shared_ptr<PostProcess>& post);

}  // namespace neuron
