// The registry of OpMeta, keyed by schema.
#include "aten/op_meta.h"

#include <memory>
#include <mutex>
#include <shared_mutex>
#include <unordered_map>

namespace neuron {
namespace {

std::shared_mutex g_meta_mu;
std::unordered_map<const c10::FunctionSchema*, std::unique_ptr<OpMeta>> g_meta;

bool starts_with(const std::string& s, const char* p) { return s.rfind(p, 0) == 0; }

}  // namespace

// Ops with no Trainium lowering in the real system's eager mode: dense linear
// algebra factorizations and solvers run on the host there.
bool lacks_native_lowering(const std::string& name) {
  static const char* prefixes[] = {"aten::linalg_", "aten::_linalg_", "aten::cholesky",
                                   "aten::lu",      "aten::_lu",      "aten::geqrf",
                                   "aten::ormqr",   "aten::orgqr",    "aten::triangular_solve",
                                   "aten::_linalg", "aten::svd",      "aten::_svd",
                                   "aten::qr",      "aten::lstsq",    "aten::eig",
                                   "aten::slogdet", "aten::logdet",   "aten::det",
                                   "aten::inverse"};
  if (name == "aten::linalg_vector_norm" || name == "aten::linalg_matrix_norm" || name == "aten::linalg_norm" ||
      starts_with(name, "aten::linalg_vector_norm") || starts_with(name, "aten::linalg_cross"))
    return false;
  for (const char* p : prefixes)
    if (starts_with(name, p)) return true;
  return false;
}

OpMeta& meta_lookup(const c10::OperatorHandle& op, const c10::FunctionSchema* key) {
  {
    std::shared_lock<std::shared_mutex> lock(g_meta_mu);
    auto it = g_meta.find(key);
    if (it != g_meta.end()) return *it->second;
  }
  auto m = std::make_unique<OpMeta>();
  const auto& schema = op.schema();
  m->name = schema.name() + (schema.overload_name().empty() ? "" : "." + schema.overload_name());
  const auto& args = schema.arguments();
  for (size_t i = 0; i < args.size(); ++i) {
    auto t = args[i].type();
    if (auto opt = t->cast<c10::OptionalType>()) t = opt->getElementType();
    if (t->kind() == c10::TypeKind::GeneratorType) m->generator_args.push_back(static_cast<int>(i));
    m->arg_mutable.push_back(args[i].alias_info() && args[i].alias_info()->isWrite());
  }
  m->cpu_indices_ok = starts_with(m->name, "aten::index") || starts_with(m->name, "aten::_index_put_impl_") ||
                      starts_with(m->name, "aten::_unsafe_index");
  m->no_native_lowering = lacks_native_lowering(m->name);
  std::unique_lock<std::shared_mutex> lock(g_meta_mu);
  auto [it, _] = g_meta.emplace(key, std::move(m));
  return *it->second;
}

std::vector<std::pair<std::string, uint64_t>> executed_ops() {
  std::vector<std::pair<std::string, uint64_t>> out;
  std::shared_lock<std::shared_mutex> lock(g_meta_mu);
  for (auto& [_, m] : g_meta) {
    auto n = m->executed.load();
    if (n) out.emplace_back(m->name, n);
  }
  return out;
}

void reset_op_counters() {
  std::shared_lock<std::shared_mutex> lock(g_meta_mu);
  for (auto& [_, m] : g_meta) {
    m->executed.store(0);
    m->warned.store(false);
  }
}

}  // namespace neuron
