"""Streams and events of torch.neuron.

The simulator executes synchronously, so streams order nothing, but the API is
PyTorch's own (torch.Stream / torch.Event on the neuron device) and events
carry real timestamps: ``elapsed_time`` measures wall time between records.
"""

import torch

from .device import _checked


class _OnNeuron(type(torch.Stream)):
    # Instances are PyTorch's own Stream/Event objects (its C++ checks want the
    # exact types); isinstance() still recognises the neuron ones.
    def __instancecheck__(cls, obj):
        return isinstance(obj, cls.__mro__[1]) and obj.device.type == "neuron"


class Stream(torch.Stream, metaclass=_OnNeuron):
    """A neuron stream (a ``torch.Stream`` on device ``neuron``)."""

    def __new__(cls, device=None, priority=0, **kwargs):
        if "stream_id" in kwargs:  # an existing stream by id
            return torch.Stream(priority=priority, **kwargs)
        return torch.Stream(device=torch.device("neuron", _checked(device)), priority=priority)


class Event(torch.Event, metaclass=_OnNeuron):
    """A neuron event (a ``torch.Event`` on device ``neuron``); timing is real."""

    def __new__(cls, enable_timing=False, blocking=False, interprocess=False, device=None):
        return torch.Event(
            device=torch.device("neuron", _checked(device)),
            enable_timing=enable_timing,
            blocking=blocking,
            interprocess=interprocess,
        )


def current_stream(device=None) -> torch.Stream:
    """The current stream of a device."""
    return torch.accelerator.current_stream(_checked(device))


def default_stream(device=None) -> torch.Stream:
    """The default stream of a device."""
    return Stream(stream_id=0, device_index=_checked(device), device_type=_PRIVATEUSE1)


_PRIVATEUSE1 = 20  # c10::DeviceType::PrivateUse1


def set_stream(stream: torch.Stream) -> None:
    """Make `stream` current on its device."""
    if stream is not None:
        torch.accelerator.set_stream(stream)


class StreamContext:
    """Context manager that makes a stream current."""

    def __init__(self, stream):
        self.stream = stream
        self.prev = None

    def __enter__(self):
        if self.stream is not None:
            self.prev = current_stream(self.stream.device_index)
            set_stream(self.stream)
        return self.stream

    def __exit__(self, *exc):
        if self.prev is not None:
            set_stream(self.prev)
        return False


def stream(stream) -> StreamContext:
    """``with torch.neuron.stream(s):`` runs the block with `s` current."""
    return StreamContext(stream)
