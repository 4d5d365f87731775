// Python bindings of the profiler support (called from the module's init).
#pragma once

#include <torch/extension.h>

namespace neuron::profiler {

void bind_memory_history(pybind11::module& m);  // memory_history.cpp
void bind(pybind11::module& m);                 // python.cpp: everything

}  // namespace neuron::profiler
