"""``torch.compile(model, backend="neuron")``: static-shape graphs for NeuronCores.

Pipeline: Dynamo -> AOTAutograd (forward/backward) -> Inductor's C++ code
generation on device memory -> native host code (the simulator's NEFF),
cached on disk. Options: ``model_name`` (names graphs and artifacts) and
``fallback_execution`` (run a graph that fails to compile eagerly instead of
raising; default from ``TORCH_NEURONX_DISABLE_FALLBACK_EXECUTION``, which is
``1``: raise).
"""

from __future__ import annotations

import itertools
import re
import threading
import time
import warnings

import torch

from neuronsim import settings as _settings

from .. import _sites
from ..profiler import _graphs as _profiler_graphs
from . import _inductor_glue as glue
from . import cache, metrics

SUPPORTED_OPTIONS = ("model_name", "fallback_execution")

_PassThrough = glue.passthrough_error_base()


class NeuronCompileError(_PassThrough):
    """Base class of backend "neuron" errors (Dynamo re-raises them unwrapped)."""


class NeuronGraphCompilationError(NeuronCompileError):
    """A graph failed to compile and ``fallback_execution`` is off."""


class NeuronDynamicShapeError(NeuronCompileError):
    """A graph with symbolic (dynamic) shapes reached the static-shape compiler."""


class NeuronCpuInputError(NeuronCompileError):
    """A CPU tensor was fed to a compiled graph with CPU auto-copy disabled."""


class NeuronCompileOptionError(NeuronCompileError):
    """Unsupported ``torch.compile`` arguments (``dynamic=True``, unknown options)."""


_STATIC_FIXES = (
    "Neuron graphs are compiled for static shapes. To fix: pad inputs to a few fixed "
    "bucket sizes, use a static KV cache (cache_implementation='static'), compile with "
    "dynamic=False, and drop torch._dynamo.mark_dynamic / use torch._dynamo.mark_static(x, dim)."
)

_graph_ids = itertools.count()
_frame_shapes: dict = {}
_frame_lock = threading.Lock()
_warned_modes: set = set()


def _flag(name: str) -> bool:
    return _settings.get(name)


class _Options:
    def __init__(self, mode, options):
        if mode not in (None, "default") and mode not in _warned_modes:
            _warned_modes.add(mode)
            warnings.warn(
                f"torch.compile(backend='neuron') supports only mode='default'; "
                f"mode={mode!r} is ignored and the graph is compiled in default mode.",
                stacklevel=3,
            )
        options = dict(options or {})
        unknown = sorted(set(options) - set(SUPPORTED_OPTIONS))
        if unknown:
            raise NeuronCompileOptionError(
                f"unsupported option(s) {unknown} for backend 'neuron'; supported: {list(SUPPORTED_OPTIONS)}"
            )
        from . import current_model_name

        self.model_name = str(options.get("model_name") or current_model_name() or "graph")
        fallback = options.get("fallback_execution")
        if fallback is None:
            fallback = not _flag("TORCH_NEURONX_DISABLE_FALLBACK_EXECUTION")
        self.fallback_execution = bool(fallback)


def _graph_site(gm) -> str | None:
    """``file:line (function)`` of the graph: the outermost user frame of its first traced op (the
    user's code Dynamo compiled), else the user's line that called the compiled code (a module of
    torch.nn, whose frames a trace leaves out)."""
    for node in gm.graph.nodes:
        m = re.search(r'File "(.+?)", line (\d+), in (\S+)', node.meta.get("stack_trace") or "")
        if m:
            return f"{m.group(1)}:{m.group(2)} ({m.group(3)})"
    f = _sites.user_frame()
    return _sites.frame_site(f) if f is not None else None


def _shape_sig(example_inputs) -> list:
    sig = []
    for x in example_inputs:
        if isinstance(x, torch.Tensor):
            sig.append((tuple(x.shape), str(x.dtype).replace("torch.", ""), str(x.device)))
        else:
            sig.append(x if isinstance(x, (int, float, bool)) else type(x).__name__)
    return sig


def _is_symbolic(x) -> bool:
    if isinstance(x, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        return True
    if isinstance(x, torch.Tensor):
        return any(isinstance(s, torch.SymInt) for s in (*x.shape, *x.stride()))
    return False


def _explicitly_dynamic(example) -> bool:
    return isinstance(example, torch.Tensor) and bool(getattr(example, "_dynamo_dynamic_indices", None))


def _dynamic_error(name: str, x) -> NeuronDynamicShapeError:
    if isinstance(x, torch.Tensor):
        dims = [f"dim {i} = {s}" for i, s in enumerate(x.shape) if isinstance(s, torch.SymInt)]
        what = f"input {name} has dynamic shape {tuple(x.shape)} ({', '.join(dims) or 'dynamic strides'})"
    else:
        what = f"input {name} is a dynamic scalar ({x})"
    return NeuronDynamicShapeError(f"{what}. {_STATIC_FIXES}")


def neuron_backend(gm: torch.fx.GraphModule, example_inputs, *, mode=None, options=None):
    """Dynamo backend ``neuron`` (see the module docstring)."""
    glue.install()
    glue.on_dynamo_recompile(metrics.record_dynamo_recompile)
    opts = _Options(mode, options)
    if glue.user_requested_dynamic():
        raise NeuronCompileOptionError(
            "torch.compile(..., backend='neuron', dynamic=True) is not supported: " f"{_STATIC_FIXES}"
        )
    names = glue.placeholder_sources(gm)
    graph_name = f"{opts.model_name}_{next(_graph_ids)}"

    # Dynamo hands backends real tensors; the traced (fake) values carry the shapes.
    fakes = glue.placeholder_fakes(gm)
    symbolic = [i for i, x in enumerate(fakes) if _is_symbolic(x)]
    if symbolic:
        examples = glue.placeholder_examples(gm)
        explicit = [i for i in symbolic if _explicitly_dynamic(examples[i])]
        if explicit or not glue.automatic_dynamic_enabled():
            i = (explicit or symbolic)[0]
            raise _dynamic_error(names[i], fakes[i])
        # Dynamo generalised a shape after seeing a second one (automatic
        # dynamic shapes): keep the graph static by compiling each concrete
        # shape separately, as a recompilation.
        return _PerShapeGraph(gm, opts, graph_name, names)

    _note_recompilation(graph_name, example_inputs)
    return _compile(gm, list(example_inputs), opts, graph_name, names)


def _note_recompilation(graph_name: str, example_inputs) -> None:
    cid = glue.current_compile_id()
    if cid is None:
        return
    frame_id, attempt = cid
    shapes = _shape_sig(example_inputs)
    with _frame_lock:
        previous = _frame_shapes.get(frame_id)
        _frame_shapes[frame_id] = shapes
    if attempt and attempt > 0:
        reason = glue.current_recompile_reason() or (
            "new input shapes" if previous is not None and previous != shapes else "guard failure"
        )
        metrics.record_recompilation(graph_name, shapes, reason, compile_id=(frame_id, attempt))


def _cpu_inputs(example_inputs) -> list:
    # 0-dim CPU tensors are scalars, which devices accept (as CUDA does).
    return [
        i
        for i, x in enumerate(example_inputs)
        if isinstance(x, torch.Tensor) and x.device.type == "cpu" and x.dim() > 0
    ]


def _target_device(example_inputs) -> torch.device:
    for x in example_inputs:
        if isinstance(x, torch.Tensor) and x.device.type == "neuron":
            return x.device
    return torch.device("neuron", torch.neuron.current_device())


def _move_graph_to(gm: torch.fx.GraphModule, device: torch.device) -> None:
    """Rewrite cpu device constants (``device=`` of factory calls) to `device`."""
    cpu = torch.device("cpu")

    def conv(v):
        if isinstance(v, torch.device) and v == cpu:
            return device
        if isinstance(v, (list, tuple)):
            return type(v)(conv(a) for a in v)
        return v

    for node in gm.graph.nodes:
        node.args = conv(node.args)
        node.kwargs = {k: (device if k == "device" and v == "cpu" else conv(v)) for k, v in node.kwargs.items()}
    gm.recompile()


_without_codegen: str | None = None  # why graphs are compiled without code generation now


def compile_without_codegen(reason: str | None) -> None:
    """Compile graphs from now on without code generation, partitioned as for Inductor and run
    op by op (for a run that has no data, `reason` names it in the compile metrics); None: as usual."""
    global _without_codegen
    _without_codegen = reason
    glue.override_compile_fx(None if reason is None else _inductor_without_codegen)


def _inductor_without_codegen(gm, example_inputs):
    """A graph compiled with Inductor itself (backend "inductor") in a run without data: as this
    backend compiles one then, and listed with its graphs."""
    graph_name = f"inductor_{next(_graph_ids)}"
    compiled = glue.partition_without_codegen(gm, list(example_inputs), graph_name)
    metrics.record_graph(graph_name, _shape_sig(example_inputs), 0.0, _without_codegen, _graph_site(gm))
    return compiled


def _compile(gm, example_inputs: list, opts: _Options, graph_name: str, names: list):
    cpu_idx = _cpu_inputs(example_inputs)
    device = _target_device(example_inputs)
    if cpu_idx:
        example_inputs = _take_cpu_inputs(gm, example_inputs, cpu_idx, device, graph_name, names)

    if cache.artifacts_enabled():
        cache.write_artifact(graph_name, "dynamo_graph.txt", gm.print_readable(print_output=False))

    if _without_codegen is not None:
        # No data to run generated code on (a dry run): partitioned as for Inductor, run op by op.
        compiled = glue.partition_without_codegen(gm, example_inputs, graph_name)
        metrics.record_graph(graph_name, _shape_sig(example_inputs), 0.0, _without_codegen, _graph_site(gm))
    else:
        compiled = _compile_with_inductor(gm, example_inputs, opts, graph_name)
    return _CopyIn(compiled, cpu_idx, device) if cpu_idx else compiled


def _take_cpu_inputs(gm, example_inputs, cpu_idx, device, graph_name: str, names: list) -> list:
    """The graph compiled for `device`, with CPU tensor inputs copied in on each call
    (unless the user turned that off)."""
    if _flag("TORCH_NEURONX_DYNAMO_DISABLE_CPU_AUTOCOPY"):
        i = cpu_idx[0]
        raise NeuronCpuInputError(
            f"input {names[i]} of compiled graph {graph_name} is a CPU tensor of shape "
            f"{tuple(example_inputs[i].shape)}; compiled neuron graphs take neuron tensors. "
            f"Move it with .to('neuron') (TORCH_NEURONX_DYNAMO_DISABLE_CPU_AUTOCOPY=1 "
            f"turned automatic copies off)."
        )
    _move_graph_to(gm, device)
    return _to_device_examples(example_inputs, cpu_idx, device)


def _verify_cache() -> None:
    """Drop corrupted cache entries before a compile, and say so."""
    discarded = cache.verify_entries()
    if discarded:
        metrics.record_discarded(discarded)
        warnings.warn(
            f"backend 'neuron': discarded {len(discarded)} corrupted compile-cache "
            f"entr{'y' if len(discarded) == 1 else 'ies'} of {cache.cache_dir()} (they will be "
            f"recompiled): {', '.join(discarded[:3])}{' ...' if len(discarded) > 3 else ''}",
            stacklevel=4,  # _compile's caller, as the fallback warning
        )


def _compile_with_inductor(gm, example_inputs: list, opts: _Options, graph_name: str):
    """Inductor's code for the graph (through the cache), recorded in the metrics; on a
    compiler failure, the eager graph if the user allowed fallback execution."""
    use_cache = cache.cache_enabled()
    _verify_cache()
    counters = glue.dynamo_counters()
    before = _cache_counts(counters)
    first_call_done = []

    def on_inner_compile(inner_gm, compiled, is_backward, seconds):
        kind = "backward" if is_backward else "forward"
        _profiler_graphs._register(compiled, f"{graph_name} {kind}", inner_gm)
        if first_call_done:  # AOTAutograd compiles the backward at the first backward()
            metrics.add_compile_seconds(seconds)
            cache.record_entries(opts.model_name)
        if cache.artifacts_enabled():
            cache.write_artifact(graph_name, f"aot_{kind}_graph.txt", inner_gm.print_readable(print_output=False))
            source = getattr(compiled, "source_code", None)
            if source:
                cache.write_artifact(graph_name, f"{kind}_output_code.py", source)

    t0 = time.perf_counter()
    try:
        compiled = glue.compile_graph(
            gm,
            example_inputs,
            cache_dir=cache.cache_dir(),
            use_cache=use_cache,
            on_inner_compile=on_inner_compile,
            # a readiness report costs each graph from the ATen graph Inductor lowers
            costed=_profiler_graphs.listening(),
        )
    except Exception as e:
        if glue.is_dynamo_control_exception(e) or isinstance(e, NeuronCompileError):
            raise
        return _fall_back(gm, opts, graph_name, e, time.perf_counter() - t0)
    first_call_done.append(True)
    seconds = time.perf_counter() - t0
    cache.record_entries(opts.model_name)
    outcome = _cache_outcome(before, _cache_counts(counters), use_cache and cache.persistent())
    metrics.record_graph(graph_name, _shape_sig(example_inputs), seconds, outcome, _graph_site(gm))
    return compiled


def _fall_back(gm, opts: _Options, graph_name: str, error: Exception, seconds: float):
    """The eager graph in place of one the compiler failed on, or the error if fallback is off."""
    cause = glue.compile_failure_cause(error)
    if not opts.fallback_execution:
        raise NeuronGraphCompilationError(
            f"graph {graph_name} failed to compile: {cause}\n"
            f"Pass options={{'fallback_execution': True}} to torch.compile (or set "
            f"TORCH_NEURONX_DISABLE_FALLBACK_EXECUTION=0) to run such graphs eagerly."
        ) from error
    _warn_fallback_once(graph_name, cause)
    metrics.record_fallback(graph_name, cause)
    metrics.add_compile_seconds(seconds)
    return gm.forward


def _warn_fallback_once(graph_name: str, cause: str) -> None:
    # One warning per cause: a broken compiler fails every graph the same way.
    if not metrics.new_fallback_cause(cause):
        return
    warnings.warn(
        f"backend 'neuron': graph {graph_name} failed to compile ({cause}); running it eagerly "
        f"(fallback_execution=True). Later graphs failing for the same cause fall back silently; "
        f"torch.neuron.get_dynamo_metrics()['fallbacks'] lists them.",
        stacklevel=4,  # _compile's caller
    )


def _to_device_examples(example_inputs, idx, device):
    out = list(example_inputs)
    for i in idx:
        x = out[i]
        y = torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device=device)
        y.requires_grad_(x.requires_grad)
        out[i] = y
    return out


class _CopyIn:
    """Runs a compiled graph after copying its CPU tensor inputs to the device."""

    def __init__(self, compiled, idx, device):
        self.compiled, self.idx, self.device = compiled, idx, device

    def __call__(self, *args):
        args = list(args)
        for i in self.idx:
            args[i] = args[i].to(self.device)
        return self.compiled(*args)


def _cache_counts(counters) -> tuple:
    aot, ind = counters["aot_autograd"], counters["inductor"]
    return (aot["autograd_cache_hit"], aot["autograd_cache_miss"], ind["fxgraph_cache_hit"], ind["fxgraph_cache_miss"])


def _cache_outcome(before, after, use_cache: bool) -> str:
    if not use_cache:
        return "disabled"
    aot_hit, aot_miss, fx_hit, fx_miss = (a - b for a, b in zip(after, before))
    return "hit" if fx_miss == 0 and (aot_hit > 0 or fx_hit > 0) else "miss"


class _PerShapeGraph:
    """A graph Dynamo made symbolic, compiled once per concrete input shape."""

    def __init__(self, gm, opts: _Options, graph_name: str, names: list):
        self.gm, self.opts, self.graph_name, self.names = gm, opts, graph_name, names
        # Dynamo's recompile that made the graph dynamic: its first static shape fills it in
        self.compile_id = glue.current_compile_id()
        self.compiled: dict = {}
        self.lock = threading.Lock()

    def _key(self, args) -> tuple:
        return tuple(
            (tuple(a.shape), a.stride(), a.dtype, a.device) if isinstance(a, torch.Tensor) else a for a in args
        )

    def __call__(self, *args):
        key = self._key(args)
        fn = self.compiled.get(key)
        if fn is None:
            with self.lock:
                fn = self.compiled.get(key)
                if fn is None:
                    fn = self._compile(args)
                    self.compiled[key] = fn
        return fn(*args)

    def _compile(self, args):
        import copy

        name = f"{self.graph_name}_s{len(self.compiled)}"
        shapes = _shape_sig(args)
        metrics.record_recompilation(
            name,
            shapes,
            "new input shapes (static specialisation of a dynamic graph)",
            compile_id=None if self.compiled else self.compile_id,
        )
        # Inductor takes ownership of (and may mutate) the graph it compiles.
        return _compile(copy.deepcopy(self.gm), list(args), self.opts, name, self.names)
