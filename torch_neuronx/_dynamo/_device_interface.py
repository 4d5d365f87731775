"""Dynamo's device interface of ``neuron`` (a private Dynamo API, like the rest of _inductor_glue).

Imported only by ``_inductor_glue.register_device_interface``, once ``torch._dynamo.device_interface``
is loaded: importing it earlier would load Dynamo for every user of the device.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
from torch._dynamo import device_interface as di

from ._inductor_glue import DEVICE


@dataclass
class NeuronCompileProperties:
    # What Inductor's heuristics ask for: the host threads the generated
    # C++ kernels run on (the simulator executes on the host CPU).
    multi_processor_count: int
    name: str
    total_memory: int
    type: str = DEVICE


def _props(device=None) -> NeuronCompileProperties:
    if isinstance(device, (str, torch.device)):
        device = torch.device(device).index
    p = torch.neuron.get_device_properties(torch.neuron.current_device() if device is None else device)
    return NeuronCompileProperties(
        multi_processor_count=torch.get_num_threads() or os.cpu_count() or 1,
        name=p.name,
        total_memory=p.total_memory,
    )


def _exchange(device: int) -> int:
    prev = torch.neuron.current_device()
    if device >= 0 and device != prev:
        torch.neuron.set_device(device)
    return prev


class NeuronInterface(di.DeviceInterface):
    """What Dynamo and Inductor ask of device ``neuron``: torch.neuron's functions, no Triton."""

    device = torch.neuron.device
    Event = torch.neuron.Event
    Stream = torch.neuron.Stream

    class Worker:
        @staticmethod
        def set_device(device: int) -> None:
            torch.neuron.set_device(device)

        @staticmethod
        def current_device() -> int:
            return torch.neuron.current_device()

        @staticmethod
        def get_device_properties(device=None):
            return _props(device)

    current_device = staticmethod(torch.neuron.current_device)
    set_device = staticmethod(torch.neuron.set_device)
    device_count = staticmethod(torch.neuron.device_count)
    is_available = staticmethod(torch.neuron.is_available)
    synchronize = staticmethod(torch.neuron.synchronize)
    current_stream = staticmethod(torch.neuron.current_stream)
    set_stream = staticmethod(torch.neuron.set_stream)
    stream = staticmethod(torch.neuron.stream)
    memory_allocated = staticmethod(torch.neuron.memory_allocated)

    @staticmethod
    def exchange_device(device: int) -> int:
        return _exchange(device)

    @staticmethod
    def maybe_exchange_device(device: int) -> int:
        return _exchange(device)

    @staticmethod
    def get_raw_stream(device_idx: int) -> int:
        return 0

    @classmethod
    def get_device_properties(cls, device=None):
        return _props(device)

    @staticmethod
    def get_compute_capability(device=None) -> str:
        return torch.neuron.get_device_properties(device).name

    @staticmethod
    def is_bf16_supported(including_emulation: bool = False) -> bool:
        return True

    @staticmethod
    def is_triton_capable(device=None) -> bool:
        return False

    @staticmethod
    def raise_if_triton_unavailable(device=None) -> None:
        raise RuntimeError("device 'neuron' compiles with Inductor's C++ backend, not Triton")


def register() -> None:
    """Register NeuronInterface for ``neuron`` and each ``neuron:i``."""
    di.register_interface_for_device(DEVICE, NeuronInterface)
    for i in range(torch.neuron.device_count()):
        di.register_interface_for_device(f"{DEVICE}:{i}", NeuronInterface)
