"""The dry executor: a script at its real size, on the simulator, with no data.

Every neuron tensor, and every host tensor over 16 MiB (a model built on CPU before
it moves), is a fake one: exact shapes, dtypes, strides and devices, no memory
behind it, and every op on it runs its shape computation only (PyTorch's
``FakeTensorMode``). Small host work on real inputs runs for real and keeps its
values (a DeviceMesh's rank table, a sampler's permutation, token counts). The device's
allocator accounting stays real: each new neuron storage is reserved on its core through
the same allocator a real run uses (``torch.neuron.memory_allocated``, peaks, the cache of
freed blocks and ``torch.OutOfMemoryError`` at the core's HBM capacity, raised by the op
that would raise it on the device), recorded in the storage ledger, and released when the
storage dies. What it cannot know, values, it answers by the value policy (``_values``).

Modes, innermost first: the fake mode (``_torch_private.new_fake_mode``), this module's
mode above it (accounting, value reads, real host work), and the recorder's above both.
The lower layers learn of a dry run through their hooks: process groups are PyTorch's fake
one (``distributed.backend.set_backend_override``) and compiled graphs are partitioned
without code generation (``_dynamo.backend.compile_without_codegen``).
"""

from __future__ import annotations

import threading
import weakref

import torch
from torch._ops import HigherOrderOperator

from .. import _C
from .._dynamo import backend as _compile_backend
from .._sites import frame_site, user_frame
from ..distributed import backend as _c10d_backend
from . import _torch_private as _tp
from ._checkpoints._saving import SaveTap, TorchSaveTap
from ._cost import PRIM_DEVICE
from ._known import KnownValues
from ._ledger import StorageLedger, StorageRecord
from ._objects import ObjectCollectivesTap
from ._observers.fallbacks import WouldBeFallbacks
from ._record import MemoryCategory
from ._values import Values, ValueUnknownError

_aten = torch.ops.aten
_WAIT_TENSOR = torch.ops._c10d_functional.wait_tensor.default
# Host (CPU) ops on real inputs whose results are under this size run for real, so small
# host work keeps its values: a DeviceMesh's rank table, a sampler's permutation, token
# counts. Larger host tensors (a model built on CPU before it moves) are fake too.
_REAL_HOST_BYTES = 16 << 20

_active = None  # the DryExecutor running in this process


class _Mode(torch.utils._python_dispatch.TorchDispatchMode):
    """Sits just above the fake mode: accounts new neuron storages, answers value reads."""

    # Higher-order ops (flex_attention) pass whole to the fake mode, whose rule makes their
    # outputs without the math's intermediates: the fused kernel's memory, as on the device.
    supports_higher_order_operators = True

    def __init__(self, dry: "DryExecutor"):
        super().__init__()
        self.dry = dry

    @classmethod
    def ignore_compile_internals(cls) -> bool:
        # Lets Dynamo trace a compiled region (as in a real run); the graph then runs here.
        return True

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if self.dry._mode is not self:
            # A thread the script started during the run and that outlived it (a pool's worker)
            # still has the run's modes: its ops run for real, as in any other thread now.
            return _tp.run_real(func, args, kwargs or {})
        # One op at a time: a fake mode holds per-call state that threads must not share.
        with self.dry._lock:
            return self._dispatch(func, args, kwargs or {})

    def _dispatch(self, func, args, kwargs):
        if func is PRIM_DEVICE:  # a fake tensor's device, asked from C++: the fake mode answers
            return func(*args)
        if isinstance(func, HigherOrderOperator):
            _tp.let_fake_mode_run(func)
            out = func(*args, **kwargs)
            self.dry._account_outputs(func, out)
            return out
        if func is _aten._local_scalar_dense.default:
            # A DTensor's value is its local shard's (DTensor reads it there): a fake one has none.
            t = _tp.local(args[0])
            if not isinstance(t, _tp.FakeTensor):
                return _tp.run_real(func, args, kwargs)  # a real host tensor has its value
            known = self.dry.known.item(t)
            return known if known is not None else self.dry.values.read(t)
        if func.namespace in ("c10d", "_c10d_functional"):
            return self._collective(func, args, kwargs)
        host = _tp.real_host_args(args, kwargs)
        if host and (func.is_view or torch.Tag.inplace_view in func.tags):
            # Views and metadata changes (set_ onto a storage, which is how safetensors points a
            # tensor at a checkpoint's memory map; t_, ...) make no data: run them on the real
            # tensors. A small result stays real, as its values exist; a large view goes fake
            # below. The fake mode refuses metadata changes of real tensors.
            out = _tp.run_real(func, args, kwargs)
            if not func.is_view or _tp.small_host_result(out, _REAL_HOST_BYTES):
                return out
        # Large real inputs never reach the fake mode as they are: it would compute on them.
        args, kwargs = _tp.fakeify(self.dry._fake, args, kwargs, _REAL_HOST_BYTES)
        host = host and _tp.real_host_args(args, kwargs)
        if host and _tp.host_result_is_small(func, args, kwargs, _REAL_HOST_BYTES):
            return _tp.run_real(func, args, kwargs)
        out = self._fake_run(func, args, kwargs, host)
        if host and _tp.small_host_result(out, _REAL_HOST_BYTES):
            # The fake mode may have run it for real already: never twice (a random op would draw twice).
            return out if not _tp.fake_inputs((out,), {}) else _tp.run_real(func, args, kwargs)
        real = self.dry.known.after(func, args, kwargs, out)
        if real is not None:
            return real  # host results of known values: the script reads them
        self.dry._after_op(func, args, out)
        return out

    def _collective(self, func, args, kwargs):
        """A collective in PyTorch's fake process group (it completes at once and moves nothing),
        its results then as the value rule says (see ``_known``)."""
        host = _tp.real_host_args(args, kwargs)
        out = _tp.run_real(func, args, kwargs) if host else self._fake_run(func, args, kwargs, False)
        self.dry.known.after(func, args, kwargs, out)
        if not host:
            self.dry._after_op(func, args, out)
        return _tp.completed_work(out)

    @staticmethod
    def _fake_run(func, args, kwargs, host: bool):
        """The fake run of an op: shapes only (its real run, for real host inputs it cannot fake)."""
        try:
            return func(*args, **kwargs)
        except Exception as e:
            if host:  # real host inputs (pin_memory, nonzero of a host mask, ...): the values are there
                return _tp.run_real(func, args, kwargs)
            if not isinstance(e, _tp.DATA_DEPENDENT):
                raise
            raise ValueUnknownError(
                f"dry run: {func.name()} at {frame_site(user_frame())} makes a tensor whose shape depends on "
                "tensor values, which a dry run does not compute. Run this script without --dry-run, or give "
                "the op a fixed-size form (e.g. a mask instead of nonzero)."
            ) from e


class DryExecutor:
    """Runs the code between ``start()`` and ``stop()`` with fake tensors and real accounting.

    Everything in it that runs under the run's lock (an RLock: the mode's dispatch, the fake
    mode's callback, storage finalizers and resizes, from any thread) enters through
    ``_dispatch``, ``_on_fake_op``, ``_release`` or ``_on_resize``."""

    dry = True
    ignores_fake_tensors = False  # every tensor is a fake one: they are the run

    def __init__(self):
        self.ledger = StorageLedger(categorize=self._categories)
        self.fallbacks = WouldBeFallbacks()
        self.values = Values()
        self.known = KnownValues()
        self._refs: dict = {}  # storage key -> weakref to the storage
        # storage key -> (key and storage of the reservation whose memory it is, weakref to it)
        self._aliases: dict = {}
        self._modules: weakref.WeakSet = weakref.WeakSet()
        self._optimizers: weakref.WeakSet = weakref.WeakSet()
        # id(parameter) -> [(module ref, name)] it was registered as; not a weak reference to the
        # parameter: torch.utils.swap_tensors (FSDP2, DTensor) refuses tensors that have one
        self._registered: dict[int, list] = {}
        self._fake = None
        self._mode = None
        self._taps = [_tp.StorageResizeTap(self._on_resize), _tp.ForeachTap(), _tp.ShardingCacheTap()]
        self._taps += [_tp.BufferStorageTap(), _tp.ParameterClassTap(), ObjectCollectivesTap(self.known.assumed)]
        self._taps += [_tp.SwapTap(self.known._forget), _tp.DataSetterTap(self.known.share), _tp.ModuleConversionTap()]
        self.saved: list = []  # the files written without data, as the report lists them
        self._taps += [_tp.StoragePointerTap(), _tp.FakeDataPointerTap(), SaveTap(self.saved.append), TorchSaveTap()]
        self._kept_taps = len(self._taps)  # the thread tap, after them, is made anew at each start
        # Threads the script starts run ops here too (and storages die in any thread).
        self._lock = threading.RLock()
        self._hooks = []

    # -- lifecycle ---------------------------------------------------------------
    def start(self) -> None:
        global _active
        if _active is not None:
            raise RuntimeError("a dry run is already in progress in this process")
        from torch.nn.modules.module import register_module_parameter_registration_hook
        from torch.optim.optimizer import register_optimizer_step_pre_hook

        self._fake = _tp.new_fake_mode(self._on_fake_op, _REAL_HOST_BYTES)
        self._fake.__enter__()
        self._mode = _Mode(self)
        self._mode.__enter__()
        self._taps.append(_tp.ThreadTap([self._fake, self._mode]))
        for tap in self._taps:
            tap.install()
        self._hooks = [
            # not a global forward hook: torch.compile(module) warns about those
            register_module_parameter_registration_hook(self._on_parameter),
            register_optimizer_step_pre_hook(lambda opt, args, kwargs: self._on_optimizer_step(opt)),
        ]
        _c10d_backend.set_backend_override(_tp.fake_process_group)
        _compile_backend.compile_without_codegen("dry run")
        _active = self

    def _on_parameter(self, module, name, param) -> None:
        self._modules.add(module)
        if param is not None:
            self._registered.setdefault(id(param), []).append((weakref.ref(module), name))

    def _on_optimizer_step(self, opt) -> None:
        """Points the optimizer at the neuron parameters that replaced its host ones.

        On the device, ``module.to("neuron")`` keeps each Parameter object (it swaps the data
        in), so an optimizer made before the move (Accelerate's ``prepare`` always does this)
        steps the device parameters. A fake tensor cannot be swapped into a host Parameter, so
        here the module gets new Parameter objects and the optimizer would hold the host ones,
        without gradients: it would step nothing and hold no state."""
        self._optimizers.add(opt)
        for group in opt.param_groups:
            params = group["params"]
            for i, p in enumerate(params):
                if p.device.type == "neuron" or p.grad is not None:
                    continue
                for ref, name in self._registered.get(id(p), ()):
                    module = ref()
                    new = module._parameters.get(name) if module is not None else None
                    if (
                        isinstance(new, _tp.FakeTensor)
                        and new.device.type == "neuron"
                        and (new.shape, new.requires_grad) == (p.shape, p.requires_grad)
                    ):
                        params[i] = new
                        break

    def stop(self) -> None:
        global _active
        _compile_backend.compile_without_codegen(None)
        _c10d_backend.set_backend_override(None)
        for h in self._hooks:
            h.remove()
        self._hooks = []
        for tap in self._taps:
            tap.remove()
        del self._taps[self._kept_taps :]
        if self._mode is not None:
            self._mode.__exit__(None, None, None)
            self._fake.__exit__(None, None, None)
            self._mode = None
        _active = None

    def failed(self, exc: BaseException) -> None:
        """transformers' error for a directory without weights gets the dry run's way out as a note."""
        from ._checkpoints import _note_missing_weights

        _note_missing_weights(exc)

    def contribute(self, recording) -> None:
        recording.dry_run = True
        recording.value_reads = self.values.record() + self.known.record()
        recording.saved_without_data = list(self.saved)

    # -- accounting --------------------------------------------------------------
    def _on_fake_op(self, func, args, kwargs, out) -> None:
        """Every fake op, from the fake mode itself: ops on DTensor shards too. An op that reads
        a storage this run holds is device work, and its new outputs are reserved; one that
        reads none is metadata work on fakes a library made for it (or a factory, which the
        mode above accounts)."""
        with self._lock:
            if not any(self._held(_tp.storage_key(t)[0]) for t in _tp.fake_inputs(args, kwargs)):
                return
            if func is _WAIT_TENSOR and isinstance(out, _tp.FakeTensor):
                self._same_memory(out, args[0])
            else:
                self._account_outputs(func, out)

    def _same_memory(self, t, of) -> None:
        """`t` is the memory of `of`, which the run holds: a wait returns the buffer its collective
        wrote (on the device, the same tensor), where the fake mode makes a new one. No new
        reservation: `of`'s storage is kept while `t`'s lives, so the memory is released when the
        last of them dies, as the device's would be (counted twice, a caller that keeps both, as
        ring attention's all-to-all rotater does, would hold the buffer twice)."""
        key, st = _tp.storage_key(t)
        of_key, of_st = _tp.storage_key(of)
        if key in self.ledger.live or key in self._aliases:
            return
        if of_key in self._aliases:  # a wait on a wait's result
            of_key, of_st, _ = self._aliases[of_key]
        self._aliases[key] = (of_key, of_st, weakref.ref(st, lambda _r: self._aliases.pop(key, None)))

    def _held(self, key) -> bool:
        """Whether the run holds the storage `key` (its own reservation, or another's memory)."""
        return key in self.ledger.live or key in self._aliases

    def _account_outputs(self, func, out) -> None:
        """Reserves each new neuron storage among an op's outputs, as the device's allocator would."""
        name = None
        for t in out if isinstance(out, (list, tuple)) else (out,):
            if not isinstance(t, _tp.FakeTensor) or t.device.type != "neuron":
                continue
            key, st = _tp.storage_key(t)
            if self._held(key):
                continue
            if name is None:
                name = func.name()
            self._account(key, st, st.nbytes(), t, name)

    def _after_op(self, func, args, out) -> None:
        outs = out if isinstance(out, (list, tuple)) else (out,)
        tensors = [t for t in outs if isinstance(t, torch.Tensor)]
        if not tensors:
            return
        _tp.forget_outputs(self._fake, tensors)
        self._account_outputs(func, out)  # factories; the fake mode reported the others already
        self.values.after_op(func, args, out)

    def _account(self, key, st, nbytes: int, t, op: str) -> None:
        core = t.device.index
        token = _C._reserve(core, nbytes) if nbytes else 0  # raises torch.OutOfMemoryError where the device would
        collective = op.startswith(("c10d::", "_c10d_functional::"))
        rec = StorageRecord(nbytes, tuple(t.shape), str(t.dtype).replace("torch.", ""), op, core, collective, token)
        self.ledger.add(key, rec)
        self._refs[key] = weakref.ref(st, lambda _r, key=key: self._release(key))
        self.ledger.note(core)

    def _release(self, key) -> None:
        with self._lock:
            self._refs.pop(key, None)
            rec = self.ledger.pop(key)
            if rec is not None and rec.token:
                _C._release(rec.token)

    def _on_resize(self, storage, nbytes: int) -> None:
        """FSDP2's storage resizes: the storage's memory is released or re-reserved."""
        with self._lock:
            # Only neuron storages have records; a fake tensor's storage itself is on "meta".
            rec = self.ledger.live.get(storage._cdata)
            if rec is None or rec.nbytes == nbytes:
                return
            token = _C._reserve(rec.core, nbytes) if nbytes else 0  # may raise OutOfMemoryError, as FSDP2's would
            if rec.token:
                _C._release(rec.token)
            self.ledger.resize(rec, nbytes, token)
            self.ledger.note(rec.core)

    def _categories(self) -> dict:
        """storage key -> MemoryCategory, for the storages parameters, gradients and optimizer state use now."""
        cat = {}

        def mark(t, c):
            if isinstance(t, torch.Tensor):
                t = _tp.local(t)
                if t.device.type == "neuron":
                    key = _tp.storage_key(t)[0]
                    cat.setdefault(self._aliases[key][0] if key in self._aliases else key, c)

        params = []
        for m in list(self._modules):
            params.extend(_tp.own_parameters(m))
        for opt in list(self._optimizers):
            for g in opt.param_groups:
                params.extend(g["params"])
            for state in opt.state.values():
                for v in state.values():
                    mark(v, MemoryCategory.OPTIMIZER_STATE)
        for p in params:
            mark(p, MemoryCategory.PARAMETERS)
            mark(p.grad, MemoryCategory.GRADIENTS)
        return cat
