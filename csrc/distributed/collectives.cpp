// c10d collectives on `neuron` tensors.
//
// Device memory is host memory, so a collective on neuron tensors is the same
// collective on zero-copy CPU views of them. Core PyTorch registers kernels of
// the c10d ops (c10d::allreduce_, allgather_, ..., send, recv_, barrier) for
// PrivateUse1 that hand the neuron tensors to the process group's PrivateUse1
// backend, which gloo rejects. We replace those kernels: each neuron tensor
// argument (Tensor, Tensor[], Tensor[][]) becomes a CPU view of the same
// memory, and the op is redispatched to its CPU kernel, which runs it on the
// process group's CPU backend (gloo, over TCP). Nothing is copied (except
// non-contiguous tensors, below).
//
// On top of gloo this layer provides what gloo lacks:
//   * ReduceOp.AVG: SUM, then the outputs are divided by the group size once
//     the work has completed (Work::wait / isCompleted / getFuture).
//   * ReduceOp.PREMUL_SUM(f): the inputs are multiplied by f, then SUM. In-place
//     collectives (all_reduce, reduce) scale their in/out tensor; the others
//     (reduce_scatter*) scale copies, so their inputs are left untouched.
//   * NCCL's argument rules where gloo's differ: tensor collectives need only
//     matching element counts (gloo wants shapes), and non-contiguous tensors
//     work, by copy-in/copy-out (gloo would treat them as dense blocks).
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
#include <vector>

#include "aten/alias_pool.h"
#include "device/device.h"
#include "distributed/arg_rules.h"
#include "distributed/collectives.h"
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

double premul_factor(const c10d::ReduceOp& rop) {
  auto* sup = dynamic_cast<c10d::PreMulSumSupplement*>(rop.supplement_.get());
  TORCH_CHECK(sup, "ReduceOp.PREMUL_SUM without a factor");
  if (sup->tensor_factor.defined()) {
    TORCH_CHECK(sup->tensor_factor.numel() == 1, "ReduceOp.PREMUL_SUM factor must have one element");
    return sup->tensor_factor.item<double>();
  }
  return sup->double_factor;
}

void collective_kernel(const c10::OperatorHandle& op, c10::DispatchKeySet, torch::jit::Stack* stack) {
  const auto& schema = op.schema();
  const auto& args = schema.arguments();
  const size_t nargs = args.size();
  const size_t base = stack->size() - nargs;
  const std::string& opname = schema.name();

  auto map = std::make_shared<ViewMap>();
  auto post = std::make_shared<PostProcess>();
  c10::DeviceIndex dev = -1;
  std::string cpu_arg;
  c10::Device cpu_device(c10::kCPU);

  auto convert = [&](const at::Tensor& t, const std::string& arg) -> at::Tensor {
    if (!t.defined()) return t;
    if (t.device().type() != kNeuron) {
      if (cpu_arg.empty()) {
        cpu_arg = arg;
        cpu_device = t.device();
      }
      return t;
    }
    TORCH_CHECK_NOT_IMPLEMENTED(t.layout() == c10::kStrided, opname, ": argument '", arg, "' is a ", t.layout(),
                                " neuron tensor; collectives on neuron take dense tensors");
    const auto idx = t.device().index();
    if (dev < 0) {
      dev = idx;
    } else {
      TORCH_CHECK(idx == dev, opname, ": all tensors of a collective must be on the same neuron device, but argument '",
                  arg, "' is on neuron:", static_cast<int>(idx), " and others on neuron:", static_cast<int>(dev));
    }
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
      if (written) post->copy_back.emplace_back(c, dense);
      c = dense;
    }
    map->emplace_back(c.unsafeGetTensorImpl(), t);
    return c;
  };
  auto convert_list = [&](const c10::List<at::Tensor>& list, const std::string& arg) {
    c10::List<at::Tensor> out;
    out.reserve(list.size());
    for (const at::Tensor& t : list) out.push_back(convert(t, arg));
    return out;
  };

  int reduce_idx = -1, pg_idx = -1;
  for (size_t i = 0; i < nargs; ++i) {
    c10::IValue& v = (*stack)[base + i];
    const std::string& name = args[i].name();
    if (v.isTensor()) {
      v = convert(v.toTensor(), name);
    } else if (v.isTensorList()) {
      v = convert_list(v.toTensorList(), name);
    } else if (v.isList()) {  // Tensor[][]
      auto list = v.toList();
      c10::impl::GenericList out(list.elementType());
      for (const c10::IValue& e : list)
        out.push_back(e.isTensorList() ? c10::IValue(convert_list(e.toTensorList(), name)) : e);
      v = std::move(out);
    } else if (is_class(args[i].type(), "c10d.ReduceOp")) {
      reduce_idx = static_cast<int>(i);
    } else if (is_class(args[i].type(), "c10d.ProcessGroup")) {
      pg_idx = static_cast<int>(i);
    }
  }
  TORCH_CHECK(cpu_arg.empty() || dev < 0, opname,
              ": expected all tensors of the collective on neuron:", static_cast<int>(dev), ", but argument '", cpu_arg,
              "' has a tensor on ", cpu_device,
              ". Move it with .to('neuron') (or run the whole collective on CPU tensors).");
  TORCH_CHECK(pg_idx >= 0, opname, ": no process group argument");
  auto pg = (*stack)[base + pg_idx].toCustomClass<c10d::ProcessGroup>();
  ensure_cpu_backend(pg);

  match_shapes(opname, stack, base, pg->getSize(), *map);
  post->span.begin(profiler::SpanKind::Collective, opname, dev >= 0 ? dev : current_device());

  if (reduce_idx >= 0) {
    auto rop = (*stack)[base + reduce_idx].toCustomClass<c10d::ReduceOp>();
    const auto kind = rop->op_;
    if (kind == c10d::ReduceOp::AVG || kind == c10d::ReduceOp::PREMUL_SUM) {
      // In-place reductions (all_reduce, reduce) have one "tensors" argument;
      // the reduce_scatter family has outputs (arg 0) and inputs (arg 1).
      const bool in_place = args[0].name() == "tensors";
      auto collect = [](const c10::IValue& v, std::vector<at::Tensor>& out) {
        if (v.isTensor()) {
          out.push_back(v.toTensor());
        } else if (v.isTensorList()) {
          for (const at::Tensor& t : v.toTensorList()) out.push_back(t);
        } else if (v.isList()) {
          for (const c10::IValue& e : v.toList())
            if (e.isTensorList())
              for (const at::Tensor& t : e.toTensorList()) out.push_back(t);
        }
      };
      if (kind == c10d::ReduceOp::AVG) {
        collect((*stack)[base], post->targets);
        post->divisor = pg->getSize();
      } else {
        const double f = premul_factor(*rop);
        c10::IValue& inputs = (*stack)[base + (in_place ? 0 : 1)];
        if (in_place) {
          std::vector<at::Tensor> ts;
          collect(inputs, ts);
          for (auto& t : ts) t.mul_(f);
        } else if (inputs.isTensor()) {
          inputs = inputs.toTensor().mul(f);
        } else if (inputs.isTensorList()) {
          c10::List<at::Tensor> out;
          for (const at::Tensor& t : inputs.toTensorList()) out.push_back(t.mul(f));
          inputs = std::move(out);
        } else if (inputs.isList()) {
          auto list = inputs.toList();
          c10::impl::GenericList out(list.elementType());
          for (const c10::IValue& e : list) {
            c10::List<at::Tensor> inner;
            for (const at::Tensor& t : e.toTensorList()) inner.push_back(t.mul(f));
            out.push_back(std::move(inner));
          }
          inputs = std::move(out);
        }
      }
      (*stack)[base + reduce_idx] = c10::IValue(c10::make_intrusive<c10d::ReduceOp>(c10d::ReduceOp::SUM));
    }
  }

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
