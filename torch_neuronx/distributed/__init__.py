"""torch.distributed on neuron: the c10d backend "neuron" (see backend.py), and ring attention
for SDPA under context parallelism (context_parallel.py)."""

from .backend import BACKEND_NAME, is_neuron_backend, register_backend

__all__ = ["BACKEND_NAME", "is_neuron_backend", "register_backend"]
