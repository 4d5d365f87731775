"""Random number generation on neuron: one default generator per device.

As AWS's TorchNeuron documents it, a generator's state is 16 bytes, an 8-byte
seed then an 8-byte offset (the layout DTensor's RNG tracker reads); the
offset advances as random ops draw values. Streams are independent of CPU's
and do not equal CPU's for the same seed.
"""

import torch
from torch._subclasses.fake_tensor import is_fake

from .. import _C
from .device import _checked, device_count

_default_generators = {}


def _generator(device=None) -> torch.Generator:
    idx = _checked(device)
    gen = _default_generators.get(idx)
    if gen is None:
        gen = _default_generators.setdefault(idx, _C._default_generator(idx))
    return gen


def __getattr__(name):
    if name == "default_generators":
        return tuple(_generator(i) for i in range(device_count()))
    raise AttributeError(name)


def manual_seed(seed: int) -> None:
    """Seed the current device's default generator."""
    _generator().manual_seed(int(seed))


def manual_seed_all(seed: int) -> None:
    """Seed every device's default generator."""
    for i in range(device_count()):
        _generator(i).manual_seed(int(seed))


def seed() -> None:
    """Seed the current device's generator with a random number."""
    _generator().seed()


def seed_all() -> None:
    """Seed every device's generator with the same random number."""
    s = _generator(0).seed() if device_count() else None
    for i in range(1, device_count()):
        _generator(i).manual_seed(s)


def initial_seed() -> int:
    """Initial seed of the current device's generator."""
    return _generator().initial_seed()


def get_rng_state(device="neuron") -> torch.Tensor:
    """RNG state of a device as a CPU ByteTensor."""
    return _generator(device).get_state()


def set_rng_state(new_state: torch.Tensor, device="neuron") -> None:
    """Restore a device's RNG state."""
    if is_fake(new_state):
        # A dry run's state has no bytes to read (DTensor's RNG tracker takes the state to the
        # device and back, which a dry run fakes). Its random ops draw nothing, so the generator
        # keeps its state; reading the fake's memory would crash the process.
        return
    # No clone (set_state copies the 16 bytes): FakeTensorMode refuses to clone
    # a real tensor, and CPU and CUDA hand the state over directly too.
    _generator(device).set_state(new_state if new_state.device.type == "cpu" else new_state.cpu())


def get_rng_state_all() -> list:
    """RNG states of all devices."""
    return [get_rng_state(i) for i in range(device_count())]


def set_rng_state_all(new_states) -> None:
    """Restore the RNG states of all devices."""
    for i, state in enumerate(new_states):
        set_rng_state(state, i)


class cpu_equal_rng:
    """Opt-in: neuron's random ops draw CPU's stream, so a seeded run equals CPU's.

    Inside the block (process-wide, every generator) each neuron generator draws
    from a Mersenne Twister seeded like CPU's default generator, op after op,
    and its state is CPU's 5,056 bytes instead of the 16-byte (seed, offset)
    AWS documents: DTensor random ops and FSDP2's ``reset_parameters`` do not
    work in it. Meant for parity checks against CPU (dropout training); seed
    inside the block. The real device has no such mode.
    """

    def __init__(self, enabled: bool = True):
        self.enabled = bool(enabled)
        self._prev = None

    def __enter__(self):
        self._prev = _C._set_cpu_equal_rng(self.enabled)
        return self

    def __exit__(self, *exc):
        _C._set_cpu_equal_rng(self._prev)
        return False
