// Unboxed fast paths for the hottest ops, and their registration.
#include <ATen/ATen.h>
#include <ATen/Operators.h>
#include <torch/library.h>

#include <tuple>
#include <type_traits>

#include "aten/alias_table.h"
#include "aten/arg_check.h"
#include "aten/op_meta.h"
#include "device/allocator.h"

namespace neuron {

// Unboxed fast paths for the hottest ops. Same semantics as cpu_fallback
// (device check, fidelity accounting, zero-copy aliases, charged results),
// without boxing: boxing copies every tensor argument into the stack, and the
// first extra reference to a tensor that Python owns takes the GIL to incref
// its PyObject. Only functional and in-place ops whose arguments are tensors,
// input tensor lists and plain values are listed: they never resize or swap
// storages.
namespace {

// The aliases of a tensor-list argument (cat). Inputs only: never an
// in-place result, so they stay out of the table's alias list, whose elements
// must not move while the call holds references to them.
struct AliasList {
  explicit AliasList(AliasPool& p) : pool(&p) {}
  AliasList(AliasList&&) = default;
  ~AliasList() {
    for (auto it = tensors.rbegin(); it != tensors.rend(); ++it) pool->give_back(std::move(*it));
  }
  operator at::ITensorListRef() const { return at::ITensorListRef(tensors.data(), tensors.size()); }

  AliasPool* pool;
  c10::SmallVector<at::Tensor, 8> tensors;
};

class UnboxedCall {
 public:
  UnboxedCall(OpMeta& meta, const c10::FunctionSchema& schema) : meta_(meta), check_(meta, schema) {}

  // Called left to right, once per argument (braced initialisation).
  at::Tensor& in(at::Tensor& t) { return convert(t); }
  const at::Tensor& in(const at::Tensor& t) { return convert(t); }
  AliasList in(const at::ITensorListRef& list) {
    const int i = arg_++;
    AliasList out(table_.pool);
    out.tensors.reserve(list.size());
    for (const at::Tensor& t : list) out.tensors.push_back(check_.is_neuron(t, i) ? table_.alias_only(t) : t);
    return out;
  }
  template <class T>
  T&& in(T&& v) {
    ++arg_;
    return std::forward<T>(v);
  }

  void before_run() { dev_ = check_.finish(); }
  c10::DeviceIndex device() const { return dev_; }

  at::Tensor& out_ref(at::Tensor& r) {
    for (size_t i = 0; i < n_; ++i)
      if (aliases_[i]->unsafeGetTensorImpl() == r.unsafeGetTensorImpl()) return *originals_[i];
    TORCH_INTERNAL_ASSERT(false, meta_.name, ": in-place result is not an argument");
    return r;
  }
  at::Tensor out_value(at::Tensor r) {
    if (!r.defined() || r.device().type() != c10::kCPU) return r;
    for (size_t i = 0; i < n_; ++i)
      if (aliases_[i]->unsafeGetTensorImpl() == r.unsafeGetTensorImpl()) return *originals_[i];
    return table_.neuron_result(r, dev_);
  }

 private:
  at::Tensor& convert(const at::Tensor& t) {
    const int i = arg_++;
    if (!check_.is_neuron(t, i)) return const_cast<at::Tensor&>(t);
    TORCH_INTERNAL_ASSERT(n_ < kMaxTensors);
    table_.alias(t);
    aliases_[n_] = &table_.aliases.back();
    originals_[n_] = const_cast<at::Tensor*>(&t);
    return *aliases_[n_++];
  }

  static constexpr size_t kMaxTensors = 8;  // the alias table's inline capacity: no reallocation
  OpMeta& meta_;
  ArgCheck check_;
  AliasTable table_;
  at::Tensor* aliases_[kMaxTensors] = {};
  at::Tensor* originals_[kMaxTensors] = {};
  size_t n_ = 0;
  int arg_ = 0;
  c10::DeviceIndex dev_ = -1;
};

template <class Op, class Sig = typename Op::schema>
struct Unboxed;

template <class Op, class R, class... A>
struct Unboxed<Op, R(A...)> {
  static R run(A... args) {
    static const c10::OperatorHandle handle =
        c10::Dispatcher::singleton().findSchemaOrThrow(Op::name, Op::overload_name);
    static OpMeta& meta = meta_for(handle);
    UnboxedCall call(meta, handle.schema());
    // Braced initialisation evaluates the conversions left to right.
    std::tuple<decltype(call.in(std::forward<A>(args)))...> converted{call.in(std::forward<A>(args))...};
    call.before_run();
    ChargeCpuAllocationsTo charge(call.device());
    auto run_cpu = [](auto&&... a) -> R { return Op::redispatch(c10::DispatchKeySet(c10::DispatchKey::CPU), a...); };
    if constexpr (std::is_reference_v<R>) {
      return call.out_ref(std::apply(run_cpu, converted));
    } else {
      return call.out_value(std::apply(run_cpu, converted));
    }
  }
};

}  // namespace

}  // namespace neuron

using neuron::Unboxed;

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  // Unboxed fast paths (same semantics as the boxed fallback).
  m.impl("add.Tensor", TORCH_FN(Unboxed<at::_ops::add_Tensor>::run));
  m.impl("add_.Tensor", TORCH_FN(Unboxed<at::_ops::add__Tensor>::run));
  m.impl("sub.Tensor", TORCH_FN(Unboxed<at::_ops::sub_Tensor>::run));
  m.impl("sub_.Tensor", TORCH_FN(Unboxed<at::_ops::sub__Tensor>::run));
  m.impl("mul.Tensor", TORCH_FN(Unboxed<at::_ops::mul_Tensor>::run));
  m.impl("mul_.Tensor", TORCH_FN(Unboxed<at::_ops::mul__Tensor>::run));
  m.impl("div.Tensor", TORCH_FN(Unboxed<at::_ops::div_Tensor>::run));
  m.impl("div_.Tensor", TORCH_FN(Unboxed<at::_ops::div__Tensor>::run));
  m.impl("neg", TORCH_FN(Unboxed<at::_ops::neg>::run));
  m.impl("exp", TORCH_FN(Unboxed<at::_ops::exp>::run));
  m.impl("mm", TORCH_FN(Unboxed<at::_ops::mm>::run));
  m.impl("bmm", TORCH_FN(Unboxed<at::_ops::bmm>::run));
  m.impl("addmm", TORCH_FN(Unboxed<at::_ops::addmm>::run));
  m.impl("sum", TORCH_FN(Unboxed<at::_ops::sum>::run));
  m.impl("sum.dim_IntList", TORCH_FN(Unboxed<at::_ops::sum_dim_IntList>::run));
  m.impl("mean.dim", TORCH_FN(Unboxed<at::_ops::mean_dim>::run));
  m.impl("_softmax", TORCH_FN(Unboxed<at::_ops::_softmax>::run));
  m.impl("_log_softmax", TORCH_FN(Unboxed<at::_ops::_log_softmax>::run));
  m.impl("gelu", TORCH_FN(Unboxed<at::_ops::gelu>::run));
  m.impl("silu", TORCH_FN(Unboxed<at::_ops::silu>::run));
  m.impl("tanh", TORCH_FN(Unboxed<at::_ops::tanh>::run));
  m.impl("sigmoid", TORCH_FN(Unboxed<at::_ops::sigmoid>::run));
  m.impl("rsqrt", TORCH_FN(Unboxed<at::_ops::rsqrt>::run));
  m.impl("pow.Tensor_Scalar", TORCH_FN(Unboxed<at::_ops::pow_Tensor_Scalar>::run));
  m.impl("where.self", TORCH_FN(Unboxed<at::_ops::where_self>::run));
  m.impl("clone", TORCH_FN(Unboxed<at::_ops::clone>::run));
  m.impl("index_select", TORCH_FN(Unboxed<at::_ops::index_select>::run));
  m.impl("cat", TORCH_FN(Unboxed<at::_ops::cat>::run));
  // Composites that route by device type to kernels that do not exist here.
}
