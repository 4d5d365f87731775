"""The dry run's value policy: what it answers when a script reads a tensor value it does not have.

A read of a value (``loss.item()``, ``tolist()``, ``float(t)``) gets a placeholder and is
listed with its source line; a branch on a tensor's value (``if loss < x:``) in the user's
code stops the run with :class:`ValueUnknownError` naming the line, since either way would
be a guess (a library's own branch is taken as True and listed). Checks that a value is
finite (``isnan`` / ``isinf`` / ``isfinite``, as the Hugging Face Trainer makes on every
step) are answered "finite", and results that follow from known values are known.
"""

from __future__ import annotations

import collections
import weakref

import torch

from .._sites import frame_site, in_library, user_frame
from . import _torch_private
from ._record import ValueRead

_aten = torch.ops.aten
PLACEHOLDER = {"int": 1, "float": 1.0, "bool": False}  # 1, not 0: a count read as a divisor must not be zero

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


class ValueUnknownError(RuntimeError):
    """Control flow depends on a tensor value, which a dry run does not have."""


class Values:
    """Known values of boolean results, and the reads a dry run answered."""

    def __init__(self):
        self.reads: collections.Counter = collections.Counter()  # (site, kind, placeholder) -> reads
        self.assumed: collections.Counter = collections.Counter()  # (site, check, value) -> reads
        self._known: dict = {}  # id(bool tensor) -> (weakref, its assumed value); no __eq__ on tensors

    def after_op(self, func, args, out) -> None:
        """An in-place op forgets what its input was known to be; a result that follows from
        known inputs (or a finiteness check) is known."""
        for a in _torch_private.written_arguments(func, args):
            self._known.pop(id(a), None)
        known = self._derive(func, args)
        if known is not None and isinstance(out, torch.Tensor):
            i = id(out)
            self._known[i] = (weakref.ref(out, lambda _r: self._known.pop(i, None)), known)

    def _derive(self, func, args):
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

    def _known_value(self, t):
        entry = self._known.get(id(t))
        return entry[1] if entry is not None and entry[0]() is t else None

    def read(self, t: torch.Tensor):
        """The Python value a script gets for a fake tensor's ``item()``."""
        f = user_frame()
        known = self._known_value(t)
        if known is not None:
            self.assumed[(frame_site(f), "finite", known)] += 1
            return known
        if _torch_private.branches_on_value(f):
            if f is not None and in_library(f.f_code.co_filename):
                # A library's own branch (TRL's metric logging: `x / n if n > 0 else 0.0`): taken as
                # True and listed; a branch in the user's code stops the run instead.
                self.reads[(frame_site(f), "bool (library branch)", True)] += 1
                return True
            raise ValueUnknownError(
                f"dry run: control flow at {frame_site(f)} depends on a tensor value ({t.dtype}, shape "
                f"{list(t.shape)}), which a dry run does not compute. Run this script without --dry-run, "
                "or make the branch independent of tensor values (e.g. a fixed step count)."
            )
        kind = "float" if t.is_floating_point() else "bool" if t.dtype == torch.bool else "int"
        value = PLACEHOLDER[kind]
        self.reads[(frame_site(f), kind, value)] += 1
        return value

    def record(self) -> list:
        reads = [ValueRead(s, k, v, n) for (s, k, v), n in self.reads.most_common()]
        return reads + [ValueRead(s, c, v, n, assumed=True) for (s, c, v), n in self.assumed.most_common()]
