"""Random number generation on neuron: one default generator per device.

Each generator drives a Mersenne Twister engine of its own, so neuron's streams
are independent of torch's CPU default generator, yet for the same seed they
equal CPU's (dropout on neuron draws what dropout on CPU would).
"""

import torch

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
    _generator(device).set_state(new_state.clone() if new_state.device.type == "cpu" else new_state.cpu())


def get_rng_state_all() -> list:
    """RNG states of all devices."""
    return [get_rng_state(i) for i in range(device_count())]


def set_rng_state_all(new_states) -> None:
    """Restore the RNG states of all devices."""
    for i, state in enumerate(new_states):
        set_rng_state(state, i)
