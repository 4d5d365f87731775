"""What a run does on the neuron device, recorded while it runs.

One TorchDispatchMode sees every ATen op (and c10d collective) that reaches the
device; it keeps per-step aggregates, not a trace, so its cost stays a few
microseconds per op. Facts counted elsewhere are read from their owners: which
ops fall back to CPU (``torch_neuronx.get_fallback_ops``), memory
(``torch.neuron`` allocator counters), compile metrics
(``torch.neuron.get_dynamo_metrics``), graph-break locations (Dynamo's own
``graph_breaks`` log).
"""

from __future__ import annotations

import collections
import heapq
import logging
import operator
import os
import re
import sys
import sysconfig
import threading
import time
import weakref

import torch
from torch._subclasses.fake_tensor import FakeTensor
from torch.utils._python_dispatch import TorchDispatchMode

from neuronsim import settings as _settings

from .. import _C
from ..neuron import memory as _memory
from ..profiler import _graphs
from . import _fake

_TOP_TENSORS = 10
_SAMPLE_S = 0.002  # memory counters are read at most this often per core (they cost ~8 us)
_PEAK_STEP = 1.02  # re-take the live-tensor snapshot when usage grows by 2%
_SERIES_MAX = 20000
_GRAPH_BREAK_LOGGER = "torch._dynamo.symbolic_convert.__graph_breaks"
_GRAPH_BREAK_AT = re.compile(r"in user code at (.+?):(\d+)\s*\nGraph Break Reason: (.*)")

# Frames in these trees are the machinery, not the code that issued an op.
_TORCH_DIRS = tuple(os.path.dirname(m.__file__) + os.sep for m in (torch, sys.modules["torch_neuronx"]))
_STDLIB = sysconfig.get_paths()["stdlib"] + os.sep
_SITE = tuple(sysconfig.get_paths()[k] + os.sep for k in ("purelib", "platlib"))

# Ops that only allocate, or build a new view of existing memory: no data moves, no kernel runs.
_METADATA_OPS = frozenset(
    {
        "aten::detach",
        "aten::lift_fresh",
        "aten::_reshape_alias",
        "aten::set_",
        "aten::_unsafe_view",
        "aten::alias",
        "aten::empty",
        "aten::empty_like",
        "aten::empty_strided",
        "aten::new_empty",
        "aten::new_empty_strided",
    }
)


# Copies and allocations run by the device's own memory kernels, never through the CPU
# fallback, so no dtype makes them fall back (a dry run must judge them as a real run does).
_MEMORY_KERNEL_OPS = _METADATA_OPS | frozenset(
    {
        "aten::_to_copy",
        "aten::copy_",
        "aten::_copy_from",
        "aten::_copy_from_and_resize",
        "aten::resize_",
        "aten::as_strided",
        "aten::view",
        "aten::set_",
        "aten::_local_scalar_dense",
        "aten::lift_fresh_copy",
    }
)


def _is_machinery(path: str) -> bool:
    return (
        path.startswith(_TORCH_DIRS)
        or (path.startswith("<") and path not in ("<stdin>", "<string>"))  # <frozen ...>, FX's <eval_with_key>
        or "torchinductor_" in path  # Inductor's generated code
        or (path.startswith(_STDLIB) and not path.startswith(_SITE))
    )


def _user_frame():
    """The innermost frame outside torch, torch_neuronx and the standard library, or None."""
    f = sys._getframe(1)
    while f is not None and _is_machinery(f.f_code.co_filename):
        f = f.f_back
    return f


def _frame_site(f) -> str:
    """``path:line (function)`` of a frame from :func:`_user_frame`."""
    if f is not None:
        return f"{f.f_code.co_filename}:{f.f_lineno} ({f.f_code.co_name})"
    # Autograd runs backward ops on its device thread, with no Python caller.
    return "autograd backward" if threading.current_thread() is not threading.main_thread() else "<no Python caller>"


def _user_site() -> str:
    """The innermost caller outside torch, torch_neuronx and the standard library."""
    return _frame_site(_user_frame())


def _tensors(args, out: list) -> list:
    for a in args:
        if isinstance(a, torch.Tensor):
            out.append(a)
        elif isinstance(a, (list, tuple)):
            for b in a:
                if isinstance(b, torch.Tensor):
                    out.append(b)
    return out


def _dtype_name(dtype) -> str:
    return str(dtype).replace("torch.", "")


def _counters(core: int) -> dict:
    """The core's allocator counters, read from torch.neuron's memory stats (their one source)."""
    s = _memory._device_stats(core)
    return {
        "allocated_current": s["allocated_bytes"]["all"]["current"],
        "allocated_peak": s["allocated_bytes"]["all"]["peak"],
        "reserved_current": s["reserved_bytes"]["all"]["current"],
        "reserved_peak": s["reserved_bytes"]["all"]["peak"],
        "num_ooms": s["num_ooms"],
        "capacity": torch.neuron.mem_get_info(core)[1],
    }


# Ops the simulator runs as CPU kernels whose device form (what a NeuronCore runs, what
# torch.utils.flop_counter has a formula for) takes the same leading arguments: attention on
# `neuron` tensors dispatches to the CPU flash kernel, which is a Tensor Engine op all the same.
_DEVICE_FORM = {
    "_scaled_dot_product_flash_attention_for_cpu": "_scaled_dot_product_flash_attention",
    "_scaled_dot_product_flash_attention_for_cpu_backward": "_scaled_dot_product_flash_attention_backward",
}


def _flop_formula(func):
    from torch.utils.flop_counter import flop_registry

    packet = func._overloadpacket
    twin = _DEVICE_FORM.get(packet.__name__)
    return flop_registry.get(packet) or (flop_registry.get(getattr(torch.ops.aten, twin)) if twin else None)


class _FuncInfo:
    __slots__ = ("name", "kind", "flops")

    def __init__(self, func):
        self.name = func.name()
        self.flops = _flop_formula(func)
        if self.name.split("::")[0] in ("c10d", "_c10d_functional"):
            self.kind = "collective" if func in _collective_ops() else "other"
        elif self.name.startswith("prim::"):
            self.kind = "none"  # metadata queries (prim::device): seen only on fake tensors
        elif func.is_view or self.name.split(".")[0] in _METADATA_OPS:
            self.kind = "view"
        elif self.flops is not None:
            self.kind = "tensor"  # matmul-like: the Tensor Engine
        else:
            self.kind = "vector"  # elementwise, reductions, copies: Vector/Scalar engines and DMA


_COLLECTIVES = None


def _collective_ops():
    global _COLLECTIVES
    if _COLLECTIVES is None:
        from torch.distributed._tools.fake_collectives import collective_ops

        _COLLECTIVES = frozenset(collective_ops)
    return _COLLECTIVES


# Ops that write part of a tensor in place (a static KV cache's update): they move the values
# and indices they read and as many bytes written, not the whole destination.
_PARTIAL_WRITES = frozenset(
    {"aten::index_copy_", "aten::index_put_", "aten::_index_put_impl_", "aten::scatter_", "aten::slice_scatter"}
)


def _moved_bytes(name: str, ins: list, outs: list) -> int:
    """HBM bytes an op moves: its inputs read and outputs written once (a partial in-place
    write: the values and indices it reads, and the values it writes)."""
    if name.split(".")[0] in _PARTIAL_WRITES and ins and outs and outs[0] is ins[0]:
        src = sum(t.nbytes for t in ins[1:])
        return 2 * src
    return sum(t.nbytes for t in ins) + sum(t.nbytes for t in outs)


def _rows(counter: collections.Counter) -> list:
    """A bucket's counter as JSON rows: the key's fields (a graph's name) followed by the count."""
    return [[*k, n] if isinstance(k, tuple) else [k, n] for k, n in counter.items()]


def _nbytes(v) -> int:
    return v.numel() * v.element_size() if isinstance(v, torch.Tensor) else 0


def graph_parts(gm) -> list:
    """The cost of one run of a compiled ATen graph, as parts timed like ops:
    ``[kind, dtype, flops, bytes, operands]`` per matmul-like node (as eager), and one
    ``"fused"`` part for all other nodes, as one kernel (its flops: vector operations).

    The fused kernel reads from HBM what its nodes take from outside it (graph inputs,
    matmul results) and writes what leaves it (graph outputs, matmul operands), each once;
    its intermediates stay on chip. Views cost nothing and are seen through.
    """
    from torch.fx.node import map_arg

    cls: dict = {}  # node -> "input" | "output" | "mm" | "view" | "vec" | "other"
    parts, vec_ops, dtype = [], 0, None
    for node in gm.graph.nodes:
        if node.op == "placeholder":
            cls[node] = "input"
        elif node.op == "output":
            cls[node] = "output"
        elif node.op == "call_function" and isinstance(node.target, torch._ops.OpOverload):
            info = _FuncInfo(node.target)
            kind = {"tensor": "mm", "view": "view", "vector": "vec"}.get(info.kind, "other")
            cls[node] = kind
            if kind not in ("mm", "vec"):
                continue
            args, kwargs = map_arg((node.args, node.kwargs), lambda n: n.meta.get("val"))
            out = node.meta.get("val")
            ins = _tensors(kwargs.values(), _tensors(args, []))
            outs = _tensors(
                (out,) if isinstance(out, torch.Tensor) else out if isinstance(out, (list, tuple)) else (), []
            )
            d = next((t.dtype for t in ins + outs if t.is_floating_point()), None)
            if kind == "mm":
                flops = int(info.flops(*args, **kwargs, out_val=out))
                nbytes = sum(_nbytes(t) for t in ins + outs)
                parts.append(["tensor", _dtype_name(d or ins[0].dtype), flops, nbytes, len(ins) + len(outs)])
            else:
                vec_ops += sum(t.numel() for t in ins + outs)  # one operation per element read or written
                dtype = dtype or d
        elif node.op == "call_function" and node.target is operator.getitem:
            cls[node] = cls.get(node.args[0], "other")  # an output of a multi-output node
        else:
            cls[node] = "other"

    def root(n):  # the node whose memory a view chain aliases
        while cls.get(n) == "view" and n.all_input_nodes:
            n = n.all_input_nodes[0]
        return n

    def leaves_fusion(n) -> bool:  # some non-view user outside the fused kernel
        return any(cls[u] not in ("vec", "view") or (cls[u] == "view" and leaves_fusion(u)) for u in n.users)

    reads, writes = {}, {}
    for node, c in cls.items():
        if c != "vec":
            continue
        for i in node.all_input_nodes:
            r = root(i)
            if cls[r] != "vec":
                reads[r] = max(reads.get(r, 0), _nbytes(i.meta.get("val")))
        if isinstance(node.meta.get("val"), torch.Tensor) and leaves_fusion(node):
            writes[node] = _nbytes(node.meta["val"])
    if vec_ops or reads or writes:
        nbytes = sum(reads.values()) + sum(writes.values())
        parts.append(["fused", _dtype_name(dtype or torch.float32), vec_ops, nbytes, len(reads) + len(writes)])
    return parts


def _is_dynamic(gm) -> bool:
    """A graph compiled for symbolic shapes: one run's cost depends on the sizes it gets."""
    for node in gm.graph.find_nodes(op="placeholder"):
        v = node.meta.get("val")
        if isinstance(v, torch.SymInt) or (
            isinstance(v, torch.Tensor) and any(isinstance(d, torch.SymInt) for d in v.shape)
        ):
            return True
    return False


_PARTS = weakref.WeakKeyDictionary()  # ATen graph -> graph_parts(), computed once per process


def _cached_parts(gm) -> list:
    parts = _PARTS.get(gm)
    if parts is None:
        parts = _PARTS[gm] = graph_parts(gm)
    return parts


_PRIM_DEVICE = torch.ops.prim.device.default


class _Mode(TorchDispatchMode):
    def __init__(self, collector):
        super().__init__()
        self.c = collector

    @classmethod
    def ignore_compile_internals(cls) -> bool:
        # Off while torch.compile traces (so Dynamo still compiles), on while compiled code runs.
        return True

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is _PRIM_DEVICE:  # a device query (half of a dry run's calls): nothing to record
            return func(*args)
        kwargs = kwargs or {}
        if self.c.dry is not None:  # nothing runs, so nothing falls back: ask what would
            out = func(*args, **kwargs)
            try:
                self.c._record(func, args, kwargs, out, would=True)
            except Exception as e:
                self.c.errors[f"{func}: {type(e).__name__}: {e}"] += 1
            return out
        n0 = _C._fallback_count()
        out = func(*args, **kwargs)
        try:
            fell_back = _C._fallback_count() != n0
            self.c._record(func, args, kwargs, out, _C._last_fallback_reason() if fell_back else None)
        except Exception as e:  # never break the user's run; say so in the report
            self.c.errors[f"{func}: {type(e).__name__}: {e}"] += 1
        return out


class _GraphBreakTap(logging.Filter):
    """Collects Dynamo's graph-break log records. A logger filter, not a handler: the records
    reach the logger's handlers (the terminal) only if the user had enabled them."""

    def __init__(self, sink: collections.Counter, user_enabled: bool):
        super().__init__()
        self.sink = sink
        self.user_enabled = user_enabled

    def filter(self, record) -> bool:
        msg = record.getMessage()
        m = _GRAPH_BREAK_AT.search(msg)
        if m:
            self.sink[(msg[:4000], f"{m.group(1)}:{m.group(2)}")] += 1
        return self.user_enabled


class Collector:
    """Records one process's run; ``start()`` / ``stop()`` then ``raw()``.

    With ``dry`` (a started :class:`~._dryrun.DryRun`), the run has no data: memory comes
    from the dry run's accounting, and fallbacks are the ones a real run would take.
    """

    def __init__(self, dry=None):
        self.dry = dry
        self._would: dict = {}  # (op, dtypes) -> fallback reason ("" for none)
        self.step = 0
        self.ops: list[collections.Counter] = [collections.Counter()]  # per step: op key -> calls
        self.collectives: list[collections.Counter] = [collections.Counter()]
        self.graphs: list[collections.Counter] = [collections.Counter()]  # per step: graph name -> runs
        self.graph_parts: dict = {}  # graph name -> graph_parts() of one run
        self.forwards = _Forwards()  # top-level forwards while no optimizer step has run (inference)
        self._graph_names: dict = {}  # generated module file -> graph name (None: not costed)
        self._tls = threading.local()  # .in_graph: this thread runs a costed compiled graph
        self._prev_listener = None
        self.fallbacks: dict = {}  # (op, dtype, reason) -> Counter(site)
        self.errors: collections.Counter = collections.Counter()
        self.graph_breaks: collections.Counter = collections.Counter()
        self.step_recompiles: list[int] = []
        self._funcs: dict = {}
        self._live: dict = {}  # storage data_ptr -> [nbytes, shape, dtype, op, refs, core, weakrefs...]
        self._series: dict = collections.defaultdict(list)  # core -> [(t, allocated, reserved)]
        self._next_sample: dict = collections.defaultdict(float)
        self._snap: dict = {}  # core -> (allocated, [tensors]) at the highest sampled usage
        # core -> allocated at the last counter read + bytes of storages first seen since: an
        # upper bound on usage now, so a new peak is never missed between timed samples
        self._bound: dict = collections.defaultdict(int)
        self._t0 = 0.0
        self.wall_seconds = 0.0
        self._mode = None
        self._hook = None
        self._log_level = None
        self._log_handler = None
        self._dynamo0 = None
        self.error = None

    def failed(self, exc: BaseException) -> None:
        """Record the exception the run ended with, and its notes; in a dry run, transformers'
        error for a directory without weights first gets the dry run's way out as a note."""
        if self.dry is not None:
            from ._checkpoint import _note_missing_weights

            _note_missing_weights(exc)
        self.error = "\n".join([f"{type(exc).__name__}: {exc}"] + getattr(exc, "__notes__", []))

    # -- lifecycle -------------------------------------------------------------
    def start(self) -> None:
        import torch.utils.flop_counter  # noqa: F401  (slow first import: not inside the first op)

        self._t0 = time.perf_counter()
        self._dynamo0 = _dynamo_metrics()
        if self.dry is None:
            self._adopt_existing_tensors()
        # OOMs before the report are not this run's (the counter is process-wide)
        self._ooms0 = {}
        if _C._is_initialized():
            # the report's peaks are this run's: like a profiler, start them afresh
            for i in range(torch.neuron.device_count()):
                torch.neuron.reset_peak_memory_stats(i)
                self._ooms0[i] = _counters(i)["num_ooms"]
        from torch.optim.optimizer import register_optimizer_step_post_hook

        self._hook = register_optimizer_step_post_hook(self._on_step)
        self.forwards.start()
        log = logging.getLogger(_GRAPH_BREAK_LOGGER)
        self._log_level = log.level
        self._log_handler = _GraphBreakTap(self.graph_breaks, log.isEnabledFor(logging.DEBUG))
        log.addFilter(self._log_handler)
        log.setLevel(logging.DEBUG)  # Dynamo logs graph breaks only to an enabled logger
        self._prev_listener, _graphs._listener = _graphs._listener, self
        self._mode = _Mode(self)
        self._mode.__enter__()

    def stop(self) -> None:
        if self._mode is not None:
            self._mode.__exit__(None, None, None)
            self._mode = None
            _graphs._listener = self._prev_listener
        if self._hook is not None:
            self._hook.remove()
            self._hook = None
        self.forwards.stop()
        if self._log_handler is not None:
            log = logging.getLogger(_GRAPH_BREAK_LOGGER)
            log.removeFilter(self._log_handler)
            log.setLevel(self._log_level)
            self._log_handler = None
        for core in list(self._series):
            self._sample(core, force=True)
        self.wall_seconds = time.perf_counter() - self._t0

    # -- recording -------------------------------------------------------------
    def _on_step(self, optimizer, args, kwargs) -> None:
        m = _dynamo_metrics()
        self.step_recompiles.append(m["num_recompilations"] if m else 0)
        for core in list(self._series):
            self._sample(core, force=True)
        self.step += 1
        self.forwards.training()
        self.ops.append(collections.Counter())
        self.collectives.append(collections.Counter())
        self.graphs.append(collections.Counter())

    def _graph_enter(self, filename: str) -> None:
        """A compiled graph starts running on this thread: count it whole, with its cost,
        and not the ATen ops its code calls (a graph without a kept ATen graph, e.g. one
        loaded whole from AOTAutograd's cache, is counted op by op instead)."""
        tls = self._tls
        depth = getattr(tls, "depth", 0)
        tls.depth = depth + 1
        if depth:
            return
        try:
            if filename not in self._graph_names:
                self._graph_names[filename] = self._cost_graph(filename)
            name = self._graph_names[filename]
        except Exception as e:  # never break the user's run; say so in the report
            self.errors[f"costing compiled graph {filename}: {type(e).__name__}: {e}"] += 1
            name = self._graph_names[filename] = None
        tls.in_graph = name is not None
        if name is not None:
            self.graphs[self.step][name] += 1
            self.forwards.count("graphs", name)

    def _graph_exit(self) -> None:
        tls = self._tls
        tls.depth -= 1
        if not tls.depth:
            tls.in_graph = False

    def _cost_graph(self, filename: str):
        gm = _graphs._gms.get(filename)
        if gm is None or _is_dynamic(gm):
            return None
        name = f"compiled graph {_graphs._names.get(filename, filename)}"
        while name in self.graph_parts:  # two graphs under one name (e.g. recompiled): keep both
            name += "'"
        self.graph_parts[name] = _cached_parts(gm)
        return name

    def _record(self, func, args, kwargs, out, fallback=None, would: bool = False) -> None:
        """One op call; ``fallback`` is the reason when it (or a kernel inside it,
        e.g. the fill_ that aten::ones runs) fell back to CPU. ``would`` (a dry run, where
        nothing runs): the reason is the one a real run would have, asked only of ops that count."""
        info = self._funcs.get(func)
        if info is None:
            info = self._funcs[func] = _FuncInfo(func)
        ins = _tensors(kwargs.values(), _tensors(args, []))
        outs = _tensors((out,) if isinstance(out, torch.Tensor) else out if isinstance(out, (list, tuple)) else (), [])
        for t in outs or ins:
            if _fake.is_wrapper(t):
                return  # DTensor and the like: their local tensors' ops are the ones that run
            if self.dry is None and isinstance(t, FakeTensor):
                return  # a compiler tracing shapes (e.g. a graph compiled on first call), not the run
        core = None
        for t in outs or ins:
            if t.device.type == "neuron":
                core = t.device.index
                break
        if core is None:
            for t in ins:
                if t.device.type == "neuron":
                    core = t.device.index
                    break
            else:
                return  # a host op: it runs on the host CPU on Trainium too
        name, kind = info.name, info.kind
        if kind == "none":
            return
        dtype = None
        for t in ins or outs:
            if t.is_floating_point():
                dtype = t.dtype
                break
        if dtype is None and (ins or outs):
            dtype = (ins or outs)[0].dtype
        dname = _dtype_name(dtype)
        if kind == "collective":
            if not name.startswith("_c10d_functional::wait_tensor"):  # a wait moves no data
                self._record_collective(func, args, kwargs, out, dname)
        elif getattr(self._tls, "in_graph", False):
            if would:
                fallback = self._would_fall_back(func, ins, outs)
            if fallback is not None:
                self._record_fallback(name, fallback, ins, outs)
        elif kind == "view":
            self.ops[self.step][(name, dname, kind, 0, 0, 0)] += 1
            self.forwards.count("ops", (name, dname, kind, 0, 0, 0))
        else:
            nbytes = _moved_bytes(name, ins, outs)
            flops = int(info.flops(*args, **kwargs, out_val=out)) if info.flops is not None else 0
            key = (name, dname, kind, flops, nbytes, len(ins) + len(outs))
            self.ops[self.step][key] += 1
            self.forwards.count("ops", key)
            if would:
                fallback = self._would_fall_back(func, ins, outs)
            if fallback is not None:
                self._record_fallback(name, fallback, ins, outs)
        if outs and self.dry is None:  # views too: a view keeps its storage alive
            for t in outs:
                if t.device.type == "neuron":
                    self._track(t, name)
        snap = self._snap.get(core)
        if time.perf_counter() >= self._next_sample[core] or (
            snap is not None and self._bound[core] > snap[0] * _PEAK_STEP
        ):
            self._sample(core)

    def _would_fall_back(self, func, ins, outs):
        """The reason a real run of this op on neuron would fall back to CPU, or None."""
        dtypes = tuple(sorted({t.dtype for t in ins + outs if t.device.type == "neuron"}, key=str))
        if not dtypes or func.name().split(".")[0] in _MEMORY_KERNEL_OPS:
            return None
        key = (func, dtypes)
        reason = self._would.get(key)
        if reason is None:
            reason = self._would[key] = _C._fallback_reason(func.name(), list(dtypes))
        return reason or None

    def _record_fallback(self, name, reason, ins, outs) -> None:
        # "<dtype> is not native" names the dtype; "no Trainium lowering" has none.
        dtypes = {_dtype_name(t.dtype) for t in ins} | {_dtype_name(t.dtype) for t in outs}
        d = reason.split(" ", 1)[0]
        key = (name, d if d in dtypes else "-", reason)
        self.fallbacks.setdefault(key, collections.Counter())[_user_site()] += 1

    def _record_collective(self, func, args, kwargs, out, dname) -> None:
        from torch.distributed._tools.fake_collectives import CollectiveOp

        try:
            size = CollectiveOp.get_process_group(func, args).size()
        except Exception:
            size = 1
        try:
            nbytes = int(CollectiveOp.get_comm_tensor_size(func, out, args, kwargs))
        except Exception:
            nbytes = sum(t.nbytes for t in _tensors(args, []))
        name = func.name().split("::")[1].split(".")[0].strip("_")
        self.collectives[self.step][(name, dname, nbytes, size)] += 1
        self.forwards.count("collectives", (name, dname, nbytes, size))

    # -- memory ----------------------------------------------------------------
    def _track(self, t, op) -> None:
        st = t.untyped_storage()
        ptr = st.data_ptr()
        if not ptr:
            return
        entry = self._live.get(ptr)
        if entry is None:
            entry = self._live[ptr] = [st.nbytes(), tuple(t.shape), _dtype_name(t.dtype), op, 0, t.device.index]
            self._bound[t.device.index] += entry[0]
        entry[4] += 1
        live = self._live

        def _dead(_ref, ptr=ptr, entry=entry):
            entry[4] -= 1
            if entry[4] == 0 and live.get(ptr) is entry:
                del live[ptr]

        entry.append(weakref.ref(t, _dead))

    def _adopt_existing_tensors(self) -> None:
        """Tensors allocated before the report started (e.g. a model built earlier)."""
        if not _C._is_initialized():
            return
        if not any(torch.neuron.memory_allocated(i) for i in range(torch.neuron.device_count())):
            return
        import gc

        for obj in gc.get_objects():
            if type(obj) in (torch.Tensor, torch.nn.Parameter) and obj.device.type == "neuron":
                self._track(obj, "(before the report started)")

    def _sample(self, core, force: bool = False) -> None:
        now = time.perf_counter()
        self._next_sample[core] = now + _SAMPLE_S
        c = _counters(core)
        self._bound[core] = c["allocated_current"]
        series = self._series[core]
        if len(series) < _SERIES_MAX or force:
            series.append((round(now - self._t0, 6), c["allocated_current"], c["reserved_current"]))
        snap = self._snap.get(core)
        if snap is None or c["allocated_current"] > snap[0] * _PEAK_STEP:
            dev_live = [e for e in self._live.values() if e[5] == core]
            top = heapq.nlargest(_TOP_TENSORS, dev_live, key=lambda e: e[0])
            self._snap[core] = (
                c["allocated_current"],
                [{"bytes": e[0], "shape": list(e[1]), "dtype": e[2], "op": e[3]} for e in top],
            )

    # -- result ----------------------------------------------------------------
    def raw(self) -> dict:
        """This process's observations, JSON-serialisable; the report is built from these."""
        info = _C._instance_info()
        memory = {}
        for core in sorted(self._series):
            c = _counters(core)
            snap = self._snap.get(core, (0, []))
            dry = self.dry.snapshot(core) if self.dry is not None else None
            if dry is not None:
                snap = (dry["at"], dry["top"])
            memory[str(core)] = {
                "peak_allocated": c["allocated_peak"],
                "peak_reserved": c["reserved_peak"],
                "capacity": c["capacity"],
                "num_ooms": c["num_ooms"] - self._ooms0.get(core, 0),
                "series": self._series[core],
                "top_tensors_at": snap[0],
                "top_tensors": snap[1],
            }
            if dry is not None:
                memory[str(core)]["breakdown"] = dry["breakdown"]
        n_steps = self.step
        return {
            "rank": _settings.get("RANK"),
            "world_size": _settings.get("WORLD_SIZE"),
            "instance_type": info["instance_type"],
            "lnc": info["logical_nc_config"],
            "steps": n_steps,
            "fp32_precision": torch.get_float32_matmul_precision(),
            "wall_seconds": round(self.wall_seconds, 4),
            "ops": [_rows(c) for c in self.ops],
            "collectives": [_rows(c) for c in self.collectives],
            "graphs": [_rows(c) for c in self.graphs],
            "graph_parts": self.graph_parts,
            "forwards": self.forwards.raw(),
            "fallbacks": [
                {"op": k[0], "dtype": k[1], "reason": k[2], "count": sum(s.values()), "sites": dict(s.most_common())}
                for k, s in self.fallbacks.items()
            ],
            "memory": memory,
            "compile": _compile_delta(self._dynamo0, _dynamo_metrics(), self.graph_breaks, self.step_recompiles),
            "collector_errors": dict(self.errors),
            "error": self.error,
            "dry_run": self.dry.raw() if self.dry is not None else None,
        }


def _dynamo_metrics():
    if "torch._dynamo" not in sys.modules:
        return None
    return torch.neuron.get_dynamo_metrics()


def _compile_delta(m0, m1, breaks: collections.Counter, step_recompiles: list) -> dict:
    """Compile metrics gathered during the report (the counters are process-wide)."""
    if m1 is None:
        return {"graphs": [], "recompilations": [], "fallbacks": [], "graph_breaks": [], "step_recompilations": []}
    m0 = m0 or {"graphs": [], "recompilations": [], "fallbacks": [], "graph_break_reasons": {}, "num_recompilations": 0}
    base = m0["num_recompilations"]
    per_step, prev = [], base
    for n in step_recompiles:
        per_step.append(n - prev)
        prev = n
    counted = {}
    for reason, n in m1["graph_break_reasons"].items():
        n -= m0["graph_break_reasons"].get(reason, 0)
        if n > 0:
            counted[reason] = n
    located = collections.Counter()
    for (msg, site), n in breaks.items():
        # Dynamo's counter key is the reason proper; the log message holds it after a preamble.
        reason = next((r for r in counted if r.splitlines()[0] in msg), None)
        if reason is None:
            m = _GRAPH_BREAK_AT.search(msg)
            reason = m.group(3).strip() if m else msg.splitlines()[0]
        located[(reason, site)] += n
    located = [{"reason": r, "site": s, "count": n} for (r, s), n in located.most_common()]
    return {
        "graphs": m1["graphs"][len(m0["graphs"]) :],
        "recompilations": m1["recompilations"][len(m0["recompilations"]) :],
        "fallbacks": m1["fallbacks"][len(m0["fallbacks"]) :],
        "graph_break_counts": counted,
        "graph_breaks": located,
        "step_recompilations": per_step,
    }


class _Forwards:
    """Top-level ``nn.Module`` forwards while no optimizer step has run: the phases of
    inference. Each bucket runs from the start of one top-level forward to the start of the
    next (so a token's sampling counts with the forward that produced it).

    A forward is a decode step when it gets the same ``past_key_values`` object as the forward
    before it and one token per sequence (``input_ids`` / ``inputs_embeds`` / its first tensor
    argument of shape ``(batch, 1, ...)``), as ``generate`` calls it; any other is a prefill.
    Forwards run inside torch.compile are not seen by module hooks: a compiled graph run
    outside an eager forward is noted, and the phases are then not estimated.
    """

    def __init__(self):
        self.buckets: list = []
        self._cur = None
        self._depth = 0
        self._off = False
        self._prev_cache = None
        self._handles = ()
        self.compiled_outside = False

    def start(self) -> None:
        from torch._dynamo.callback import callback_handler
        from torch._dynamo.utils import counters
        from torch.nn.modules import module

        # Global module hooks change what Dynamo traces (and so its guards): code compiled
        # without them would recompile. So no hooks once anything is compiled, and none
        # from the moment a compile starts.
        if counters["stats"]["unique_graphs"]:
            self.compiled_outside = True
            return
        callback_handler.register_start_callback(self._on_compile)
        self._handles = (
            module.register_module_forward_pre_hook(self._pre),
            module.register_module_forward_hook(self._post, with_kwargs=True, always_call=True),
        )

    def _on_compile(self, _args=None) -> None:
        self.compiled_outside = True
        self._unhook()

    def _unhook(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles = ()
        self._cur = None

    def stop(self) -> None:
        from torch._dynamo.callback import callback_handler

        try:
            callback_handler.remove_start_callback(self._on_compile)
        except ValueError:  # never registered (compiled before the report)
            pass
        self._unhook()

    def training(self) -> None:
        """An optimizer step ran: this is training, whose steps are the optimizer's."""
        self._off = True
        self.buckets.clear()
        self._cur = None

    def count(self, what: str, key) -> None:
        if self._cur is not None:
            self._cur[what][key] += 1
        elif what == "graphs" and not self._off and self.buckets:
            self.compiled_outside = True

    def _pre(self, module, args):
        if torch.compiler.is_compiling():
            return
        self._depth += 1
        if self._depth == 1 and not self._off:
            self._cur = {
                "phase": None,
                "tokens": None,
                "ops": collections.Counter(),
                "collectives": collections.Counter(),
                "graphs": collections.Counter(),
            }
            self.buckets.append(self._cur)

    def _post(self, module, args, *kwargs_and_output):
        # (module, args, kwargs, output); a forward that raised gets (module, args, None):
        # PyTorch calls always-called global hooks without kwargs on that path.
        kwargs = kwargs_and_output[0] if len(kwargs_and_output) == 2 else {}
        if torch.compiler.is_compiling():
            return
        self._depth = max(self._depth - 1, 0)
        if self._depth == 0 and self._cur is not None and self._cur["phase"] is None:
            self._cur["phase"], self._cur["tokens"] = self._classify(args, kwargs)

    def _classify(self, args, kwargs) -> tuple:
        cache = kwargs.get("past_key_values")
        x = kwargs.get("input_ids")
        x = kwargs.get("inputs_embeds") if x is None else x
        if not isinstance(x, torch.Tensor):
            x = next((a for a in args if isinstance(a, torch.Tensor)), None)
        tokens = int(x.shape[1]) if isinstance(x, torch.Tensor) and x.dim() >= 2 else None
        prev, self._prev_cache = self._prev_cache, _weak(cache)
        same_cache = cache is not None and prev is not None and prev() is cache
        return ("decode" if same_cache and tokens == 1 else "prefill"), tokens

    def raw(self) -> dict:
        done = [b for b in self.buckets if b["phase"] is not None]
        return {
            "compiled_outside": self.compiled_outside,
            "buckets": [
                {
                    "phase": b["phase"],
                    "tokens": b["tokens"],
                    "ops": _rows(b["ops"]),
                    "collectives": _rows(b["collectives"]),
                    "graphs": _rows(b["graphs"]),
                }
                for b in done
            ],
        }


def _weak(obj):
    if obj is None:
        return None
    try:
        return weakref.ref(obj)
    except TypeError:  # not weak-referenceable: keep it (a cache lives as long as its generate anyway)
        return lambda: obj
