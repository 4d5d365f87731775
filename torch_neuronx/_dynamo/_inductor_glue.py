"""Everything that touches private Inductor / Dynamo internals, in one place.

The simulator's "NEFF" is Inductor's CPU C++ code: device memory is host memory,
so CPU kernels can read and write neuron buffers through their data pointers.
Inductor, however, treats every non-CPU device as a Triton GPU; this module
registers the C++ CPU code generator for device ``neuron`` and teaches the few
"is this the CPU?" checks that matter to answer yes for ``neuron``. Buffers are
still allocated with ``empty_strided(..., device="neuron")`` (our allocator).

These are private APIs that change between releases, hence the version pin.
"""

from __future__ import annotations

import functools
import threading

import torch

SUPPORTED_TORCH = "2.13."
DEVICE = "neuron"

_lock = threading.RLock()
_installed = False
_installing = False
_compile_fx_override = None  # (gm, example_inputs) -> compiled, used instead of Inductor when set
_inductor_compile_fx = None  # Inductor's own compile_fx, which the override does not replace


class UnsupportedTorchVersionError(RuntimeError):
    """The installed torch is not the one the Inductor glue was written for."""


def check_torch_version(version: str | None = None) -> None:
    """Raise UnsupportedTorchVersionError unless torch is 2.13.*."""
    version = torch.__version__ if version is None else version
    if not version.startswith(SUPPORTED_TORCH):
        raise UnsupportedTorchVersionError(
            f"torch.compile(backend='neuron') relies on Inductor internals of torch "
            f"{SUPPORTED_TORCH}*; found torch {version}. Install torch=={SUPPORTED_TORCH}* "
            f"or a torch-neuronx release built for torch {version}."
        )


def torch_version_supported() -> bool:
    return torch.__version__.startswith(SUPPORTED_TORCH)


def _is_cpu_like(device_type) -> bool:
    return device_type in ("cpu", DEVICE)


def install() -> None:
    """Register device ``neuron`` with Inductor and Dynamo (idempotent)."""
    global _installed, _installing
    if _installed:
        return
    with _lock:
        # Re-entry: installing imports Inductor modules whose import hook
        # (see torch_neuronx._dynamo.register) asks for the installation again.
        if _installed or _installing:
            return
        _installing = True
        try:
            check_torch_version()
            register_device_interface()
            _register_codegen()
            _patch_cpu_checks()
            _patch_layout_choice()
            _patch_rng_state_hops()
            _patch_cat_lowering()
            _patch_flex_attention()
            _patch_compile_fx()
            _installed = True
        finally:
            _installing = False


# --------------------------------------------------------------------------- #
# Dynamo device interface
# --------------------------------------------------------------------------- #

_interface_registered = False


def register_device_interface() -> None:
    """Register Dynamo's device interface of ``neuron`` (idempotent; imports no Inductor)."""
    global _interface_registered
    if _interface_registered:
        return
    _interface_registered = True
    # The interface subclasses Dynamo's DeviceInterface, so its module is imported only once
    # Dynamo's is (the import hook in torch_neuronx._dynamo calls this then).
    from . import _device_interface

    _device_interface.register()


# --------------------------------------------------------------------------- #
# Dynamo's DDPOptimizer: compiled without the caller's dispatch modes
# --------------------------------------------------------------------------- #

_ddp_branch_patched = False


def patch_ddp_optimizer_modes() -> None:
    """Compile a frame under DistributedDataParallel with the active dispatch modes off, as Dynamo
    compiles every other frame (idempotent; imports no Inductor).

    Dynamo turns the current TorchDispatchModes off while it traces and compiles a frame
    (``with compile_lock, _disable_current_modes()`` in ``CatchErrorsWrapper.__call__``), so a mode
    whose ``ignore_compile_internals()`` is True sees only the compiled code's run. Its branch for
    a frame of a DDP-wrapped module (``optimize_ddp="ddp_optimizer"``: DDPOptimizer splits the graph
    at DDP's gradient buckets) calls the DDPOptimizer callback under ``compile_lock`` alone: such a
    mode then sees Dynamo's fake tensors, AOTAutograd's functional tensors and DDPOptimizer's
    fake-mode runs, and a fake mode active in the caller stays active under Dynamo's. A readiness
    recording then records the compiler's ops as the run's, and a dry run (whose tensors belong
    to its own fake mode) fails in the split's compilation ("Mixing fake modes NYI", or "Please
    convert all Tensors to FakeTensors first"). The branch's callback (the only user of
    ``_clone_with_backend``) runs here under ``_disable_current_modes()`` too."""
    global _ddp_branch_patched
    if _ddp_branch_patched:
        return
    _ddp_branch_patched = True
    from torch._dynamo import convert_frame
    from torch.utils._python_dispatch import _disable_current_modes

    def without_modes(callback):
        @functools.wraps(callback)
        def call(*args, **kwargs):
            with _disable_current_modes():
                return callback(*args, **kwargs)

        return call

    for cls in (convert_frame.ConvertFrame, convert_frame.ConvertFrameAssert):
        clone = getattr(cls.__dict__.get("_clone_with_backend"), "fget", None)  # self -> (backend -> callback)
        if clone is None:  # runs inside `import torch._dynamo`: a changed Dynamo must still import
            continue
        cls._clone_with_backend = property(
            lambda self, clone=clone: lambda backend: without_modes(clone(self)(backend))
        )


# --------------------------------------------------------------------------- #
# Inductor code generation: C++ kernels + Python wrapper for device "neuron"
# --------------------------------------------------------------------------- #


def _register_codegen() -> None:
    from torch._inductor.codegen.common import register_backend_for_device, register_device_op_overrides
    from torch._inductor.codegen.cpp import CppScheduling
    from torch._inductor.codegen.cpp_wrapper_cpu import CppWrapperCpu
    from torch._inductor.codegen.cpu_device_op_overrides import CpuDeviceOpOverrides
    from torch._inductor.codegen.wrapper import PythonWrapperCodegen, SubgraphPythonWrapperCodegen
    from torch._inductor.virtualized import V

    class _NeuronKernelCalls:
        # PythonWrapperCodegen raises "device neuron nyi" for non-Triton kernels
        # on devices other than cpu/mps; C++ kernels are called the CPU way.
        def _generate_kernel_call_helper(self, kernel_name, call_args, *, device=None, triton=True, **kwargs):
            device = device or V.graph.get_current_device_or_throw()
            if not triton and device.type == DEVICE:
                self.writeline(self.wrap_kernel_call(kernel_name, call_args))
                return
            return super()._generate_kernel_call_helper(kernel_name, call_args, device=device, triton=triton, **kwargs)

    class NeuronSubgraphWrapperCodegen(_NeuronKernelCalls, SubgraphPythonWrapperCodegen):
        pass

    class NeuronWrapperCodegen(_NeuronKernelCalls, PythonWrapperCodegen):
        @staticmethod
        def create(is_subgraph, subgraph_name, parent_wrapper, partition_signatures=None):
            if is_subgraph:
                return NeuronSubgraphWrapperCodegen(subgraph_name, parent_wrapper, partition_signatures)
            return NeuronWrapperCodegen()

    class NeuronDeviceOpOverrides(CpuDeviceOpOverrides):
        # Generated wrappers switch the current core around a graph's kernels
        # so buffers of a model on neuron:N are allocated on core N.
        # The second manager times the graph on the device for torch.profiler.
        def device_guard(self, device_idx: int) -> str:
            return f"torch.neuron.device({device_idx}), torch.neuron._compiled_graph({device_idx})"

        def set_device(self, device_idx: int) -> str:
            return "pass"  # the guard above already made the core current

        def synchronize(self) -> str:
            return "torch.neuron.synchronize()"

    class NeuronCppWrapper(CppWrapperCpu):
        # Inductor asks a device for its C++ wrapper for AOTInductor (aoti_compile_and_package,
        # torch._inductor.aot_compile, torch._export.aot_compile) and for cpp_wrapper=True.
        # Neuron has no ahead-of-time artifact (nor does the real device): refuse here, naming
        # what to use, instead of failing later in the generated code (a missing stream guard).
        @staticmethod
        def create(is_subgraph, subgraph_name, parent_wrapper, partition_signatures=None):
            raise NotImplementedError(_no_cpp_wrapper_message(V.graph.aot_mode))

    register_backend_for_device(DEVICE, CppScheduling, NeuronWrapperCodegen, NeuronCppWrapper)
    register_device_op_overrides(DEVICE, NeuronDeviceOpOverrides())


def _no_cpp_wrapper_message(aot: bool) -> str:
    if aot:
        return (
            f"AOTInductor does not support device '{DEVICE}': a model with {DEVICE} tensors cannot be "
            'compiled ahead of time into a .pt2 or .so package. Use torch.compile(model, backend="neuron") '
            "to compile it for the device (compiled graphs are cached on disk and reused by later "
            "processes), and torch.export.export(model, args) if you need the graph itself."
        )
    return (
        f"Inductor's C++ wrapper (cpp_wrapper=True) does not support device '{DEVICE}'. "
        'Use torch.compile(model, backend="neuron"), which generates the Python wrapper.'
    )


# --------------------------------------------------------------------------- #
# "Is this the CPU?" checks
# --------------------------------------------------------------------------- #


def override_compile_fx(fn) -> None:
    """Compile every graph that reaches Inductor's ``compile_fx`` with ``fn(gm, example_inputs)``
    instead (None: Inductor again). Plain ``torch.compile`` (backend "inductor") and libraries that
    compile with it reach Inductor without backend "neuron"; a run without data must not generate
    code for them either: generated code would read fake tensors' memory."""
    global _compile_fx_override
    _compile_fx_override = fn


def _patch_compile_fx() -> None:
    global _inductor_compile_fx
    from torch._inductor import compile_fx as module

    orig = _inductor_compile_fx = module.compile_fx

    def compile_fx(model_, example_inputs_, *args, **kwargs):
        override = _compile_fx_override
        if override is None:
            return orig(model_, example_inputs_, *args, **kwargs)
        return override(model_, example_inputs_)

    _rebind(module, "compile_fx", compile_fx)


def _rebind(module, name: str, new) -> None:
    """Replace `module.name` and every already-imported alias of it in Inductor."""
    import sys

    orig = getattr(module, name)
    functools.update_wrapper(new, orig)
    for mod_name, mod in list(sys.modules.items()):
        if mod is not None and mod_name.startswith("torch._inductor") and getattr(mod, name, None) is orig:
            setattr(mod, name, new)


def _patch_cpu_checks() -> None:
    from torch._inductor import config, ir, scheduler, utils

    # Picks the kernel language for the current device; anything unknown is
    # taken for Triton, which mis-types C++ kernels (dtype propagation).
    orig_backend = utils.get_current_backend

    def get_current_backend(device_type=None):
        if device_type is None:
            from torch._inductor.virtualized import V

            device_type = V.graph.get_current_device_or_throw().type
        return config.cpu_backend if device_type == DEVICE else orig_backend(device_type)

    _rebind(utils, "get_current_backend", get_current_backend)

    # Heuristics tuned for the C++ backend (realize thresholds for heavy
    # pointwise ops, accumulated reads): CPU's values suit generated C++.
    _rebind(ir, "is_cpu", lambda x: _is_cpu_like(ir.get_device_type(x)))

    # Loop reordering / index inversion during fusion is disabled for CPU
    # because the C++ backend does not support it; it must be off for neuron.
    def is_cpu(self) -> bool:
        device = self.get_device()
        return device is not None and _is_cpu_like(device.type)

    scheduler.BaseSchedulerNode.is_cpu = is_cpu

    # Graphs on neuron:N get a device guard so allocations land on core N.
    orig_need_guard = utils.device_need_guard
    _rebind(utils, "device_need_guard", lambda device: device == DEVICE or orig_need_guard(device))

    # The FX graph cache keys the C++ thread count only for graphs that
    # generate CPU C++ code; neuron graphs do too.
    from torch._inductor.codecache import FxGraphHashDetails

    orig_contains_cpu = FxGraphHashDetails._contains_cpu_tensor.__func__

    def _contains_cpu_tensor(cls, value) -> bool:
        if isinstance(value, torch.Tensor):
            return _is_cpu_like(value.device.type)
        return orig_contains_cpu(cls, value)

    FxGraphHashDetails._contains_cpu_tensor = classmethod(_contains_cpu_tensor)


def _patch_layout_choice() -> None:
    """No channels_last layout optimisation for graphs with neuron convolutions.

    Inductor's layout heuristic for non-CPU devices would make conv weights
    channels_last; the device runs CPU's convolution, which (like the fake
    convolution of an "Overrideable" backend) answers contiguous, so the
    conversions would only cost copies.
    """
    from torch._inductor.graph import GraphLowering

    orig = GraphLowering.decide_layout_opt

    def _on_neuron(node) -> bool:
        val = node.args[0].meta.get("val") if isinstance(node.args[0], torch.fx.Node) else None
        return isinstance(val, torch.Tensor) and val.device.type == DEVICE

    @functools.wraps(orig)
    def decide_layout_opt(gm, *, is_inference: bool) -> bool:
        if any(n.target is torch.ops.aten.convolution.default and _on_neuron(n) for n in gm.graph.nodes):
            return False
        return orig(gm, is_inference=is_inference)

    GraphLowering.decide_layout_opt = staticmethod(decide_layout_opt)


def _patch_cat_lowering() -> None:
    """Lower ``aten.cat`` on neuron as on CPU: a ConcatKernel, not a masked pointwise cat.

    Inductor's cat lowering checks ``device.type == "cpu"`` inline: for CPU it copies each
    input into its slice (vectorized), because the masked "pointwise cat" does not
    vectorize in the C++ backend. Neuron uses that backend, so it needs CPU's choice
    (a Flux single block's cat + GELU ran 10x slower as a scalar masked loop).
    It also keeps neuron off an Inductor bug CPU never reaches: a pointwise cat fused into
    a reduction wraps its index in ``Identity()``, and a clamped gather index over it
    fails ``simplify_loops`` ("The argument '6 - ((0))' is not comparable", inkling2's
    relative-position bias + attention sinks; CPU fails alike with ``force_pointwise_cat``).
    """
    from torch._inductor import config, ir, lowering

    aten = torch.ops.aten
    orig = lowering.lowerings[aten.cat.default]

    def _plain(inputs) -> bool:
        if len(inputs) < 2 or inputs[0].get_device() is None or inputs[0].get_device().type != DEVICE:
            return False
        if all(i.get_dtype() in (torch.int8, torch.uint8) for i in inputs):
            return False  # the original's CPU-only fallback does not apply; keep its path
        sizevars = lowering.V.graph.sizevars
        return not any(len(i.get_size()) == 1 and sizevars.statically_known_equals(i.get_size()[0], 0) for i in inputs)

    @functools.wraps(orig)
    def cat(*args, **kwargs):
        inputs = args[0] if args else kwargs["tensors"]
        dim = args[1] if len(args) > 1 else kwargs.get("dim", 0)
        if config.force_pointwise_cat or not _plain(inputs):
            return orig(*args, **kwargs)
        dim = lowering._validate_dim(inputs[0], dim, 0)
        dtype = lowering.get_promoted_dtype(
            *inputs, type_promotion_kind=lowering.ELEMENTWISE_TYPE_PROMOTION_KIND.DEFAULT
        )
        inputs = [lowering.to_dtype(i, dtype) for i in inputs]
        return ir.TensorBox(ir.ConcatKernel.create(inputs, dim))

    for key, fn in list(lowering.lowerings.items()):
        if fn is orig:
            lowering.lowerings[key] = cat


# --------------------------------------------------------------------------- #
# RNG state around recomputed random ops (activation checkpointing)
# --------------------------------------------------------------------------- #


def _neuron_device_of(args, kwargs):
    """The neuron device a random op runs on (its ``device=`` or first tensor), else None."""
    device = kwargs.get("device")
    if device is None:
        device = next((a.device for a in args if isinstance(a, torch.Tensor)), None)
    if device is None:
        return None
    device = torch.device(device)
    return device if device.type == DEVICE else None


def _patch_flex_attention() -> None:
    """Compile flex_attention on neuron as the math it runs eagerly.

    Inductor lowers the flex_attention HOPs with Triton templates for every device but
    CPU (forward only) and MPS. On neuron, a pass in front of the post-grad passes
    replaces both HOPs (forward and backward graphs) by their math, which Inductor then
    fuses into C++ kernels like the rest of the graph.
    """
    from torch._inductor import compile_fx

    from .. import _attention

    original = compile_fx.post_grad_passes

    def post_grad_passes(gm, is_inference):
        _attention.decompose_flex_nodes(gm)
        return original(gm, is_inference)

    compile_fx.post_grad_passes = post_grad_passes


def trace_in_compiling_graph(fn, example_values: list):
    """``fn`` traced to an FX graph with Inductor's decompositions, in the fake mode of the graph
    Inductor is compiling (a pass's replacement for a node must share its fake tensors)."""
    from torch._inductor.decomposition import select_decomp_table
    from torch._inductor.virtualized import V
    from torch.fx.experimental.proxy_tensor import make_fx

    with V.fake_mode:
        return make_fx(fn, decomposition_table=select_decomp_table())(*example_values)


def _patch_rng_state_hops() -> None:
    """Let checkpointed random ops on neuron save/restore the neuron generator, as CUDA does.

    With activation checkpointing the partitioner recomputes random ops (dropout, SDPA
    dropout) in the backward graph and, for devices without graph-safe RNG (all but
    CUDA, so neuron like CPU), wraps them in the HOPs ``run_and_save_rng_state`` (forward:
    stash the generator state) and ``run_with_rng_state`` (backward: replay from it), so
    the recomputation draws the same masks. Their BackendSelect kernel, which the fake
    impl of ``run_and_save_rng_state`` also calls, knows only cuda/cpu/hpu/xpu from a
    closure-local table and asserts "Backend not supported for neuron". We register the
    neuron (PrivateUse1) kernels and put a BackendSelect/fake kernel in front of the
    original ones that handles neuron and delegates every other device.
    """
    from torch._C import DispatchKey
    from torch._higher_order_ops.utils import registered_hop_fake_fns
    from torch._prims import rng_prims

    save, replay = rng_prims.run_and_save_rng_state, rng_prims.run_with_rng_state

    def save_neuron(op, *args, **kwargs):
        device = _neuron_device_of(args, kwargs) or torch.device(DEVICE, torch.neuron.current_device())
        return torch.neuron.get_rng_state(device), op(*args, **kwargs)

    def replay_neuron(rng_state, op, *args, **kwargs):
        device = _neuron_device_of(args, kwargs) or torch.device(DEVICE, torch.neuron.current_device())
        current = torch.neuron.get_rng_state(device)
        torch.neuron.set_rng_state(rng_state, device)
        try:
            return op(*args, **kwargs)
        finally:
            torch.neuron.set_rng_state(current, device)

    orig_save_select = save.py_kernels[DispatchKey.BackendSelect]
    orig_replay_select = replay.py_kernels[DispatchKey.BackendSelect]

    def save_select(op, *args, **kwargs):
        if _neuron_device_of(args, kwargs) is not None:
            return save_neuron(op, *args, **kwargs)
        return orig_save_select(op, *args, **kwargs)

    def replay_select(rng_state, op, *args, **kwargs):
        if _neuron_device_of(args, kwargs) is not None:
            return replay_neuron(rng_state, op, *args, **kwargs)
        return orig_replay_select(rng_state, op, *args, **kwargs)

    for hop, neuron_kernel, select in ((save, save_neuron, save_select), (replay, replay_neuron, replay_select)):
        if DispatchKey.PrivateUse1 not in hop.py_kernels:
            hop.py_impl(DispatchKey.PrivateUse1)(neuron_kernel)
        hop.py_kernels[DispatchKey.BackendSelect] = select
        hop._dispatch_cache.clear()  # it may already hold the original BackendSelect kernel
    # The fake impl of run_and_save_rng_state is the BackendSelect kernel itself (it
    # returns a real CPU state tensor next to fake outputs, like CUDA's); the fake impl
    # of run_with_rng_state ignores the device and needs no change. The saved state
    # is typed from the real one save_neuron returns (the 16-byte (seed, offset)),
    # so the forward's output and the backward's input agree.
    registered_hop_fake_fns[save] = save_select


# --------------------------------------------------------------------------- #
# Compilation entry points
# --------------------------------------------------------------------------- #


def passthrough_error_base() -> type:
    """Base class for errors that Dynamo re-raises to the user unwrapped.

    Dynamo wraps backend exceptions in BackendCompilerFailed except
    ShortenTraceback subclasses, which it re-raises as they are.
    """
    from torch._dynamo.exc import ShortenTraceback

    class NeuronPassThroughError(ShortenTraceback):
        def __init__(self, msg: str):
            super().__init__(msg, first_useful_frame=None)

    return NeuronPassThroughError


def is_dynamo_control_exception(e: BaseException) -> bool:
    """Exceptions Dynamo uses for control flow; a backend must let them through."""
    from torch._dynamo import exc

    if isinstance(e, exc.BackendCompilerFailed):
        # InductorError (e.g. no working C++ compiler, an unwritable cache) is a
        # ShortenTraceback too, but it is a real compile failure.
        return False
    return isinstance(e, (exc.RestartAnalysis, exc.SkipFrame, exc.ShortenTraceback))


def compile_failure_cause(e: BaseException) -> str:
    """One line naming what made a compile fail (the error Inductor wrapped, if any)."""
    from torch._dynamo import exc

    inner = getattr(e, "inner_exception", None)
    if isinstance(e, exc.BackendCompilerFailed) and inner is not None:
        e = inner
    text = str(e).strip()
    return f"{type(e).__name__}: {text.splitlines()[0] if text else '(no message)'}"


def dynamo_counters() -> dict:
    """Dynamo/Inductor/AOTAutograd global counters (category -> Counter)."""
    from torch._dynamo.utils import counters

    return counters


def current_compile_id():
    """(frame_id, frame_compile_id) of the Dynamo compile in progress, or None."""
    from torch._guards import CompileContext

    cid = CompileContext.current_compile_id()
    if cid is None:
        return None
    return (cid.frame_id, cid.frame_compile_id)


def current_recompile_reason() -> str | None:
    """Dynamo's first guard-failure reason for the recompile in progress."""
    from torch._dynamo.utils import get_metrics_context

    ctx = get_metrics_context()
    return getattr(ctx, "_metrics", {}).get("recompile_reason") if ctx is not None else None


_recompile_hook = None


def on_dynamo_recompile(callback) -> None:
    """Call ``callback(frame_id, attempt, reason)`` whenever Dynamo recompiles a frame.

    Dynamo consults its recompile user-context hooks on every frame compile, after
    it has worked out the recompile reason and before it checks the recompile limit,
    so this also sees recompiles that the limit stops before any backend runs.
    Idempotent; registers again if ``torch._dynamo.reset_recompile_user_contexts()``
    dropped the hook.
    """
    global _recompile_hook
    from torch._dynamo.utils import get_hook_for_recompile_user_context, register_hook_for_recompile_user_context

    if _recompile_hook is not None and _recompile_hook in (get_hook_for_recompile_user_context() or ()):
        return

    def hook() -> str:
        reason = current_recompile_reason()
        cid = current_compile_id()
        if reason is not None and cid is not None:
            callback(cid[0], cid[1], reason)
        return ""

    _recompile_hook = hook
    register_hook_for_recompile_user_context(hook)


def automatic_dynamic_enabled() -> bool:
    import torch._dynamo.config as dcfg

    return bool(dcfg.automatic_dynamic_shapes)


def user_requested_dynamic() -> bool:
    """True inside torch.compile(..., dynamic=True) (Dynamo patches this config)."""
    import torch._dynamo.config as dcfg

    return not dcfg.assume_static_by_default


def placeholder_sources(gm) -> list:
    """Human-readable name of each graph input (e.g. "L['x']"), in order."""
    names = []
    for node in gm.graph.nodes:
        if node.op != "placeholder":
            continue
        arg = node.meta.get("grapharg")
        source = getattr(arg, "source", None)
        names.append(source.name if source is not None else node.name)
    return names


def placeholder_fakes(gm) -> list:
    """The fake value Dynamo traced each graph input with (None when unknown)."""
    out = []
    for node in gm.graph.nodes:
        if node.op == "placeholder":
            out.append(node.meta.get("example_value", node.meta.get("val")))
    return out


def placeholder_examples(gm) -> list:
    """The real tensor Dynamo saw for each graph input (None when unknown)."""
    out = []
    for node in gm.graph.nodes:
        if node.op != "placeholder":
            continue
        arg = node.meta.get("grapharg")
        try:
            out.append(arg.example if arg is not None else None)
        except Exception:  # a freed weakref: the example is gone
            out.append(None)
    return out


# Inductor settings of every compile for neuron (the C++ code's Python wrapper; no remote caches)
_COMPILE_PATCHES = {"fx_graph_remote_cache": False, "autotune_remote_cache": False, "cpp_wrapper": False}


def post_grad_graph(gm, example_inputs, *, is_inference: bool) -> None:
    """Apply to `gm` (in place) what Inductor applies to an AOTAutograd graph before lowering it
    (``codegen_and_compile``): views as reshapes, fake tensor propagation, the post-grad passes.
    The result is the ATen graph a compiled graph is costed from."""
    from torch._dynamo.utils import preserve_rng_state
    from torch._inductor.compile_fx import _recursive_post_grad_passes, fake_tensor_prop, view_to_reshape
    from torch._inductor.virtualized import V
    from torch.utils._python_dispatch import _disable_current_modes

    # The passes run ops on the compile's own fake tensors. A backward is compiled at the first
    # backward(), inside the modes of the caller (a dry run's fake mode), which would take those
    # ops for the script's own and their results, kept in the graph, for live device memory.
    with preserve_rng_state(), _disable_current_modes():
        view_to_reshape(gm)
        with torch.no_grad():
            fake_mode = fake_tensor_prop(gm, example_inputs)
        with V.set_fake_mode(fake_mode):
            _recursive_post_grad_passes(gm, is_inference=is_inference)


def compile_graph(gm, example_inputs, *, cache_dir: str, use_cache: bool, on_inner_compile=None, costed: bool = False):
    """Compile an FX graph with Inductor (through AOTAutograd) for device neuron.

    ``cache_dir`` becomes Inductor's cache dir for every compile of this graph,
    including the backward graph, which AOTAutograd compiles lazily at the first
    backward; ``on_inner_compile(gm, compiled, is_backward, seconds)`` sees each graph.
    ``costed=True`` (a readiness report costs each graph from its ATen graph) hands
    ``on_inner_compile`` the graph Inductor lowers, after its post-grad passes, also when
    Inductor's cache hit (a hit skips the passes); and skips AOTAutograd's cache (a hit there
    returns compiled code without calling Inductor, so ``on_inner_compile`` would not see
    the graph). Inductor's own cache still spares the C++ compile.
    """
    from torch._functorch import config as functorch_config
    from torch._inductor import config as inductor_config
    from torch._inductor.compile_fx import compile_fx, compile_fx_inner

    install()
    patches = {**_COMPILE_PATCHES, "fx_graph_cache": use_cache}
    if _vector_isas_verified(cache_dir):
        patches["cpp.vec_isa_ok"] = True

    aot = use_cache and not costed
    # AOTAutograd writes its cache entry once the backward is compiled. Compiled lazily (at the
    # first backward, outside this scope) the entry would land in Inductor's default directory,
    # not in cache_dir where the next process looks, so every process would miss: compile the
    # backward with the forward instead.
    functorch_patches = {
        "enable_autograd_cache": aot,
        "enable_remote_autograd_cache": False,
        "force_non_lazy_backward_lowering": aot,
    }

    @functools.wraps(compile_fx_inner)
    def inner_compile(gm_, example_inputs_, **kwargs):
        import time

        t0 = time.perf_counter()
        hits = dynamo_counters()["inductor"]["fxgraph_cache_hit"]
        with _cache_scope(cache_dir), inductor_config.patch(patches), functorch_config.patch(functorch_patches):
            compiled = compile_fx_inner(gm_, example_inputs_, **kwargs)
            if costed and dynamo_counters()["inductor"]["fxgraph_cache_hit"] > hits:
                post_grad_graph(gm_, example_inputs_, is_inference=bool(kwargs.get("is_inference", False)))
        if on_inner_compile is not None:
            on_inner_compile(gm_, compiled, bool(kwargs.get("is_backward", False)), time.perf_counter() - t0)
        return compiled

    with _cache_scope(cache_dir), inductor_config.patch(patches), functorch_config.patch(functorch_patches):
        return compile_fx(gm, example_inputs, inner_compile=inner_compile)


def partition_without_codegen(gm, example_inputs, graph_name: str = "graph"):
    """What compile_graph does up to code generation: Inductor's ``compile_fx`` (its pre-grad,
    joint-graph and post-grad passes, AOTAutograd with its decompositions and partitioner, so
    the same activations are saved for the backward), with the forward and backward graphs
    Inductor would lower then run op by op. For the dry run, which has no data for generated
    code to run on. Each run of these graphs is announced to the profiler layer's graph
    listener as one compiled graph with its ATen graph, as a generated module's run is, so
    that a recording costs it whole (with its fusion) in a dry run too, from the same graph."""
    from torch._functorch import config as functorch_config
    from torch._functorch.aot_autograd import make_boxed_func
    from torch._inductor import config as inductor_config

    from ..profiler import _graphs

    install()

    def inner_compile(g, inputs, **kwargs):
        kind = "backward" if kwargs.get("is_backward") else "forward"
        post_grad_graph(g, inputs, is_inference=bool(kwargs.get("is_inference", False)))
        # Its own key stands for a generated module's file, under which a listener knows the graph.
        key = f"<graph without codegen: {graph_name} {kind} {id(g)}>"
        _graphs.register_graph(key, f"{graph_name} {kind}", g)

        def run(*args):
            with _graphs.graph_run(key):
                return g.forward(*args)

        return make_boxed_func(run)

    patches = {**_COMPILE_PATCHES, "fx_graph_cache": False}
    with inductor_config.patch(patches), functorch_config.patch(enable_autograd_cache=False):
        return _inductor_compile_fx(gm, example_inputs, inner_compile=inner_compile)


_isa_verdicts: dict = {}  # cache_dir -> bool, for this process


def _vector_isas_verified(cache_dir: str) -> bool:
    """Whether every vector ISA this CPU advertises compiles and loads here.

    Inductor finds out in every new process by compiling a probe per ISA and loading it
    in a child Python (seconds per process, most of a small model's warm-cache compile).
    The answer depends only on the CPU, the C++ compiler and torch, so it is kept in the
    compile cache; when it is yes, compiles say so (``cpp.vec_isa_ok``) instead of probing.
    Every process decides the same way, so the setting (part of Inductor's cache keys)
    is the same in the process that filled the cache and the ones that hit it.
    """
    import hashlib
    import json
    import os
    import platform

    from torch._inductor import config as inductor_config
    from torch._inductor import cpp_builder, cpu_vec_isa

    if inductor_config.cpp.vec_isa_ok is not None:  # the user decided (TORCHINDUCTOR_VEC_ISA_OK)
        return False
    with _lock:
        if cache_dir in _isa_verdicts:
            return _isa_verdicts[cache_dir]
        try:
            with open("/proc/cpuinfo") as f:
                flags = next((line for line in f if line.startswith("flags")), "")
            compiler = cpp_builder.get_cpp_compiler()
            key = hashlib.sha256(
                "|".join(
                    (
                        torch.__version__,
                        platform.machine(),
                        flags,
                        compiler,
                        cpp_builder.get_compiler_version_info(compiler),
                    )
                ).encode()
            ).hexdigest()
        except OSError:  # no /proc/cpuinfo: let Inductor probe
            _isa_verdicts[cache_dir] = False
            return False
        path = os.path.join(cache_dir, "vec_isa_verdicts.json")
        try:
            with open(path) as f:
                known = json.load(f)
            if not isinstance(known, dict):
                known = {}
        except (OSError, ValueError):
            known = {}
        verdict = known.get(key)
        if not isinstance(verdict, bool):
            with _cache_scope(cache_dir):  # the probes compile into the cache
                probed = [str(isa) for isa in cpu_vec_isa.valid_vec_isa_list()]
            with inductor_config.patch({"cpp.vec_isa_ok": True}):
                advertised = [str(isa) for isa in cpu_vec_isa.valid_vec_isa_list.__wrapped__()]
            verdict = bool(probed) and probed == advertised
            known[key] = verdict
            try:  # atomically: ranks of one job share the cache
                tmp = f"{path}.{os.getpid()}.tmp"
                with open(tmp, "w") as f:
                    json.dump(known, f)
                os.replace(tmp, path)
            except OSError:  # a read-only cache: decided again by the next process
                pass
        _isa_verdicts[cache_dir] = verdict
        return verdict


_env_lock = threading.RLock()


class _cache_scope:
    """Points Inductor's on-disk caches (FX graph, AOTAutograd, C++ kernels) at cache_dir."""

    def __init__(self, cache_dir: str):
        self.cache_dir = cache_dir

    def __enter__(self):
        from neuronsim import settings as _settings

        _env_lock.acquire()
        self._scope = _settings.override("TORCHINDUCTOR_CACHE_DIR", self.cache_dir)
        self._scope.__enter__()

    def __exit__(self, *exc):
        self._scope.__exit__(None, None, None)
        _env_lock.release()
        return False
