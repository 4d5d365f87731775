// c10d collectives on `neuron` tensors.
//
// Device memory is host memory, so a collective on neuron tensors is the same
// collective on zero-copy CPU views of them. Core PyTorch registers kernels of
// the c10d ops (c10d::allreduce_, allgather_, ..., send, recv_, barrier) for
// PrivateUse1 that hand the neuron tensors to the process group's PrivateUse1
// backend, which gloo rejects. We replace those kernels: the walk every boxed
// op takes (aten/arg_walk.h, with the argument rules of aten/arg_check.h)
// makes each neuron tensor argument (Tensor, Tensor[], Tensor[][]) a CPU view
// of the same memory, and the op is redispatched to its CPU kernel, which runs
// it on the process group's CPU backend (gloo, over TCP). Nothing is copied
// (except non-contiguous tensors, below).
//
// On top of gloo this layer provides what gloo lacks:
//   * ReduceOp.AVG and PREMUL_SUM, and all_to_all with uneven sizes
//     (gloo_gaps.h).
//   * NCCL's argument rules where gloo's differ (arg_rules.h): tensor
//     collectives need only matching element counts (gloo wants shapes); and
//     non-contiguous tensors work, by copy-in/copy-out (gloo would treat them
//     as dense blocks).
// The Work returned wraps gloo's: it applies the AVG division and the copy-out,
// and its result() / getFuture() give the neuron tensors instead of the CPU
// views (DDP's reducer builds gradient views from the future's value).
#include <ATen/MemoryOverlap.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/util/Exception.h>
#include <torch/library.h>
#include <torch/csrc/distributed/c10d/GroupRegistry.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Types.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <memory>
#include <string>
#include <utility>

#include "aten/alias_pool.h"
#include "aten/arg_walk.h"
#include "device/device.h"
#include "distributed/arg_rules.h"
#include "distributed/collectives.h"
#include "distributed/gloo_gaps.h"
#include "distributed/work.h"

namespace neuron {
namespace {

bool is_class(const c10::TypePtr& t, const char* suffix) {
  auto cls = t->cast<c10::ClassType>();
  if (!cls || !cls->name()) return false;
  const std::string q = cls->name()->qualifiedName();
  const std::string s(suffix);
  return q.size() >= s.size() && q.compare(q.size() - s.size(), s.size(), s) == 0;
}

// A process group created for neuron only (e.g. init_process_group() without a
// backend) has no CPU backend; the CPU kernels we redispatch to need one. Use
// the group's neuron backend for CPU too (gloo serves both).
void ensure_cpu_backend(const c10::intrusive_ptr<c10d::ProcessGroup>& pg) {
  if (pg->hasBackendForDeviceType(c10::kCPU)) return;
  TORCH_CHECK(pg->hasBackendForDeviceType(kNeuron), "process group '", pg->getGroupName(),
              "' has no backend for device neuron; create it with backend \"neuron\" "
              "(torch.distributed.init_process_group(\"neuron\"))");
  auto backend = pg->getBackend(kNeuron);
  using BT = c10d::ProcessGroup::BackendType;
  for (BT bt : {BT::CUSTOM, BT::GLOO, BT::UNDEFINED, BT::NCCL, BT::UCC, BT::MPI, BT::XCCL}) {
    try {
      if (pg->getBackend(bt).get() == backend.get()) {
        pg->setBackend(c10::kCPU, bt, backend);
        return;
      }
    } catch (const c10::Error&) {
    }
  }
  TORCH_CHECK(false, "process group '", pg->getGroupName(), "': cannot find the backend type of its neuron backend");
}

// A neuron tensor as the CPU tensor gloo runs on: a view of its memory, or a
// contiguous copy where the view is not dense.
at::Tensor gloo_view(const std::string& opname, const std::string& arg, const at::Tensor& t, ViewMap& map,
                     PostProcess& post) {
  auto c = cpu_view_of(t);
  if (!c.is_contiguous()) {
    // gloo reads and writes a tensor's memory as one dense block (NCCL
    // rejects such tensors instead): the collective runs on a contiguous
    // copy, which is copied back into the tensors it writes on completion.
    const bool written = opname != "c10d::send" && arg.rfind("input", 0) != 0;
    TORCH_CHECK_VALUE(!written || at::has_internal_overlap(c) != at::MemOverlap::Yes, opname, ": argument '", arg,
                      "' has overlapping memory (e.g. an expanded tensor) and the collective writes it; "
                      "pass a tensor that owns its memory (.clone())");
    auto dense = c.contiguous();
    if (written) post.copy_back.emplace_back(c, dense);
    c = dense;
  }
  map.emplace_back(c.unsafeGetTensorImpl(), t);
  return c;
}

// The indices of a c10d op's process group and reduce op arguments (-1: none).
std::pair<int, int> group_and_reduce_args(const c10::FunctionSchema& schema) {
  int pg = -1, reduce = -1;
  const auto& args = schema.arguments();
  for (size_t i = 0; i < args.size(); ++i) {
    if (is_class(args[i].type(), "c10d.ProcessGroup")) pg = static_cast<int>(i);
    if (is_class(args[i].type(), "c10d.ReduceOp")) reduce = static_cast<int>(i);
  }
  return {pg, reduce};
}

void collective_kernel(const c10::OperatorHandle& op, c10::DispatchKeySet, torch::jit::Stack* stack) {
  const auto& schema = op.schema();
  const size_t nargs = schema.arguments().size();
  const size_t base = stack->size() - nargs;
  const std::string& opname = schema.name();

  auto map = std::make_shared<ViewMap>();
  auto post = std::make_shared<PostProcess>();
  ArgCheck check = ArgCheck::collective(opname, schema);
  walk_args(check, *stack, nargs, [&](const at::Tensor& t, size_t i) {
    return gloo_view(opname, schema.arguments()[i].name(), t, *map, *post);
  });
  const c10::DeviceIndex dev = check.finish();
  const auto [pg_idx, reduce_idx] = group_and_reduce_args(schema);
  TORCH_CHECK(pg_idx >= 0, opname, ": no process group argument");
  auto pg = (*stack)[base + pg_idx].toCustomClass<c10d::ProcessGroup>();
  ensure_cpu_backend(pg);

  match_shapes(opname, stack, base, pg->getSize(), *map);
  post->span.begin(profiler::SpanKind::Collective, opname, dev);
  if (reduce_idx >= 0) reduce_as_sum(schema, *stack, base, reduce_idx, pg->getSize(), *post);
  if (opname == "c10d::alltoall_" && uneven_all_to_all(op, stack, pg, map, post)) return;

  op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::CPU), stack);

  const size_t nrets = schema.returns().size();
  for (size_t i = stack->size() - nrets; i < stack->size(); ++i) {
    c10::IValue& v = (*stack)[i];
    if (is_class(schema.returns()[i - (stack->size() - nrets)].type(), "c10d.Work")) {
      auto inner = v.toCustomClass<c10d::Work>();
      c10::intrusive_ptr<c10d::Work> w = make_neuron_work(std::move(inner), map, post);
      track_for_coalescing(pg, w);
      v = c10::IValue(std::move(w));
    } else {
      v = to_neuron(v, *map);
    }
  }
}

// Discards the dispatcher's "overriding a previously registered kernel"
// warnings while we replace core's PrivateUse1 c10d kernels.
struct SilentWarnings : c10::WarningHandler {
  void process(const c10::Warning&) override {}
};

}  // namespace

int register_collective_routes() {
  static std::unique_ptr<torch::Library> lib;
  static int count = -1;
  if (count >= 0) return count;
  count = 0;
  static SilentWarnings silent;
  c10::WarningUtils::WarningHandlerGuard guard(&silent);
  lib =
      std::make_unique<torch::Library>(torch::Library::IMPL, "c10d", c10::DispatchKey::PrivateUse1, __FILE__, __LINE__);
  auto& d = c10::Dispatcher::singleton();
  for (const auto& name : d.getAllOpNames()) {
    if (name.name.rfind("c10d::", 0) != 0) continue;
    auto op = d.findOp(name);
    if (!op || !op->hasKernelForDispatchKey(c10::DispatchKey::PrivateUse1)) continue;
    if (!op->hasKernelForDispatchKey(c10::DispatchKey::CPU)) continue;
    std::string full = name.name + (name.overload_name.empty() ? "" : "." + name.overload_name);
    lib->impl(full.c_str(), torch::CppFunction::makeFromBoxedFunction<&collective_kernel>());
    ++count;
  }
  return count;
}

}  // namespace neuron

// torch.ops.neuron_c10d.{start,end}_coalescing, used by torch_neuronx.distributed
// for ProcessGroup._start_coalescing / _end_coalescing on neuron.
TORCH_LIBRARY(neuron_c10d, m) {
  m.def("start_coalescing(str group_name) -> ()", &neuron::start_coalescing);
  m.def("end_coalescing(str group_name) -> __torch__.torch.classes.c10d.Work", &neuron::end_coalescing);
}
