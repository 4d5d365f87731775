// Recording of device memory history and CUDA-format snapshots (see
// memory_history.h). Python API: torch.neuron.memory._record_memory_history,
// _snapshot, _dump_snapshot.
#include "profiler/memory_history.h"

#include "profiler/python.h"
#include "runtime/runtime.h"

#include <torch/csrc/profiler/combined_traceback.h>

#include <chrono>
#include <deque>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

// From torch/csrc/profiler/python/combined_traceback.h (libtorch_python), whose
// header needs nlohmann/json, which torch does not install.
namespace torch {
std::vector<pybind11::object> py_symbolize(std::vector<CapturedTraceback*>& to_symbolize);
void installCapturedTracebackPython();
}  // namespace torch

namespace neuron::profiler {

namespace detail {
std::atomic<bool> g_mem_recording{false};
}

namespace {

enum class Action { Alloc, FreeRequested, FreeCompleted, Oom };

const char* action_name(Action a) {
  switch (a) {
    case Action::Alloc: return "alloc";
    case Action::FreeRequested: return "free_requested";
    case Action::FreeCompleted: return "free_completed";
    case Action::Oom: return "oom";
  }
  return "?";
}

using Traceback = std::shared_ptr<torch::CapturedTraceback>;

struct TraceEntry {
  Action action;
  uintptr_t addr;
  size_t size;
  size_t device_free;  // oom only
  int64_t time_us;
  Traceback frames;
};

struct LiveAlloc {
  int device;
  size_t nbytes;
  Traceback frames;
};

struct History {
  std::mutex mu;
  bool trace_alloc = true;  // keep the event trace ("all"), not only the live state ("state")
  // Read by the hooks outside mu.
  std::atomic<bool> frames_alloc{true};  // tracebacks of allocations (context "state", "alloc", "all")
  std::atomic<bool> frames_free{true};   // and of frees (context "all")
  std::atomic<bool> cpp{false};
  size_t max_entries = SIZE_MAX;
  std::vector<std::deque<TraceEntry>> traces;     // per device
  std::unordered_map<uintptr_t, LiveAlloc> live;  // allocations made while recording
};

History& history() {
  static History* h = new History();  // leaked: allocations outlive static destruction
  return *h;
}

int64_t now_us() {
  return std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// Under h.mu.
void append(History& h, int device, TraceEntry e) {
  if (!h.trace_alloc || device < 0) return;
  if (static_cast<size_t>(device) >= h.traces.size()) h.traces.resize(device + 1);
  auto& t = h.traces[device];
  t.push_back(std::move(e));
  while (t.size() > h.max_entries) t.pop_front();
}

Traceback gather(const History& h, bool want) {
  if (!want) return nullptr;
  return torch::CapturedTraceback::gather(/*python=*/true, /*script=*/true, h.cpp);
}

}  // namespace

void on_alloc(c10::DeviceIndex device, const void* ptr, size_t nbytes) {
  if (!ptr) return;
  auto& h = history();
  // Outside the lock: gathering Python frames may take the GIL.
  Traceback tb = gather(h, h.frames_alloc);
  const auto addr = reinterpret_cast<uintptr_t>(ptr);
  std::lock_guard<std::mutex> lock(h.mu);
  h.live[addr] = {device, nbytes, tb};
  append(h, device, {Action::Alloc, addr, nbytes, 0, now_us(), std::move(tb)});
}

void on_free(const void* ptr) {
  if (!ptr) return;
  auto& h = history();
  const auto addr = reinterpret_cast<uintptr_t>(ptr);
  int device = -1;
  size_t nbytes = 0;
  {
    std::lock_guard<std::mutex> lock(h.mu);
    auto it = h.live.find(addr);
    if (it != h.live.end()) {
      device = it->second.device;
      nbytes = it->second.nbytes;
      h.live.erase(it);
    }
  }
  if (device < 0) {  // allocated before recording started
    rt::BlockInfo b;
    if (!rt::Runtime::get().live_block(ptr, &b)) return;
    device = b.device;
    nbytes = b.nbytes;
  }
  Traceback tb = gather(h, h.frames_free);
  std::lock_guard<std::mutex> lock(h.mu);
  const int64_t t = now_us();
  append(h, device, {Action::FreeRequested, addr, nbytes, 0, t, tb});
  append(h, device, {Action::FreeCompleted, addr, nbytes, 0, t, std::move(tb)});
}

void on_oom(c10::DeviceIndex device, size_t nbytes, size_t device_free) {
  auto& h = history();
  Traceback tb = gather(h, h.frames_alloc);
  std::lock_guard<std::mutex> lock(h.mu);
  append(h, device, {Action::Oom, 0, nbytes, device_free, now_us(), std::move(tb)});
}

namespace {

namespace py = pybind11;

void record_memory_history(bool enabled, bool trace_alloc, bool frames_alloc, bool frames_free, bool cpp,
                           size_t max_entries, bool clear) {
  auto& h = history();
  static std::once_flag python_unwinder;
  if (enabled) std::call_once(python_unwinder, [] { torch::installCapturedTracebackPython(); });
  // h.mu is taken without the GIL: an allocating thread holding h.mu never
  // waits for the GIL, but one gathering frames may hold the GIL and wait for h.mu.
  std::vector<std::deque<TraceEntry>> old_traces;
  std::unordered_map<uintptr_t, LiveAlloc> old_live;
  {
    py::gil_scoped_release no_gil;
    std::lock_guard<std::mutex> lock(h.mu);
    if (!enabled || clear) {
      old_traces.swap(h.traces);
      if (!enabled) old_live.swap(h.live);
    }
    h.trace_alloc = trace_alloc;
    h.frames_alloc = frames_alloc;
    h.frames_free = frames_free;
    h.cpp = cpp;
    h.max_entries = max_entries;
    const int ndev = rt::Runtime::get().device_count();
    if (static_cast<int>(h.traces.size()) < ndev) h.traces.resize(ndev);
    detail::g_mem_recording.store(enabled, std::memory_order_relaxed);
  }
}

py::dict snapshot() {
  auto& h = history();
  auto& rt = rt::Runtime::get();
  const auto blocks = rt.blocks();
  const int ndev = rt.device_count();

  // Copy what is needed under the lock, symbolize after.
  std::vector<Traceback> block_tb(blocks.size());
  std::vector<std::vector<TraceEntry>> traces(ndev);
  {
    py::gil_scoped_release no_gil;
    std::lock_guard<std::mutex> lock(h.mu);
    for (size_t i = 0; i < blocks.size(); ++i) {
      if (blocks[i].cached) continue;
      auto it = h.live.find(reinterpret_cast<uintptr_t>(blocks[i].ptr));
      if (it != h.live.end()) block_tb[i] = it->second.frames;
    }
    for (int d = 0; d < ndev && d < static_cast<int>(h.traces.size()); ++d)
      traces[d].assign(h.traces[d].begin(), h.traces[d].end());
  }

  std::vector<torch::CapturedTraceback*> to_symbolize;
  for (auto& tb : block_tb)
    if (tb) to_symbolize.push_back(tb.get());
  for (auto& t : traces)
    for (auto& e : t)
      if (e.frames) to_symbolize.push_back(e.frames.get());
  std::vector<py::object> symbolized = torch::py_symbolize(to_symbolize);
  std::unordered_map<torch::CapturedTraceback*, py::object> frames_of;
  for (size_t i = 0; i < to_symbolize.size(); ++i) frames_of.emplace(to_symbolize[i], symbolized[i]);
  auto frames = [&](const Traceback& tb) -> py::object {
    if (!tb) return py::list();
    return frames_of.at(tb.get());
  };

  // A core's allocator gives every block its own host allocation: each block
  // is a segment of one block, as a CUDA segment that holds a single block.
  constexpr size_t kSmallSegment = size_t{1} << 20;
  py::list segments;
  for (size_t i = 0; i < blocks.size(); ++i) {
    const auto& b = blocks[i];
    const auto addr = reinterpret_cast<uintptr_t>(b.ptr);
    const size_t used = b.cached ? 0 : b.nbytes;
    py::dict blk;
    blk["address"] = addr;
    blk["size"] = b.block;
    blk["requested_size"] = used;
    blk["state"] = b.cached ? "inactive" : "active_allocated";
    blk["frames"] = frames(block_tb[i]);
    py::dict seg;
    seg["device"] = b.device;
    seg["address"] = addr;
    seg["total_size"] = b.block;
    seg["allocated_size"] = used;
    seg["active_size"] = used;
    seg["requested_size"] = used;
    seg["stream"] = 0;
    seg["segment_type"] = b.block <= kSmallSegment ? "small" : "large";
    seg["segment_pool_id"] = py::make_tuple(0, 0);
    seg["is_expandable"] = false;
    seg["frames"] = frames(block_tb[i]);
    py::list seg_blocks;
    seg_blocks.append(blk);
    seg["blocks"] = seg_blocks;
    segments.append(seg);
  }

  py::list device_traces;
  for (int d = 0; d < ndev; ++d) {
    py::list t;
    for (const auto& e : traces[d]) {
      py::dict ev;
      ev["action"] = action_name(e.action);
      ev["addr"] = e.addr;
      ev["size"] = e.size;
      ev["stream"] = 0;
      ev["time_us"] = e.time_us;
      ev["frames"] = frames(e.frames);
      if (e.action == Action::Oom) ev["device_free"] = e.device_free;
      t.append(ev);
    }
    device_traces.append(t);
  }

  py::dict settings;
  settings["PYTORCH_NEURON_ALLOC_CONF"] = "";
  py::dict out;
  out["segments"] = segments;
  out["device_traces"] = device_traces;
  out["allocator_settings"] = settings;
  return out;
}

}  // namespace

void bind_memory_history(py::module& m) {
  m.def("_memory_record_history", &record_memory_history, py::arg("enabled"), py::arg("trace_alloc"),
        py::arg("frames_alloc"), py::arg("frames_free"), py::arg("cpp"), py::arg("max_entries"), py::arg("clear"));
  m.def("_memory_snapshot", &snapshot);
}

}  // namespace neuron::profiler
