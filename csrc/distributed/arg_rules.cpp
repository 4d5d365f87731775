// Where gloo's argument rules differ from NCCL's, the NCCL rules: see
// arg_rules.h.
#include "distributed/arg_rules.h"

#include <c10/util/Exception.h>

#include <numeric>
#include <string>
#include <vector>

#include "distributed/work.h"

namespace neuron {
namespace {

// NCCL checks only element counts where gloo checks shapes: all_gather_into_tensor
// of a (1, 2) tensor into a flat output, reduce_scatter_tensor of a (2, 2) input
// into a (2,) output, and the list forms with same-sized tensors of other
// shapes. Such tensors (contiguous by now) are given gloo as views of the shape
// it expects; the views map back to the caller's tensors.
at::Tensor view_as_mapped(const at::Tensor& t, at::IntArrayRef shape, ViewMap& map) {
  if (t.sizes() == shape) return t;
  auto v = t.view(shape);
  map.emplace_back(v.unsafeGetTensorImpl(), to_neuron(t, map));
  return v;
}

void check_same_dtype(const std::string& opname, const at::Tensor& out, const at::Tensor& in) {
  TORCH_CHECK_TYPE(out.scalar_type() == in.scalar_type(), opname, ": output tensor has dtype ", out.scalar_type(),
                   " but the input has ", in.scalar_type(), "; they must be equal");
}

// `flat` holds world x the elements of `part` (all_gather: output and input;
// reduce_scatter: input and output): both become 1-D.
void match_flat_pair(const std::string& opname, c10::IValue& flat, c10::IValue& part, int64_t world, bool gather,
                     ViewMap& map) {
  const at::Tensor f = flat.toTensor(), p = part.toTensor();
  check_same_dtype(opname, gather ? f : p, gather ? p : f);
  TORCH_CHECK_VALUE(f.numel() == world * p.numel(), opname, ": the ", gather ? "output" : "input",
                    " tensor must have world_size (", world, ") times the elements of the ",
                    gather ? "input" : "output", " tensor (", p.numel(), "), i.e. ", world * p.numel(), ", but it has ",
                    f.numel(), " (shapes ", f.sizes(), " and ", p.sizes(), ")");
  flat = view_as_mapped(f, {f.numel()}, map);
  part = view_as_mapped(p, {p.numel()}, map);
}

// list[i][j] takes the shape of ref[i] when their element counts are equal.
c10::IValue match_nested(const c10::IValue& list, const c10::IValue& ref, ViewMap& map) {
  auto refs = ref.toTensorList();
  auto outer = list.toList();
  c10::impl::GenericList out(outer.elementType());
  for (size_t i = 0; i < outer.size(); ++i) {
    c10::List<at::Tensor> inner;
    for (const at::Tensor& t : outer.get(i).toTensorList()) {
      const bool same = i < refs.size() && t.defined() && t.numel() == refs.get(i).numel();
      inner.push_back(same ? view_as_mapped(t, refs.get(i).sizes(), map) : t);
    }
    out.push_back(std::move(inner));
  }
  return out;
}

}  // namespace

void match_shapes(const std::string& opname, torch::jit::Stack* stack, size_t base, int64_t world, ViewMap& map) {
  c10::IValue& a0 = (*stack)[base];
  c10::IValue& a1 = (*stack)[base + 1];
  if (opname == "c10d::_allgather_base_" || opname == "c10d::_reduce_scatter_base_") {
    const bool gather = opname == "c10d::_allgather_base_";
    match_flat_pair(opname, gather ? a0 : a1, gather ? a1 : a0, world, gather, map);
  } else if (opname == "c10d::allgather_into_tensor_coalesced_" || opname == "c10d::reduce_scatter_tensor_coalesced_") {
    const bool gather = opname == "c10d::allgather_into_tensor_coalesced_";
    auto outs = a0.toTensorList().vec(), ins = a1.toTensorList().vec();
    TORCH_CHECK_VALUE(outs.size() == ins.size(), opname, ": ", outs.size(), " outputs but ", ins.size(), " inputs");
    c10::List<at::Tensor> new_outs, new_ins;
    for (size_t i = 0; i < outs.size(); ++i) {
      c10::IValue o(outs[i]), in(ins[i]);
      match_flat_pair(opname, gather ? o : in, gather ? in : o, world, gather, map);
      new_outs.push_back(o.toTensor());
      new_ins.push_back(in.toTensor());
    }
    a0 = std::move(new_outs);
    a1 = std::move(new_ins);
  } else if (opname == "c10d::allgather_" || opname == "c10d::gather_") {
    a0 = match_nested(a0, a1, map);  // output_tensors[i][r] ~ input_tensors[i]
  } else if (opname == "c10d::reduce_scatter_" || opname == "c10d::scatter_") {
    a1 = match_nested(a1, a0, map);  // input_tensors[i][r] ~ output_tensors[i]
  }
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
