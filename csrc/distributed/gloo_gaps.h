// What NCCL does and gloo lacks, built from gloo's collectives for the
// collectives layer: ReduceOp.AVG and PREMUL_SUM, and all_to_all with tensors
// of different sizes.
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include <cstdint>
#include <memory>

#include "distributed/work.h"

namespace neuron {

// ReduceOp.AVG and PREMUL_SUM as SUM, the reduce op at `reduce_idx` of the
// stack rewritten (other ops untouched). AVG: the outputs are divided by
// `world` once the work has completed (`post`). PREMUL_SUM(f): the inputs are
// multiplied by f first; in-place collectives (all_reduce, reduce) scale their
// in/out tensors, the others (reduce_scatter*) scale copies, so their inputs
// are left untouched.
void reduce_as_sum(const c10::FunctionSchema& schema, torch::jit::Stack& stack, size_t base, int reduce_idx,
                   int64_t world, PostProcess& post);

// all_to_all with tensors of different sizes, which gloo's list all_to_all
// refuses. Returns false (stack untouched) when the sizes are even; otherwise
// issues the collective and leaves its (outputs, Work) on the stack.
bool uneven_all_to_all(const c10::OperatorHandle& op, torch::jit::Stack* stack,
                       const c10::intrusive_ptr<c10d::ProcessGroup>& pg, const std::shared_ptr<ViewMap>& map,
                       const std::shared_ptr<PostProcess>& post);

}  // namespace neuron
