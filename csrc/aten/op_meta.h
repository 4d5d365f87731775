// Metadata of an ATen operator on the `neuron` device, computed once per
// schema: its name, which arguments are generators or written to, and the
// per-op execution counter that torch_neuronx.ops_tracking reads.
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>

#include <atomic>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace neuron {

struct OpMeta {
  std::string name;
  std::vector<int> generator_args;
  std::vector<char> arg_mutable;
  bool cpu_indices_ok = false;  // index ops accept CPU index tensors, as on CUDA
  bool no_native_lowering = false;
  std::atomic<uint64_t> executed{0};
  std::atomic<bool> warned{false};
};

// Ops with no Trainium lowering in the real system's eager mode (they run on the host there).
bool lacks_native_lowering(const std::string& name);

// The registry's entry for `key`, created on first use (thread-safe).
OpMeta& meta_lookup(const c10::OperatorHandle& op, const c10::FunctionSchema* key);

// Inline: called once per op by both fallback paths.
inline OpMeta& meta_for(const c10::OperatorHandle& op) {
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

// (op name, times executed) of every op run since the last reset.
std::vector<std::pair<std::string, uint64_t>> executed_ops();
// Zeroes the execution counts and re-arms the once-per-op warnings.
void reset_op_counters();

}  // namespace neuron
