// Python bindings of the profiler support: device spans of compiled graphs
// (entered by the code Inductor generates for neuron) and memory history.
#include "profiler/python.h"

#include "profiler/device_events.h"

#include <optional>

namespace neuron::profiler {

namespace py = pybind11;

namespace {

// `with _C._GraphSpan(device, name):` around the kernels of a compiled graph.
struct GraphSpan {
  GraphSpan(int device, std::string name) : device_(device), name_(std::move(name)) {}
  void enter() {
    if (device_tracing()) span_.emplace(SpanKind::Graph, name_.c_str(), static_cast<c10::DeviceIndex>(device_));
  }
  void exit() { span_.reset(); }

  int device_;
  std::string name_;
  std::optional<DeviceSpan> span_;
};

}  // namespace

void bind(py::module& m) {
  py::class_<GraphSpan>(m, "_GraphSpan")
      .def(py::init<int, std::string>())
      .def("__enter__", [](GraphSpan& s) { s.enter(); })
      .def("__exit__", [](GraphSpan& s, py::args) {
        s.exit();
        return false;
      });
  m.def("_device_tracing", &device_tracing);
  bind_memory_history(m);
}

}  // namespace neuron::profiler
