"""Every private PyTorch detail readiness relies on, in one place.

The dry run runs a script under PyTorch's ``FakeTensorMode``: tensors carry shapes,
dtypes, strides and devices but no data. A few behaviours of that mode, and of the
code that runs under it, need help that no public API gives; the recorder reads a few
facts PyTorch keeps privately (Dynamo's graph-break log, a collective's group). Each is
here with the reason, and ``PATCH_POINTS`` lists them with the PyTorch version each was
checked against, so a PyTorch upgrade is checked in one file
(``tests/readiness/test_parts.py`` checks that each still exists).
"""

from __future__ import annotations

import dis
import re
import sys
import threading
import weakref

import torch
from torch._ops import HigherOrderOperator, OpOverload  # noqa: F401  (readiness's dispatch modes read them)
from torch._subclasses.fake_tensor import (
    DataDependentOutputException,
    DynamicOutputShapeException,
    FakeTensor,
    FakeTensorMode,
)
from torch.utils._python_dispatch import TorchDispatchMode, is_traceable_wrapper_subclass  # noqa: F401
from torch.utils._pytree import tree_leaves, tree_map  # noqa: F401


class _ReportingFakeMode(FakeTensorMode):
    """A FakeTensorMode that hands every op's call and outputs to a callback.

    A dispatch mode stacked above the fake mode does not see the ops a tensor subclass runs
    on its inner tensors (DTensor's ops on its local shards, optimizer state of sharded
    parameters): the subclass runs them with the modes above the fake one popped. Those
    ops pass here. So do ops that only compute metadata on fakes the fake mode made for
    them (DTensor's sharding propagation runs its op on global-shape fakes in the current
    fake mode), which allocate nothing in a real run: the callback tells them apart.
    Small host work on real inputs that reaches it so runs for real (results under
    ``real_host_bytes``), as the dry run's own mode runs it: DTensor's shard offsets of a
    strided shard (an ``arange`` it reads back with ``tolist()``) have their values."""

    def __init__(self, on_outputs, real_host_bytes: int = 0, **kwargs):
        super().__init__(**kwargs)
        self._on_outputs = on_outputs
        self._real_host_bytes = real_host_bytes
        self._depth = threading.local()

    def __deepcopy__(self, memo):
        # a deep copy of a fake tensor copies its __dict__, which names its mode; the copy must be
        # made in this same mode (accelerate's FSDP2 preparation deep-copies buffers), and the
        # mode's callback reaches objects that cannot be copied (thread-locals)
        return self

    def dispatch(self, func, types, args=(), kwargs=None):
        # Only the outermost call: nested ones are the fake mode's own decomposition of
        # that op, whose intermediates a device kernel would not allocate.
        depth = getattr(self._depth, "n", 0)
        self._depth.n = depth + 1
        try:
            out = super().dispatch(func, types, args, kwargs)
        finally:
            self._depth.n = depth
        if depth == 0:
            kwargs = kwargs or {}
            if real_host_args(args, kwargs) and small_host_result(out, self._real_host_bytes):
                return run_real(func, args, kwargs)
            self._on_outputs(func, args, kwargs, out)
        return out


def let_fake_mode_run(hop) -> None:
    """A higher-order op finds its rule for a mode by the mode's exact class: give the dry run's
    fake mode FakeTensorMode's rule (flex_attention's makes its outputs from shapes alone)."""
    table = hop.python_key_table
    if _ReportingFakeMode not in table and FakeTensorMode in table:
        table[_ReportingFakeMode] = table[FakeTensorMode]
        hop._dispatch_cache.clear()


def new_fake_mode(on_outputs, real_host_bytes: int = 0) -> FakeTensorMode:
    """The mode a dry run executes in; ``on_outputs(func, args, kwargs, out)`` sees every op. Real
    tensors made before it (module constants of libraries imported earlier) are converted
    on first use instead of raising; ops on real host inputs with results under
    ``real_host_bytes`` run for real."""
    return _ReportingFakeMode(on_outputs, real_host_bytes, allow_non_fake_inputs=True)


def leaves(args, kwargs):
    """The arguments of an op call, one level of lists/tuples deep (ATen's schemas go no deeper)."""
    for seq in (args, kwargs.values()):
        for a in seq:
            if isinstance(a, (list, tuple)):
                yield from a
            else:
                yield a


def fake_inputs(args, kwargs):
    """The fake tensors among an op's arguments."""
    return [a for a in leaves(args, kwargs) if isinstance(a, FakeTensor)]


def real_host_args(args, kwargs) -> bool:
    """No argument is fake and nothing names the neuron device: the op could run for real."""
    for a in leaves(args, kwargs):
        if isinstance(a, torch.Tensor):
            if isinstance(a, FakeTensor) or is_traceable_wrapper_subclass(a) or a.device.type != "cpu":
                return False
        elif isinstance(a, torch.device) and a.type != "cpu":
            return False
        elif isinstance(a, str) and a.startswith("neuron"):
            return False
    return True


def fakeify(mode: FakeTensorMode, args, kwargs, min_bytes: int = 0):
    """(args, kwargs) with every real tensor of at least `min_bytes` replaced by its fake.

    The fake mode runs some ops for real when no input is fake (it propagates constants
    through arithmetic and copies); on a real host tensor that is large (weights a
    checkpoint memory-maps) that computes, and reads, what a dry run must not. Converting
    reads no data."""

    def real(a) -> bool:
        return (
            isinstance(a, torch.Tensor)
            and not isinstance(a, FakeTensor)
            and not is_traceable_wrapper_subclass(a)
            and a.numel() * a.element_size() >= min_bytes
        )

    if not any(real(a) for a in leaves(args, kwargs)):
        return args, kwargs  # the common case: nothing to convert, no copies

    def conv(a):
        if isinstance(a, (list, tuple)):
            return type(a)(conv(b) for b in a)
        return mode.from_tensor(a) if real(a) else a

    return tuple(conv(a) for a in args), {k: conv(v) for k, v in kwargs.items()}


def _meta_like(a):
    if isinstance(a, torch.Tensor):
        return torch.empty_strided(a.shape, a.stride(), dtype=a.dtype, device="meta")
    if isinstance(a, (list, tuple)):
        return type(a)(_meta_like(b) for b in a)
    return a


def _signature(a):
    """What an op's result size can depend on, for one argument: a tensor's shape, strides
    and dtype, anything else as it is (TypeError when that cannot be a dict key)."""
    if isinstance(a, torch.Tensor):
        return (tuple(a.shape), a.stride(), a.dtype)
    if isinstance(a, (list, tuple)):
        return tuple(_signature(b) for b in a)
    hash(a)
    return a


_SMALL: dict = {}  # (func, argument signatures, limit) -> host_result_is_small's answer


def host_result_is_small(func, args, kwargs, limit: int) -> bool:
    """An ATen op on real host tensors makes results of under `limit` bytes in all, as its
    meta kernel says (shapes only, no data: far cheaper than the fake mode, which converts
    every real input to a fake one first). False when the meta kernel cannot say. Answers
    are kept per op and argument signature: libraries repeat the same small host ops (a
    device mesh's coordinates, once per parameter)."""
    try:
        key = (func, _signature(args), _signature(tuple(kwargs.items())), limit)
    except TypeError:
        return _host_result_is_small(func, args, kwargs, limit)
    small = _SMALL.get(key)
    if small is None:
        if len(_SMALL) >= 1 << 16:  # scalars in the key (a learning rate) can make it grow
            _SMALL.clear()
        small = _SMALL[key] = _host_result_is_small(func, args, kwargs, limit)
    return small


def _host_result_is_small(func, args, kwargs, limit: int) -> bool:
    if func.namespace != "aten" or not any(isinstance(a, torch.Tensor) for a in leaves(args, kwargs)):
        return False  # factories (whose size is in their arguments) and other namespaces: ask the fake mode
    from torch.utils._python_dispatch import _disable_current_modes

    try:
        with _disable_current_modes():
            out = func(*_meta_like(args), **{k: _meta_like(v) for k, v in kwargs.items()})
    except Exception:  # no meta kernel, a value-dependent shape, an input view past its storage
        return False
    return small_host_result(out, limit, device="meta")


def small_host_result(out, limit: int, device: str = "cpu") -> bool:
    """The (fake) results are host tensors (on `device`) of under `limit` bytes in all (at
    `limit`, :func:`fakeify` already counts a tensor as large)."""
    total = 0
    for t in out if isinstance(out, (list, tuple)) else (out,):
        if isinstance(t, torch.Tensor):
            if t.device.type != device:
                return False
            total += t.numel() * t.element_size()
    return total < limit


# The fake mode cannot give these ops' result shapes (they depend on the values).
DATA_DEPENDENT = (DataDependentOutputException, DynamicOutputShapeException)


def modes_off():
    """A context in which ops run outside every dispatch mode (the fake one included): for real."""
    from torch.utils._python_dispatch import _disable_current_modes

    return _disable_current_modes()


def run_real(func, args, kwargs):
    """Runs an op outside every dispatch mode (the fake one included): on real tensors."""
    from torch.utils._python_dispatch import _disable_current_modes

    with _disable_current_modes():
        return func(*args, **kwargs)


def forget_outputs(mode: FakeTensorMode, outs) -> None:
    """Drop the fake mode's memo entries for op outputs.

    The mode memoises every result it wraps in a WeakValueDictionary; the weak
    reference that leaves on a tensor makes ``torch.utils.swap_tensors`` refuse it,
    and ``Module._apply`` swaps fake parameters, so ``model.to(torch.bfloat16)``
    (or ``.to("neuron")``) of a model built under the mode fails. A fresh result is
    never looked up in that memo again (it is keyed by a meta tensor nobody holds).
    """
    memo = mode.fake_tensor_converter.meta_converter.tensor_memo
    for t in outs:
        for ref in weakref.getweakrefs(t):
            key = getattr(ref, "key", None)  # the memo's KeyedRef
            if key is not None and memo.get(key) is t:
                del memo[key]


def storage_key(t: torch.Tensor) -> tuple:
    """(key, storage) of a tensor's storage: the key is stable while the storage lives, and
    views of one storage share it. The Python storage object is preserved by PyTorch as long
    as its StorageImpl lives, so a weak reference to it tells when the memory is freed."""
    st = t.untyped_storage()
    return st._cdata, st


def storage_key_of(st) -> int:
    """:func:`storage_key`'s key of an untyped storage."""
    return st._cdata


def local(t: torch.Tensor) -> torch.Tensor:
    """A DTensor's local shard (what occupies this rank's memory); other tensors as they are."""
    return getattr(t, "_local_tensor", t)


def is_wrapper(t: torch.Tensor) -> bool:
    """DTensor and other wrapper subclasses: their local tensors are what occupy memory."""
    return is_traceable_wrapper_subclass(t)


def is_functorch_wrapper(t: torch.Tensor) -> bool:
    """vmap's and grad's wrappers (of type torch.Tensor, without a storage of their own): the
    tensor they wrap is what occupies memory."""
    return torch._C._functorch.is_functorch_wrapped_tensor(t)


def fake_process_group(opts):
    """PyTorch's fake process group for a c10d backend creator's options: the group's real rank
    and size; collectives complete at once and move nothing (their fake outputs have the
    right shapes). Object collectives read values and stop a dry run at that line."""
    from torch._C._distributed_c10d import FakeProcessGroup

    return FakeProcessGroup._create_internal(opts.group_rank, opts.group_size)


class ForeachTap:
    """Lets optimizers take their multi-tensor (foreach) path on fake tensors, as they do
    on real neuron tensors: ``torch.optim`` picks it only for parameters whose type is in
    ``_foreach_supported_types`` (Tensor, Parameter), and a fake parameter's type is
    FakeTensor; without this a dry run would time and account the per-tensor loop."""

    def install(self) -> None:
        from torch.optim import optimizer
        from torch.utils import _foreach_utils

        lists = (optimizer._foreach_supported_types, _foreach_utils._foreach_supported_types)
        self._added = [types for types in lists if FakeTensor not in types]
        for types in self._added:
            types.append(FakeTensor)

    def remove(self) -> None:
        for types in getattr(self, "_added", ()):
            types.remove(FakeTensor)
        self._added = []


_ABSENT = object()  # an attribute an owner does not have itself (it inherits it)


class AttributeTap:
    """Replaces attribute `_name` of class or module `_owner`, for the dry run only, with what
    `_replacement()` makes (each tap reads the original it wraps there): `remove` puts back what
    the owner had itself, or deletes the attribute when it inherited it. Installing or removing
    twice in a row changes nothing."""

    _owner: object
    _name: str
    _installed = False

    def _replacement(self):
        raise NotImplementedError

    def install(self) -> None:
        if not self._installed:
            new = self._replacement()
            self._old = vars(self._owner).get(self._name, _ABSENT)
            setattr(self._owner, self._name, new)
            self._installed = True

    def remove(self) -> None:
        if self._installed:
            if self._old is _ABSENT:
                delattr(self._owner, self._name)
            else:
                setattr(self._owner, self._name, self._old)
            self._installed = False


class SwapTap(AttributeTap):
    """Drops what the dry run keeps about two tensors before ``torch.utils.swap_tensors`` swaps
    them. ``Module.to`` swaps fake parameters, and swap_tensors refuses a tensor with a weak
    reference: the one by which the dry run keeps a small tensor's known values (a bias moved
    from the host, which accelerate's loader then makes a parameter). `forget` takes a tensor."""

    _owner, _name = torch.utils, "swap_tensors"

    def __init__(self, forget):
        self._forget = forget

    def _replacement(self):
        orig = torch.utils.swap_tensors

        def swap_tensors(t1, t2):
            self._forget(t1)
            self._forget(t2)
            if isinstance(t2, FakeTensor) and not isinstance(t1, FakeTensor):
                _drop_fake_mode_refs(t1, t2)  # a real host parameter takes its moved value
            return orig(t1, t2)

        return swap_tensors


class DataSetterTap(AttributeTap):
    """Lets ``tensor.data = fake`` make a real host tensor the fake one's alias, as it makes a host
    tensor a device one in a real run; then ``on_alias(tensor, fake)``.

    FSDP2's ``fully_shard`` moves a host-built model's parameters to the device in place
    (``param.data = param.to(device)``). A small host tensor is real in a dry run, and the
    setter gives its C++ tensor the fake one's meta storage while its Python object stays a
    plain tensor: it would then be on "meta". Here the object is swapped
    (``torch.utils.swap_tensors``, which Module.to uses for fakes) with a fake alias of the new
    value, keeping what ``.data =`` keeps: identity, parameter-ness, ``requires_grad`` and
    Python attributes. A tensor with a gradient (which a swap would lose), a non-leaf and a
    wrapper subclass keep the plain setter."""

    _owner, _name = torch.Tensor, "data"

    def __init__(self, on_alias):
        self._on_alias = on_alias

    def _replacement(self):
        descr = torch._C.TensorBase.__dict__["data"]

        def set_data(t, value):
            if isinstance(value, FakeTensor) and _plain_leaf_without_grad(t):
                _become_alias(t, value)
                self._on_alias(t, value)
            else:
                descr.__set__(t, value)

        return property(descr.__get__, set_data, doc=descr.__doc__)


class ModuleConversionTap(AttributeTap):
    """Lets ``Module.to(device)`` keep a host-built module's parameter objects in a dry run, as
    it does in a real run: tied weights stay tied.

    A real run moves a parameter with ``param.data = moved``, in place, so a weight that two
    modules share (an embedding tied to the LM head) is moved once and stays one object. In a
    dry run the moved value of a small host parameter (a real tensor) is a fake one, for which
    ``Module._apply`` makes a new Parameter per module instead: the tie comes apart and the
    weight is counted twice. For a module that holds such a parameter, ``_apply`` here runs
    with PyTorch's swap-on-conversion setting, which swaps the moved value into the existing
    object (what it already does for fake parameters)."""

    _owner, _name = torch.nn.Module, "_apply"

    def _replacement(self):
        orig = torch.nn.Module._apply
        future = torch.__future__

        def _apply(module, fn, recurse=True):
            if recurse:
                for child in module.children():
                    child._apply(fn)
            users = future.get_swap_module_params_on_conversion()
            real = any(p is not None and _plain_leaf_without_grad(p) for p in module._parameters.values())
            future.set_swap_module_params_on_conversion(users or real)
            try:
                return orig(module, fn, recurse=False)
            finally:
                future.set_swap_module_params_on_conversion(users)

        return _apply


def _plain_leaf_without_grad(t: torch.Tensor) -> bool:
    return not isinstance(t, FakeTensor) and not is_traceable_wrapper_subclass(t) and t.is_leaf and t.grad is None


def _become_alias(t: torch.Tensor, value: FakeTensor) -> None:
    """Swaps real tensor `t` with a fake alias of `value`: `t` keeps its identity and attributes."""
    with torch.no_grad():
        alias = value.detach()
    alias.requires_grad_(t.requires_grad)
    if isinstance(t, torch.nn.Parameter):
        alias._is_param = True  # how nn.Parameter marks a parameter of a tensor subclass
    _drop_fake_mode_refs(t, alias)
    torch.utils.swap_tensors(t, alias)  # read at call time: the dry run's SwapTap wraps it
    for k, v in vars(alias).items():  # `alias` now holds `t`'s old attributes
        vars(t).setdefault(k, v)


def _drop_fake_mode_refs(t: torch.Tensor, alias: FakeTensor) -> None:
    """Drops the fake mode's weak references to real `t` (its converter's memo of the real
    tensors it converted) and to `alias` (its memo of results; the aliases of a constant it
    tracks), which swap_tensors refuses: after the swap `t` is neither tensor."""
    from torch.multiprocessing.reductions import StorageWeakRef

    converter = alias.fake_mode.fake_tensor_converter
    converter.meta_converter.describer.lookup_tensor.pop(t, None)
    forget_outputs(alias.fake_mode, (alias,))
    if alias.constant is not None:  # a one-element host value the fake mode folds: a device one is not
        refs = converter.constant_storage_mapping.get(StorageWeakRef(alias.constant._typed_storage()), [])
        refs[:] = [r for r in refs if r() is not alias]
        alias.constant = None


class ShardingCacheTap:
    """Lets DTensor cache its sharding propagation in a dry run, as it does in an eager run.

    DTensor propagates without its cache while it believes it is tracing, and an active fake
    mode is one of its signs. The dry run's fake mode is active throughout, with concrete
    shapes, so the cache holds as it does in eager; propagating every op anew took about 7%
    of a rank of a TP x FSDP dry run. Installed on DTensor's propagator for the dry run only.
    """

    def __init__(self):
        self._prop = None

    def install(self) -> None:
        from torch.distributed.tensor import DTensor

        prop = DTensor._op_dispatcher.sharding_propagator
        if "propagate_op_sharding_non_cached" in vars(prop):
            return
        # The cache wraps the original method, bound when the propagator was built.
        cached, uncached = prop.propagate_op_sharding, prop.propagate_op_sharding_non_cached

        def propagate(op_schema):
            try:
                return cached(op_schema)
            except TypeError:  # an unhashable schema (symbolic sizes of a compiler's trace)
                return uncached(op_schema)

        prop.propagate_op_sharding_non_cached = propagate
        self._prop = prop

    def remove(self) -> None:
        if self._prop is not None:
            del self._prop.propagate_op_sharding_non_cached
            self._prop = None


class _ModesLeft:
    """Pops a thread's dry-run modes as the thread ends (see `ThreadTap`)."""

    def __init__(self, modes):
        self._modes, self._thread = modes, threading.get_ident()

    def __del__(self):
        if threading.get_ident() != self._thread:  # a daemon's locals dropped at finalisation
            return
        for mode in reversed(self._modes):  # an infra mode (fake) sits in its own slot, by key
            torch._C._pop_torch_dispatch_stack(getattr(mode, "_mode_key", None))


_thread_modes = threading.local()  # module-level: a ThreadTap's end must not drop other threads' entries


class ThreadTap:
    """Runs the threads a script starts during a dry run in the dry run too.

    Dispatch modes are per thread, so an op in a thread the script starts (transformers
    loads a checkpoint's tensors in a thread pool) would escape the fake mode: it would
    read the checkpoint and allocate real device memory. ``threading.setprofile`` runs a
    function in each thread the threading module starts, before its target; that function
    enters `modes` there (innermost first) and hands the thread to the previous profile
    hook. A thread still alive after the dry run keeps the modes, and the dry run's mode
    then runs its ops for real.

    The modes leave with the thread's Python locals, which the ending thread clears itself,
    holding the GIL, before its join returns. Left on its dispatch stack, they would be
    released by the thread's C++ thread-local destructor, which takes the GIL after the join
    returned: for a thread joined by an exit hook (tqdm's monitor, which a progress bar
    starts) that can be as Python finalises, which ends the thread inside a destructor and
    aborts the process ("terminate called without an active exception"). Locals rather
    than a profile hook watching ``run`` return: that hook would run at every call."""

    def __init__(self, modes):
        self._modes = modes
        self._prev = None
        self._installed = False

    def install(self) -> None:
        self._prev = threading.getprofile()
        threading.setprofile(self._enter)
        self._installed = True

    def _enter(self, frame, event, arg) -> None:
        sys.setprofile(self._prev)
        for mode in self._modes:
            torch._C._push_on_torch_dispatch_stack(mode)
        _thread_modes.left = _ModesLeft(self._modes)

    def remove(self) -> None:
        if self._installed:
            threading.setprofile(self._prev)
            self._installed = False


class StorageResizeTap(AttributeTap):
    """Calls ``on_resize(storage, new_nbytes)`` for every ``UntypedStorage.resize_``.

    FSDP2 frees and re-allocates unsharded parameters by resizing their storage (no ATen
    op a dispatch mode would see), so the dry run's accounting must see those resizes.
    """

    _owner, _name = torch.UntypedStorage, "resize_"

    def __init__(self, on_resize):
        self._on_resize = on_resize

    def _replacement(self):
        orig = torch.UntypedStorage.resize_
        on_resize = self._on_resize

        def resize_(storage, size):
            out = orig(storage, size)
            on_resize(storage, int(size))
            return out

        return resize_


class StoragePointerTap(AttributeTap):
    """Gives each storage without memory (a fake tensor's, on "meta") its own pointer in a dry run.

    Such a storage's ``data_ptr()`` is 0, so to the libraries that tell shared tensors apart by
    their storage's pointer (safetensors, transformers' ``save_pretrained``, huggingface_hub's
    sharding) every weight of a dry run shares one storage: saving fails, or counts one tensor's
    bytes for all. Here it is the address of its StorageImpl: distinct storages differ, and views
    and tied weights share one, as a real storage's pointer does."""

    _owner, _name = torch.UntypedStorage, "data_ptr"

    def _replacement(self):
        orig = torch._C.StorageBase.data_ptr

        def data_ptr(storage):
            return storage._cdata if storage.device.type == "meta" else orig(storage)

        return data_ptr


class FakeDataPointerTap(AttributeTap):
    """A fake tensor's ``data_ptr()`` in a dry run: its storage's pointer (``StoragePointerTap``)
    plus its offset, as a real tensor's is. transformers' ``save_pretrained`` compares the data
    pointers of tensors that share a storage (tied weights) to tell identical ones from disjoint
    views; PyTorch's own answer for a fake tensor is the meta storage's 0, with a deprecation
    warning printed in the middle of the user's save."""

    _owner, _name = FakeTensor, "data_ptr"

    def _replacement(self):
        def data_ptr(t):
            return t.untyped_storage().data_ptr() + t.storage_offset() * t.element_size()

        return data_ptr


class BufferStorageTap(AttributeTap):
    """Makes ``UntypedStorage.from_buffer`` a real host storage in a dry run.

    Under a fake mode it makes a storage on "meta", without the bytes. The bytes exist (a
    pickled object: c10d's object collectives turn one into a tensor this way), so the storage
    holds them, as in a real run.
    """

    _owner, _name = torch.UntypedStorage, "from_buffer"

    def _replacement(self):
        orig = torch._C.StorageBase.from_buffer

        def from_buffer(*args, **kwargs):
            with modes_off():
                return orig(*args, **kwargs)

        return staticmethod(from_buffer)


class ParameterClassTap(AttributeTap):
    """Lets ``type(param)(value, requires_grad=...)`` make a parameter of a fake one, as it does of
    a real one (``Parameter(value, requires_grad=...)``).

    A parameter made in a dry run is a FakeTensor marked as a parameter (``nn.Parameter`` of a
    tensor subclass), so its type is FakeTensor, whose constructor takes a fake mode. accelerate's
    ``set_module_tensor_to_device``, which diffusers loads weights with, rebuilds each parameter
    by its type that way.
    """

    _owner, _name = FakeTensor, "__new__"

    def _replacement(self):
        orig = FakeTensor.__dict__["__new__"]

        def new(cls, *args, **kwargs):
            if (
                cls is FakeTensor
                and len(args) == 1
                and isinstance(args[0], torch.Tensor)
                and set(kwargs) <= {"requires_grad"}
            ):
                return torch.nn.Parameter(args[0], requires_grad=kwargs.get("requires_grad", True))
            return orig.__func__(cls, *args, **kwargs)

        return staticmethod(new)


# -- torch.distributed.pipelining: a schedule's step and its stages' actions ---------------------------
# The actions a stage runs for one micro-batch, by the method that runs them: the names of
# torch.distributed.pipelining's _ComputationType ("F" forward, "B" full backward, "I" backward of
# the inputs only, "W" of the weights only).
_STAGE_ACTIONS = {"forward_one_chunk": "F", "backward_weight_one_chunk": "W"}


def pipeline_schedules() -> tuple:
    """The classes whose ``step()`` runs a pipeline schedule (none when pipelining cannot be imported)."""
    try:
        from torch.distributed.pipelining import schedules
    except ImportError:
        return ()
    return schedules.PipelineScheduleSingle, schedules.PipelineScheduleMulti


def schedule_facts(schedule) -> dict:
    """What a pipeline schedule is: its class's name, micro-batches per step, stages in all, its
    stages' indices on this rank, the pipeline group's global ranks, and every rank's actions in
    order (``{group rank: [(stage, kind, micro-batch), ...]}``, the schedule's own IR; idle slots
    and communication left out)."""
    import torch.distributed as dist
    from torch.distributed.pipelining import schedules

    stages = getattr(schedule, "_stages", None) or [schedule._stage]
    n, num_stages = schedule._n_microbatches, schedule._num_stages
    if isinstance(schedule, schedules.PipelineScheduleSingle):
        # torch 2.13's IR of a single-stage schedule is its picture, not what step() runs (its 1F1B
        # IR numbers the last stage's micro-batches from 1): the order step() runs, per rank
        order = {s: _single_stage_order(schedule, s, num_stages, n) for s in range(num_stages)}
    else:  # multi-stage schedules run their IR
        order = {
            int(rank): [
                (a.stage_index, str(a.computation_type.value), a.microbatch_index)
                for a in actions
                if a is not None and str(a.computation_type.value) in ("F", "B", "I", "W")
            ]
            for rank, actions in schedule.pipeline_order.items()
        }
    group = stages[0].group
    ranks = dist.get_process_group_ranks(group) if group is not None else list(range(stages[0].group_size))
    return {
        "schedule": type(schedule).__name__,
        "microbatches": n,
        "stages": num_stages,
        "stage_indices": [s.stage_index for s in stages],
        "group": list(ranks),
        "order": order,
    }


def _single_stage_order(schedule, stage: int, num_stages: int, n: int) -> list:
    """The actions a single-stage schedule's ``_step_microbatches`` runs on `stage`, in order:
    1F1B's warmup forwards (as many as the stages after it, itself included), then one backward
    and one forward in turn, then the remaining backwards; any other, every forward, then every
    backward (GPipe's)."""
    from torch.distributed.pipelining import schedules

    if not isinstance(schedule, schedules.Schedule1F1B):
        backward = [(stage, "B", mb) for mb in range(n)] if schedule._has_backward else []
        return [(stage, "F", mb) for mb in range(n)] + backward
    return one_f_one_b_order(stage, num_stages, n)


def one_f_one_b_order(stage: int, num_stages: int, n: int) -> list:
    """1F1B's actions on `stage` of `num_stages` for `n` micro-batches: (stage, "F" or "B", micro-batch)."""
    warmup = min(n, num_stages - stage)
    order = [(stage, "F", mb) for mb in range(warmup)]
    f = warmup
    for b in range(n):
        order.append((stage, "B", b))
        if f < n:
            order.append((stage, "F", f))
            f += 1
    return order


def first_microbatches(schedule, args: tuple, kwargs: dict, target, m: int) -> tuple:
    """(args, kwargs, target) of a whole-batch ``step()`` cut to its first `m` micro-batches, split
    and merged by the schedule's own chunk specs (so a schedule of `m` splits them the same way)."""
    from torch.distributed.pipelining.microbatch import TensorChunkSpec, merge_chunks, split_args_kwargs_into_chunks

    n = schedule._n_microbatches
    arg_chunks, kwarg_chunks = split_args_kwargs_into_chunks(
        args, kwargs, n, schedule._args_chunk_spec, schedule._kwargs_chunk_spec
    )
    spec = schedule._args_chunk_spec or tuple(TensorChunkSpec(0) for _ in args)
    kwarg_spec = schedule._kwargs_chunk_spec or {k: TensorChunkSpec(0) for k in kwargs}
    args = merge_chunks(arg_chunks[:m], spec) if args else args
    kwargs = merge_chunks(kwarg_chunks[:m], kwarg_spec) if kwargs else kwargs
    if target is not None:
        chunks, _ = split_args_kwargs_into_chunks((target,), None, n)
        target = merge_chunks([c[0] for c in chunks[:m]], TensorChunkSpec(0))
    return tuple(args), dict(kwargs), target


def initialize_stage(schedule, args: tuple, kwargs: dict, target) -> None:
    """Prepare a single-stage schedule's stage for all its micro-batches (the receive buffers of
    each), from the first of the whole-batch inputs, as its first ``step()`` does: a step of fewer
    micro-batches would prepare fewer. Nothing when it is prepared already."""
    from torch.distributed.pipelining.microbatch import split_args_kwargs_into_chunks

    if schedule._stage_forward_initialized and (schedule._stage_backward_initialized or not schedule._has_backward):
        return
    schedule._stage.has_backward = schedule._has_backward
    arg_mbs, kwarg_mbs = schedule._split_inputs(args, kwargs)
    targets = (
        split_args_kwargs_into_chunks((target,), None, schedule._n_microbatches)[0] if target is not None else None
    )
    schedule._initialize_stage(arg_mbs[0], kwarg_mbs[0], targets[0][0] if targets else None)


def pass_microbatches(stage, microbatches) -> None:
    """For each micro-batch of `microbatches` that the stage before `stage` ran and `stage` did not:
    send that stage its inputs' gradients and receive its activations, by the stage's own ops, as
    its step does for one it runs (a gradient it has none of goes as the stage's zeros of its shape)."""
    from torch.distributed.pipelining import schedules

    for mb in microbatches:
        stage.bwd_cache[mb] = (None,) * len(stage.args_recv_info[mb])
        ops = stage.get_bwd_send_ops(mb) + stage.get_fwd_recv_ops(mb)
        schedules._wait_batch_p2p(schedules._batch_p2p(ops))


def schedule_stages(schedule) -> list:
    """The stages a pipeline schedule runs on this rank."""
    return getattr(schedule, "_stages", None) or [schedule._stage]


def set_microbatches(schedule, n: int) -> int:
    """Set the micro-batches a schedule's next step runs; returns what it was."""
    old, schedule._n_microbatches = schedule._n_microbatches, n
    return old


class ScheduleStepTap:
    """Wraps ``step()`` of every pipeline schedule with ``wrap(orig)``'s function, for one run."""

    def __init__(self, wrap):
        self._wrap = wrap
        self._orig: dict = {}

    def install(self) -> None:
        for cls in pipeline_schedules():
            if cls not in self._orig:
                self._orig[cls] = orig = vars(cls)["step"]
                cls.step = self._wrap(orig)

    def remove(self) -> None:
        for cls, orig in self._orig.items():
            cls.step = orig
        self._orig = {}


class PipelineActionTap:
    """Runs each stage action of torch.distributed.pipelining (a micro-batch's forward with its
    loss, backward, or weight backward) inside ``around(stage_index, kind, microbatch)``, a context
    manager."""

    def __init__(self, around):
        self._around = around
        self._orig: dict = {}  # (class, method name) -> the class's own method

    def install(self) -> None:
        try:
            from torch.distributed.pipelining.schedules import _PipelineSchedule
            from torch.distributed.pipelining.stage import _PipelineStageBase
        except ImportError:
            return
        targets = [
            (_PipelineStageBase, n) for n in ("forward_one_chunk", "backward_one_chunk", "backward_weight_one_chunk")
        ]
        targets.append((_PipelineSchedule, "_maybe_compute_loss"))  # in the schedule's loop, after the forward
        for owner, name in targets:
            if name in vars(owner) and (owner, name) not in self._orig:
                self._orig[(owner, name)] = orig = vars(owner)[name]
                setattr(owner, name, self._loss(orig) if owner is _PipelineSchedule else self._wrap(name, orig))

    def _wrap(self, name: str, orig):
        import functools

        around = self._around

        @functools.wraps(orig)
        def action(stage, chunk_id, *args, **kwargs):
            # a full backward is "B", one of the inputs only "I" (full_backward=False)
            kind = _STAGE_ACTIONS.get(name) or ("B" if kwargs.get("full_backward", True) else "I")
            with around(stage.stage_index, kind, chunk_id):
                return orig(stage, chunk_id, *args, **kwargs)

        return action

    def _loss(self, orig):
        import functools

        around = self._around

        @functools.wraps(orig)
        def loss(schedule, stage, output, target_mbs, mb_index, *args, **kwargs):
            with around(stage.stage_index, "F", mb_index):  # part of the micro-batch's forward
                return orig(schedule, stage, output, target_mbs, mb_index, *args, **kwargs)

        return loss

    def remove(self) -> None:
        for (owner, name), orig in self._orig.items():
            setattr(owner, name, orig)
        self._orig = {}


# -- what the recorder reads -----------------------------------------------------------------
# Dynamo logs each graph break, with its user line, only to this (private) logger when enabled.
GRAPH_BREAK_LOGGER = "torch._dynamo.symbolic_convert.__graph_breaks"
GRAPH_BREAK_AT = re.compile(r"in user code at (.+?):(\d+)\s*\nGraph Break Reason: (.*)")


class CompiledCallTap:
    """Tells `on_call(module, args, kwargs)` of each outermost call of a ``torch.compile``'d
    module call or method (not of calls made while Dynamo traces): a forward run inside compiled code has no
    module hook to delimit it, but the call of the compiled callable runs in eager Python. Only
    callables that ``torch.compile`` makes while installed are seen (``OptimizeContext.__call__``
    makes the wrapper that sets Dynamo's frame callback; ``torch.compile(module)`` makes one
    for the module's call), and only those of a module (``model.forward``, generate's compiled
    ``self.__call__``, ``model.compile()``): a compiled function of one's own (a helper, a
    compiled ``flex_attention``) is not a model's forward."""

    def __init__(self, on_call):
        self._on_call = on_call
        self._depth = threading.local()

    def install(self) -> None:
        import functools
        import types

        from torch._dynamo.eval_frame import OptimizeContext

        orig = self._orig = OptimizeContext.__call__
        tap = self

        @functools.wraps(orig)
        def __call__(ctx, fn):
            compiled = orig(ctx, fn)
            # a bound method of a module, or the frame torch.compile(module) wraps around a module
            # whose forward Dynamo would skip (``external_utils.wrap_inline``)
            owner = getattr(fn, "__self__", None)
            owner = getattr(fn, "__wrapped__", None) if owner is None else owner
            if isinstance(owner, torch.nn.Module) and isinstance(compiled, types.FunctionType):
                return tap._wrap(compiled, owner)
            return compiled

        OptimizeContext.__call__ = __call__

    def _wrap(self, compiled, module):
        import functools
        import weakref

        depth, module = self._depth, weakref.ref(module)

        @functools.wraps(compiled)  # keeps Dynamo's attributes (_torchdynamo_orig_callable, ...)
        def call(*args, **kwargs):
            if torch.compiler.is_compiling():
                return compiled(*args, **kwargs)
            d = getattr(depth, "n", 0)
            if d == 0:
                self._on_call(module(), args, kwargs)
            depth.n = d + 1
            try:
                return compiled(*args, **kwargs)
            finally:
                depth.n = d

        return call

    def active(self) -> bool:
        """Whether this thread is inside a call of a tapped compiled callable."""
        return getattr(self._depth, "n", 0) > 0

    def remove(self) -> None:
        from torch._dynamo.eval_frame import OptimizeContext

        if getattr(self, "_orig", None) is not None:
            OptimizeContext.__call__, self._orig = self._orig, None


class RedistributionTap:
    """Notes the local arguments a DTensor op runs on after DTensor redistributed its inputs for it
    (a Shard(0) input of a matmul that needs it replicated: the all-gathered tensor), for the
    recorder to cost the local op DTensor actually runs.

    DTensor's dispatcher (its C++ fast path too) calls ``OpDispatcher.redistribute_local_args``
    whenever its sharding decision redistributes an op's inputs, and only then; wrapped while a
    recording runs, it keeps, per thread, the op, the identity of each input's shard before, and
    the shape and dtype of each local argument after (not the tensors: that would keep an
    all-gathered weight alive). Asking DTensor's sharding propagation instead costs a full Python
    propagation per op and shapes the first time (its C++ cache is not the Python one), and a few
    microseconds per DTensor op after; this costs nothing for an op that redistributes nothing."""

    def __init__(self):
        self._notes = threading.local()
        self._orig = None
        self.armed = False  # a recording runs: wrap DTensor's redistribution once it is imported

    def on_import(self, _module=None) -> None:
        """DTensor's dispatch module is imported: wrap it if a recording runs."""
        if self.armed:
            self.install()

    def install(self) -> None:
        """Wrap DTensor's redistribution (``torch.distributed.tensor`` must be imported)."""
        from torch.distributed.tensor._dispatch import OpDispatcher

        if self._orig is not None:
            return
        self._orig = vars(OpDispatcher)["redistribute_local_args"]
        redistribute, notes = self._orig.__func__, self._notes

        def redistribute_local_args(op_info, suggested_input_schema, use_val_from_redistribute_schema):
            before = tuple(id(a) if isinstance(a, torch.Tensor) else None for a in op_info.local_args)
            redistribute(op_info, suggested_input_schema, use_val_from_redistribute_schema)
            after = tuple(
                (tuple(a.shape), a.dtype) if isinstance(a, torch.Tensor) else None for a in op_info.local_args
            )
            notes.last = (suggested_input_schema.op, before, after, op_info.args_tree_spec is not None)

        OpDispatcher.redistribute_local_args = staticmethod(redistribute_local_args)

    def remove(self) -> None:
        self.armed = False
        if self._orig is not None:
            from torch.distributed.tensor._dispatch import OpDispatcher

            OpDispatcher.redistribute_local_args, self._orig = self._orig, None
            self._notes = threading.local()

    def local_args(self, func, args):
        """The positional arguments of the local op DTensor just ran for `func` on `args`, when it
        redistributed them for it: each DTensor as its local shard after the redistribution (a meta
        tensor of that shape where it changed), the rest as they are. None when it redistributed
        nothing for this call: the current shards are the ones it ran on."""
        note, self._notes.last = getattr(self._notes, "last", None), None
        if note is None or note[0] != func:
            return None
        import torch.utils._pytree as pytree

        _, before, after, flattened = note
        flat, spec = pytree.tree_flatten(args) if flattened else (list(args), None)
        flat = [local(a) if isinstance(a, torch.Tensor) else a for a in flat]
        if len(flat) != len(before) or any(b is not None and b != id(a) for a, b in zip(flat, before)):
            return None  # a note of another call of the op (one DTensor ran inside another's dispatch)
        for i, (a, meta) in enumerate(zip(flat, after)):
            if meta is not None and isinstance(a, torch.Tensor) and meta != (tuple(a.shape), a.dtype):
                flat[i] = torch.empty(meta[0], dtype=meta[1], device="meta")
        return pytree.tree_unflatten(flat, spec) if flattened else tuple(flat)


def collective_group(func, args):
    """The process group a c10d op runs in (None when it cannot be told)."""
    from torch.distributed._tools.fake_collectives import CollectiveOp

    try:
        return CollectiveOp.get_process_group(func, args)
    except Exception:
        return None


def comm_bytes(func, out, args, kwargs) -> int | None:
    """The bytes a c10d op's collective moves, as PyTorch's own estimators count them (None when
    it cannot be told)."""
    from torch.distributed._tools.fake_collectives import CollectiveOp

    try:
        return int(CollectiveOp.get_comm_tensor_size(func, out, args, kwargs))
    except Exception:
        return None


def issued_async(func, args, kwargs) -> bool:
    """Whether a c10d op was issued with ``async_op=True`` (functional collectives: False)."""
    if not func.name().startswith("c10d::"):
        return False
    for i, a in enumerate(func._schema.arguments):
        if a.name == "async_op":
            if a.name in kwargs:
                return bool(kwargs[a.name])
            return bool(args[i]) if i < len(args) else bool(a.default_value)
    return False


def overload_packet(func):
    """An ATen op overload's packet (``aten.mm`` of ``aten.mm.default``): what flop formulas are keyed by."""
    return func._overloadpacket


# -- c10d's object collectives, as a dry run re-issues them (objects) -------------------------------
def group_or_default(group):
    """`group`, or the default group for None."""
    from torch.distributed import distributed_c10d as c10d

    return c10d._group_or_default_group(group)


def in_group(group) -> bool:
    """Whether this rank is a member of `group`."""
    from torch.distributed import distributed_c10d as c10d

    return not c10d._rank_not_in_group(group)


def group_rank_of(group, rank, group_rank) -> int:
    """A peer's rank in `group`, from its global `rank` or its `group_rank` (whichever is given)."""
    from torch.distributed import distributed_c10d as c10d

    return c10d._canonicalize_group_rank(group, rank, group_rank)


def object_collective_device(group):
    """The device c10d's object collectives of `group` put their byte tensors on."""
    from torch.distributed import distributed_c10d as c10d

    return c10d._get_object_coll_device(group)


def c10d_pickle(obj) -> bytes:
    """`obj` pickled as c10d's object collectives pickle it."""
    import io

    from torch.distributed import distributed_c10d as c10d

    f = io.BytesIO()
    c10d._pickler(f).dump(obj)
    return f.getvalue()


def c10d_unpickle(data: bytes):
    """An object as c10d's object collectives unpickle it."""
    import io

    from torch.distributed import distributed_c10d as c10d

    return c10d._unpickler(io.BytesIO(data)).load()


# -- Dynamo's compile events (the phases of a generation) ------------------------------------------
def dynamo_compiled_a_graph() -> bool:
    """Whether Dynamo has compiled any graph in this process."""
    from torch._dynamo.utils import counters

    return bool(counters["stats"]["unique_graphs"])


def on_compile_start(callback, remove: bool = False) -> None:
    """Call `callback()` when Dynamo starts compiling a frame (or stop calling it)."""
    from torch._dynamo.callback import callback_handler

    if not remove:
        callback_handler.register_start_callback(callback)
        return
    try:
        callback_handler.remove_start_callback(callback)
    except ValueError:  # never registered (compiled before the recording)
        pass


def group_size(group) -> int:
    """The size of a process group, given as a group or by the name functional collectives pass."""
    if isinstance(group, str):
        from torch._C._distributed_c10d import _resolve_process_group

        group = _resolve_process_group(group)
    return group.size()


def group_desc(name: str) -> str:
    """The description c10d gave the group named `name` (a DeviceMesh dimension's is
    ``mesh_<dim>``), or "" when it has none (or is gone)."""
    try:
        from torch._C._distributed_c10d import _resolve_process_group

        return _resolve_process_group(name).group_desc or ""
    except Exception:
        return ""


def group_ranks(pg) -> list:
    """The global ranks of a group's members, in group-rank order."""
    import torch.distributed as dist

    try:
        return list(dist.get_process_group_ranks(pg))
    except Exception:  # a group this process's c10d does not know by object: its size at least
        return list(range(pg.size()))


def reduce_op_name(a) -> str | None:
    """A c10d op's boxed ReduceOp argument as its name ("sum", "max", ...), else None."""
    if type(a).__name__ != "ScriptObject" or "op" not in a._method_names():
        return None
    import torch.distributed as dist

    return dist.ReduceOp.RedOpType(a.op()).name.lower()


def completed_work(out):
    """A c10d op's ``(tensors, Work)`` with its Work replaced by one already completed with those
    tensors: the fake process group's Work has a future without a value, which DDP's reducer
    (its default all-reduce hook) requires."""
    if not (isinstance(out, tuple) and len(out) == 2 and type(out[1]).__name__ == "ScriptObject"):
        return out
    from torch._C._distributed_c10d import _create_work_from_future

    fut = torch.futures.Future()
    fut.set_result(out[0])
    return out[0], _create_work_from_future(fut).boxed()


def written_arguments(func, args):
    """The tensor arguments an op writes in place (from its schema's alias annotations)."""
    for a, spec in zip(args, func._schema.arguments):
        if isinstance(a, torch.Tensor) and spec.alias_info is not None and spec.alias_info.is_write:
            yield a


def own_parameters(module) -> list:
    """A module's own parameters (not its children's), without the generator's overhead."""
    return [p for p in module._parameters.values() if p is not None]


def own_parameter(module, name: str):
    """The parameter `module` registers as `name` itself (None when it has none by that name)."""
    return module._parameters.get(name)


# Opcodes that branch on the value just computed: the Python value of a tensor feeds control flow.
_BRANCH_OPS = frozenset(
    op
    for name, op in dis.opmap.items()
    if name.startswith(("POP_JUMP", "JUMP_IF_")) or name in ("UNARY_NOT", "TO_BOOL", "ASSERT")
)


def branches_on_value(f) -> bool:
    """True when the frame converts a tensor to a Python value to branch on it (``if t:``,
    ``while not t:``, ``t and ...``, ``assert t``, ``if bool(t):``). Reads CPython's bytecode
    at the running instruction: CPython 3.10-3.13's opcodes."""
    if f is None:
        return False
    code = f.f_code.co_code
    i = f.f_lasti  # a byte offset: the instruction running now
    if code[i] in _BRANCH_OPS:
        return True
    if dis.opname[code[i]] not in ("CALL", "PRECALL"):
        return False
    i += 2
    while i < len(code) and dis.opname[code[i]] in ("CACHE", "EXTENDED_ARG", "PRECALL", "CALL"):
        i += 2
    return i < len(code) and code[i] in _BRANCH_OPS


def _has(path: str) -> bool:
    """``"module:attr.attr"`` names something that exists."""
    import importlib

    module, _, attrs = path.partition(":")
    try:
        obj = importlib.import_module(module)
    except ImportError:
        return False
    for a in attrs.split(".") if attrs else ():
        if not hasattr(obj, a):
            return False
        obj = getattr(obj, a)
    return True


# Each private detail: (what, where it is used, checked against, what must still exist).
PATCH_POINTS = (
    ("FakeTensorMode.dispatch overridden", "new_fake_mode", "2.13.0",
     "torch._subclasses.fake_tensor:FakeTensorMode.dispatch"),
    ("the fake mode's tensor memo", "forget_outputs", "2.13.0",
     "torch._subclasses.meta_utils:MetaConverter"),
    ("FakeProcessGroup._create_internal", "fake_process_group", "2.13.0",
     "torch._C._distributed_c10d:FakeProcessGroup._create_internal"),
    ("optimizers' _foreach_supported_types", "ForeachTap", "2.13.0",
     "torch.optim.optimizer:_foreach_supported_types"),
    ("foreach utils' _foreach_supported_types", "ForeachTap", "2.13.0",
     "torch.utils._foreach_utils:_foreach_supported_types"),
    ("Tensor.data's setter replaced on torch.Tensor", "DataSetterTap", "2.13.0", "torch._C:TensorBase.data"),
    ("Module._apply replaced on nn.Module (swap-on-conversion per module)", "ModuleConversionTap", "2.13.0",
     "torch.__future__:set_swap_module_params_on_conversion"),
    ("the fake converter's weak table of real tensors it converted", "_drop_fake_mode_refs", "2.13.0",
     "torch._subclasses.meta_utils:MetaTensorDescriber.get_tensor_id"),
    ("the fake converter's table of a constant's aliases", "_drop_fake_mode_refs", "2.13.0",
     "torch._subclasses.fake_tensor:FakeTensorConverter.add_constant_storage_mapping"),
    ("DTensor's sharding propagator cache", "ShardingCacheTap", "2.13.0",
     "torch.distributed.tensor._sharding_prop:ShardingPropagator.propagate_op_sharding_non_cached"),
    ("pushing a mode on another thread's dispatch stack", "ThreadTap", "2.13.0",
     "torch._C:_push_on_torch_dispatch_stack"),
    ("popping it, an infra mode by its key", "ThreadTap", "2.13.0", "torch._C:_pop_torch_dispatch_stack"),
    ("UntypedStorage.resize_ replaced on the class", "StorageResizeTap", "2.13.0",
     "torch:UntypedStorage.resize_"),
    ("UntypedStorage.from_buffer replaced on the class", "BufferStorageTap", "2.13.0",
     "torch._C:StorageBase.from_buffer"),
    ("UntypedStorage.data_ptr replaced on the class", "StoragePointerTap", "2.13.0",
     "torch._C:StorageBase.data_ptr"),
    ("FakeTensor.data_ptr set on the class (inherited from TensorBase)", "FakeDataPointerTap", "2.13.0",
     "torch._C:TensorBase.data_ptr"),
    ("safetensors.torch._flatten_as_ptr replaced on its module", "dry.checkpoints.saving.SaveTap",
     "safetensors 0.8.0", "safetensors.torch:_flatten_as_ptr"),
    ("safetensors.torch.serialize_file replaced on its module", "dry.checkpoints.saving.SaveTap",
     "safetensors 0.8.0", "safetensors.torch:serialize_file"),
    ("safetensors.torch.serialize replaced on its module", "dry.checkpoints.saving.SaveTap",
     "safetensors 0.8.0", "safetensors.torch:serialize"),
    ("torch.save replaced on its module", "dry.checkpoints.saving.TorchSaveTap", "2.13.0", "torch:save"),
    ("torch.load replaced on its module", "dry.checkpoints.saving.TorchLoadTap", "2.13.0", "torch:load"),
    ("transformers' GenerationMixin.generate replaced on the class", "record.observers.generate.GenerateTap",
     "transformers 5.23.0", "transformers.generation.utils:GenerationMixin.generate"),
    ("c10d's object collectives replaced on their modules", "dry.objects.ObjectCollectivesTap", "2.13.0",
     "torch.distributed.distributed_c10d:scatter_object_list"),
    ("FakeTensor.__new__ replaced on the class", "ParameterClassTap", "2.13.0",
     "torch._subclasses.fake_tensor:FakeTensor.__new__"),
    ("running outside every dispatch mode", "run_real", "2.13.0",
     "torch.utils._python_dispatch:_disable_current_modes"),
    ("an op schema's alias annotations", "written_arguments", "2.13.0", "torch._C:FunctionSchema"),
    ("Module._parameters", "own_parameters, own_parameter", "2.13.0", "torch.nn:Module.register_parameter"),
    ("CPython bytecode at f_lasti", "branches_on_value", "3.11", "dis:opmap"),
    ("Dynamo's graph-break logger and message", "GRAPH_BREAK_LOGGER", "2.13.0",
     "torch._dynamo.symbolic_convert:InstructionTranslatorBase"),
    ("fake_collectives.CollectiveOp (a collective's group and bytes)", "comm_bytes, collective_group", "2.13.0",
     "torch.distributed._tools.fake_collectives:CollectiveOp.get_comm_tensor_size"),
    ("an op schema's arguments by name", "issued_async", "2.13.0", "torch._C:FunctionSchema"),
    ("an op overload's packet", "overload_packet", "2.13.0", "torch._ops:OpOverload.overloadpacket"),
    ("c10d's object-collective helpers", "group_or_default, in_group, group_rank_of, object_collective_device",
     "2.13.0", "torch.distributed.distributed_c10d:_canonicalize_group_rank"),
    ("c10d's object-collective pickler", "c10d_pickle, c10d_unpickle", "2.13.0",
     "torch.distributed.distributed_c10d:_unpickler"),
    ("dispatch modes, higher-order ops, pytree", "TorchDispatchMode, HigherOrderOperator, tree_leaves", "2.13.0",
     "torch.utils._python_dispatch:TorchDispatchMode"),
    ("a Work made from a future", "completed_work", "2.13.0", "torch._C._distributed_c10d:_create_work_from_future"),
    ("higher-order ops' rules by mode class", "let_fake_mode_run", "2.13.0",
     "torch._higher_order_ops.flex_attention:flex_attention.python_key_table"),
    ("a boxed ReduceOp's op() method", "reduce_op_name", "2.13.0", "torch.distributed:ReduceOp.RedOpType"),
    ("a process group by its name", "group_desc, group_size", "2.13.0",
     "torch._C._distributed_c10d:_resolve_process_group"),
    ("Dynamo's compile-start callbacks and counters", "on_compile_start, dynamo_compiled_a_graph", "2.13.0",
     "torch._dynamo.callback:callback_handler.register_start_callback"),
    ("a pipeline schedule's micro-batches, stages and IR", "schedule_facts, set_microbatches", "2.13.0",
     "torch.distributed.pipelining.schedules:PipelineScheduleSingle._get_pipeline_order"),
    ("a pipeline stage's actions", "PipelineActionTap", "2.13.0",
     "torch.distributed.pipelining.stage:_PipelineStageBase.backward_weight_one_chunk"),
    ("a pipeline schedule's loss of a micro-batch", "PipelineActionTap", "2.13.0",
     "torch.distributed.pipelining.schedules:_PipelineSchedule._maybe_compute_loss"),
    ("the wrapper torch.compile makes for a callable", "CompiledCallTap", "2.13.0",
     "torch._dynamo.eval_frame:OptimizeContext.__call__"),
    ("OpDispatcher.redistribute_local_args replaced on the class (its C++ fast path calls it too)",
     "RedistributionTap", "2.13.0", "torch.distributed.tensor._dispatch:OpDispatcher.redistribute_local_args"),
)  # fmt: skip


def missing_patch_points() -> list:
    """The PATCH_POINTS whose private detail no longer exists in this PyTorch."""
    return [p for p in PATCH_POINTS if not _has(p[3])]
