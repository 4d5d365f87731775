// Where gloo's argument rules differ from NCCL's, the NCCL rules: see
// arg_rules.h.
#include "distributed/arg_rules.h"

#include <c10/util/Exception.h>

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

}  // namespace neuron
