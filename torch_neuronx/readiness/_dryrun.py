"""The dry run: a script at its real size, on the simulator, with no data.

Every neuron tensor, and every host tensor over 16 MiB (a model built on CPU before
it moves), is a fake one: exact shapes, dtypes, strides and devices, no memory
behind it, and every op on it runs its shape computation only (PyTorch's
``FakeTensorMode``). Small host work on real inputs runs for real and keeps its
values (a DeviceMesh's rank table, a sampler's permutation, token counts). The device's allocator accounting stays real:
each new neuron storage is reserved on its core through the same allocator a
real run uses (``torch.neuron.memory_allocated``, peaks, the cache of freed
blocks and ``torch.OutOfMemoryError`` at the core's HBM capacity, raised by the
op that would raise it on the device), and released when the storage dies.

What a dry run cannot know it says: values. A read of a value (``loss.item()``,
``tolist()``, ``float(t)``) gets a placeholder and is listed with its source
line; a branch on a tensor's value (``if loss < x:``) stops the run with
:class:`ValueUnknownError` naming the line, since either way would be a guess.
Checks that a value is finite (``isnan`` / ``isinf`` / ``isfinite``, as the
Hugging Face Trainer makes on every step) are answered "finite".
"""

from __future__ import annotations

import collections
import dis
import functools
import heapq
import threading
import weakref

import torch

from .. import _C
from . import _fake
from ._collect import _PRIM_DEVICE, _SITE, _user_frame
from ._collect import _frame_site as _site

_aten = torch.ops.aten
_PEAK_STEP = 1.02  # re-take the snapshot of live storages when usage grows by 2%
_TOP_TENSORS = 10
# Host (CPU) ops on real inputs whose results are under this size run for real, so small
# host work keeps its values: a DeviceMesh's rank table, a sampler's permutation, token
# counts. Larger host tensors (a model built on CPU before it moves) are fake too.
_REAL_HOST_BYTES = 16 << 20
PLACEHOLDER = {"int": 1, "float": 1.0, "bool": False}  # 1, not 0: a count read as a divisor must not be zero

CATEGORIES = ("parameters", "gradients", "optimizer state", "collective buffers", "activations and temporaries")

# Boolean results whose value a dry run assumes: training data and weights are finite.
_FINITE_CHECKS = {
    _aten.isnan.default: False,
    _aten.isinf.default: False,
    _aten.isposinf.default: False,
    _aten.isneginf.default: False,
    _aten.isfinite.default: True,
}
_KNOWN_COMBINE = {  # op -> how a known result follows from known inputs
    _aten.logical_not.default: lambda a: not a[0],
    _aten.bitwise_not.default: lambda a: not a[0],
    _aten.logical_or.default: lambda a: a[0] or a[1],
    _aten.bitwise_or.Tensor: lambda a: a[0] or a[1],
    _aten.logical_and.default: lambda a: a[0] and a[1],
    _aten.bitwise_and.Tensor: lambda a: a[0] and a[1],
    _aten.any.default: lambda a: a[0],
    _aten.any.dim: lambda a: a[0],
    _aten.any.dims: lambda a: a[0],
    _aten.all.default: lambda a: a[0],
    _aten.all.dim: lambda a: a[0],
    _aten.clone.default: lambda a: a[0],
    _aten._to_copy.default: lambda a: a[0],
    _aten.view.default: lambda a: a[0],
    _aten.squeeze.default: lambda a: a[0],
    _aten.unsqueeze.default: lambda a: a[0],
    _aten.max.default: lambda a: a[0],
    _aten.min.default: lambda a: a[0],
}
# Tensors made from a Python value have it: generate()'s stopping criteria build their flags with
# torch.full from the (known) length, so a dry run stops at max_new_tokens like a real run in which
# no token is an end-of-sequence token.
_KNOWN_FILL = {
    _aten.full.default: lambda args: args[1],
    _aten.ones.default: lambda args: 1,
    _aten.zeros.default: lambda args: 0,
}
_KNOWN_SCALAR = {  # op -> its known result from a known tensor and its Python scalar argument
    _aten.eq.Scalar: lambda v, s: v == s,
    _aten.ne.Scalar: lambda v, s: v != s,
}
# and/or with one input known decide without the other: x & False is False, x | True is True.
_DECIDING = {
    _aten.bitwise_and.Tensor: False,
    _aten.logical_and.default: False,
    _aten.bitwise_or.Tensor: True,
    _aten.logical_or.default: True,
}
# Opcodes that branch on the value just computed: the Python value of a tensor feeds control flow.
_BRANCH_OPS = frozenset(
    op
    for name, op in dis.opmap.items()
    if name.startswith(("POP_JUMP", "JUMP_IF_")) or name in ("UNARY_NOT", "TO_BOOL", "ASSERT")
)

_ACTIVE: DryRun | None = None


def active() -> DryRun | None:
    """The dry run in progress in this process, if any."""
    return _ACTIVE


class ValueUnknownError(RuntimeError):
    """Control flow depends on a tensor value, which a dry run does not have."""


def _in_library(path: str) -> bool:
    return path.startswith(_SITE)


def _branches_on_value(f) -> bool:
    """True when the frame converts a tensor to a Python value to branch on it (``if t:``,
    ``while not t:``, ``t and ...``, ``assert t``, ``if bool(t):``)."""
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


class _Mode(torch.utils._python_dispatch.TorchDispatchMode):
    """Sits just above the fake mode: accounts new neuron storages, answers value reads."""

    def __init__(self, dry: DryRun):
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
            with torch.utils._python_dispatch._disable_current_modes():
                return func(*args, **(kwargs or {}))
        # One op at a time: a fake mode holds per-call state that threads must not share.
        with self.dry._lock:
            return self._dispatch(func, args, kwargs or {})

    def _dispatch(self, func, args, kwargs):
        # Runs under the run's lock: the DryRun methods called only from here (_after_op,
        # _read_value) do not take it again.
        if func is _PRIM_DEVICE:  # a fake tensor's device, asked from C++: the fake mode answers
            return func(*args)
        if func is _aten._local_scalar_dense.default:
            if not isinstance(args[0], _fake.FakeTensor):
                return _fake.run_real(func, args, kwargs)  # a real host tensor has its value
            return self.dry._read_value(args[0])
        host = _fake.real_host_args(args, kwargs)
        if host and (func.is_view or torch.Tag.inplace_view in func.tags):
            # Views and metadata changes (set_ onto a storage, which is how safetensors points a
            # tensor at a checkpoint's memory map; t_, ...) make no data: run them on the real
            # tensors. A small result stays real, as its values exist; a large view goes fake
            # below. The fake mode refuses metadata changes of real tensors.
            out = _fake.run_real(func, args, kwargs)
            if not func.is_view or _fake.small_host_result(out, _REAL_HOST_BYTES):
                return out
        # Large real inputs never reach the fake mode as they are: it would compute on them.
        args, kwargs = _fake.fakeify(self.dry._fake, args, kwargs, _REAL_HOST_BYTES)
        host = host and _fake.real_host_args(args, kwargs)
        if host and _fake.host_result_is_small(func, args, kwargs, _REAL_HOST_BYTES):
            return _fake.run_real(func, args, kwargs)
        try:
            out = func(*args, **kwargs)  # the fake run: shapes only
        except Exception as e:
            if host:  # real host inputs (pin_memory, nonzero of a host mask, ...): the values are there
                return _fake.run_real(func, args, kwargs)
            if not isinstance(e, _fake.DATA_DEPENDENT):
                raise
            f = _user_frame()
            raise ValueUnknownError(
                f"dry run: {func.name()} at {_site(f)} makes a tensor whose shape depends on tensor values, "
                "which a dry run does not compute. Run this script without --dry-run, or give the op a "
                "fixed-size form (e.g. a mask instead of nonzero)."
            ) from e
        if host and _fake.small_host_result(out, _REAL_HOST_BYTES):
            return _fake.run_real(func, args, kwargs)
        self.dry._after_op(func, args, out)
        return out


def _locked(method):
    """A DryRun method under the run's lock, for those called outside the mode's dispatch
    (from the fake mode, storage finalizers and resizes, in any thread)."""

    @functools.wraps(method)
    def run(self, *args, **kwargs):
        with self._lock:
            return method(self, *args, **kwargs)

    return run


class DryRun:
    """Runs the code between ``start()`` and ``stop()`` with fake tensors and real accounting."""

    def __init__(self):
        self.reads: collections.Counter = collections.Counter()  # (site, kind, placeholder) -> reads
        self.assumed: collections.Counter = collections.Counter()  # (site, check, value) -> reads
        self._live: dict = {}  # storage key -> [nbytes, shape, dtype, op, core, token, collective]
        self._refs: dict = {}  # storage key -> weakref to the storage
        self._known: dict = {}  # id(bool tensor) -> (weakref, its assumed value); no __eq__ on tensors
        self._modules: weakref.WeakSet = weakref.WeakSet()
        self._optimizers: weakref.WeakSet = weakref.WeakSet()
        self._snap: dict = {}  # core -> snapshot at the highest usage seen
        self._allocated: dict = collections.defaultdict(int)
        self._fake = None
        self._mode = None
        self._resize = _fake.StorageResizeTap(self._on_resize)
        self._foreach = _fake.ForeachTap()
        self._sharding = _fake.ShardingCacheTap()
        self._threads = None
        # Threads the script starts run ops here too (and storages die in any thread).
        self._lock = threading.RLock()
        self._hooks = []

    # -- lifecycle ---------------------------------------------------------------
    def start(self) -> None:
        global _ACTIVE
        if _ACTIVE is not None:
            raise RuntimeError("a dry run is already in progress in this process")
        from torch.nn.modules.module import register_module_parameter_registration_hook
        from torch.optim.optimizer import register_optimizer_step_pre_hook

        self._fake = _fake.new_fake_mode(self._on_fake_op)
        self._fake.__enter__()
        self._mode = _Mode(self)
        self._mode.__enter__()
        self._resize.install()
        self._foreach.install()
        self._sharding.install()
        self._threads = _fake.ThreadTap([self._fake, self._mode])
        self._threads.install()
        self._hooks = [
            # not a global forward hook: torch.compile(module) warns about those
            register_module_parameter_registration_hook(lambda m, name, p: self._modules.add(m)),
            register_optimizer_step_pre_hook(lambda opt, args, kwargs: self._optimizers.add(opt)),
        ]
        _ACTIVE = self

    def stop(self) -> None:
        global _ACTIVE
        for h in self._hooks:
            h.remove()
        self._hooks = []
        self._resize.remove()
        self._foreach.remove()
        self._sharding.remove()
        if self._threads is not None:
            self._threads.remove()
        if self._mode is not None:
            self._mode.__exit__(None, None, None)
            self._fake.__exit__(None, None, None)
            self._mode = None
        _ACTIVE = None

    # -- accounting --------------------------------------------------------------
    @_locked
    def _on_fake_op(self, func, args, kwargs, out) -> None:
        """Every fake op, from the fake mode itself: ops on DTensor shards too. An op that reads
        a storage this run holds is device work, and its new outputs are reserved; one that
        reads none is metadata work on fakes a library made for it (or a factory, which the
        mode above accounts)."""
        if not any(_fake.storage_key(t)[0] in self._live for t in _fake.fake_inputs(args, kwargs)):
            return
        self._account_outputs(func, out)

    def _account_outputs(self, func, out) -> None:
        """Reserves each new neuron storage among an op's outputs, as the device's allocator would."""
        name = None
        for t in out if isinstance(out, (list, tuple)) else (out,):
            if not isinstance(t, _fake.FakeTensor) or t.device.type != "neuron":
                continue
            key, st = _fake.storage_key(t)
            if key in self._live:
                continue
            if name is None:
                name = func.name()
            self._account(key, st, st.nbytes(), t, name)

    def _after_op(self, func, args, out) -> None:
        outs = out if isinstance(out, (list, tuple)) else (out,)
        tensors = [t for t in outs if isinstance(t, torch.Tensor)]
        if not tensors:
            return
        _fake.forget_outputs(self._fake, tensors)
        self._account_outputs(func, out)  # factories; the fake mode reported the others already
        self._forget_written(func, args)
        known = self._derive_known(func, args)
        if known is not None and isinstance(out, torch.Tensor):
            i = id(out)
            self._known[i] = (weakref.ref(out, lambda _r: self._known.pop(i, None)), known)

    def _derive_known(self, func, args):
        """The value of the op's result when it follows from known inputs, else None."""
        known = _FINITE_CHECKS.get(func)
        if known is not None:
            return known
        if func in _KNOWN_FILL and all(not isinstance(a, torch.Tensor) for a in args):
            return _KNOWN_FILL[func](args)
        ins = [self._known_value(a) for a in args if isinstance(a, torch.Tensor)]
        if func in _DECIDING and any(v is not None and bool(v) == _DECIDING[func] for v in ins):
            return _DECIDING[func]
        if not ins or any(v is None for v in ins):
            return None
        if func in _KNOWN_SCALAR and len(args) > 1:
            return _KNOWN_SCALAR[func](ins[0], args[1])
        if func in _KNOWN_COMBINE:
            return _KNOWN_COMBINE[func](ins)
        return None

    def _forget_written(self, func, args) -> None:
        """An in-place op changes its input: a value known before is no longer."""
        for a, spec in zip(args, func._schema.arguments):
            if isinstance(a, torch.Tensor) and spec.alias_info is not None and spec.alias_info.is_write:
                self._known.pop(id(a), None)

    def _known_value(self, t):
        entry = self._known.get(id(t))
        return entry[1] if entry is not None and entry[0]() is t else None

    def _account(self, key, st, nbytes: int, t, op: str) -> None:
        core = t.device.index
        token = _C._reserve(core, nbytes) if nbytes else 0  # raises torch.OutOfMemoryError where the device would
        collective = op.startswith(("c10d::", "_c10d_functional::"))
        self._live[key] = [nbytes, tuple(t.shape), str(t.dtype).replace("torch.", ""), op, core, token, collective]
        self._refs[key] = weakref.ref(st, lambda _r, key=key: self._release(key))
        self._allocated[core] += nbytes
        self._note_growth(core)

    @_locked
    def _release(self, key) -> None:
        entry = self._live.pop(key, None)
        self._refs.pop(key, None)
        if entry is not None:
            self._allocated[entry[4]] -= entry[0]
            if entry[5]:
                _C._release(entry[5])

    @_locked
    def _on_resize(self, storage, nbytes: int) -> None:
        """FSDP2's storage resizes: the storage's memory is released or re-reserved."""
        # Only neuron storages have entries; a fake tensor's storage itself is on "meta".
        entry = self._live.get(storage._cdata)
        if entry is None or entry[0] == nbytes:
            return
        core = entry[4]
        token = _C._reserve(core, nbytes) if nbytes else 0  # may raise OutOfMemoryError, as FSDP2's would
        if entry[5]:
            _C._release(entry[5])
        self._allocated[core] += nbytes - entry[0]
        entry[0], entry[5] = nbytes, token
        self._note_growth(core)

    def _note_growth(self, core: int) -> None:
        """Re-take the core's snapshot when its usage passed the last one by _PEAK_STEP."""
        snap = self._snap.get(core)
        if snap is None or self._allocated[core] > snap["at"] * _PEAK_STEP:
            self._snap[core] = self._snapshot(core)

    # -- the breakdown at the peak -------------------------------------------------
    def _categories(self) -> dict:
        """storage key -> category, for the storages parameters, gradients and optimizer state use now."""
        cat = {}

        def mark(t, c):
            if isinstance(t, torch.Tensor):
                t = _fake.local(t)
                if t.device.type == "neuron":
                    cat.setdefault(_fake.storage_key(t)[0], c)

        params = []
        for m in list(self._modules):
            params.extend(p for p in m._parameters.values() if p is not None)
        for opt in list(self._optimizers):
            for g in opt.param_groups:
                params.extend(g["params"])
            for state in opt.state.values():
                for v in state.values():
                    mark(v, "optimizer state")
        for p in params:
            mark(p, "parameters")
            mark(p.grad, "gradients")
        return cat

    def _snapshot(self, core: int) -> dict:
        live = [(k, e) for k, e in self._live.items() if e[4] == core and e[0]]
        cat = self._categories()
        by_cat = dict.fromkeys(CATEGORIES, 0)
        for k, e in live:
            c = cat.get(k) or ("collective buffers" if e[6] else "activations and temporaries")
            by_cat[c] += e[0]
        top = heapq.nlargest(_TOP_TENSORS, live, key=lambda ke: ke[1][0])
        return {
            "at": self._allocated[core],
            "breakdown": by_cat,
            "top": [
                {
                    "bytes": e[0],
                    "shape": list(e[1]),
                    "dtype": e[2],
                    "op": e[3],
                    "kind": cat.get(k) or ("collective buffers" if e[6] else "activations and temporaries"),
                }
                for k, e in top
            ],
        }

    def snapshot(self, core: int) -> dict | None:
        """The live storages of a core at its highest usage seen (within 2%)."""
        return self._snap.get(core)

    # -- values ------------------------------------------------------------------
    def _read_value(self, t: torch.Tensor):
        f = _user_frame()
        known = self._known_value(t)
        if known is not None:
            self.assumed[(_site(f), "finite", known)] += 1
            return known
        if _branches_on_value(f):
            if f is not None and _in_library(f.f_code.co_filename):
                # A library's own branch (TRL's metric logging: `x / n if n > 0 else 0.0`): taken as
                # True and listed; a branch in the user's code stops the run instead.
                self.reads[(_site(f), "bool (library branch)", True)] += 1
                return True
            raise ValueUnknownError(
                f"dry run: control flow at {_site(f)} depends on a tensor value ({t.dtype}, shape "
                f"{list(t.shape)}), which a dry run does not compute. Run this script without --dry-run, "
                "or make the branch independent of tensor values (e.g. a fixed step count)."
            )
        kind = "float" if t.is_floating_point() else "bool" if t.dtype == torch.bool else "int"
        value = PLACEHOLDER[kind]
        self.reads[(_site(f), kind, value)] += 1
        return value

    # -- the record ----------------------------------------------------------------
    def raw(self) -> dict:
        return {
            "value_reads": [
                {"site": s, "kind": k, "placeholder": v, "count": n} for (s, k, v), n in self.reads.most_common()
            ],
            "assumed": [{"site": s, "check": c, "value": v, "count": n} for (s, c, v), n in self.assumed.most_common()],
        }
