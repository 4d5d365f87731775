// ATen on the `neuron` device. Every op runs through its CPU kernel on
// zero-copy CPU views of device memory (the simulator's "execute"); a handful
// of ops that define what device memory *is* (allocation, views, copies,
// resizing) get explicit kernels, and a few ops that PyTorch routes by device
// type get explicit ones so that numerics and kernel choice equal CPU's.
#include "neuron.h"
#include "profiler/device_events.h"

#include <ATen/EmptyTensor.h>
#include <ATen/Operators.h>
#include <ATen/autocast_mode.h>
#include <ATen/native/DispatchStub.h>
#include <ATen/native/TensorFactories.h>
#include <ATen/native/transformers/attention.h>
#include <ATen/ops/_local_scalar_dense_native.h>
#include <ATen/ops/_reshape_alias_native.h>
#include <ATen/ops/as_strided_native.h>
#include <ATen/ops/resize_native.h>
#include <ATen/ops/set_native.h>
#include <ATen/ops/view_native.h>
#include <ATen/ops/_fused_sdp_choice_native.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/DeviceGuard.h>
#include <torch/library.h>

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <shared_mutex>
#include <tuple>
#include <unordered_map>

namespace neuron {
namespace {

// ---------------------------------------------------------------------------
// Op metadata, computed once per schema.
struct OpMeta {
  std::string name;
  std::vector<int> generator_args;
  std::vector<char> arg_mutable;
  bool cpu_indices_ok = false;  // index ops accept CPU index tensors, as on CUDA
  bool no_native_lowering = false;
  std::atomic<uint64_t> executed{0};
  std::atomic<bool> warned{false};
};

std::shared_mutex g_meta_mu;
std::unordered_map<const c10::FunctionSchema*, std::unique_ptr<OpMeta>> g_meta;

OpMeta& meta_lookup(const c10::OperatorHandle& op, const c10::FunctionSchema* key);

bool starts_with(const std::string& s, const char* p) { return s.rfind(p, 0) == 0; }

// Ops with no Trainium lowering in the real system's eager mode: dense linear
// algebra factorizations and solvers run on the host there.
bool lacks_native_lowering(const std::string& name) {
  static const char* prefixes[] = {"aten::linalg_", "aten::_linalg_", "aten::cholesky", "aten::lu",
                                   "aten::_lu", "aten::geqrf", "aten::ormqr", "aten::orgqr",
                                   "aten::triangular_solve", "aten::_linalg", "aten::svd",
                                   "aten::_svd", "aten::qr", "aten::lstsq", "aten::eig",
                                   "aten::slogdet", "aten::logdet", "aten::det", "aten::inverse"};
  if (name == "aten::linalg_vector_norm" || name == "aten::linalg_matrix_norm" ||
      name == "aten::linalg_norm" || starts_with(name, "aten::linalg_vector_norm") ||
      starts_with(name, "aten::linalg_cross"))
    return false;
  for (const char* p : prefixes)
    if (starts_with(name, p)) return true;
  return false;
}

OpMeta& meta_for(const c10::OperatorHandle& op) {
  const c10::FunctionSchema* key = &op.schema();
  // Loops call the same few ops back to back: skip the shared lock then.
  thread_local const c10::FunctionSchema* last_key = nullptr;
  thread_local OpMeta* last_meta = nullptr;
  if (key == last_key) return *last_meta;
  OpMeta& m = meta_lookup(op, key);
  last_key = key;
  last_meta = &m;
  return m;
}

OpMeta& meta_lookup(const c10::OperatorHandle& op, const c10::FunctionSchema* key) {
  {
    std::shared_lock<std::shared_mutex> lock(g_meta_mu);
    auto it = g_meta.find(key);
    if (it != g_meta.end()) return *it->second;
  }
  auto m = std::make_unique<OpMeta>();
  const auto& schema = op.schema();
  m->name = schema.name() + (schema.overload_name().empty() ? "" : "." + schema.overload_name());
  const auto& args = schema.arguments();
  for (size_t i = 0; i < args.size(); ++i) {
    auto t = args[i].type();
    if (auto opt = t->cast<c10::OptionalType>()) t = opt->getElementType();
    if (t->kind() == c10::TypeKind::GeneratorType) m->generator_args.push_back(static_cast<int>(i));
    m->arg_mutable.push_back(args[i].alias_info() && args[i].alias_info()->isWrite());
  }
  m->cpu_indices_ok = starts_with(m->name, "aten::index") || starts_with(m->name, "aten::_index_put_impl_") ||
                      starts_with(m->name, "aten::_unsafe_index");
  m->no_native_lowering = lacks_native_lowering(m->name);
  std::unique_lock<std::shared_mutex> lock(g_meta_mu);
  auto [it, _] = g_meta.emplace(key, std::move(m));
  return *it->second;
}

// ---------------------------------------------------------------------------
// Fidelity accounting.
std::mutex g_track_mu;
std::map<std::string, std::set<std::string>> g_fallbacks;  // op -> reasons
std::atomic<int> g_strict{-1};

bool strict_fallback() {
  int s = g_strict.load();
  if (s < 0) {
    const char* v = std::getenv("TORCH_NEURONX_STRICT_FALLBACK");
    s = (v && std::string(v) != "0" && std::string(v) != "") ? 1 : 0;
    g_strict.store(s);
  }
  return s == 1;
}

const char* non_native_dtype(at::ScalarType t) {
  switch (t) {
    case at::kDouble: return "float64";
    case at::kComplexHalf: return "complex32";
    case at::kComplexFloat: return "complex64";
    case at::kComplexDouble: return "complex128";
    case at::kUInt16: return "uint16";
    case at::kUInt32: return "uint32";
    case at::kUInt64: return "uint64";
    default: return nullptr;
  }
}

void record_fallback(OpMeta& meta, const std::string& reason) {
  TORCH_CHECK(!strict_fallback(), "Operator '", meta.name, "' is not supported natively on Trainium (",
              reason, ") and TORCH_NEURONX_STRICT_FALLBACK=1 forbids the CPU fallback");
  {
    std::lock_guard<std::mutex> lock(g_track_mu);
    g_fallbacks[meta.name].insert(reason);
  }
  if (!meta.warned.exchange(true)) {
    TORCH_WARN("Operator '", meta.name, "' executed via CPU fallback (", reason, ")");
  }
}

// ---------------------------------------------------------------------------
// CPU aliases of device memory. Tensors that share a neuron storage share one
// CPU storage, so PyTorch's overlap and aliasing checks see what they would
// see on CPU.
void release_storage(void* ctx) { c10::raw::intrusive_ptr::decref(static_cast<c10::StorageImpl*>(ctx)); }

c10::Storage cpu_storage_over(c10::StorageImpl* nimpl) {
  c10::raw::intrusive_ptr::incref(nimpl);
  c10::DataPtr dp(nimpl->mutable_data(), nimpl, &release_storage, c10::Device(c10::kCPU));
  return c10::Storage(c10::Storage::use_byte_size_t(), nimpl->nbytes(), std::move(dp),
                      charging_cpu_allocator(), /*resizable=*/true);
}

c10::Storage neuron_storage_over(c10::StorageImpl* cimpl, c10::DeviceIndex dev) {
  c10::raw::intrusive_ptr::incref(cimpl);
  c10::DataPtr dp(cimpl->mutable_data(), cimpl, &release_storage, c10::Device(kNeuron, dev));
  return c10::Storage(c10::Storage::use_byte_size_t(), cimpl->nbytes(), std::move(dp),
                      device_allocator(), /*resizable=*/true);
}

at::Tensor tensor_on(c10::Storage storage, c10::DispatchKey key, const at::Tensor& like) {
  auto t = at::detail::make_tensor<c10::TensorImpl>(std::move(storage), c10::DispatchKeySet(key), like.dtype());
  auto* impl = t.unsafeGetTensorImpl();
  impl->set_sizes_and_strides(like.sizes(), like.strides(), like.storage_offset());
  if (like.is_conj()) impl->_set_conj(true);
  if (like.is_neg()) impl->_set_neg(true);
  return t;
}

// The CPU alias objects are recycled per thread: building and destroying a
// StorageImpl and a TensorImpl per argument was most of the fallback's cost.
// Each pooled tensor keeps a storage of its own, which borrows the device
// memory (no reference, no deleter) only while the op runs; one a kernel kept
// hold of is given an owning pointer. Sizes and strides are only rewritten
// when they change, which also spares recomputing the contiguity flags.
struct AliasPool {
  c10::SmallVector<at::Tensor, 16> tensors;
  c10::DispatchKeySet keys;  // of a CPU alias; anything else is not reused

  at::Tensor tensor_over(c10::StorageImpl* nimpl, const at::Tensor& like) {
    if (tensors.empty()) {
      c10::Storage own(c10::Storage::use_byte_size_t(), 0, c10::DataPtr(nullptr, c10::Device(c10::kCPU)),
                       charging_cpu_allocator(), /*resizable=*/true);
      borrow(own.unsafeGetStorageImpl(), nimpl);
      at::Tensor t = tensor_on(std::move(own), c10::DispatchKey::CPU, like);
      keys = plain_keys(t.unsafeGetTensorImpl());
      return t;
    }
    at::Tensor t = std::move(tensors.back());
    tensors.pop_back();
    auto* impl = t.unsafeGetTensorImpl();
    borrow(impl->storage().unsafeGetStorageImpl(), nimpl);
    if (impl->dtype() != like.dtype()) impl->set_storage_and_dtype(impl->storage(), like.dtype());
    if (impl->sizes() != like.sizes() || impl->strides() != like.strides()) {
      impl->set_sizes_and_strides(like.sizes(), like.strides(), like.storage_offset());
    } else if (impl->storage_offset() != like.storage_offset()) {
      impl->set_storage_offset(like.storage_offset());
    }
    impl->_set_conj(like.is_conj());
    impl->_set_neg(like.is_neg());
    return t;
  }

  // tensor_over() sets the conj/neg bits per use.
  static c10::DispatchKeySet plain_keys(const c10::TensorImpl* impl) {
    return impl->key_set().remove(c10::DispatchKey::Conjugate).remove(c10::DispatchKey::Negative);
  }

  static void borrow(c10::StorageImpl* cpu, c10::StorageImpl* nimpl) {
    cpu->set_data_ptr_noswap(c10::DataPtr(nimpl->mutable_data(), c10::Device(c10::kCPU)));
    cpu->set_nbytes(nimpl->nbytes());
  }

  // Reused only when nothing but its table entry shares its storage.
  void give_back(at::Tensor&& t) {
    auto* impl = t.unsafeGetTensorImpl();
    if (tensors.size() < tensors.capacity() && t.use_count() == 1 && t.weak_use_count() == 1 &&
        impl->storage().use_count() == 2 && !impl->pyobj_slot()->load_pyobj() && !impl->is_wrapped_number() &&
        plain_keys(impl) == keys && impl->allow_tensor_metadata_change()) {
      auto* st = impl->storage().unsafeGetStorageImpl();
      st->set_data_ptr_noswap(c10::DataPtr(nullptr, c10::Device(c10::kCPU)));
      st->set_nbytes(0);
      tensors.push_back(std::move(t));
    }
    t.reset();
  }
};

AliasPool& alias_pool() {
  thread_local AliasPool pool;
  return pool;
}

// A kernel's fresh result, owned by nobody else and already device memory
// (the charging allocator), becomes a neuron tensor in place: no new
// TensorImpl or StorageImpl.
bool adopt_in_place(const at::Tensor& r, c10::DeviceIndex dev) {
  auto* impl = r.unsafeGetTensorImpl();
  if (r.use_count() != 1 || r.weak_use_count() != 1 || impl->pyobj_slot()->load_pyobj()) return false;
  if (!impl->has_storage() || !impl->allow_tensor_metadata_change()) return false;
  const c10::Storage& st = impl->storage();
  if (st.use_count() != 1) return false;
  auto* cimpl = st.unsafeGetStorageImpl();
  if (!is_device_memory(cimpl->data_ptr()) || !cimpl->resizable()) return false;
  cimpl->mutable_data_ptr().unsafe_set_device(c10::Device(kNeuron, dev));
  cimpl->set_allocator(device_allocator());
  impl->set_storage_keep_dtype(st);
  impl->_change_backend_component_keys(c10::Device(kNeuron, dev));
  return true;
}

struct AliasTable {
  struct Entry {
    c10::StorageImpl* neuron;
    c10::Storage cpu;
    const void* data;
    size_t nbytes;
  };
  c10::SmallVector<Entry, 8> entries;
  c10::SmallVector<std::pair<c10::StorageImpl*, c10::Storage>, 4> adopted;  // cpu -> neuron
  c10::SmallVector<at::Tensor, 8> aliases;
  AliasPool& pool = alias_pool();

  AliasTable() = default;
  AliasTable(const AliasTable&) = delete;
  AliasTable& operator=(const AliasTable&) = delete;

  ~AliasTable() {
    // Latest first: an alias sharing an earlier one's storage lets go of it
    // before the earlier one is considered for reuse.
    for (auto it = aliases.rbegin(); it != aliases.rend(); ++it) pool.give_back(std::move(*it));
    for (auto& e : entries) {
      auto* impl = e.cpu.unsafeGetStorageImpl();
      if (e.cpu.use_count() > 1 && impl->data_ptr().get_deleter() == nullptr && impl->data() != nullptr) {
        // A kernel kept the alias: it must keep the device memory alive too.
        c10::raw::intrusive_ptr::incref(e.neuron);
        impl->set_data_ptr_noswap(
            c10::DataPtr(impl->mutable_data(), e.neuron, &release_storage, c10::Device(c10::kCPU)));
      }
    }
  }

  const at::Tensor& alias(const at::Tensor& t) {
    aliases.push_back(alias_only(t));
    return aliases.back();
  }

  // An alias the caller gives back to the pool (see AliasList).
  at::Tensor alias_only(const at::Tensor& t) {
    auto* nimpl = t.storage().unsafeGetStorageImpl();
    for (auto& e : entries)
      if (e.neuron == nimpl) return tensor_on(e.cpu, c10::DispatchKey::CPU, t);
    at::Tensor a = pool.tensor_over(nimpl, t);
    entries.push_back({nimpl, a.storage(), nimpl->data(), nimpl->nbytes()});
    return a;
  }

  // The neuron storage that holds the memory of a CPU storage produced by a kernel.
  c10::Storage neuron_storage_for(const c10::Storage& cpu, c10::DeviceIndex dev) {
    auto* cimpl = cpu.unsafeGetStorageImpl();
    for (auto& e : entries)
      if (e.cpu.unsafeGetStorageImpl() == cimpl)
        return c10::Storage(c10::intrusive_ptr<c10::StorageImpl>::reclaim_copy(e.neuron));
    for (auto& a : adopted)
      if (a.first == cimpl) return a.second;
    c10::Storage out;
    if (is_device_memory(cimpl->data_ptr())) {
      // Allocated on this device by the CPU kernel: adopt without copying.
      out = neuron_storage_over(cimpl, dev);
    } else {
      out = c10::Storage(c10::Storage::use_byte_size_t(), cimpl->nbytes(), allocate_on(dev, cimpl->nbytes()),
                         device_allocator(), true);
      if (cimpl->nbytes()) runtime().copy(out.mutable_data(), cimpl->data(), cimpl->nbytes());
    }
    adopted.emplace_back(cimpl, out);
    return out;
  }

  // A CPU kernel's result as a neuron tensor: a fresh result of its own is
  // adopted in place; one over an alias's storage (or anything else) is
  // wrapped over the neuron storage that holds its memory.
  at::Tensor neuron_result(const at::Tensor& r, c10::DeviceIndex dev) {
    if (adopt_in_place(r, dev)) return r;
    return tensor_on(neuron_storage_for(r.storage(), dev), c10::DispatchKey::PrivateUse1, r);
  }

  // A kernel resized an aliased storage: the new buffer came from the device
  // (charging allocator); move it into the neuron storage all views share.
  void sync_resized_storages(c10::DeviceIndex dev) {
    for (auto& e : entries) {
      auto* cimpl = e.cpu.unsafeGetStorageImpl();
      if (cimpl->data() == e.data && cimpl->nbytes() == e.nbytes) continue;
      c10::DataPtr moved = cimpl->set_data_ptr(c10::DataPtr(nullptr, c10::Device(c10::kCPU)));
      const size_t nbytes = cimpl->nbytes();
      if (!is_device_memory(moved)) {
        c10::DataPtr fresh = allocate_on(dev, nbytes);
        if (nbytes) runtime().copy(fresh.get(), moved.get(), nbytes);
        moved = std::move(fresh);
      }
      moved.unsafe_set_device(c10::Device(kNeuron, dev));
      e.neuron->set_data_ptr_noswap(std::move(moved));
      e.neuron->set_nbytes(nbytes);
      // Keep the (dying) alias consistent for any later lookup in this call.
      c10::raw::intrusive_ptr::incref(e.neuron);
      cimpl->set_data_ptr_noswap(c10::DataPtr(e.neuron->mutable_data(), e.neuron, &release_storage, c10::Device(c10::kCPU)));
      e.data = e.neuron->data();
      e.nbytes = nbytes;
    }
  }
};

// ---------------------------------------------------------------------------
// The boxed fallback.
struct Converted {
  at::Tensor neuron;
  at::Tensor cpu;
  bool mut;
};

[[noreturn]] void device_mismatch(const OpMeta& meta, const c10::FunctionSchema& schema, size_t arg,
                                  const at::Device& bad, const at::Device& expected) {
  TORCH_CHECK(false, "Expected all tensors to be on the same device, but got ", schema.arguments()[arg].name(),
              " is on ", bad, ", different from other tensors on ", expected,
              " (when checking argument in method ", meta.name, ")");
}

// The argument checks both fallback paths make, in PyTorch's terms: every
// neuron tensor on one device, CPU tensors only as 0-dim scalars (as on CUDA)
// or where the op allows them, strided layouts only; and the fidelity
// accounting of the op once its device is known.
class ArgCheck {
 public:
  ArgCheck(OpMeta& meta, const c10::FunctionSchema& schema) : meta_(meta), schema_(schema) {}

  // True for a neuron tensor, which then needs an alias.
  bool is_neuron(const at::Tensor& t, int i, bool allow_cpu = false) {
    if (!t.defined()) return false;
    if (t.device().type() == kNeuron) {
      if (auto* r = non_native_dtype(t.scalar_type())) odd_dtype_ = r;
      if (dev_ < 0) {
        dev_ = t.device().index();
      } else if (t.device().index() != dev_) {
        device_mismatch(meta_, schema_, i, t.device(), at::Device(kNeuron, dev_));
      }
      TORCH_CHECK_NOT_IMPLEMENTED(t.layout() == c10::kStrided, "neuron supports only strided tensors (",
                                  meta_.name, ")");
      return true;
    }
    if (!(t.device().type() == c10::kCPU && (t.dim() == 0 || allow_cpu)) && bad_arg_ < 0) {
      bad_arg_ = i;
      bad_device_ = t.device();
    }
    return false;
  }

  // A `device=neuron[:i]` argument.
  void saw_device(c10::DeviceIndex index) {
    if (dev_ < 0) dev_ = index;
  }

  // After all arguments: the op's device (the current one if no argument
  // named it), a recorded mismatch raised, the op counted and fallbacks noted.
  c10::DeviceIndex finish() {
    if (dev_ < 0) dev_ = current_device();
    if (bad_arg_ >= 0) device_mismatch(meta_, schema_, bad_arg_, bad_device_, at::Device(kNeuron, dev_));
    meta_.executed.fetch_add(1, std::memory_order_relaxed);
    if (meta_.no_native_lowering) {
      record_fallback(meta_, "no Trainium lowering");
    } else if (odd_dtype_) {
      record_fallback(meta_, std::string(odd_dtype_) + " is not native on Trainium");
    }
    return dev_;
  }

 private:
  OpMeta& meta_;
  const c10::FunctionSchema& schema_;
  c10::DeviceIndex dev_ = -1;
  int bad_arg_ = -1;  // a non-scalar CPU tensor next to neuron tensors
  at::Device bad_device_{c10::kCPU};
  const char* odd_dtype_ = nullptr;
};

}  // namespace

void cpu_fallback(const c10::OperatorHandle& op, c10::DispatchKeySet, torch::jit::Stack* stack) {
  OpMeta& meta = meta_for(op);
  const auto& schema = op.schema();
  const size_t nargs = schema.arguments().size();
  const size_t base = stack->size() - nargs;

  AliasTable table;
  c10::SmallVector<Converted, 8> conv;
  ArgCheck check(meta, schema);

  auto convert = [&](const at::Tensor& t, size_t i, bool allow_cpu) -> at::Tensor {
    if (!check.is_neuron(t, static_cast<int>(i), allow_cpu)) return t;
    auto c = table.alias(t);
    conv.push_back({t, c, static_cast<bool>(meta.arg_mutable[i])});
    return c;
  };

  for (size_t i = 0; i < nargs; ++i) {
    c10::IValue& v = (*stack)[base + i];
    if (v.isTensor()) {
      v = convert(v.toTensor(), i, false);
    } else if (v.isTensorList()) {
      auto list = v.toTensorList();
      c10::List<at::Tensor> out;
      out.reserve(list.size());
      for (const at::Tensor& t : list) out.push_back(convert(t, i, false));
      v = std::move(out);
    } else if (v.isList()) {
      auto list = v.toList();
      if (list.size() && (list.get(0).isTensor() || list.get(0).isNone())) {
        c10::List<std::optional<at::Tensor>> out;
        out.reserve(list.size());
        for (const c10::IValue& e : list)
          out.push_back(e.isTensor() ? std::optional<at::Tensor>(convert(e.toTensor(), i, meta.cpu_indices_ok))
                                     : std::nullopt);
        v = std::move(out);
      }
    } else if (v.isDevice()) {
      auto d = v.toDevice();
      if (d.type() == kNeuron) {
        check.saw_device(d.has_index() ? d.index() : current_device());
        v = c10::Device(c10::kCPU);
      }
    }
  }
  const c10::DeviceIndex dev = check.finish();

  for (int i : meta.generator_args) {
    c10::IValue& v = (*stack)[base + i];
    v = cpu_engine_of(v.isNone() ? default_generator(dev) : v.toGenerator());
  }

  {
    ChargeCpuAllocationsTo charge(dev);
    profiler::DeviceSpan span(profiler::SpanKind::Op, meta.name.c_str(), dev);
    op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::CPU), stack);
  }

  if (!conv.empty()) {
    table.sync_resized_storages(dev);
    for (auto& c : conv) {
      if (!c.mut) continue;
      auto* nimpl = c.neuron.unsafeGetTensorImpl();
      if (c.cpu.storage().unsafeGetStorageImpl() != c.neuron.storage().unsafeGetStorageImpl() &&
          !c.cpu.storage().is_alias_of(c.neuron.storage())) {
        // set_-style kernels swapped the storage.
        bool same_entry = false;
        for (auto& e : table.entries)
          if (e.cpu.unsafeGetStorageImpl() == c.cpu.storage().unsafeGetStorageImpl() &&
              e.neuron == c.neuron.storage().unsafeGetStorageImpl())
            same_entry = true;
        if (!same_entry) nimpl->set_storage_keep_dtype(table.neuron_storage_for(c.cpu.storage(), dev));
      }
      if (c.cpu.sizes() != c.neuron.sizes() || c.cpu.strides() != c.neuron.strides() ||
          c.cpu.storage_offset() != c.neuron.storage_offset())
        nimpl->set_sizes_and_strides(c.cpu.sizes(), c.cpu.strides(), c.cpu.storage_offset());
    }
  }

  auto wrap = [&](const at::Tensor& r) -> at::Tensor {
    if (!r.defined() || r.device().type() != c10::kCPU) return r;
    for (auto& c : conv)
      if (c.cpu.unsafeGetTensorImpl() == r.unsafeGetTensorImpl()) return c.neuron;
    TORCH_CHECK_NOT_IMPLEMENTED(r.layout() == c10::kStrided, "'", meta.name, "' produced a ", r.layout(),
                                " tensor: Trainium has no sparse kernels, so neuron supports only strided "
                                "(dense) tensors. Run this op on CPU (tensor.cpu()) and move the dense "
                                "result back with .to('neuron').");
    return table.neuron_result(r, dev);
  };

  const size_t nrets = schema.returns().size();
  for (size_t i = stack->size() - nrets; i < stack->size(); ++i) {
    c10::IValue& v = (*stack)[i];
    if (v.isTensor()) {
      v = wrap(v.toTensor());
    } else if (v.isTensorList()) {
      auto list = v.toTensorList();
      for (size_t j = 0; j < list.size(); ++j) list.set(j, wrap(list.get(j)));
    } else if (v.isList()) {
      auto list = v.toList();
      for (size_t j = 0; j < list.size(); ++j)
        if (list.get(j).isTensor()) list.set(j, wrap(list.get(j).toTensor()));
    }
  }
}

// ---------------------------------------------------------------------------
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
    profiler::DeviceSpan span(profiler::SpanKind::Op, meta.name.c_str(), call.device());
    auto run_cpu = [](auto&&... a) -> R { return Op::redispatch(c10::DispatchKeySet(c10::DispatchKey::CPU), a...); };
    if constexpr (std::is_reference_v<R>) {
      return call.out_ref(std::apply(run_cpu, converted));
    } else {
      return call.out_value(std::apply(run_cpu, converted));
    }
  }
};

}  // namespace

at::Tensor cpu_view_of(const at::Tensor& t) {
  if (!t.defined() || t.device().type() != kNeuron) return t;
  return tensor_on(cpu_storage_over(t.storage().unsafeGetStorageImpl()), c10::DispatchKey::CPU, t);
}

// Python-facing tracking accessors (module.cpp).
std::vector<std::pair<std::string, uint64_t>> executed_ops() {
  std::vector<std::pair<std::string, uint64_t>> out;
  std::shared_lock<std::shared_mutex> lock(g_meta_mu);
  for (auto& [_, m] : g_meta) {
    auto n = m->executed.load();
    if (n) out.emplace_back(m->name, n);
  }
  return out;
}

std::map<std::string, std::set<std::string>> fallback_ops() {
  std::lock_guard<std::mutex> lock(g_track_mu);
  return g_fallbacks;
}

void clear_op_tracking() {
  {
    std::shared_lock<std::shared_mutex> lock(g_meta_mu);
    for (auto& [_, m] : g_meta) {
      m->executed.store(0);
      m->warned.store(false);
    }
  }
  std::lock_guard<std::mutex> lock(g_track_mu);
  g_fallbacks.clear();
  g_strict.store(-1);
}

namespace {

// ---------------------------------------------------------------------------
// Explicit kernels.
c10::DeviceIndex index_of(std::optional<c10::Device> device) {
  auto idx = device && device->has_index() ? device->index() : current_device();
  check_device_index(idx);
  return idx;
}

void check_strided(std::optional<c10::Layout> layout) {
  TORCH_CHECK_NOT_IMPLEMENTED(!layout || *layout == c10::kStrided, "neuron supports only strided (dense) tensors, got layout ",
                              *layout, ": Trainium has no sparse kernels");
}

at::Tensor neuron_empty(c10::IntArrayRef size, std::optional<at::ScalarType> dtype, std::optional<at::Layout> layout,
                        std::optional<at::Device> device, std::optional<bool>, std::optional<at::MemoryFormat> fmt) {
  check_strided(layout);
  c10::DeviceGuard guard(c10::Device(kNeuron, index_of(device)));
  return at::detail::empty_generic(size, device_allocator(), c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
                                   c10::dtype_or_default(dtype), fmt);
}

at::Tensor neuron_empty_strided(c10::IntArrayRef size, c10::IntArrayRef stride, std::optional<at::ScalarType> dtype,
                                std::optional<at::Layout> layout, std::optional<at::Device> device,
                                std::optional<bool>) {
  check_strided(layout);
  c10::DeviceGuard guard(c10::Device(kNeuron, index_of(device)));
  return at::detail::empty_strided_generic(size, stride, device_allocator(),
                                           c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
                                           c10::dtype_or_default(dtype));
}

at::Tensor neuron_efficientzerotensor(c10::IntArrayRef size, std::optional<at::ScalarType> dtype,
                                      std::optional<at::Layout>, std::optional<at::Device> device,
                                      std::optional<bool>) {
  const auto d = c10::Device(kNeuron, index_of(device));
  at::native::ZeroTensorAllocator allocator(d);
  auto ks = c10::DispatchKeySet(c10::DispatchKey::PrivateUse1) | c10::DispatchKeySet(c10::DispatchKey::ZeroTensor);
  return at::detail::empty_generic(size, &allocator, ks, c10::dtype_or_default(dtype), std::nullopt);
}

bool plain_same_layout(const at::Tensor& a, const at::Tensor& b) {
  return a.scalar_type() == b.scalar_type() && a.sizes() == b.sizes() && a.is_contiguous() && b.is_contiguous() &&
         !a.is_conj() && !b.is_conj() && !a.is_neg() && !b.is_neg();
}

// Host<->device and device<->device copies (copy_ routes them here).
at::Tensor neuron_copy_from(const at::Tensor& self, const at::Tensor& dst, bool) {
  if (self.numel() == 0 && dst.numel() == 0) return dst;
  if (plain_same_layout(self, dst)) {
    runtime().copy(dst.data_ptr(), self.data_ptr(), dst.nbytes());
    return dst;
  }
  // Conversions, broadcasting and strided layouts: CPU's copy kernel on views.
  const auto dev = dst.device().type() == kNeuron ? dst.device().index() : self.device().index();
  AliasTable table;
  auto cdst = dst.device().type() == kNeuron ? table.alias(dst) : dst;
  auto csrc = self.device().type() == kNeuron ? table.alias(self) : self;
  ChargeCpuAllocationsTo charge(dev);
  cdst.copy_(csrc);
  return dst;
}

at::Tensor neuron_copy_from_and_resize(const at::Tensor& self, const at::Tensor& dst) {
  dst.resize_(self.sizes());
  return neuron_copy_from(self, dst, false);
}

const at::Tensor& neuron_resize_(const at::Tensor& self, c10::IntArrayRef size, std::optional<at::MemoryFormat> fmt) {
  c10::DeviceGuard guard(self.device());
  return at::native::resize_(self, size, fmt);
}

at::Tensor& neuron_set_storage_(at::Tensor& self, at::Storage source, int64_t offset, c10::IntArrayRef size,
                                c10::IntArrayRef stride) {
  c10::DeviceGuard guard(self.device());
  return at::native::set_storage_cpu_(self, std::move(source), offset, size, stride);
}

at::Tensor& neuron_set_empty_(at::Tensor& self) {
  c10::DeviceGuard guard(self.device());
  at::Storage storage(at::Storage::use_byte_size_t(), 0, device_allocator(), /*resizable=*/true);
  return self.set_(storage, 0, {0}, {});
}

// CPU's native_dropout draws from CPU's default generator; draw from the
// device's generator instead (same algorithm, so same stream for same seed).
std::tuple<at::Tensor, at::Tensor> neuron_native_dropout(const at::Tensor& input, double p, std::optional<bool> train) {
  if (input.numel() == 0) return {input, at::empty_like(input, input.options())};
  if (!train.has_value() || *train) {
    const double p1m = 1. - p;
    const double scale = p1m == 0 ? 0. : 1. / p1m;
    auto mask = at::empty_like(input, input.options().dtype(at::kBool));
    mask.bernoulli_(p1m, default_generator(input.device().index()));
    return {input.mul(mask).mul_(scale), mask};
  }
  return {input.clone(), at::ones_like(input, input.options().dtype(at::kBool))};
}

// Integer histc, as CUDA supports it (CPU rejects integers); transformers'
// mixture-of-experts routing calls it on every non-CPU device.
template <typename T>
void int_histc(const at::Tensor& in, at::Tensor& hist, int64_t bins, T lo, T hi) {
  auto* out = hist.data_ptr<T>();
  const auto* data = in.data_ptr<T>();
  const int64_t n = in.numel();
  if (lo == hi && n > 0) {
    lo = *std::min_element(data, data + n);
    hi = *std::max_element(data, data + n);
  }
  if (lo == hi) {
    lo = lo - 1;
    hi = hi + 1;
  }
  for (int64_t i = 0; i < n; ++i) {
    const T v = data[i];
    if (v < lo || v > hi) continue;
    int64_t b = static_cast<int64_t>((static_cast<int64_t>(v) - lo) * bins / (static_cast<int64_t>(hi) - lo));
    if (b == bins) b -= 1;
    out[b] += 1;
  }
}

void neuron_histc(const c10::OperatorHandle& op, c10::DispatchKeySet ks, torch::jit::Stack* stack) {
  const size_t nargs = op.schema().arguments().size();
  const at::Tensor self = (*stack)[stack->size() - nargs].toTensor();
  if (!c10::isIntegralType(self.scalar_type(), /*includeBool=*/false)) return cpu_fallback(op, ks, stack);
  const int64_t bins = (*stack)[stack->size() - nargs + 1].toInt();
  const double min = (*stack)[stack->size() - nargs + 2].toScalar().toDouble();
  const double max = (*stack)[stack->size() - nargs + 3].toScalar().toDouble();
  TORCH_CHECK(bins > 0, "bins must be > 0");
  TORCH_CHECK(min <= max, "max must be larger than min");
  const bool has_out = nargs == 5;
  at::Tensor hist = has_out ? (*stack)[stack->size() - 1].toTensor() : at::Tensor();
  if (has_out) {
    hist.resize_({bins});
    hist.zero_();
  } else {
    hist = at::zeros({bins}, self.options());
  }
  auto cin = cpu_view_of(self.contiguous());
  auto chist = cpu_view_of(hist);
  AT_DISPATCH_INTEGRAL_TYPES(self.scalar_type(), "histc_neuron", [&] {
    int_histc<scalar_t>(cin, chist, bins, static_cast<scalar_t>(min), static_cast<scalar_t>(max));
  });
  torch::jit::drop(*stack, nargs);
  torch::jit::push(*stack, hist);
}

bool neuron_has_compatible_shallow_copy_type(const at::Tensor& self, const at::Tensor& from) {
  // Dense CPU <-> neuron tensors are interchangeable under `param.data = t`,
  // as CPU <-> CUDA are; without this, module.to("neuron") unties weights.
  auto dense = [](const at::Tensor& t) {
    return t.layout() == c10::kStrided && !t.is_quantized() && !t.is_nested() &&
           (t.device().type() == kNeuron || t.device().type() == c10::kCPU);
  };
  if (dense(self) && dense(from)) return true;
  return self.unsafeGetTensorImpl()->has_compatible_shallow_copy_type(from.key_set());
}

int64_t neuron_sdp_choice(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                          const std::optional<at::Tensor>& mask, double dropout, bool causal,
                          std::optional<double> scale, bool gqa) {
  // Exactly CPU's choice (flash kernel for CPU, math when it does not apply).
  return at::native::_fused_sdp_choice_cpp(q, k, v, mask, dropout, causal, scale, gqa);
}

// CPU's oneDNN convolution may answer in channels-last; torch.compile's fake
// convolution predicts contiguous results for a device without a dedicated
// conv backend (as for every "Overrideable" backend), and compiled code
// asserts those strides. Return what the compiler predicts.
void neuron_convolution(const c10::OperatorHandle& op, c10::DispatchKeySet ks, torch::jit::Stack* stack) {
  cpu_fallback(op, ks, stack);
  const size_t nrets = op.schema().returns().size();
  for (size_t i = stack->size() - nrets; i < stack->size(); ++i) {
    c10::IValue& v = (*stack)[i];
    if (v.isTensor() && v.toTensor().defined() && !v.toTensor().is_contiguous()) v = v.toTensor().contiguous();
  }
}

void record_stream_noop(at::Tensor&, c10::Stream) {}

}  // namespace

// As on CUDA: the op is numerically unsafe under autocast.
at::Tensor binary_cross_entropy_banned(const at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&,
                                       int64_t) {
  TORCH_CHECK(false,
              "torch.nn.functional.binary_cross_entropy and torch.nn.BCELoss are unsafe to autocast.\n"
              "Many models use a sigmoid layer right before the binary cross entropy layer.\n"
              "In this case, combine the two layers using torch.nn.functional.binary_cross_entropy_with_logits\n"
              "or torch.nn.BCEWithLogitsLoss.  binary_cross_entropy_with_logits and BCEWithLogits are\n"
              "safe to autocast.");
}

}  // namespace neuron

using namespace neuron;

namespace at::native {
REGISTER_PRIVATEUSE1_DISPATCH(_fused_sdp_choice_stub, &neuron::neuron_sdp_choice)
}

TORCH_LIBRARY_IMPL(_, PrivateUse1, m) { m.fallback(torch::CppFunction::makeFromBoxedFunction<&cpu_fallback>()); }

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("empty.memory_format", TORCH_FN(neuron_empty));
  m.impl("empty_strided", TORCH_FN(neuron_empty_strided));
  m.impl("_efficientzerotensor", TORCH_FN(neuron_efficientzerotensor));
  m.impl("_copy_from", TORCH_FN(neuron_copy_from));
  m.impl("_copy_from_and_resize", TORCH_FN(neuron_copy_from_and_resize));
  m.impl("resize_", TORCH_FN(neuron_resize_));
  m.impl("as_strided", TORCH_FN(at::native::as_strided_tensorimpl));
  m.impl("view", TORCH_FN(at::native::view));
  m.impl("_reshape_alias", TORCH_FN(at::native::_reshape_alias));
  m.impl("set_.source_Storage", TORCH_FN(at::native::set_));
  m.impl("set_.source_Storage_storage_offset", TORCH_FN(neuron_set_storage_));
  m.impl("set_.source_Tensor", TORCH_FN(at::native::set_tensor_));
  m.impl("set_", TORCH_FN(neuron_set_empty_));
  m.impl("_local_scalar_dense", TORCH_FN(at::native::_local_scalar_dense_cpu));
  m.impl("native_dropout", TORCH_FN(neuron_native_dropout));
  m.impl("record_stream", TORCH_FN(record_stream_noop));
  m.impl("histc", torch::CppFunction::makeFromBoxedFunction<&neuron_histc>());
  m.impl("histc.out", torch::CppFunction::makeFromBoxedFunction<&neuron_histc>());
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
  m.impl("convolution", torch::CppFunction::makeFromBoxedFunction<&neuron_convolution>());
  m.impl("convolution_backward", torch::CppFunction::makeFromBoxedFunction<&neuron_convolution>());
}

namespace neuron {
namespace {
void reject_sparse(const c10::OperatorHandle& op, c10::DispatchKeySet, torch::jit::Stack*) {
  TORCH_CHECK_NOT_IMPLEMENTED(false, "'", op.schema().name(), "' on a sparse neuron tensor: Trainium has no sparse "
                              "kernels, so neuron supports only strided (dense) tensors. Keep sparse tensors on "
                              "CPU and move dense results with .to('neuron').");
}
}  // namespace
}  // namespace neuron

TORCH_LIBRARY_IMPL(_, SparsePrivateUse1, m) { m.fallback(torch::CppFunction::makeFromBoxedFunction<&reject_sparse>()); }
TORCH_LIBRARY_IMPL(_, SparseCsrPrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&reject_sparse>());
}

TORCH_LIBRARY_IMPL(aten, AutogradPrivateUse1, m) {
  m.impl("_has_compatible_shallow_copy_type", TORCH_FN(neuron_has_compatible_shallow_copy_type));
}

// copy_ between conjugate/negative views would otherwise re-enter copy_ from
// the Conjugate/Negative fallbacks forever.
TORCH_LIBRARY_IMPL(aten, Conjugate, m) {
  m.impl("_copy_from", torch::CppFunction::makeFallthrough());
  m.impl("_copy_from_and_resize", torch::CppFunction::makeFallthrough());
}
TORCH_LIBRARY_IMPL(aten, Negative, m) {
  m.impl("_copy_from", torch::CppFunction::makeFallthrough());
  m.impl("_copy_from_and_resize", torch::CppFunction::makeFallthrough());
}

// Autocast with CUDA's op policy.
TORCH_LIBRARY_IMPL(_, AutocastPrivateUse1, m) { m.fallback(torch::CppFunction::makeFallthrough()); }

namespace at::autocast {
#define ADD_NS(RAW_OP) at::RAW_OP
TORCH_LIBRARY_IMPL(aten, AutocastPrivateUse1, m) {
#define _NEURON_LOW(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, lower_precision_fp)
  AT_FORALL_LOWER_PRECISION_FP(_NEURON_LOW)
#define _NEURON_FP32(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, fp32)
  AT_FORALL_FP32(_NEURON_FP32)
#define _NEURON_FP32_OPT(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, fp32_set_opt_dtype)
  AT_FORALL_FP32_SET_OPT_DTYPE(_NEURON_FP32_OPT)
  AT_FORALL_DIFFERENT_REDISPATCH_SIGNATURE(KERNEL_DIFFERENT_REDISPATCH_SIGNATURE_PRIVATEUSEONE)
#define _NEURON_PROMOTE(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, promote)
  AT_FORALL_PROMOTE(_NEURON_PROMOTE)
  m.impl(TORCH_SELECTIVE_NAME("aten::binary_cross_entropy"), TORCH_FN(neuron::binary_cross_entropy_banned));
}
}  // namespace at::autocast

// Ops with both a CPU kernel and a device-generic composite would run the
// composite on neuron (different numerics, or meta + out= round trips): send
// them to the CPU kernel like everything else.
namespace neuron {
int register_cpu_kernel_routes() {
  static std::vector<std::unique_ptr<torch::Library>> libs;
  static int count = -1;
  if (count >= 0) return count;
  count = 0;
  auto lib = std::make_unique<torch::Library>(torch::Library::IMPL, "aten", c10::DispatchKey::PrivateUse1,
                                              __FILE__, __LINE__);
  auto& d = c10::Dispatcher::singleton();
  for (const auto& name : d.getAllOpNames()) {
    if (name.name.rfind("aten::", 0) != 0) continue;
    auto op = d.findOp(name);
    if (!op) continue;
    if (op->hasKernelForDispatchKey(c10::DispatchKey::PrivateUse1)) continue;
    if (!op->hasKernelForDispatchKey(c10::DispatchKey::CPU)) continue;
    if (!op->hasKernelForDispatchKey(c10::DispatchKey::CompositeExplicitAutograd) &&
        !op->hasKernelForDispatchKey(c10::DispatchKey::CompositeExplicitAutogradNonFunctional) &&
        !op->hasKernelForDispatchKey(c10::DispatchKey::CompositeImplicitAutograd))
      continue;
    std::string full = name.name + (name.overload_name.empty() ? "" : "." + name.overload_name);
    lib->impl(full.c_str(), torch::CppFunction::makeFromBoxedFunction<&cpu_fallback>());
    ++count;
  }
  libs.push_back(std::move(lib));
  return count;
}
}  // namespace neuron
