// What NCCL does and gloo lacks, built from gloo's collectives: see
// gloo_gaps.h.
#include "distributed/gloo_gaps.h"

#include <c10/util/Exception.h>
#include <torch/csrc/distributed/c10d/Types.hpp>

#include <numeric>
#include <vector>

#include "distributed/work.h"

namespace neuron {
namespace {

double premul_factor(const c10d::ReduceOp& rop) {
  auto* sup = dynamic_cast<c10d::PreMulSumSupplement*>(rop.supplement_.get());
  TORCH_CHECK(sup, "ReduceOp.PREMUL_SUM without a factor");
  if (sup->tensor_factor.defined()) {
    TORCH_CHECK(sup->tensor_factor.numel() == 1, "ReduceOp.PREMUL_SUM factor must have one element");
    return sup->tensor_factor.item<double>();
  }
  return sup->double_factor;
}

// The tensors of a Tensor, Tensor[] or Tensor[][] argument.
void collect(const c10::IValue& v, std::vector<at::Tensor>& out) {
  if (v.isTensor()) {
    out.push_back(v.toTensor());
  } else if (v.isTensorList()) {
    for (const at::Tensor& t : v.toTensorList()) out.push_back(t);
  } else if (v.isList()) {
    for (const c10::IValue& e : v.toList())
      if (e.isTensorList())
        for (const at::Tensor& t : e.toTensorList()) out.push_back(t);
  }
}

// The inputs of an out-of-place reduction (reduce_scatter*), scaled copies.
c10::IValue scaled_copies(const c10::IValue& inputs, double f) {
  if (inputs.isTensor()) return inputs.toTensor().mul(f);
  if (inputs.isTensorList()) {
    c10::List<at::Tensor> out;
    for (const at::Tensor& t : inputs.toTensorList()) out.push_back(t.mul(f));
    return out;
  }
  if (!inputs.isList()) return inputs;
  auto list = inputs.toList();
  c10::impl::GenericList out(list.elementType());
  for (const c10::IValue& e : list) {
    c10::List<at::Tensor> inner;
    for (const at::Tensor& t : e.toTensorList()) inner.push_back(t.mul(f));
    out.push_back(std::move(inner));
  }
  return out;
}

}  // namespace

void reduce_as_sum(const c10::FunctionSchema& schema, torch::jit::Stack& stack, size_t base, int reduce_idx,
                   int64_t world, PostProcess& post) {
  auto rop = stack[base + reduce_idx].toCustomClass<c10d::ReduceOp>();
  const auto kind = rop->op_;
  if (kind != c10d::ReduceOp::AVG && kind != c10d::ReduceOp::PREMUL_SUM) return;
  if (kind == c10d::ReduceOp::AVG) {
    collect(stack[base], post.targets);
    post.divisor = world;
  } else {
    // In-place reductions (all_reduce, reduce) have one "tensors" argument;
    // the reduce_scatter family has outputs (arg 0) and inputs (arg 1).
    const bool in_place = schema.arguments()[0].name() == "tensors";
    const double f = premul_factor(*rop);
    c10::IValue& inputs = stack[base + (in_place ? 0 : 1)];
    if (in_place) {
      std::vector<at::Tensor> ts;
      collect(inputs, ts);
      for (auto& t : ts) t.mul_(f);
    } else {
      inputs = scaled_copies(inputs, f);
    }
  }
  stack[base + reduce_idx] = c10::IValue(c10::make_intrusive<c10d::ReduceOp>(c10d::ReduceOp::SUM));
}

// all_to_all with tensors of different sizes (gloo's list all_to_all takes
// equal sizes only): one all_to_all_single with split sizes over a flat
// staging buffer (gloo's own list all_to_all stages the same way), whose
// slices are copied to the outputs when the work completes.
bool uneven_all_to_all(const c10::OperatorHandle& op, torch::jit::Stack* stack,
                       const c10::intrusive_ptr<c10d::ProcessGroup>& pg, const std::shared_ptr<ViewMap>& map,
                       const std::shared_ptr<PostProcess>& post) {
  const size_t nargs = op.schema().arguments().size();
  const size_t base = stack->size() - nargs;
  auto outputs = (*stack)[base].toTensorList().vec();
  auto inputs = (*stack)[base + 1].toTensorList().vec();
  const int64_t world = pg->getSize();
  TORCH_CHECK(static_cast<int64_t>(outputs.size()) == world && static_cast<int64_t>(inputs.size()) == world,
              "all_to_all: expected ", world, " input and output tensors, got ", inputs.size(), " and ",
              outputs.size());
  bool even = true;
  for (size_t i = 0; i < outputs.size(); ++i)
    even = even && outputs[i].sizes() == outputs[0].sizes() && inputs[i].sizes() == inputs[0].sizes() &&
           outputs[i].sizes() == inputs[0].sizes();
  if (even) return false;
  const auto dtype = inputs[0].scalar_type();
  std::vector<int64_t> in_splits, out_splits;
  std::vector<at::Tensor> flat_in;
  for (auto& t : inputs) {
    TORCH_CHECK(t.scalar_type() == dtype, "all_to_all: all tensors must have one dtype, got ", dtype, " and ",
                t.scalar_type());
    in_splits.push_back(t.numel());
    flat_in.push_back(t.reshape({-1}));
  }
  for (auto& t : outputs) {
    TORCH_CHECK(t.scalar_type() == dtype, "all_to_all: all tensors must have one dtype, got ", dtype, " and ",
                t.scalar_type());
    out_splits.push_back(t.numel());
  }
  auto send = at::cat(flat_in);
  auto recv = at::empty({std::accumulate(out_splits.begin(), out_splits.end(), int64_t{0})}, send.options());
  c10d::AllToAllOptions opts;
  const int64_t timeout = (*stack)[base + nargs - 1].toInt();
  if (timeout >= 0) opts.timeout = std::chrono::milliseconds(timeout);
  post->then = [outputs, recv, out_splits] {
    int64_t off = 0;
    for (size_t i = 0; i < outputs.size(); ++i) {
      outputs[i].copy_(recv.narrow(0, off, out_splits[i]).view(outputs[i].sizes()));
      off += out_splits[i];
    }
  };
  // (gloo may move from the split vectors: pass copies)
  auto out_counts = out_splits;
  auto in_counts = in_splits;
  auto work = pg->getBackend(c10::kCPU)->alltoall_base(recv, send, out_counts, in_counts, opts);
  torch::jit::drop(*stack, nargs);
  c10::List<at::Tensor> outs;
  for (auto& t : outputs) outs.push_back(to_neuron(t, *map));
  torch::jit::push(*stack, std::move(outs));
  c10::intrusive_ptr<c10d::Work> w = make_neuron_work(work, map, post);
  track_for_coalescing(pg, w);
  torch::jit::push(*stack, c10::IValue(std::move(w)));
  return true;
}

}  // namespace neuron
