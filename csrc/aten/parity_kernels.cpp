// Explicit kernels of ops that PyTorch routes by device type, so that
// numerics and kernel choices on neuron equal CPU's, and random ops draw from
// the neuron generator.
#include <ATen/ATen.h>
#include <ATen/native/DispatchStub.h>
#include <ATen/native/transformers/attention.h>
#include <ATen/ops/_fused_sdp_choice_native.h>
#include <torch/library.h>

#include <algorithm>
#include <tuple>

#include "aten/alias_pool.h"
#include "aten/fallback.h"
#include "device/generator.h"

namespace neuron {
namespace {

// CPU's native_dropout draws from CPU's default generator; draw the mask from
// the device's generator instead (its offset advances as for any random op).
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

}  // namespace
}  // namespace neuron

namespace at::native {
REGISTER_PRIVATEUSE1_DISPATCH(_fused_sdp_choice_stub, &neuron::neuron_sdp_choice)
}

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("native_dropout", TORCH_FN(neuron::neuron_native_dropout));
  m.impl("histc", torch::CppFunction::makeFromBoxedFunction<&neuron::neuron_histc>());
  m.impl("histc.out", torch::CppFunction::makeFromBoxedFunction<&neuron::neuron_histc>());
  // mode.values is a composite that refuses device types other than CPU, CUDA
  // and XPU; run it as CPU runs it.
  m.impl("mode.values", torch::CppFunction::makeFromBoxedFunction<&neuron::cpu_fallback>());
  // Composites that route by device type to kernels that do not exist here.
  m.impl("convolution", torch::CppFunction::makeFromBoxedFunction<&neuron::neuron_convolution>());
  m.impl("convolution_backward", torch::CppFunction::makeFromBoxedFunction<&neuron::neuron_convolution>());
}
