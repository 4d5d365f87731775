"""Devices of torch.neuron: availability, current device, properties."""

import dataclasses

import torch
from torch.accelerator._utils import _get_device_index

from .. import _C


def _index(device=None) -> int:
    """Device index of `device` (None: the current device), resolved as torch.accelerator does.

    The range check and its message live in C++ (every `_C` call that takes an
    index makes it), as for torch.cuda and torch.xpu.
    """
    if device is not None and not isinstance(device, (int, str, torch.device)):
        raise TypeError(f"Invalid device {device!r}: expected an int, str or torch.device")
    return _get_device_index(device, optional=True)


def _checked(device=None) -> int:
    """Like _index, and raise IndexError (C++'s message) when no such device exists."""
    idx = _index(device)
    _C._check_device_index(idx)
    return idx


def is_available() -> bool:
    """True when at least one logical NeuronCore is visible."""
    return _C._device_count() > 0


def device_count() -> int:
    """Number of logical NeuronCores this process sees."""
    return _C._device_count()


def is_initialized() -> bool:
    """True once this process has used a neuron device."""
    return _C._is_initialized()


def init() -> None:
    """Initialise the Neuron runtime now instead of on first use."""
    _C._init()


def _is_in_bad_fork() -> bool:
    return _C._is_in_bad_fork()


def current_device() -> int:
    """Index of the current neuron device."""
    return _C._current_device()


def set_device(device) -> None:
    """Set the current neuron device for this process (threads inherit it)."""
    idx = _index(device)
    if idx >= 0:
        _C._set_device(idx)


class device:
    """Context manager that changes the current device (for this thread)."""

    def __init__(self, device):
        self.idx = -1 if device is None else _index(device)
        self.prev_idx = -1

    def __enter__(self):
        self.prev_idx = _C._exchange_device(self.idx)

    def __exit__(self, *exc):
        self.idx = _C._exchange_device(self.prev_idx)
        return False


class device_of(device):
    """Context manager that makes the device of `obj` current (no-op for CPU)."""

    def __init__(self, obj):
        super().__init__(obj.get_device() if obj.device.type == "neuron" else None)


@dataclasses.dataclass(frozen=True)
class _NeuronDeviceProperties:
    name: str
    total_memory: int
    index: int
    logical_core_id: int
    neuron_device: int
    physical_cores: tuple
    logical_nc_config: int
    instance_type: str

    def __repr__(self):
        return (
            f"_NeuronDeviceProperties(name='{self.name}', total_memory={self.total_memory // (1 << 20)}MB, "
            f"logical_core_id={self.logical_core_id}, neuron_device={self.neuron_device}, "
            f"physical_cores={list(self.physical_cores)}, logical_nc_config={self.logical_nc_config}, "
            f"instance_type='{self.instance_type}')"
        )


def get_device_properties(device=None) -> _NeuronDeviceProperties:
    """Properties of a logical NeuronCore (`name` is the chip, e.g. "trn2")."""
    idx = _checked(device)
    info = _C._instance_info()
    core = info["cores"][idx]
    return _NeuronDeviceProperties(
        name=info["chip"],
        total_memory=core["hbm_capacity"],
        index=idx,
        logical_core_id=core["logical_id"],
        neuron_device=core["chip"],
        physical_cores=tuple(core["physical_cores"]),
        logical_nc_config=info["logical_nc_config"],
        instance_type=info["instance_type"],
    )


def get_device_name(device=None) -> str:
    """Name of the device, e.g. "trn2"."""
    return get_device_properties(device).name


def get_device_capability(device=None) -> dict:
    """Dtypes the device supports natively (used by torch's device-type tests)."""
    _checked(device)
    native = [
        torch.float32,
        torch.float16,
        torch.bfloat16,
        torch.int8,
        torch.int16,
        torch.int32,
        torch.int64,
        torch.uint8,
        torch.bool,
    ]
    return {"supported_dtypes": native}


def is_bf16_supported(including_emulation: bool = True) -> bool:
    """Trainium computes natively in bfloat16."""
    return True


def get_amp_supported_dtype() -> list:
    """Dtypes torch.autocast("neuron") accepts."""
    return [torch.float16, torch.bfloat16, torch.float32]


def synchronize(device=None) -> None:
    """Wait for all work on `device` (execution is synchronous in the simulator)."""
    _C._synchronize(_index(device))
