// The boxed fallback. Every op without an explicit kernel or fast path runs
// here: neuron arguments become CPU aliases, the CPU kernel runs with its
// allocations charged to the device, and its results become neuron tensors.
#include "aten/fallback.h"

#include <ATen/ATen.h>

#include "aten/alias_table.h"
#include "aten/arg_walk.h"
#include "aten/nested.h"
#include "aten/op_meta.h"
#include "device/device.h"
#include "device/generator.h"

namespace neuron {
namespace {

// An upper bound on the values a random op draws, known before it runs so the
// generator's offset can be reserved first (as CUDA's Philox offsets are):
// the largest tensor argument (the tensor filled in place, `out=`, or the
// distribution's parameters), else the size a factory op is given, else an
// integer count (randperm's n into a still-empty `out`).
uint64_t random_values_drawn(const torch::jit::Stack& stack, size_t base, size_t nargs) {
  uint64_t most = 0, size = 0, n = 0;
  for (size_t i = base; i < base + nargs; ++i) {
    const c10::IValue& v = stack[i];
    if (v.isTensor()) {
      most = std::max<uint64_t>(most, v.toTensor().numel());
    } else if (v.isTensorList()) {
      for (const at::Tensor& t : v.toTensorList()) most = std::max<uint64_t>(most, t.numel());
    } else if (v.isIntList()) {
      uint64_t p = 1;
      for (int64_t d : v.toIntList()) p *= static_cast<uint64_t>(std::max<int64_t>(d, 0));
      size = std::max(size, p);
    } else if (v.isInt()) {
      n = std::max<uint64_t>(n, static_cast<uint64_t>(std::max<int64_t>(v.toInt(), 0)));
    }
  }
  return most ? most : size ? size : n;
}

// A CPU random op handed a neuron generator (Diffusers' randn_tensor samples on
// CPU with the pipeline's generator whenever the device is neuron). The
// generator lives on the host (AWS: its methods run on the host only), so the
// op draws there from the generator's (seed, offset), advances the offset, and
// its result stays on CPU. False if no generator argument is a neuron one.
bool host_random_op(const c10::OperatorHandle& op, const OpMeta& meta, torch::jit::Stack* stack, size_t base,
                    size_t nargs) {
  bool neuron_gen = false;
  for (int i : meta.generator_args) {
    const c10::IValue& v = (*stack)[base + i];
    neuron_gen |= v.isGenerator() && v.toGenerator().device().type() == kNeuron;
  }
  if (!neuron_gen) return false;
  const uint64_t count = random_values_drawn(*stack, base, nargs);
  for (int i : meta.generator_args) {
    c10::IValue& v = (*stack)[base + i];
    if (v.isGenerator() && v.toGenerator().device().type() == kNeuron) v = cpu_engine_for(v.toGenerator(), count);
  }
  op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::CPU), stack);
  return true;
}

// A kernel that writes an argument may have given its alias another storage
// (set_-style kernels) or other sizes, strides or offset: the neuron tensor
// takes them on.
void sync_written_args(AliasTable& table, c10::SmallVector<Converted, 8>& conv, c10::DeviceIndex dev) {
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

}  // namespace

at::Tensor result_to_neuron(AliasTable& table, const c10::SmallVector<Converted, 8>& conv, const OpMeta& meta,
                            const at::Tensor& r, c10::DeviceIndex dev) {
  if (!r.defined() || r.device().type() != c10::kCPU) return r;
  for (auto& c : conv)
    if (c.cpu.unsafeGetTensorImpl() == r.unsafeGetTensorImpl()) return c.neuron;
  if (r.is_quantized()) reject_quantized(meta.name);
  if (r.is_nested()) return nested_to_neuron(table, r, dev);
  TORCH_CHECK_NOT_IMPLEMENTED(r.layout() == c10::kStrided, "'", meta.name, "' produced a ", r.layout(),
                              " tensor: Trainium has no sparse kernels, so neuron supports only strided "
                              "(dense) tensors. Run this op on CPU (tensor.cpu()) and move the dense "
                              "result back with .to('neuron').");
  return table.neuron_result(r, dev);
}

void cpu_fallback(const c10::OperatorHandle& op, c10::DispatchKeySet, torch::jit::Stack* stack) {
  OpMeta& meta = meta_for(op);
  const auto& schema = op.schema();
  const size_t nargs = schema.arguments().size();
  const size_t base = stack->size() - nargs;

  AliasTable table;
  c10::SmallVector<Converted, 8> conv;
  ArgCheck check(meta, schema);
  walk_args(check, *stack, nargs, [&](const at::Tensor& t, size_t i) -> at::Tensor {
    const at::Tensor& c = table.alias(t);
    conv.push_back({t, c, static_cast<bool>(meta.arg_mutable[i])});
    return c;
  });
  if (!meta.generator_args.empty() && check.saw_no_neuron() && host_random_op(op, meta, stack, base, nargs)) return;
  const c10::DeviceIndex dev = check.finish();

  if (!meta.generator_args.empty()) {
    const uint64_t count = random_values_drawn(*stack, base, nargs);
    for (int i : meta.generator_args) {
      c10::IValue& v = (*stack)[base + i];
      v = cpu_engine_for(v.isNone() ? default_generator(dev) : v.toGenerator(), count);
    }
  }

  run_on_device(meta, dev, [&] { op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::CPU), stack); });
  if (!conv.empty()) sync_written_args(table, conv, dev);
  walk_returns(*stack, schema.returns().size(),
               [&](const at::Tensor& r) { return result_to_neuron(table, conv, meta, r, dev); });
}

}  // namespace neuron
