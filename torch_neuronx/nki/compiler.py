"""``nki.compiler``: compiler directives. Scheduling hints leave results unchanged (the
simulator runs instructions in program order), so they are accepted; manual memory
allocation is not simulated and says so when used."""

import contextlib


def skip_middle_end_transformations(fn):
    """Compiler hint (skip middle-end passes): no effect on a kernel's results."""
    return fn


def no_reorder():
    """Keep instructions in program order; the simulator always executes in order."""
    return contextlib.nullcontext()


class _Allocators:
    def __init__(self, buffer):
        self._buffer = buffer

    def _unsupported(self, name):
        def alloc(*args, **kwargs):
            raise NotImplementedError(
                f"nki.compiler.{self._buffer}.{name}: manual {self._buffer.upper()} "
                f"allocation (fixed addresses, modulo allocation) is not simulated; allocate "
                f"with nl.ndarray(..., buffer=nl.{self._buffer}) and let the simulator place it"
            )

        alloc.__name__ = name
        return alloc

    def __getattr__(self, name):
        if name in ("alloc", "mod_alloc", "auto_alloc"):
            return self._unsupported(name)
        raise AttributeError(f"module 'nki.compiler.{self._buffer}' has no attribute {name!r}")


sbuf = _Allocators("sbuf")
psum = _Allocators("psum")
