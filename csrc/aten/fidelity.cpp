// Fidelity accounting of the fallback paths.
#include "aten/fidelity.h"

#include <c10/util/Exception.h>

#include <atomic>
#include <cstdlib>
#include <mutex>

namespace neuron {
namespace {

std::mutex g_track_mu;
std::map<std::string, std::set<std::string>> g_fallbacks;  // op -> reasons
std::atomic<int> g_strict{-1};
// Per thread: an op and the kernels it runs inside it execute on one thread.
thread_local int64_t t_fallback_calls = 0;
thread_local std::string t_last_reason;

bool strict_fallback() {
  int s = g_strict.load();
  if (s < 0) {
    const char* v = std::getenv("TORCH_NEURONX_STRICT_FALLBACK");
    s = (v && std::string(v) != "0" && std::string(v) != "") ? 1 : 0;
    g_strict.store(s);
  }
  return s == 1;
}

}  // namespace

std::string fallback_reason(bool no_native_lowering, const char* non_native_dtype_name) {
  if (no_native_lowering) return "no Trainium lowering";
  if (non_native_dtype_name) return std::string(non_native_dtype_name) + " is not native on Trainium";
  return "";
}

void record_fallback(OpMeta& meta, const std::string& reason) {
  TORCH_CHECK(!strict_fallback(), "Operator '", meta.name, "' is not supported natively on Trainium (", reason,
              ") and TORCH_NEURONX_STRICT_FALLBACK=1 forbids the CPU fallback");
  {
    std::lock_guard<std::mutex> lock(g_track_mu);
    g_fallbacks[meta.name].insert(reason);
  }
  ++t_fallback_calls;
  t_last_reason = reason;
  if (!meta.warned.exchange(true)) {
    TORCH_WARN("Operator '", meta.name, "' executed via CPU fallback (", reason, ")");
  }
}

int64_t fallback_count() { return t_fallback_calls; }

std::string last_fallback_reason() { return t_last_reason; }

std::map<std::string, std::set<std::string>> fallback_ops() {
  std::lock_guard<std::mutex> lock(g_track_mu);
  return g_fallbacks;
}

void clear_op_tracking() {
  reset_op_counters();
  std::lock_guard<std::mutex> lock(g_track_mu);
  g_fallbacks.clear();
  g_strict.store(-1);
}

}  // namespace neuron
