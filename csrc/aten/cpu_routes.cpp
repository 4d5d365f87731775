// Ops with both a CPU kernel and a device-generic composite would run the
// composite on neuron (different numerics, or meta + out= round trips): send
// them to the CPU kernel like everything else. Likewise for nested tensors:
// ops with a NestedTensorCPU kernel and a composite go to the nested fallback.
#include <torch/library.h>

#include <memory>
#include <string>
#include <vector>

#include "aten/fallback.h"
#include "aten/nested.h"

namespace neuron {

int register_cpu_kernel_routes() {
  static std::vector<std::unique_ptr<torch::Library>> libs;
  static int count = -1;
  if (count >= 0) return count;
  count = 0;
  auto lib =
      std::make_unique<torch::Library>(torch::Library::IMPL, "aten", c10::DispatchKey::PrivateUse1, __FILE__, __LINE__);
  auto nested = std::make_unique<torch::Library>(torch::Library::IMPL, "aten",
                                                 c10::DispatchKey::NestedTensorPrivateUse1, __FILE__, __LINE__);
  auto& d = c10::Dispatcher::singleton();
  for (const auto& name : d.getAllOpNames()) {
    if (name.name.rfind("aten::", 0) != 0) continue;
    auto op = d.findOp(name);
    if (!op) continue;
    if (!op->hasKernelForDispatchKey(c10::DispatchKey::CompositeExplicitAutograd) &&
        !op->hasKernelForDispatchKey(c10::DispatchKey::CompositeExplicitAutogradNonFunctional) &&
        !op->hasKernelForDispatchKey(c10::DispatchKey::CompositeImplicitAutograd))
      continue;
    std::string full = name.name + (name.overload_name.empty() ? "" : "." + name.overload_name);
    if (op->hasKernelForDispatchKey(c10::DispatchKey::NestedTensorCPU) &&
        !op->hasKernelForDispatchKey(c10::DispatchKey::NestedTensorPrivateUse1)) {
      nested->impl(full.c_str(), torch::CppFunction::makeFromBoxedFunction<&nested_fallback>());
      ++count;
    }
    if (op->hasKernelForDispatchKey(c10::DispatchKey::PrivateUse1)) continue;
    if (!op->hasKernelForDispatchKey(c10::DispatchKey::CPU)) continue;
    lib->impl(full.c_str(), torch::CppFunction::makeFromBoxedFunction<&cpu_fallback>());
    ++count;
  }
  libs.push_back(std::move(lib));
  libs.push_back(std::move(nested));
  return count;
}
}  // namespace neuron
