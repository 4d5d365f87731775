// Python bindings of the device core (torch_neuronx._C).
#include <torch/csrc/Generator.h>
#include <torch/csrc/autograd/engine.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/extension.h>

#include "neuron.h"
#include "profiler/python.h"

#include <chrono>
#include <thread>

namespace neuron {
int register_cpu_kernel_routes();
int register_collective_routes();  // collectives.cpp
std::vector<std::pair<std::string, uint64_t>> executed_ops();
std::map<std::string, std::set<std::string>> fallback_ops();
void clear_op_tracking();
}  // namespace neuron

namespace py = pybind11;
using namespace neuron;

namespace {

py::dict instance_info() {
  const auto& info = runtime().instance();
  py::dict d;
  d["instance_type"] = info.instance_type;
  d["chip"] = info.chip.name;
  d["num_chips"] = info.num_chips;
  d["physical_cores_per_chip"] = info.chip.physical_cores;
  d["hbm_bytes_per_chip"] = info.chip.hbm_bytes;
  d["hbm_bandwidth_per_chip"] = info.chip.hbm_bandwidth;
  d["bf16_flops_per_chip"] = info.chip.bf16_flops;
  d["sbuf_bytes_per_core"] = info.chip.sbuf_bytes;
  d["psum_bytes_per_core"] = info.chip.psum_bytes;
  d["logical_nc_config"] = info.lnc;
  d["logical_cores_total"] = info.logical_cores_total;
  py::list cores;
  for (const auto& c : info.visible) {
    py::dict cd;
    cd["index"] = c.index;
    cd["logical_id"] = c.logical_id;
    cd["chip"] = c.chip;
    cd["physical_cores"] = c.physical_cores;
    cd["hbm_capacity"] = c.hbm_capacity;
    cores.append(cd);
  }
  d["cores"] = cores;
  return d;
}

py::dict memory_counters(int device) {
  check_device_index(device);
  auto c = runtime().memory(device);
  py::dict d;
  d["allocated_current"] = c.allocated_current;
  d["allocated_peak"] = c.allocated_peak;
  d["allocated_total"] = c.allocated_total;
  d["freed_total"] = c.freed_total;
  d["reserved_current"] = c.reserved_current;
  d["reserved_peak"] = c.reserved_peak;
  d["reserved_total"] = c.reserved_total;
  d["released_total"] = c.released_total;
  d["num_alloc_retries"] = c.num_alloc_retries;
  d["segment_count"] = c.segment_count;
  d["segment_count_peak"] = c.segment_count_peak;
  d["num_allocs"] = c.num_allocs;
  d["num_frees"] = c.num_frees;
  d["num_ooms"] = c.num_ooms;
  d["live_count"] = c.live_count;
  d["live_count_peak"] = c.live_count_peak;
  d["capacity"] = c.capacity;
  return d;
}

// Autograd starts one worker thread per device. Left alone they wake up during
// static destruction, after Python finalised, and abort the process
// ("terminate called without an active exception"). Stop them at exit while
// Python is alive, and let them tear down their thread states.
void shutdown_autograd_threads() {
  py::gil_scoped_release no_gil;
  torch::autograd::Engine::get_default_engine().stop();
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("_register_cpu_kernel_routes", &register_cpu_kernel_routes);
  m.def("_register_collective_routes", &register_collective_routes);
  m.def("_shutdown_autograd_threads", &shutdown_autograd_threads);
  m.def("_instance_info", &instance_info);
  m.def("_device_count", [] {
    try {
      return device_count();
    } catch (...) {
      return 0;
    }
  });
  m.def("_checked_device_count", [] { return device_count(); });
  m.def("_current_device", [] { return static_cast<int>(current_device()); });
  m.def("_set_device", [](int i) { set_device_process_wide(static_cast<c10::DeviceIndex>(i)); });
  // torch.neuron.device(i): the device guard's exchange, so it changes this
  // thread's current device only (set_device is the process-wide one).
  m.def("_exchange_device", [](int i) {
    int old = current_device();
    if (i >= 0 && i != old)
      c10::impl::getDeviceGuardImpl(kNeuron)->exchangeDevice(c10::Device(kNeuron, static_cast<c10::DeviceIndex>(i)));
    return old;
  });
  m.def("_init", &lazy_init);
  m.def("_is_initialized", &is_initialized);
  m.def("_is_in_bad_fork", &in_bad_fork);
  m.def("_synchronize", [](int i) {
    check_device_index(i);
    runtime().synchronize(i);
  });
  m.def("_memory_counters", &memory_counters);
  m.def("_reset_peak", [](int i) {
    check_device_index(i);
    runtime().reset_peak(i);
  });
  m.def("_empty_cache", [] { runtime().release_cached(-1); });
  m.def("_reset_accumulated", [](int i) {
    check_device_index(i);
    runtime().reset_accumulated(i);
  });
  m.def("_default_generator", [](int i) {
    return py::reinterpret_steal<py::object>(
        THPGenerator_initDefaultGenerator(default_generator(static_cast<c10::DeviceIndex>(i))));
  });
  // Zero-copy host view of a neuron tensor (same memory, sizes, strides):
  // what host-side engines such as gloo operate on.
  m.def("_cpu_view", [](const at::Tensor& t) { return cpu_view_of(t); });
  m.def("_executed_ops", &executed_ops);
  m.def("_fallback_ops", &fallback_ops);
  m.def("_clear_op_tracking", &clear_op_tracking);
  profiler::bind(m);
}
