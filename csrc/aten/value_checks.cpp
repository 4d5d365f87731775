// Composites that skip CPU's value checks on PrivateUse1 (CUDA relies on a
// device-side assert instead): neuron makes the checks and raises CPU's errors.
#include <ATen/ATen.h>
#include <ATen/ops/one_hot_native.h>
#include <torch/library.h>

namespace neuron {
namespace {

at::Tensor neuron_one_hot(const at::Tensor& self, int64_t num_classes) {
  if (self.dtype() == at::kLong && self.numel() > 0) {
    TORCH_CHECK(self.min().item<int64_t>() >= 0, "Class values must be non-negative.");
    if (num_classes != -1)
      TORCH_CHECK(num_classes > self.max().item<int64_t>(), "Class values must be smaller than num_classes.");
  }
  return at::native::one_hot(self, num_classes);
}

}  // namespace
}  // namespace neuron

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) { m.impl("one_hot", TORCH_FN(neuron::neuron_one_hot)); }
