// Python bindings of the device core (torch_neuronx._C).
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/csrc/Generator.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/extension.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>

#include <chrono>
#include <thread>
#include <unordered_set>

#include "aten/fallback.h"
#include "aten/fidelity.h"
#include "aten/op_meta.h"
#include "device/allocator.h"
#include "device/device.h"
#include "device/generator.h"
#include "distributed/collectives.h"
#include "profiler/python.h"

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

// Thread states of threads Python's threading module does not run (autograd's device
// threads among them).
int foreign_thread_states(const std::unordered_set<unsigned long>& python_threads) {
  int n = 0;
  for (PyThreadState* t = PyInterpreterState_ThreadHead(PyInterpreterState_Get()); t != nullptr;
       t = PyThreadState_Next(t))
    n += python_threads.count(t->thread_id) == 0;
  return n;
}

// Autograd starts one worker thread per device, each holding a Python thread state.
// Stopped, a thread re-takes the GIL to delete that state; if Python has begun to
// finalise by then, the thread is ended inside a noexcept destructor and the process
// aborts ("terminate called without an active exception"). A fixed pause after stop()
// lost that race on a loaded machine, and so did waiting for the number of states to fall
// to the number of Python's threads (a daemon thread ending meanwhile stood in for a device
// thread still holding its state). So stop them at exit while Python is alive and wait, GIL
// released, until every state left belongs to one of `python_threads` (the idents of the
// main thread and live daemon threads). Bounded: a library that keeps a thread state for
// its own C thread costs the wait, not a hang.
void shutdown_autograd_threads(const std::unordered_set<unsigned long>& python_threads) {
  {
    py::gil_scoped_release no_gil;
    torch::autograd::Engine::get_default_engine().stop();
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  while (foreign_thread_states(python_threads) > 0 && std::chrono::steady_clock::now() < deadline) {
    py::gil_scoped_release no_gil;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("_register_cpu_kernel_routes", &register_cpu_kernel_routes);
  m.def("_register_collective_routes", &register_collective_routes);
  // How many C++ owners a c10d backend has (the Python object counts as one).
  m.def("_c10d_use_count", [](c10d::Backend& b) { return c10::raw::intrusive_ptr::use_count(&b); });
  m.def("_shutdown_autograd_threads", &shutdown_autograd_threads);
  m.def("_instance_info", &instance_info);
  // (name, physical cores, HBM bytes, allowed LNC, default LNC) per chip and
  // (name, chip, chips) per instance type, from neuronsim/hardware.py.
  m.def("_set_hardware_tables",
        [](const std::vector<std::tuple<std::string, int, uint64_t, std::vector<int>, int>>& chips,
           const std::vector<std::tuple<std::string, std::string, int>>& types) {
          std::vector<rt::ChipSpec> cs;
          for (const auto& [name, cores, hbm, lnc, lnc_default] : chips)
            cs.push_back({name, cores, hbm, lnc, lnc_default});
          std::vector<rt::InstanceType> ts;
          for (const auto& [name, chip, n] : types) ts.push_back({name, chip, n});
          rt::set_hardware_tables(std::move(cs), std::move(ts));
        });
  m.def("_device_count", [] {
    try {
      return device_count();
    } catch (...) {
      return 0;
    }
  });
  m.def("_check_device_index", [](int64_t i) { check_device_index(i); });
  m.def("_current_device", [] { return static_cast<int>(current_device()); });
  m.def("_set_device", [](int64_t i) {
    check_device_index(i);  // before the narrowing to DeviceIndex
    set_device_process_wide(static_cast<c10::DeviceIndex>(i));
  });
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
  m.def("_synchronize", [](int64_t i) {
    check_device_index(i);
    runtime().synchronize(i);
  });
  m.def("_default_generator", [](int i) {
    return py::reinterpret_steal<py::object>(
        THPGenerator_initDefaultGenerator(default_generator(static_cast<c10::DeviceIndex>(i))));
  });
  m.def("_set_cpu_equal_rng", &set_cpu_equal_rng);
  m.def("_executed_ops", &executed_ops);
  m.def("_fallback_ops", &fallback_ops);
  m.def("_fallback_count", &fallback_count);
  m.def("_last_fallback_reason", &last_fallback_reason);
  m.def("_clear_op_tracking", &clear_op_tracking);
  // The dry run: accounting of data-less storages, and the fallback judgement of ops it does not run.
  m.def("_reserve", [](int64_t device, uint64_t nbytes) {
    return reserve_on(static_cast<c10::DeviceIndex>(device), static_cast<size_t>(nbytes));
  });
  m.def("_release", [](uintptr_t token) { release_reservation(token); });
  // (allocated, reserved) bytes on a core now: what a memory sample reads, without building
  // the allocator's whole statistics dict (about a hundredth of its cost).
  m.def("_memory_in_use", [](int64_t device) {
    check_device_index(device);
    auto c = runtime().memory(static_cast<int>(device));
    return std::make_pair(c.allocated_current, c.reserved_current);
  });
  // (allocated, reserved) high-water marks: the peaks since the last _reset_memory_high_water,
  // which the program's own resets of its peak statistics (torch.neuron's, torch.accelerator's)
  // leave alone, so a recording sees the run's peak however the script resets its counters.
  m.def("_memory_high_water", [](int64_t device) {
    check_device_index(device);
    auto c = runtime().memory(static_cast<int>(device));
    return std::make_pair(c.allocated_high_water, c.reserved_high_water);
  });
  m.def("_reset_memory_high_water", [](int64_t device) {
    check_device_index(device);
    runtime().reset_high_water(static_cast<int>(device));
  });
  m.def("_fallback_reason", [](const std::string& op, const std::vector<at::ScalarType>& dtypes) {
    const char* odd = nullptr;
    for (auto t : dtypes)
      if ((odd = non_native_dtype(t))) break;
    return fallback_reason(lacks_native_lowering(op), odd);
  });
  profiler::bind(m);
}
