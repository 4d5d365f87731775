// The Work objects of collectives on neuron tensors: the wrapper of the CPU
// backend's Work (neuron tensors in results; ReduceOp.AVG's division and the
// copy-out of non-contiguous tensors after completion) and the coalescing
// window of dist._coalescing_manager.
#pragma once

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "profiler/device_events.h"

namespace neuron {

using ViewMap = std::vector<std::pair<const c10::TensorImpl*, at::Tensor>>;  // CPU view -> neuron tensor

// What runs once the collective has completed (ReduceOp.AVG's division, the
// copy-out of an uneven all_to_all, then of non-contiguous tensors).
struct PostProcess {
  std::once_flag once;
  std::vector<at::Tensor> targets;  // CPU views of the outputs
  int64_t divisor = 1;
  std::function<void()> then;
  profiler::AsyncSpan span;  // the collective's device event
  // (user's non-contiguous tensor, the contiguous copy the collective wrote)
  std::vector<std::pair<at::Tensor, at::Tensor>> copy_back;

  void run() {
    std::call_once(once, [this] {
      if (then) then();
      if (divisor != 1) {
        for (auto& t : targets) {
          if (!t.defined() || t.numel() == 0) continue;
          if (c10::isIntegralType(t.scalar_type(), /*includeBool=*/false))
            t.div_(divisor, "trunc");
          else
            t.div_(divisor);
        }
      }
      for (auto& [dst, src] : copy_back) dst.copy_(src);
      span.end();
    });
  }
};

// The neuron tensor a CPU view in `map` stands for (anything else unchanged),
// through tensor lists and lists.
at::Tensor to_neuron(const at::Tensor& t, const ViewMap& map);
c10::IValue to_neuron(const c10::IValue& v, const ViewMap& map);

// The wrapped Work: applies `post` once the inner work has completed, and maps
// the CPU views in its results back to the neuron tensors of `map`.
c10::intrusive_ptr<c10d::Work> make_neuron_work(c10::intrusive_ptr<c10d::Work> inner, std::shared_ptr<ViewMap> map,
                                                std::shared_ptr<PostProcess> post);

// Coalescing (dist._coalescing_manager(group, device=neuron)): gloo has no
// startCoalescing/endCoalescing. Between start and end, the works of the
// group's collectives on neuron tensors are collected; end returns one Work
// that completes when all of them have. (The "fast path" ops the manager
// captures are issued as one coalesced collective just before end.)
void track_for_coalescing(const c10::intrusive_ptr<c10d::ProcessGroup>& pg, const c10::intrusive_ptr<c10d::Work>& w);
void start_coalescing(const std::string& group_name);
c10::intrusive_ptr<c10d::Work> end_coalescing(const std::string& group_name);

}  // namespace neuron
