"""PyTorch integration of NKI kernels: ``wrap_nki`` and ``nki_op``.

A jitted kernel called with torch tensors already runs eagerly (the simulator
takes cpu or neuron tensors). What this module adds is what the dispatcher and
``torch.compile`` need, in the style of ``torch.library.triton_op``:

* ``wrap_nki(kernel)`` turns a kernel into a callable that goes through one
  generic custom op, ``nki::kernel_call``. Dynamo records that op as a single
  graph node; its fake (meta) implementation gets output shapes and dtypes by
  running the kernel once on zero-filled host tensors of the same shapes (cached
  per shape signature), so no user-written fake is needed.
* ``nki_op("ns::name", mutates_args=...)`` registers a Python function that
  calls NKI kernels (or an annotated jitted kernel itself) as a real torch custom
  op: schema from the annotations, fake implementation by tracing the function
  on fake tensors, ``register_autograd`` for a backward made of kernels or torch
  ops, and a functionalization rule so ``torch.compile`` traces through it.

The graph stores the kernel by a stable key (module, qualified name and a hash
of its source) and its non-tensor arguments as a literal string, so a compiled
graph means the same kernel in every process that loads it from a cache.
"""

from __future__ import annotations

import ast
import contextlib
import functools
import hashlib
import inspect
import threading
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch
import torch._dynamo
from torch._library.infer_schema import infer_schema

__all__ = ["NKIKernelCaller", "nki_op", "wrap_nki"]

_KERNELS: dict[str, Any] = {}
_OBJECT_CONSTANTS: dict[str, Any] = {}
_TRACES: dict[tuple, tuple] = {}
_state = threading.local()


def _calls_bypass_op() -> bool:
    return getattr(_state, "bypass", False)


@contextlib.contextmanager
def _bypass_op(enabled: bool = True):
    """Inside an ``nki_op``'s own implementation, kernels run directly (no second dispatch)."""
    previous = _calls_bypass_op()
    _state.bypass = enabled
    try:
        yield
    finally:
        _state.bypass = previous


def _kernel_function(kernel: Any) -> Callable:
    """The Python function behind a jitted kernel (``nki.jit`` keeps it as ``func``)."""
    for attr in ("func", "fn", "__wrapped__"):
        inner = getattr(kernel, attr, None)
        if inner is not None and callable(inner):
            return _kernel_function(inner) if inner is not kernel else inner
    return kernel


def _is_nki_kernel(obj: Any) -> bool:
    return callable(obj) and _kernel_function(obj) is not obj


def _kernel_key(kernel: Any) -> str:
    func = _kernel_function(kernel)
    try:
        source = inspect.getsource(func)
    except (OSError, TypeError):
        source = repr(getattr(func, "__code__", func))
    target = getattr(kernel, "platform_target", None)
    digest = hashlib.sha1(f"{source}\0{target}".encode()).hexdigest()[:12]
    return f"{func.__module__}.{func.__qualname__}:{digest}"


def _lookup_kernel(key: str) -> Any:
    try:
        return _KERNELS[key]
    except KeyError:
        raise RuntimeError(
            f"NKI kernel {key!r} is not registered in this process: call wrap_nki(kernel) "
            "(or the nki_op that uses it) before running a graph that contains it."
        ) from None


def _encode_constant(value: Any) -> str:
    text = repr(value)
    try:
        if ast.literal_eval(text) == value and type(ast.literal_eval(text)) is type(value):
            return text
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        pass
    # Not a Python literal (a dtype object, an enum, ...): keep the object in this
    # process and put a key in the graph; a graph cached by another process then
    # simply misses instead of meaning something else.
    key = f"<object {type(value).__qualname__} {text}>"
    _OBJECT_CONSTANTS[key] = value
    return repr(key)


@torch._dynamo.assume_constant_result
def _encode_constants(items: tuple) -> str:
    """Non-tensor kernel arguments as one string (a dict literal) for the graph."""
    return "{" + ", ".join(f"{name!r}: {_encode_constant(v)}" for name, v in items) + "}"


def _decode_constants(text: str) -> dict[str, Any]:
    decoded = ast.literal_eval(text)
    return {
        name: _OBJECT_CONSTANTS[v] if isinstance(v, str) and v in _OBJECT_CONSTANTS else v
        for name, v in decoded.items()
    }


def _launch(kernel_key: str, grid: Sequence[int], kwargs: dict[str, Any]) -> Any:
    kernel = _lookup_kernel(kernel_key)
    launcher = kernel[tuple(grid)] if len(grid) else kernel
    return launcher(**kwargs)


def _as_tensor_list(result: Any, kernel_key: str, allow_none: bool = False) -> list[torch.Tensor]:
    if result is None and allow_none:
        return []
    outputs = list(result) if isinstance(result, (tuple, list)) else [result]
    if not outputs or not all(isinstance(t, torch.Tensor) for t in outputs):
        raise TypeError(
            f"NKI kernel {kernel_key!r} must return a tensor or a tuple of tensors allocated with "
            f"nl.ndarray(..., buffer=nl.shared_hbm); it returned {type(result).__name__}"
        )
    return outputs


@torch.library.custom_op("nki::kernel_call", mutates_args=())
def _kernel_call(
    kernel: str, grid: list[int], tensors: list[torch.Tensor], names: str, constants: str
) -> list[torch.Tensor]:
    """Run one NKI kernel launch in the simulator on the tensors' device.

    ``names`` are the kernel parameter names of ``tensors``, comma-separated.
    """
    kwargs = dict(zip(_split_names(names), tensors))
    kwargs.update(_decode_constants(constants))
    versions = [t._version for t in tensors]
    outputs = _as_tensor_list(_launch(kernel, grid, kwargs), kernel)
    if any(t._version != v for t, v in zip(tensors, versions)):
        raise RuntimeError(
            f"NKI kernel {kernel!r} wrote into one of its tensor arguments, but this launch "
            "was traced as pure; its write would be lost under torch.compile"
        )
    # A custom op's outputs may not alias its inputs; a kernel returning an input
    # HBM tensor gets a copy.
    input_ptrs = {t.untyped_storage().data_ptr() for t in tensors if t.numel()}
    return [o.clone() if o.numel() and o.untyped_storage().data_ptr() in input_ptrs else o for o in outputs]


def _split_names(names: str) -> list[str]:
    return names.split(",") if names else []


@torch._dynamo.assume_constant_result
def _trace(kernel: str, grid: tuple, inputs: tuple, names: tuple, constants: str):
    """Shape trace of one launch: output (shape, dtype)s and the inputs the kernel writes.

    The kernel runs once on host tensors of ones with the same shapes and dtypes
    (cached per signature); a write into an argument shows up as a bump of that
    tensor's version counter.
    """
    cache_key = (kernel, grid, inputs, names, constants)
    traced = _TRACES.get(cache_key)
    if traced is None:
        import numpy as np
        from torch.utils._python_dispatch import _disable_current_modes

        with _disable_current_modes(), torch.no_grad(), np.errstate(all="ignore"):
            args = {n: torch.ones(shape, dtype=dtype) for n, (shape, dtype) in zip(names, inputs)}
            versions = {n: t._version for n, t in args.items()}
            kwargs = dict(args)
            kwargs.update(_decode_constants(constants))
            outputs = _as_tensor_list(_launch(kernel, grid, kwargs), kernel, allow_none=True)
        written = tuple(n for n, t in args.items() if t._version != versions[n])
        if not outputs and not written:
            raise TypeError(f"NKI kernel {kernel!r} neither returns a tensor nor writes an argument")
        traced = (tuple((tuple(o.shape), o.dtype) for o in outputs), written)
        _TRACES[cache_key] = traced
    return traced


def _fake_outputs(kernel, grid, tensors, names, constants):
    if not tensors:
        raise ValueError(f"NKI kernel {kernel!r} needs at least one tensor argument")
    specs, _ = _trace(kernel, tuple(grid), _signature(tensors), tuple(_split_names(names)), constants)
    device = tensors[0].device
    return [torch.empty(shape, dtype=dtype, device=device) for shape, dtype in specs]


def _signature(tensors) -> tuple:
    return tuple((tuple(int(s) for s in t.shape), t.dtype) for t in tensors)


_kernel_call.register_fake(_fake_outputs)


@torch.library.custom_op("nki::kernel_call_inplace", mutates_args={"tensors", "outputs"})
def _kernel_call_inplace(
    kernel: str,
    grid: list[int],
    tensors: list[torch.Tensor],
    names: str,
    constants: str,
    outputs: list[torch.Tensor],
) -> None:
    """A launch of a kernel that writes into (some of) its tensor arguments.

    Declared as mutating all of them: functionalization then copies back every
    argument, which is exact for the ones the kernel leaves untouched. Returned
    tensors are copied into ``outputs`` (preallocated from the shape trace):
    PyTorch cannot functionalize an op that both mutates a tensor list and
    returns tensors.
    """
    kwargs = dict(zip(_split_names(names), tensors))
    kwargs.update(_decode_constants(constants))
    results = _as_tensor_list(_launch(kernel, grid, kwargs), kernel, allow_none=True)
    if len(results) != len(outputs):
        raise RuntimeError(f"NKI kernel {kernel!r} returned {len(results)} tensors, traced {len(outputs)}")
    for out, result in zip(outputs, results):
        out.copy_(result)


@_kernel_call_inplace.register_fake
def _kernel_call_inplace_fake(kernel, grid, tensors, names, constants, outputs):
    return None


class NKIKernelCaller:
    """A kernel wrapped by :func:`wrap_nki`: call it with torch tensors, ``caller[grid]`` for a grid."""

    def __init__(self, kernel_key: str, grid: tuple[int, ...], arg_names: list[str], defaults: dict[str, Any]):
        self.kernel_key = kernel_key
        self.grid = grid
        self.arg_names = arg_names
        self.defaults = defaults

    def __getitem__(self, grid) -> "NKIKernelCaller":
        grid = (grid,) if isinstance(grid, int) else tuple(int(g) for g in grid)
        return NKIKernelCaller(self.kernel_key, grid, self.arg_names, self.defaults)

    def __repr__(self) -> str:
        return f"wrap_nki({self.kernel_key}){list(self.grid) if self.grid else ''}"

    def __call__(self, *args, **kwargs):
        if len(args) > len(self.arg_names):
            raise TypeError(f"{self.kernel_key} takes {len(self.arg_names)} arguments, got {len(args)}")
        bound = dict(zip(self.arg_names, args))
        for name, value in kwargs.items():
            if name not in self.arg_names:
                raise TypeError(f"{self.kernel_key} got an unexpected argument {name!r}")
            if name in bound:
                raise TypeError(f"{self.kernel_key} got multiple values for argument {name!r}")
            bound[name] = value
        for name in self.arg_names:
            if name not in bound:
                if name not in self.defaults:
                    raise TypeError(f"{self.kernel_key} missing required argument {name!r}")
                bound[name] = self.defaults[name]
        names = [n for n in self.arg_names if isinstance(bound[n], torch.Tensor)]
        if not names:
            raise ValueError(f"NKI kernel {self.kernel_key!r} needs at least one tensor argument")
        tensors = [bound[n] for n in names]
        if _calls_bypass_op() or _plain_eager(tensors):
            result = _launch(self.kernel_key, self.grid, bound)
            return _unpack(_as_tensor_list(result, self.kernel_key, allow_none=True))
        constants = _encode_constants(tuple((n, bound[n]) for n in self.arg_names if n not in names))
        specs, written = _trace(self.kernel_key, self.grid, _signature(tensors), tuple(names), constants)
        if not written:
            return _unpack(
                torch.ops.nki.kernel_call(self.kernel_key, list(self.grid), tensors, ",".join(names), constants)
            )
        device = tensors[0].device
        outputs = [torch.empty(shape, dtype=dtype, device=device) for shape, dtype in specs]
        torch.ops.nki.kernel_call_inplace(
            self.kernel_key, list(self.grid), tensors, ",".join(names), constants, outputs
        )
        return _unpack(outputs)


def _plain_eager(tensors) -> bool:
    """No compiler, tracer or tensor subclass is watching: launch directly (no shape trace)."""
    from torch.utils._python_dispatch import _get_current_dispatch_mode

    if torch.compiler.is_compiling() or _get_current_dispatch_mode() is not None:
        return False
    return all(type(t) in (torch.Tensor, torch.nn.Parameter) for t in tensors)


def _unpack(outputs):
    if not outputs:
        return None
    return outputs[0] if len(outputs) == 1 else tuple(outputs)


@torch._dynamo.assume_constant_result
def _register_kernel(kernel: Any) -> tuple:
    """Register ``kernel`` under its stable key; return (key, grid, arg names, defaults)."""
    func = _kernel_function(kernel)
    params = inspect.signature(func).parameters.values()
    if any(p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in params):
        raise TypeError(f"wrap_nki: kernel {func.__qualname__} must not take *args or **kwargs")
    key = _kernel_key(kernel)
    _KERNELS[key] = kernel
    grid = tuple(int(g) for g in getattr(kernel, "grid", ()) or ())
    defaults = tuple((p.name, p.default) for p in params if p.default is not p.empty)
    return key, grid, tuple(p.name for p in params), defaults


def wrap_nki(kernel: Any) -> NKIKernelCaller:
    """Wrap an ``@nki.jit`` kernel so calls can be captured by ``torch.compile``.

    The returned callable takes torch tensors (cpu or neuron) and non-tensor
    arguments like the kernel; ``wrap_nki(kernel)[grid](...)`` launches a grid.
    Under ``torch.compile`` (or any tracing mode) each call is one
    ``nki::kernel_call`` custom-op node whose output shapes come from tracing the
    kernel; in plain eager mode the kernel is launched directly. Returns a tensor
    (one output), a tuple, or None (a kernel that only writes its arguments).
    A kernel that writes into its arguments (the older output-argument style)
    is detected by the shape trace and dispatched as a mutating op.
    """
    if isinstance(kernel, NKIKernelCaller):
        return kernel
    if not callable(kernel):
        raise TypeError(f"wrap_nki expects an @nki.jit kernel, got {type(kernel).__name__}")
    key, grid, arg_names, defaults = _register_kernel(kernel)
    return NKIKernelCaller(key, grid, list(arg_names), dict(defaults))


def _function_for_kernel(kernel: Any) -> Callable:
    """An annotated jitted kernel as a plain function calling it through ``wrap_nki``."""
    func = _kernel_function(kernel)
    caller = wrap_nki(kernel)

    @functools.wraps(func)
    def call_kernel(*args, **kwargs):
        return caller(*args, **kwargs)

    call_kernel.__signature__ = inspect.signature(func)
    return call_kernel


def nki_op(
    name: str,
    fn: Callable | None = None,
    mutates_args: str | Iterable[str] = (),
):
    """Register a function backed by NKI kernels as the torch custom op ``name`` ("ns::op").

    Like ``torch.library.triton_op``: ``fn`` has type annotations (they give the
    schema) and calls NKI kernels, directly or through :func:`wrap_nki`;
    ``fn`` may also be an annotated ``@nki.jit`` kernel itself. The result is a
    ``torch.library.CustomOpDef``: it runs eagerly on cpu and neuron tensors,
    its fake implementation is ``fn`` traced on fake tensors, it is one node for
    Dynamo (``torch.compile(backend="neuron", fullgraph=True)`` does not break),
    and ``.register_autograd(backward, setup_context=...)`` gives it a gradient.
    """

    def decorate(fn: Callable):
        impl = _function_for_kernel(fn) if _is_nki_kernel(fn) else fn
        schema = infer_schema(impl, mutates_args=mutates_args)

        def backend_impl(*args, **kwargs):
            with _bypass_op():
                return impl(*args, **kwargs)

        op = torch.library.custom_op(name, backend_impl, mutates_args=mutates_args, schema=schema)
        # The function is traceable on fake tensors: every kernel call inside it
        # reaches nki::kernel_call, whose fake implementation knows the shapes.
        op.register_fake(impl)

        from torch._subclasses.fake_tensor import FakeTensor
        from torch._subclasses.functional_tensor import FunctionalTensor, FunctionalTensorMode

        def functional_decomposition(mode, op_overload, types, args, kwargs):
            # Under torch.compile the op is traced through, so the graph holds the
            # kernel calls themselves and functionalization handles mutations.
            if any(not issubclass(t, (FakeTensor, FunctionalTensor)) and t is not torch.Tensor for t in types):
                return NotImplemented
            with mode:
                return impl(*args, **kwargs)

        op.register_torch_dispatch(FunctionalTensorMode, functional_decomposition)
        return op

    if fn is None:
        return decorate
    return decorate(fn)
