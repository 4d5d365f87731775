"""torch.distributed on neuron: the c10d backend "neuron" (see backend.py), DTensor sharding of
SDPA for tensor parallelism (sdpa_sharding.py), and ring attention for SDPA under context
parallelism (context_parallel.py)."""

from .backend import BACKEND_NAME, is_neuron_backend, register_backend
from .hangs import CollectiveMismatchError, CollectiveTimeoutError, dump_flight_recorder, load_flight_recorder

__all__ = [
    "BACKEND_NAME",
    "CollectiveMismatchError",
    "CollectiveTimeoutError",
    "dump_flight_recorder",
    "is_neuron_backend",
    "load_flight_recorder",
    "register_backend",
]
