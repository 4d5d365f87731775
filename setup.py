"""Builds the C++ device core (torch_neuronx._C) with torch.utils.cpp_extension, and ships
the start-up file behind ``import nki`` (see neuronsim/_alias.py) in wheels and editable
installs alike."""

import glob
import os

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.command.editable_wheel import editable_wheel

# Installed at the root of site-packages, so every interpreter runs it at start-up: without
# torch, `import nki` / `import neuronxcc.nki` resolve to neuronsim.nki unless a real AWS NKI
# is installed. site reads .pth files in name order, so an editable install's own
# __editable__.*.pth has put neuronsim on the path before this runs; when neuronsim is gone
# (a deleted checkout) the line does nothing rather than break start-up.
PTH_NAME = "neuronsim-nki.pth"
PTH_LINE = (
    "import importlib.util; importlib.util.find_spec('neuronsim') is None or "
    "__import__('neuronsim._alias', fromlist=['install']).install()\n"
)


def _write_pth(directory):
    path = os.path.join(directory, PTH_NAME)
    with open(path, "w") as f:
        f.write(PTH_LINE)
    return path


class BuildPyWithPth(build_py):
    """build_py that also writes the start-up file into build_lib, the wheel's root."""

    def run(self):
        super().run()
        if not self.editable_mode:  # editable installs get it from EditableWheelWithPth
            _write_pth(self.build_lib)

    def get_outputs(self, include_bytecode=True):
        outputs = super().get_outputs(include_bytecode)
        return outputs if self.editable_mode else outputs + [os.path.join(self.build_lib, PTH_NAME)]


class EditableWheelWithPth(editable_wheel):
    """``pip install -e``: setuptools' editable wheel carries only its own path hook, and
    build_py's outputs are not installed in editable mode, so the start-up file is added to
    the unpacked wheel after the build steps (it is then listed in the wheel's RECORD)."""

    def _run_build_commands(self, dist_name, unpacked_wheel, build_lib, tmp_dir):
        result = super()._run_build_commands(dist_name, unpacked_wheel, build_lib, tmp_dir)
        _write_pth(unpacked_wheel)
        return result


if not hasattr(editable_wheel, "_run_build_commands"):  # the hook above is setuptools-internal
    raise RuntimeError(
        "setuptools' editable_wheel has no _run_build_commands (the step setup.py extends to put "
        f"{PTH_NAME} in editable installs); build with the setuptools of pyproject.toml's "
        "build-system or update EditableWheelWithPth"
    )


def _extension():
    # Importing torch would autoload the installed torch_neuronx (an older build,
    # or this half-built tree): the build only needs torch itself.
    os.environ["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "0"
    import torch
    from torch.utils.cpp_extension import BuildExtension, CppExtension

    # Every .cpp under csrc/ except the runtime's stand-alone C++ tests.
    sources = sorted(p for p in glob.glob("csrc/**/*.cpp", recursive=True) if "/tests/" not in p)
    ext = CppExtension(
        "torch_neuronx._C",
        sources,
        # kineto/: the headers of torch.profiler's activity-profiler plugin API (csrc/profiler).
        include_dirs=[os.path.abspath("csrc"), os.path.join(os.path.dirname(torch.__file__), "include", "kineto")],
        extra_compile_args=["-O2", "-Wno-unused-parameter"],
    )
    return ext, BuildExtension.with_options(use_ninja=True)


# Commands that ship the start-up file (tests/nki/test_packaging.py builds with them).
CMDCLASS = {"build_py": BuildPyWithPth, "editable_wheel": EditableWheelWithPth}

if __name__ == "__main__":  # pip's build backend runs this file as __main__ too
    ext, build_ext = _extension()
    setup(ext_modules=[ext], cmdclass={**CMDCLASS, "build_ext": build_ext})
