// The one walk over a boxed op's arguments and results, for every path that
// runs a boxed op on neuron tensors: the fallback, the nested fallback and the
// collectives (the fast paths walk their unboxed arguments with the same
// ArgCheck); and the run of an op's CPU kernel on the device. Inline: once per
// op.
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>

#include <optional>
#include <utility>

#include "aten/arg_check.h"
#include "aten/op_meta.h"
#include "device/allocator.h"
#include "device/device.h"
#include "profiler/device_events.h"

namespace neuron {

// Every tensor among the `nargs` arguments on top of `stack` (alone or in a
// Tensor[], Tensor?[] or Tensor[][]) passes `check`'s rules, and each neuron
// one is replaced by `to_cpu(t, i)` (i: its argument's index); a
// `device=neuron` argument becomes `cpu`. As in PyTorch's CPUFallback.cpp,
// one pass puts each argument back where it was; the caller's
// `check.finish()` then gives the op's device.
template <class ToCpu>
void walk_args(ArgCheck& check, torch::jit::Stack& stack, size_t nargs, ToCpu&& to_cpu) {
  const size_t base = stack.size() - nargs;
  auto convert = [&](const at::Tensor& t, size_t i, bool allow_cpu) -> at::Tensor {
    return check.is_neuron(t, static_cast<int>(i), allow_cpu) ? to_cpu(t, i) : t;
  };
  auto convert_list = [&](const c10::List<at::Tensor>& list, size_t i) {
    c10::List<at::Tensor> out;
    out.reserve(list.size());
    for (const at::Tensor& t : list) out.push_back(convert(t, i, false));
    return out;
  };
  for (size_t i = 0; i < nargs; ++i) {
    c10::IValue& v = stack[base + i];
    if (v.isTensor()) {
      v = convert(v.toTensor(), i, false);
    } else if (v.isTensorList()) {
      v = convert_list(v.toTensorList(), i);
    } else if (v.isList()) {
      auto list = v.toList();
      if (list.empty()) continue;
      const c10::IValue first = list.get(0);
      if (first.isTensor() || first.isNone()) {  // Tensor?[]
        c10::List<std::optional<at::Tensor>> out;
        out.reserve(list.size());
        const bool allow_cpu = check.cpu_in_optional_lists();
        for (const c10::IValue& e : list)
          out.push_back(e.isTensor() ? std::optional<at::Tensor>(convert(e.toTensor(), i, allow_cpu)) : std::nullopt);
        v = std::move(out);
      } else if (first.isTensorList()) {  // Tensor[][] (c10d's lists of lists)
        c10::impl::GenericList out(list.elementType());
        out.reserve(list.size());
        for (const c10::IValue& e : list) out.push_back(c10::IValue(convert_list(e.toTensorList(), i)));
        v = std::move(out);
      }
    } else if (v.isDevice()) {
      const c10::Device d = v.toDevice();
      if (d.type() == kNeuron) {
        check.saw_device(d.has_index() ? d.index() : current_device());
        v = c10::Device(c10::kCPU);
      }
    }
  }
}

// Every tensor among the `nrets` results on top of `stack` (alone or in a
// list) is replaced by `to_neuron(r)`.
template <class ToNeuron>
void walk_returns(torch::jit::Stack& stack, size_t nrets, ToNeuron&& to_neuron) {
  for (size_t i = stack.size() - nrets; i < stack.size(); ++i) {
    c10::IValue& v = stack[i];
    if (v.isTensor()) {
      v = to_neuron(v.toTensor());
    } else if (v.isTensorList()) {
      auto list = v.toTensorList();
      for (size_t j = 0; j < list.size(); ++j) list.set(j, to_neuron(list.get(j)));
    } else if (v.isList()) {
      auto list = v.toList();
      for (size_t j = 0; j < list.size(); ++j)
        if (list.get(j).isTensor()) list.set(j, to_neuron(list.get(j).toTensor()));
    }
  }
}

// An op's CPU kernel run for device `dev`: what it allocates is charged to
// the device, and its run is one op span of the device in torch.profiler.
template <class Run>
decltype(auto) run_on_device(const OpMeta& meta, c10::DeviceIndex dev, Run&& run) {
  ChargeCpuAllocationsTo charge(dev);
  profiler::DeviceSpan span(profiler::SpanKind::Op, meta.name.c_str(), dev);
  return run();
}

// The same for an op whose result stays on the host (a copy to CPU): one op
// span of the device, allocations left in host memory.
template <class Run>
decltype(auto) run_on_host(const OpMeta& meta, c10::DeviceIndex dev, Run&& run) {
  profiler::DeviceSpan span(profiler::SpanKind::Op, meta.name.c_str(), dev);
  return run();
}

}  // namespace neuron
