// Reads the Neuron environment variables into an InstanceInfo, with errors
// that name the variable, its value and what is allowed.
#include "runtime/instance.h"

#include <algorithm>
#include <cstdlib>
#include <set>
#include <sstream>

namespace neuron::rt {
namespace {

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v ? std::string(v) : std::string();
}

std::string trim(const std::string& s) {
  auto b = s.find_first_not_of(" \t");
  auto e = s.find_last_not_of(" \t");
  return b == std::string::npos ? std::string() : s.substr(b, e - b + 1);
}

int parse_int(const std::string& var, const std::string& text) {
  std::string t = trim(text);
  if (t.empty() || t.find_first_not_of("0123456789") != std::string::npos)
    throw ConfigError(var + "='" + env(var.c_str()) + "' is invalid: expected a non-negative integer, got '" + t + "'");
  try {
    return std::stoi(t);
  } catch (...) {
    throw ConfigError(var + "='" + env(var.c_str()) + "' is out of range");
  }
}

// "0-3", "1,3", "0-1,4" -> sorted unique ids. Every id and range bound is
// checked against `limit` before a range is expanded: a huge range must fail
// at once, not after allocating every id in it.
std::vector<int> parse_core_list(const std::string& var, const std::string& text, int limit,
                                 const std::string& limit_text) {
  std::set<int> ids;
  std::stringstream ss(text);
  std::string part;
  auto check = [&](int id) {
    if (id >= limit)
      throw ConfigError(var + "='" + text + "' names core " + std::to_string(id) + ", but " + limit_text);
    return id;
  };
  while (std::getline(ss, part, ',')) {
    part = trim(part);
    auto dash = part.find('-');
    if (dash == std::string::npos) {
      ids.insert(check(parse_int(var, part)));
    } else {
      int lo = parse_int(var, part.substr(0, dash));
      int hi = parse_int(var, part.substr(dash + 1));
      if (hi < lo) throw ConfigError(var + "='" + text + "' is invalid: range '" + part + "' is decreasing");
      check(hi);
      for (int i = lo; i <= hi; ++i) ids.insert(i);
    }
  }
  if (ids.empty()) throw ConfigError(var + "='" + text + "' is invalid: no cores listed");
  return {ids.begin(), ids.end()};
}

}  // namespace

InstanceInfo describe_instance() {
  InstanceInfo info;
  std::string itype = trim(env("TORCH_NEURONX_INSTANCE_TYPE"));
  if (itype.empty()) itype = kDefaultInstanceType;
  const std::vector<InstanceType> types = instance_types();
  const InstanceType* found = nullptr;
  for (const auto& t : types)
    if (itype == t.name) found = &t;
  if (!found) {
    std::string known;
    for (const auto& t : types) known += std::string(known.empty() ? "" : ", ") + t.name;
    throw ConfigError("TORCH_NEURONX_INSTANCE_TYPE='" + itype + "' is not a known instance type (known: " + known +
                      ")");
  }
  info.instance_type = itype;
  info.chip = chip_spec(found->chip);
  info.num_chips = found->chips;

  const std::string lnc_env = env("NEURON_LOGICAL_NC_CONFIG");
  info.lnc = lnc_env.empty() ? info.chip.lnc_default : parse_int("NEURON_LOGICAL_NC_CONFIG", lnc_env);
  if (std::find(info.chip.lnc_allowed.begin(), info.chip.lnc_allowed.end(), info.lnc) == info.chip.lnc_allowed.end()) {
    std::string allowed;
    for (int v : info.chip.lnc_allowed) allowed += (allowed.empty() ? "" : " or ") + std::to_string(v);
    throw ConfigError("NEURON_LOGICAL_NC_CONFIG='" + lnc_env + "' is not supported on " + info.chip.name +
                      " (expected " + allowed + ")");
  }
  const int per_chip = info.chip.physical_cores / info.lnc;
  info.logical_cores_total = per_chip * info.num_chips;
  const uint64_t hbm_per_core = info.chip.hbm_bytes / per_chip;

  std::vector<int> ids;
  const std::string visible = env("NEURON_RT_VISIBLE_CORES");
  if (!visible.empty()) {
    ids = parse_core_list("NEURON_RT_VISIBLE_CORES", visible, info.logical_cores_total,
                          itype + " at LNC=" + std::to_string(info.lnc) + " has " +
                              std::to_string(info.logical_cores_total) + " logical cores (0-" +
                              std::to_string(info.logical_cores_total - 1) + ")");
  } else {
    for (int i = 0; i < info.logical_cores_total; ++i) ids.push_back(i);
  }
  const std::string num = env("NEURON_RT_NUM_CORES");
  if (!num.empty()) {
    int n = parse_int("NEURON_RT_NUM_CORES", num);
    if (n < 1 || n > static_cast<int>(ids.size()))
      throw ConfigError("NEURON_RT_NUM_CORES='" + num + "' is invalid: between 1 and " + std::to_string(ids.size()) +
                        " cores are available");
    ids.resize(n);
  }
  for (size_t i = 0; i < ids.size(); ++i) {
    CoreInfo c;
    c.index = static_cast<int>(i);
    c.logical_id = ids[i];
    c.chip = ids[i] / per_chip;
    for (int p = 0; p < info.lnc; ++p) c.physical_cores.push_back(ids[i] * info.lnc + p);
    c.hbm_capacity = hbm_per_core;
    info.visible.push_back(std::move(c));
  }
  return info;
}

}  // namespace neuron::rt
