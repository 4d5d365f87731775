"""Builds the C++ device core (torch_neuronx._C) with torch.utils.cpp_extension."""

import glob
import os

# Importing torch would autoload the installed torch_neuronx (an older build,
# or this half-built tree): the build only needs torch itself.
os.environ["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "0"

import torch
from setuptools import setup
from torch.utils.cpp_extension import BuildExtension, CppExtension

# Every .cpp under csrc/ except the runtime's stand-alone C++ tests.
sources = sorted(p for p in glob.glob("csrc/**/*.cpp", recursive=True) if "/tests/" not in p)

setup(
    ext_modules=[
        CppExtension(
            "torch_neuronx._C",
            sources,
            # kineto/: the headers of torch.profiler's activity-profiler plugin API (csrc/profiler).
            include_dirs=[os.path.abspath("csrc"), os.path.join(os.path.dirname(torch.__file__), "include", "kineto")],
            extra_compile_args=["-O2", "-Wno-unused-parameter"],
        )
    ],
    cmdclass={"build_ext": BuildExtension.with_options(use_ninja=True)},
)
