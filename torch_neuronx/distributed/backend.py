"""The c10d backend "neuron".

Device memory of the simulated Trainium is host memory, so collectives on
neuron tensors run on gloo (TCP, rendezvous through torchrun's store) over
zero-copy CPU views of the tensors. The routing lives in C++
(csrc/distributed/): core's PrivateUse1 kernels of the c10d ops are
replaced by kernels that view the neuron tensors as CPU tensors and call the
CPU kernels, i.e. the process group's CPU backend. That layer also implements
ReduceOp.AVG and ReduceOp.PREMUL_SUM, which gloo lacks.

The backend is registered for devices ["neuron", "cpu"], so that
``init_process_group("neuron")`` creates ONE gloo instance that serves both
device types (``_new_process_group_helper`` registers a single backend when
every device maps to the same backend name): neuron and CPU collectives of a
group share one ordered stream of messages, like NCCL groups do, and object
collectives / DCP's CPU metadata exchanges work on the same group.
"""

from __future__ import annotations

import atexit

import torch
import torch.distributed as dist

BACKEND_NAME = "neuron"
DEVICES = ["neuron", "cpu"]

_registered = False

# Every gloo backend this process created, held from Python. A group can end up owned
# only by C++ code that frees it with the GIL held (DDP's reducer, at the end of a script
# that destroyed its groups); gloo's destructor then joins its worker threads under the
# GIL, while a worker finishing a collective may need the GIL to free a tensor that Python
# has seen: the process hangs. With this reference, the last release is a Python one,
# whose binding drops the GIL while gloo joins: at the next group creation for backends
# nobody else holds, the rest at exit.
_backends: list = []


def _release_backends(everything: bool = False) -> None:
    from .. import _C

    # use_count counts the Python object as one owner.
    _backends[:] = [] if everything else [b for b in _backends if _C._c10d_use_count(b) > 1]


_override = None  # creates the backend instead of gloo, while set
_group_listeners: list = []  # told of every group this process joins


def add_group_listener(listener) -> None:
    """Call `listener(name, global_ranks)` for every neuron group this process joins from now on."""
    _group_listeners.append(listener)


def remove_group_listener(listener) -> None:
    if listener in _group_listeners:
        _group_listeners.remove(listener)


def set_backend_override(create) -> None:
    """Let `create(opts)` make the backend of every group created from now on (a dry run gives
    PyTorch's fake process group: the real rank and size, collectives that move no data);
    None: gloo again."""
    global _override
    _override = create


def _create_backend(opts, backend_options=None):
    """c10d creator (extended API): a gloo backend for the group's ranks (or the override's)."""
    from torch.distributed import ProcessGroupGloo

    from . import hangs

    for listener in list(_group_listeners):
        listener(opts.group_id, list(opts.global_ranks_in_group or range(opts.group_size)))
    # Joining a group does not initialise the device, as with NCCL for CUDA: DeviceMesh
    # then binds a rank that never chose its device (LOCAL_RANK, else rank % devices)
    # through torch.neuron.set_device, which initialises it.
    if _override is not None:
        return _override(opts)
    timeout = hangs.check_timeout(opts.timeout)
    # The group's name and ranks go in at construction: gloo registers them with the
    # Flight Recorder then (its pg_config, which torchfrtrace matches entries against).
    gloo_opts = ProcessGroupGloo._Options()
    gloo_opts._timeout = timeout
    gloo_opts._devices = [ProcessGroupGloo.create_default_device()]
    gloo_opts.group_name = opts.group_id
    gloo_opts.global_ranks_in_group = list(opts.global_ranks_in_group or [])
    backend = ProcessGroupGloo(opts.store, opts.group_rank, opts.group_size, gloo_opts)
    backend._set_sequence_number_for_group()
    _release_backends()
    _backends.append(backend)
    hangs.register(backend, opts, timeout, keep=_backends.append)
    return backend


def _perform_nocolor_split(self, device) -> None:
    """Non-members' part of creating a subgroup from a group bound to a device.

    torch calls it on the parent's backend of every rank *outside* a new
    subgroup when the default group has a ``device_id``; it exists for NCCL's
    communicator split. A gloo subgroup is connected through the store by its
    members alone, so there is nothing to do here.
    """
    return None


def _is_neuron_device(device) -> bool:
    return device is not None and torch.device(device).type == "neuron"


def _install_coalescing(pg_cls) -> None:
    """ProcessGroup._start/_end_coalescing for neuron (what
    ``dist._coalescing_manager(group, device=neuron)`` calls).

    gloo implements neither; on neuron the works issued in between are
    collected by csrc/distributed/collectives.cpp and _end_coalescing returns one Work
    over all of them. Other devices keep core's behaviour.
    """
    if getattr(pg_cls._start_coalescing, "_neuron", False):
        return
    orig_start, orig_end = pg_cls._start_coalescing, pg_cls._end_coalescing

    def _start_coalescing(self, device):
        if _is_neuron_device(device):
            return torch.ops.neuron_c10d.start_coalescing(self.group_name)
        return orig_start(self, device)

    def _end_coalescing(self, device):
        if _is_neuron_device(device):
            from torch.distributed.distributed_c10d import Work

            return Work.unbox(torch.ops.neuron_c10d.end_coalescing(self.group_name))
        return orig_end(self, device)

    _start_coalescing._neuron = True
    pg_cls._start_coalescing = _start_coalescing
    pg_cls._end_coalescing = _end_coalescing


def register_backend() -> None:
    """Register the c10d backend "neuron" and its collective kernels (idempotent)."""
    global _registered
    if _registered:
        return
    from .. import _C

    _C._register_collective_routes()
    if dist.is_available() and not hasattr(dist.ProcessGroupGloo, "perform_nocolor_split"):
        # init_process_group("neuron", device_id=...) then new_group(...)
        dist.ProcessGroupGloo.perform_nocolor_split = _perform_nocolor_split
    if dist.is_available():
        _install_coalescing(dist.ProcessGroup)
        from . import hangs

        hangs.install()
        from . import context_parallel, sdpa_sharding

        sdpa_sharding.install_hook()  # DTensor shards neuron's SDPA op, once DTensor loads
        context_parallel.install_hook()  # ring attention for neuron's SDPA, once PyTorch's CP module loads
    if dist.is_available() and BACKEND_NAME.upper() not in dist.Backend._plugins:
        dist.Backend.register_backend(BACKEND_NAME, _create_backend, extended_api=True, devices=DEVICES)
        atexit.register(_release_backends, everything=True)
    _registered = True


def is_neuron_backend(group=None) -> bool:
    """True when `group` (default: the default group) uses the neuron backend."""
    return dist.get_backend(group) == BACKEND_NAME
