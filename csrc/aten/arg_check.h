// The argument checks of both fallback paths. Inline: once per argument.
#pragma once

#include <ATen/ATen.h>

#include <string>

#include "aten/fidelity.h"
#include "aten/op_meta.h"
#include "device/device.h"

namespace neuron {

[[noreturn]] inline void device_mismatch(const OpMeta& meta, const c10::FunctionSchema& schema, size_t arg,
                                         const at::Device& bad, const at::Device& expected) {
  // An out= tensor elsewhere: CUDA's words for it (structured kernels' check).
  if (schema.arguments()[arg].is_out())
    TORCH_CHECK(false, "Expected out tensor to have device ", expected, ", but got ", bad, " instead (",
                schema.arguments()[arg].name(), " of ", meta.name, ")");
  TORCH_CHECK(false, "Expected all tensors to be on the same device, but got ", schema.arguments()[arg].name(),
              " is on ", bad, ", different from other tensors on ", expected, " (when checking argument in method ",
              meta.name, ")");
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
      TORCH_CHECK_NOT_IMPLEMENTED(t.layout() == c10::kStrided, "neuron supports only strided tensors (", meta_.name,
                                  ")");
      return true;
    }
    // A 0-dim CPU tensor passes as a scalar operand, never as one the op writes.
    const bool cpu_scalar = t.device().type() == c10::kCPU && t.dim() == 0 && !writes(i);
    if (!(cpu_scalar || (t.device().type() == c10::kCPU && allow_cpu)) && bad_arg_ < 0) {
      bad_arg_ = i;
      bad_device_ = t.device();
    }
    return false;
  }

  bool writes(int i) const {
    const auto* alias = schema_.arguments()[i].alias_info();
    return alias != nullptr && alias->isWrite();
  }

  // A `device=neuron[:i]` argument.
  void saw_device(c10::DeviceIndex index) {
    if (dev_ < 0) dev_ = index;
  }

  // No neuron tensor and no `device=neuron` among the arguments (so far).
  bool saw_no_neuron() const { return dev_ < 0; }

  // After all arguments: the op's device (the current one if no argument
  // named it), a recorded mismatch raised, the op counted and fallbacks noted.
  c10::DeviceIndex finish() {
    if (dev_ < 0) dev_ = current_device();
    if (bad_arg_ >= 0) device_mismatch(meta_, schema_, bad_arg_, bad_device_, at::Device(kNeuron, dev_));
    meta_.executed.fetch_add(1, std::memory_order_relaxed);
    if (meta_.no_native_lowering || odd_dtype_)
      record_fallback(meta_, fallback_reason(meta_.no_native_lowering, odd_dtype_));
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

}  // namespace neuron
