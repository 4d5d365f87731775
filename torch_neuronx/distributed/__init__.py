"""torch.distributed on neuron: the c10d backend "neuron" (see backend.py)."""

from .backend import BACKEND_NAME, is_neuron_backend, register_backend

__all__ = ["BACKEND_NAME", "is_neuron_backend", "register_backend"]
