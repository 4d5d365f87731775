// The kineto plugin that gives torch.profiler the neuron device's timeline.
//
// PyTorch forwards a registered PrivateUse1 IActivityProfiler to kineto; when
// a profile requests ProfilerActivity.PrivateUse1 (profile(activities=[...,
// ProfilerActivity.PrivateUse1]), use_device="neuron"), kineto configures a
// session of it around the trace. While the session runs, the hooks in the
// op, graph and collective paths record spans; at the end of the trace they
// become CONCURRENT_KERNEL activities (what PyTorch reads as PrivateUse1
// device events), one process per NeuronCore with a row per kind, each linked
// to the CPU op that launched it, so key_averages() attributes device time.
#ifndef USE_KINETO
#define USE_KINETO
#endif
// Kineto's activity classes format with fmt, which libtorch does not export.
#define FMT_HEADER_ONLY

#include "profiler/device_events.h"

#include <c10/util/ApproximateClock.h>
#include <torch/csrc/profiler/standalone/privateuse1_profiler.h>

#include <GenericTraceActivity.h>
#include <IActivityProfiler.h>
#include <libkineto.h>
#include <output_base.h>

#include <memory>
#include <mutex>
#include <set>
#include <vector>

namespace neuron::profiler {

namespace detail {
std::atomic<bool> g_tracing{false};
}

namespace {

struct Span {
  SpanKind kind;
  std::string name;
  int device;
  int64_t start, end;
  uint64_t correlation;
};

std::mutex g_mu;
std::vector<Span> g_spans;  // under g_mu

// Correlation ids kineto pushes around each profiled CPU op (on the op's thread).
thread_local std::vector<uint64_t> tl_correlation;
// Depth of device spans open on this thread (nested ones are not recorded).
thread_local int tl_depth = 0;

const char* kind_name(SpanKind k) {
  switch (k) {
    case SpanKind::Op: return "ops";
    case SpanKind::Graph: return "compiled graphs";
    case SpanKind::Collective: return "collectives";
  }
  return "?";
}

class NeuronSession final : public libkineto::IActivityProfilerSession {
 public:
  void start() override {
    {
      std::lock_guard<std::mutex> lock(g_mu);
      g_spans.clear();
    }
    detail::g_tracing.store(true, std::memory_order_relaxed);
    status_ = libkineto::TraceStatus::RECORDING;
  }
  void stop() override {
    detail::g_tracing.store(false, std::memory_order_relaxed);
    std::lock_guard<std::mutex> lock(g_mu);
    spans_ = std::move(g_spans);
    g_spans.clear();
    status_ = libkineto::TraceStatus::READY;
  }
  std::vector<std::string> errors() override { return {}; }

  void processTrace(libkineto::ActivityLogger& logger) override {
    processTrace(logger, [](int32_t) -> const libkineto::ITraceActivity* { return nullptr; }, 0, 0);
  }

  // getLinkedActivity maps a correlation id to the CPU op's activity: PyTorch
  // reads a device event's launching op from linkedActivity().
  void processTrace(libkineto::ActivityLogger& logger, libkineto::getLinkedActivityCallback getLinkedActivity, int64_t,
                    int64_t) override {
    for (const auto& s : spans_) {
      libkineto::GenericTraceActivity a(span_, libkineto::ActivityType::CONCURRENT_KERNEL, s.name);
      a.startTime = s.start;
      a.endTime = s.end;
      a.device = s.device;
      a.resource = static_cast<int32_t>(s.kind);
      a.id = static_cast<int32_t>(s.correlation);
      if (s.correlation) {
        a.linked = getLinkedActivity(static_cast<int32_t>(s.correlation));
        a.addMetadata("External id", s.correlation);  // unquoted: a number, as for CUDA kernels
      }
      a.addMetadataQuoted("device", "neuron:" + std::to_string(s.device));
      a.addMetadataQuoted("kind", kind_name(s.kind));
      devices_.insert(s.device);
      logger.handleGenericActivity(a);
    }
  }

  std::unique_ptr<libkineto::DeviceInfo> getDeviceInfo() override {
    // One DeviceInfo per session: it names the first core used; the others'
    // rows still carry their resource names.
    const int d = devices_.empty() ? 0 : *devices_.begin();
    return std::make_unique<libkineto::DeviceInfo>(
        libkineto::DeviceInfo{d, d, "neuron:" + std::to_string(d), "NeuronCore (simulated)"});
  }
  std::vector<libkineto::ResourceInfo> getResourceInfos() override {
    std::vector<libkineto::ResourceInfo> out;
    for (int d : devices_)
      for (auto k : {SpanKind::Op, SpanKind::Graph, SpanKind::Collective})
        out.push_back({static_cast<int64_t>(k), static_cast<int64_t>(k), d,
                       std::string("neuron:") + std::to_string(d) + " " + kind_name(k)});
    return out;
  }
  std::unique_ptr<libkineto::CpuTraceBuffer> getTraceBuffer() override { return nullptr; }

  void pushCorrelationId(uint64_t id) override { tl_correlation.push_back(id); }
  void popCorrelationId() override {
    if (!tl_correlation.empty()) tl_correlation.pop_back();
  }

 private:
  libkineto::TraceSpan span_{0, 0, "neuron"};
  std::vector<Span> spans_;
  std::set<int> devices_;
};

class NeuronActivityProfiler final : public libkineto::IActivityProfiler {
 public:
  const std::string& name() const override { return name_; }
  const std::set<libkineto::ActivityType>& availableActivities() const override { return types_; }
  std::unique_ptr<libkineto::IActivityProfilerSession> configure(const std::set<libkineto::ActivityType>& types,
                                                                 const libkineto::Config&) override {
    if (!types.count(libkineto::ActivityType::CONCURRENT_KERNEL)) return nullptr;
    return std::make_unique<NeuronSession>();
  }
  std::unique_ptr<libkineto::IActivityProfilerSession> configure(int64_t, int64_t,
                                                                 const std::set<libkineto::ActivityType>& types,
                                                                 const libkineto::Config& config) override {
    return configure(types, config);
  }

 private:
  std::string name_{"neuron"};
  std::set<libkineto::ActivityType> types_{libkineto::ActivityType::CONCURRENT_KERNEL};
};

REGISTER_PRIVATEUSE1_PROFILER(NeuronActivityProfiler);

}  // namespace

uint64_t current_correlation() { return tl_correlation.empty() ? 0 : tl_correlation.back(); }

int64_t now_ns() { return c10::getTime(); }

void record_span(SpanKind kind, std::string name, c10::DeviceIndex device, int64_t start_ns, int64_t end_ns,
                 uint64_t correlation) {
  if (!device_tracing()) return;
  std::lock_guard<std::mutex> lock(g_mu);
  g_spans.push_back({kind, std::move(name), static_cast<int>(device), start_ns, end_ns, correlation});
}

void DeviceSpan::begin(SpanKind kind, const char* name, c10::DeviceIndex device) {
  if (tl_depth++ > 0) {
    active_ = true;  // only to balance the depth
    name_ = nullptr;
    return;
  }
  active_ = true;
  kind_ = kind;
  name_ = name;
  device_ = device;
  correlation_ = current_correlation();
  start_ = now_ns();
}

void DeviceSpan::end() {
  --tl_depth;
  if (!name_) return;
  record_span(kind_, name_, device_, start_, now_ns(), correlation_);
}

}  // namespace neuron::profiler
