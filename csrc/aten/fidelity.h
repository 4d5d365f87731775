// Fidelity accounting: which ops ran through a CPU fallback that the real
// Trainium stack would not run natively, and why (torch_neuronx.ops_tracking).
#pragma once

#include <c10/core/ScalarType.h>

#include <map>
#include <set>
#include <string>
#include <utility>

#include "aten/op_meta.h"

namespace neuron {

// The name of a dtype Trainium does not compute in natively, else nullptr.
// Inline: asked for every neuron tensor argument.
inline const char* non_native_dtype(at::ScalarType t) {
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

// Why an op would not run natively on Trainium, or "" when it would: the one
// wording of the reasons, for the fallback paths and the dry run (which runs no
// fallback but reports what a real run would).
std::string fallback_reason(bool no_native_lowering, const char* non_native_dtype_name);

// Records a fallback of the op (warning once per op); raises under
// TORCH_NEURONX_STRICT_FALLBACK=1.
void record_fallback(OpMeta& meta, const std::string& reason);
// This thread's count of fallback calls: a caller that runs an op reads it before
// and after to tell whether the op (or a kernel inside it) fell back, and only
// then asks for the reason (the count alone copies no string on every op).
int64_t fallback_count();
// The reason of this thread's latest fallback ("" before the first).
std::string last_fallback_reason();
// op -> reasons, since the last clear.
std::map<std::string, std::set<std::string>> fallback_ops();
// Forgets counts, fallbacks and warnings; re-reads TORCH_NEURONX_STRICT_FALLBACK.
void clear_op_tracking();

}  // namespace neuron
