"""The recorder: one dispatch mode that hands every op reaching the device to the observers.

It keeps per-bucket aggregates, not a trace, so its cost stays a few microseconds per op.
Facts counted elsewhere are read from their owners: which ops fall back to CPU (the
device's count, or in a dry run what the device says would), memory (``torch.neuron``
allocator counters and the executor's storage ledger), compile metrics
(``torch.neuron.get_dynamo_metrics``), graph-break locations (Dynamo's own log).
"""

from __future__ import annotations

import collections
import time

import torch

from neuronsim import collectives as _collectives
from neuronsim import settings as _settings

from ... import _C
from ...distributed._after_import import after_import
from .. import _torch_private
from .measure import PRIM_DEVICE, WAIT_TENSOR, FuncInfo, dtype_name, matmul_shapes, moved_bytes, outputs, tensors
from .observers.collectives import collective_key
from .observers.compile import Compile
from .observers.fallbacks import Fallbacks
from .observers.graphs import Graphs
from .observers.memory import Memory
from .observers.phases import Phases
from .observers.pipeline import Pipeline
from .observers.sequence import CollectiveSequence
from .observers.spans import Spans
from .recording import Recording


class _Mode(_torch_private.TorchDispatchMode):
    # Higher-order ops (flex_attention) come here whole: a fused kernel on the device.
    supports_higher_order_operators = True

    def __init__(self, recorder: "Recorder"):
        super().__init__()
        self.r = recorder
        self.strategy = recorder.fallbacks.strategy

    @classmethod
    def ignore_compile_internals(cls) -> bool:
        # Off while torch.compile traces (so Dynamo still compiles), on while compiled code runs.
        return True

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is PRIM_DEVICE:  # a device query (half of a dry run's calls): nothing to record
            return func(*args)
        kwargs = kwargs or {}
        if isinstance(func, _torch_private.HigherOrderOperator):
            out = func(*args, **kwargs)  # below this mode: its inner ops are the kernel's own
            try:
                self.r.on_higher_order_op(func, args, kwargs, out)
            except Exception as e:
                self.r.errors[f"{func.name()}: {type(e).__name__}: {e}"] += 1
            return out
        strategy = self.strategy
        token = strategy.before()
        out = func(*args, **kwargs)
        try:
            self.r.on_op(func, args, kwargs, out, strategy.after(token))
        except Exception as e:  # never break the user's run; say so in the report
            self.r.errors[f"{func}: {type(e).__name__}: {e}"] += 1
        return out


def _on_local_shards(args, kwargs, out, ts: list, redistributed):
    """A DTensor op as the local op DTensor runs on this rank's core: it runs it below this mode,
    out of its sight (tensor parallelism's matmuls, an optimizer's step on FSDP2's sharded
    parameters). Its inputs are the local shards after any redistribution DTensor made for the
    op (`redistributed`, from ``RedistributionTap``: a Shard(0) input of a matmul that needs it
    whole is all-gathered first), else the shards as they are. None when another wrapper is among
    them (a compiler's functional tensors: tracing, not the run)."""
    if not all(hasattr(t, "_local_tensor") for t in ts if _torch_private.is_wrapper(t)):
        return None

    def local(a):
        if isinstance(a, (list, tuple)):
            return type(a)(local(b) for b in a)
        return _torch_private.local(a) if isinstance(a, torch.Tensor) else a

    return local(args if redistributed is None else redistributed), {k: local(v) for k, v in kwargs.items()}, local(out)


def _device_and_dtype(ins: list, outs: list) -> tuple:
    """(the core an op ran on, its dtype's name): the first neuron output's core (else input's),
    the first floating input's dtype (else the first tensor's); core None for a host op."""
    core = next((t.device.index for t in outs or ins if t.device.type == "neuron"), None)
    if core is None:
        core = next((t.device.index for t in ins if t.device.type == "neuron"), None)
    dtype = next((t.dtype for t in ins or outs if t.is_floating_point()), None)
    if dtype is None and (ins or outs):
        dtype = (ins or outs)[0].dtype
    return core, dtype_name(dtype)


def _not_the_run(t, ignores_fake_tensors: bool) -> bool:
    """DTensor and the like (their local tensors' ops are the ones that run), and in a real run
    fake tensors (a compiler tracing shapes, not the run)."""
    return _torch_private.is_wrapper(t) or (ignores_fake_tensors and isinstance(t, _torch_private.FakeTensor))


class Recorder:
    """Records one process's run with an executor (real or dry); ``start()``, ``stop()``, then
    ``recording()``."""

    def __init__(self, executor):
        self.executor = executor
        self.errors: collections.Counter = collections.Counter()
        self.spans = Spans()
        self.phases = Phases(self.spans)
        self.graphs = Graphs(self.spans, self.phases, self.errors)
        self.fallbacks = Fallbacks(executor.fallbacks)
        self.memory = Memory(executor.ledger, track_outputs=not executor.dry)
        self.compile = Compile(self.spans)
        self.sequence = CollectiveSequence(executor.object_collective)
        self.pipeline = Pipeline(self.spans)
        self._funcs: dict = {}
        self._instances: dict = {}  # group name -> instances it spans
        self._redistributions = _torch_private.RedistributionTap()  # DTensor's, for the local op's shapes
        self._mode = None
        self._t0 = 0.0
        self.wall_seconds = 0.0
        self.error = None

    def start(self) -> None:
        import torch.utils.flop_counter  # noqa: F401  (slow first import: not inside the first op)

        self._t0 = time.perf_counter()
        self.compile.start()
        self.memory.start()
        self.spans.on_step(self.memory.sample_all)
        self.spans.start()
        self.phases.start()
        self.graphs.start()
        self.sequence.start()
        self.pipeline.start()
        # DTensor may be imported later, by the script: its redistribution is wrapped then
        self._redistributions.armed = True
        after_import("torch.distributed.tensor._dispatch", self._redistributions.on_import, "DTensor's local shapes")
        self._mode = _Mode(self)
        self._mode.__enter__()

    def stop(self) -> None:
        if self._mode is not None:
            self._mode.__exit__(None, None, None)
            self._mode = None
            self.graphs.stop()
        self.pipeline.stop()
        self._redistributions.remove()
        self.sequence.stop()
        self.spans.stop()
        self.phases.stop()
        self.compile.stop()
        self.memory.stop()
        self.wall_seconds = time.perf_counter() - self._t0

    def failed(self, exc: BaseException) -> None:
        """Record the exception the run ended with, and its notes (the executor's first)."""
        self.executor.failed(exc)
        self.error = "\n".join([f"{type(exc).__name__}: {exc}"] + getattr(exc, "__notes__", []))

    def _not_the_run(self, t) -> bool:
        return _not_the_run(t, self.executor.ignores_fake_tensors)

    def on_op(self, func, args, kwargs, out, early_fallback) -> None:
        """One op call; `early_fallback` is the reason a real run's op fell back, if it did."""
        info = self._funcs.get(func)
        if info is None:
            info = self._funcs[func] = FuncInfo(func)
        ins, outs = tensors(kwargs.values(), tensors(args, [])), outputs(out)
        if any(self._not_the_run(t) for t in outs or ins):
            redistributed = self._redistributions.local_args(func, args)
            local = _on_local_shards(args, kwargs, out, ins + outs, redistributed)
            if local is None:
                return
            args, kwargs, out = local
            ins, outs = tensors(kwargs.values(), tensors(args, [])), outputs(out)
            if any(self._not_the_run(t) for t in outs or ins):
                return
        name, kind = info.name, info.kind
        # a wait moves no data, and is not a collective of the group's stream
        collective = kind == "collective" and not name.startswith(WAIT_TENSOR)
        if collective:  # on any device: host collectives are in the group's ordered stream too
            self.sequence.record(func, args, kwargs, _collectives.normalise(name))
        core, dname = _device_and_dtype(ins, outs)
        if core is None or kind == "none":
            return  # a host op runs on the host CPU on Trainium too
        if kind == "collective":
            if collective:
                self.spans.count_collective(collective_key(func, args, kwargs, out, dname, core, self._instances))
        elif self.graphs.in_graph():
            self.fallbacks.check(func, name, ins, outs, early_fallback)
        elif kind == "view":
            self.spans.count_op((name, dname, kind, 0, 0, 0, ()))
        else:
            flops = int(info.flops(*args, **kwargs, out_val=out)) if info.flops is not None else 0
            mm = matmul_shapes(name, args) if kind == "tensor" else ()
            self.spans.count_op((name, dname, kind, flops, moved_bytes(name, ins, outs), len(ins) + len(outs), mm))
            self.fallbacks.check(func, name, ins, outs, early_fallback)
        self.memory.after_op(core, outs, name)

    def on_higher_order_op(self, func, args, kwargs, out) -> None:
        """A higher-order op runs as one kernel on the device (flex_attention: a fused attention
        kernel): counted as one Tensor Engine op with its FLOPs, reading its tensor arguments and
        writing its outputs once. One without a FLOP formula is noted as not costed."""
        from torch.utils.flop_counter import flop_registry

        formula = flop_registry.get(func)
        ins, outs = tensors(kwargs.values(), tensors(args, [])), outputs(out)
        if any(self._not_the_run(t) for t in ins + outs):
            return
        core, dname = _device_and_dtype(ins, outs)
        if core is None:
            return
        if formula is None:
            self.errors[f"{func.name()}: a higher-order op this recording does not cost"] += 1
            return
        flops = int(formula(*args, **kwargs, out_val=out))
        nbytes = sum(t.nbytes for t in ins + outs)
        mm = matmul_shapes(func.name(), args)
        self.spans.count_op((f"higher_order::{func.name()}", dname, "tensor", flops, nbytes, len(ins) + len(outs), mm))
        self.memory.after_op(core, outs, func.name())

    def recording(self) -> Recording:
        """This process's recording (call after ``stop()``)."""
        info = _C._instance_info()
        r = Recording(
            rank=_settings.get("RANK"),
            world_size=_settings.get("WORLD_SIZE"),
            instance_type=info["instance_type"],
            lnc=info["logical_nc_config"],
            steps=self.spans.n_steps,
            fp32_precision=torch.get_float32_matmul_precision(),
            wall_seconds=round(self.wall_seconds, 4),
            buckets=[b.typed() for b in self.spans.steps],
            graph_parts=dict(self.graphs.parts),
            regions=[b.typed() for b in self.spans.regions],
            generation=self.phases.record(),
            fallbacks=self.fallbacks.record(),
            groups=self.sequence.record_groups(),
            memory=self.memory.record(),
            compile=self.compile.record(),
            recorder_errors=dict(self.errors),
            error=self.error,
            pipeline=self.pipeline.record(),
        )
        self.executor.contribute(r)
        return r
