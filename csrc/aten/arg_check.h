// The argument rules of every path that runs an op on neuron tensors: the
// boxed fallback, the nested fallback, the fast paths and the collectives.
// Inline: once per argument.
#pragma once

#include <ATen/ATen.h>

#include <string>

#include "aten/fidelity.h"
#include "aten/op_meta.h"
#include "device/device.h"

namespace neuron {

// The one wording of a tensor on the wrong device, PyTorch's (CUDA's) own,
// and `hint` after it.
[[noreturn]] inline void device_mismatch(const std::string& op_name, const c10::FunctionSchema& schema, size_t arg,
                                         const at::Device& bad, const at::Device& expected, const char* hint = "") {
  // An out= tensor elsewhere: CUDA's words for it (structured kernels' check).
  if (schema.arguments()[arg].is_out())
    TORCH_CHECK(false, "Expected out tensor to have device ", expected, ", but got ", bad, " instead (",
                schema.arguments()[arg].name(), " of ", op_name, ")");
  TORCH_CHECK(false, "Expected all tensors to be on the same device, but got ", schema.arguments()[arg].name(),
              " is on ", bad, ", different from other tensors on ", expected, " (when checking argument in method ",
              op_name, ")", hint);
}

// The argument rules, in PyTorch's terms: every neuron tensor on one device,
// strided layouts only, and CPU tensors only as 0-dim scalar operands (as on
// CUDA) or where the op allows them (index tensors of index ops). A collective
// sends or receives every tensor it is given, so none of its tensors is a
// scalar operand and a CPU tensor is always on the wrong device (as NCCL's
// "tensors must be CUDA"). An op (not a collective) is then counted, and its
// fallback recorded, once its device is known.
class ArgCheck {
 public:
  // An ATen op: counted in its OpMeta, CPU scalars allowed.
  ArgCheck(OpMeta& meta, const c10::FunctionSchema& schema)
      : meta_(&meta), name_(meta.name), schema_(schema), cpu_scalars_(true) {}

  // A c10d collective, named `name`: no CPU tensor at all, nothing counted.
  static ArgCheck collective(const std::string& name, const c10::FunctionSchema& schema) {
    return ArgCheck(name, schema);
  }

  // True for a neuron tensor, which then needs an alias.
  bool is_neuron(const at::Tensor& t, int i, bool allow_cpu = false) {
    if (!t.defined()) return false;
    if (t.device().type() == kNeuron) {
      if (auto* r = non_native_dtype(t.scalar_type())) odd_dtype_ = r;
      if (dev_ < 0) {
        dev_ = t.device().index();
      } else if (t.device().index() != dev_) {
        device_mismatch(name_, schema_, i, t.device(), at::Device(kNeuron, dev_), meta_ ? "" : kCollectiveHint);
      }
      TORCH_CHECK_NOT_IMPLEMENTED(t.layout() == c10::kStrided, "neuron supports only strided tensors (", name_, ")");
      return true;
    }
    // A 0-dim CPU tensor passes as a scalar operand, never as one the op writes.
    const bool cpu = t.device().type() == c10::kCPU;
    const bool cpu_scalar = cpu && cpu_scalars_ && t.dim() == 0 && !writes(i);
    if (!(cpu_scalar || (cpu && (allow_cpu || cpu_anywhere_))) && bad_arg_ < 0) {
      bad_arg_ = i;
      bad_device_ = t.device();
    }
    return false;
  }

  bool writes(int i) const {
    const auto* alias = schema_.arguments()[i].alias_info();
    return alias != nullptr && alias->isWrite();
  }

  // A copy between devices (nested tensors' .to(), copy_) takes CPU tensors
  // anywhere: moving them is what it is for.
  void allow_cpu_tensors() { cpu_anywhere_ = true; }

  // CPU tensors pass in the op's Tensor?[] arguments (index ops' indices).
  bool cpu_in_optional_lists() const { return meta_ && meta_->cpu_indices_ok; }

  // A `device=neuron[:i]` argument.
  void saw_device(c10::DeviceIndex index) {
    if (dev_ < 0) dev_ = index;
  }

  // No neuron tensor and no `device=neuron` among the arguments (so far).
  bool saw_no_neuron() const { return dev_ < 0; }

  // After all arguments: the op's device (the current one if no argument
  // named it), a recorded mismatch raised, an op counted and its fallback noted.
  c10::DeviceIndex finish() {
    if (dev_ < 0) dev_ = current_device();
    if (bad_arg_ >= 0)
      device_mismatch(name_, schema_, bad_arg_, bad_device_, at::Device(kNeuron, dev_), meta_ ? "" : kCollectiveHint);
    if (meta_) {
      meta_->executed.fetch_add(1, std::memory_order_relaxed);
      if (meta_->no_native_lowering || odd_dtype_)
        record_fallback(*meta_, fallback_reason(meta_->no_native_lowering, odd_dtype_));
    }
    return dev_;
  }

 private:
  ArgCheck(const std::string& name, const c10::FunctionSchema& schema)
      : meta_(nullptr), name_(name), schema_(schema), cpu_scalars_(false) {}

  // A collective has no CPU fallback for a stray tensor: say how to fix it.
  static constexpr const char* kCollectiveHint =
      ". A collective sends or receives every tensor it is given on one device: move the tensor with "
      ".to('neuron') (or run the whole collective on CPU tensors)";

  OpMeta* meta_;  // null for a collective
  const std::string& name_;
  const c10::FunctionSchema& schema_;
  const bool cpu_scalars_;
  bool cpu_anywhere_ = false;
  c10::DeviceIndex dev_ = -1;
  int bad_arg_ = -1;  // a CPU tensor (not a scalar operand) next to neuron tensors
  at::Device bad_device_{c10::kCPU};
  const char* odd_dtype_ = nullptr;
};

}  // namespace neuron
