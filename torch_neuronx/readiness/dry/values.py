"""The value store: everything a dry run knows about tensor values, in one table.

A dry run computes no data, yet some values it has: small tensors made from values the script
has (a parameter count moved to the device for DDP's check that every rank built the same model,
a seed, a flag, position ids made with ``arange``); what follows from them; what a collective
returns under the value rule (``collective_values``); what a point-to-point send passes
(``mailbox``); and what it assumes: data are finite, so ``isnan`` / ``isinf`` / ``isfinite``
answer as on finite data (the Hugging Face Trainer checks them every step), and so do the flags
combined from them.

An entry is either the **exact** values, a host copy (tensors under 64 KiB: ops whose inputs are
all exact run for real on the copies, so a library that reads them back with ``item()``,
``.cpu()`` or ``copy_`` into a host tensor gets real values), or **every** element's one Python
value, for a tensor of any size (a factory's fill, a finiteness check and what ``any``, ``all``,
``logical_or``, ... make of them). One forgetting rule: an op that writes a tensor and whose result
does not follow from known values forgets it. What it cannot know it answers by the read policy
(``reads``).
"""

from __future__ import annotations

import collections
import dataclasses
import weakref

import torch

from ..._sites import user_site
from .. import _torch_private as _tp
from ..record.recording import ValueRead
from . import collective_values
from .reads import Reads

_LIMIT = 64 << 10  # bytes: exact values kept per tensor
_aten = torch.ops.aten
# Factories whose values follow from their Python arguments alone (not empty, not random): a
# model's position ids (``torch.arange(seq, device=...)``) are known, as in a real run.
_FACTORIES = frozenset((
    _aten.arange.default, _aten.arange.start, _aten.arange.start_step, _aten.full.default,
    _aten.zeros.default, _aten.ones.default, _aten.scalar_tensor.default, _aten.linspace.default,
    _aten.eye.default, _aten.eye.m,
))  # fmt: skip
# Boolean results a dry run assumes: training data and weights are finite.
_FINITE_CHECKS = {
    _aten.isnan.default: False,
    _aten.isinf.default: False,
    _aten.isposinf.default: False,
    _aten.isneginf.default: False,
    _aten.isfinite.default: True,
}
# Fills of any size: generate()'s stopping criteria build their flags with torch.full from the
# (known) length, so a dry run stops at max_new_tokens like a real run in which no token is an
# end-of-sequence token.
_FILLS = {
    _aten.full.default: lambda args: args[1],
    _aten.ones.default: lambda args: 1,
    _aten.zeros.default: lambda args: 0,
}
_COMBINE = {  # op -> how every element of its result follows from its inputs' one value each
    _aten.logical_not.default: lambda a: not a[0],
    _aten.bitwise_not.default: lambda a: not a[0],
    _aten.logical_or.default: lambda a: a[0] or a[1],
    _aten.bitwise_or.Tensor: lambda a: a[0] or a[1],
    _aten.logical_and.default: lambda a: a[0] and a[1],
    _aten.bitwise_and.Tensor: lambda a: a[0] and a[1],
    **dict.fromkeys((_aten.any.default, _aten.any.dim, _aten.any.dims, _aten.all.default, _aten.all.dim,
                     _aten.clone.default, _aten._to_copy.default, _aten.view.default, _aten.squeeze.default,
                     _aten.unsqueeze.default, _aten.max.default, _aten.min.default), lambda a: a[0]),
}  # fmt: skip
_WITH_SCALAR = {_aten.eq.Scalar: lambda v, s: v == s, _aten.ne.Scalar: lambda v, s: v != s}
# and/or with one input known decide without the other: x & False is False, x | True is True.
_DECIDING = {
    _aten.bitwise_and.Tensor: False,
    _aten.logical_and.default: False,
    _aten.bitwise_or.Tensor: True,
    _aten.logical_or.default: True,
}


@dataclasses.dataclass(frozen=True)
class Known:
    """What is known of one tensor's values: `exact` (a host tensor), or `every` element's value."""

    exact: torch.Tensor | None = None
    every: object = None
    assumed: bool = False  # follows from the assumption that data are finite


def plain(a) -> bool:
    """A plain real tensor: not fake, not a subclass (DTensor, a compiler's FunctionalTensor, Parameter)."""
    return type(a) is torch.Tensor


def small(x) -> bool:
    ts = x if isinstance(x, (list, tuple)) else (x,)
    return all(not isinstance(t, torch.Tensor) or t.numel() * t.element_size() < _LIMIT for t in ts)


class ValueStore:
    """Known values of fake tensors (keyed by the fake tensor, while it lives), the collectives
    whose results were assumed, and the reads answered without a value."""

    def __init__(self):
        self._known: dict = {}  # id(fake) -> (weakref to it, Known); tensors have no __eq__
        self.assumed: collections.Counter = collections.Counter()  # (site, collective) -> calls
        self.reads = Reads()

    # -- the table -------------------------------------------------------------------------------
    def has(self, t) -> bool:
        """Whether something is known of `t` (cheap: the hot path asks it of every fake input)."""
        return id(t) in self._known

    def known(self, t) -> Known | None:
        entry = self._known.get(id(t))
        return entry[1] if entry is not None and entry[0]() is t else None

    def exact(self, t):
        """The host copy of a fake tensor's values, or None."""
        k = self.known(t)
        return k.exact if k is not None else None

    def set(self, t, known: Known) -> None:
        i = id(t)
        self._known[i] = (weakref.ref(t, lambda _r: self._known.pop(i, None)), known)

    def forget(self, t) -> None:
        self._known.pop(id(t), None)

    def share(self, t, of) -> None:
        """`t` now has `of`'s storage (``t.data = of``): its values are `of`'s, when known."""
        k = self.known(of)
        if k is not None:
            self.set(t, k)

    def assume(self, collective: str) -> None:
        """List a collective whose results the value rule gave, at the script's line."""
        self.assumed[(user_site(), collective)] += 1

    # -- reads -----------------------------------------------------------------------------------
    def item(self, t):
        """The Python value a script gets for a fake tensor's ``item()``: known, or the read policy's."""
        k = self.known(t)
        if k is not None and k.exact is not None:
            with _tp.modes_off():
                return k.exact.item()
        if k is not None and k.every is not None:
            return self.reads.assumed(k.every) if k.assumed else k.every
        return self.reads.answer(t)

    # -- ops -------------------------------------------------------------------------------------
    def after_op(self, func, args, kwargs, out):
        """After an op's fake run: a real result to return instead of `out` (host results, or a
        write into a host tensor, made from known values), else None, having kept what `out` is
        known to be and forgotten what the op wrote without a known result."""
        if func.namespace in ("c10d", "_c10d_functional"):
            with _tp.modes_off():  # the values are host tensors: computed for real
                collective_values.apply(self, func, args)
            return None
        real, derived = _exact_result(self, func, args, kwargs, out)
        if real is not None or derived:
            return real
        for t in _tp.written_arguments(func, args):
            self.forget(t)
        every = _every_result(self, func, args)
        if every is not None and isinstance(out, torch.Tensor):
            self.set(out, every)
        return None

    def record(self) -> list:
        """The reads answered without a value, and the collectives whose results were assumed."""
        assumed = [
            ValueRead(site, op, "every rank's data taken as this rank's", n, assumed=True)
            for (site, op), n in self.assumed.most_common()
        ]
        return self.reads.record() + assumed


def _host_args(store: ValueStore, args, kwargs):
    """(args, kwargs) on the host, each fake tensor replaced by its exact value; None if one is unknown."""
    unknown = []

    def conv(a):
        if isinstance(a, _tp.FakeTensor):
            v = store.exact(a)
            unknown.append(v is None)
            return v
        if isinstance(a, torch.Tensor):  # a real tensor (torch.tensor(..., device="neuron") lifts one)
            if not plain(a) or not small(a):  # a subclass (a compiler's wrapper) has no value of its own
                unknown.append(True)
                return a
            return a if a.device.type == "cpu" else a.cpu()
        if isinstance(a, torch.device) and a.type != "cpu":
            return torch.device("cpu")
        if isinstance(a, str) and a.startswith("neuron"):
            return "cpu"
        return type(a)(conv(b) for b in a) if isinstance(a, (list, tuple)) else a

    host = tuple(conv(a) for a in args), {k: conv(v) for k, v in kwargs.items()}
    return None if any(unknown) else host


def _exact_result(store: ValueStore, func, args, kwargs, out) -> tuple:
    """(a real result to return, or None; whether `out`'s exact values were kept): the op run for
    real on the host copies of its inputs, when every input is exactly known and `out` is small."""
    leaves = list(_tp.leaves(args, kwargs))
    if func not in _FACTORIES and (
        func.namespace != "aten" or not any(store.has(a) if isinstance(a, _tp.FakeTensor) else plain(a) for a in leaves)
    ):
        return None, False  # the common case: nothing known among the inputs
    if any(isinstance(a, torch.nn.Parameter) for a in leaves):
        # weights are not what libraries read back; and a weak reference to a fake parameter
        # would make torch.utils.swap_tensors refuse it (Module.to swaps fake parameters)
        return None, False
    with _tp.modes_off():
        host = _host_args(store, args, kwargs) if small(out) else None
    if host is None:
        return None, False
    try:
        real = _tp.run_real(func, *host)
    except Exception:  # the values cannot follow (an op with no host kernel): they are not known
        return None, False
    fakes = out if isinstance(out, (list, tuple)) else (out,)
    if all(not isinstance(t, _tp.FakeTensor) or t.device.type == "cpu" for t in fakes) or any(
        not isinstance(a, _tp.FakeTensor) for a in _tp.written_arguments(func, args)
    ):
        return real, True  # the script gets host tensors: give it the values
    reals = real if isinstance(real, (list, tuple)) else (real,)
    for f, r in zip(fakes, reals):
        if isinstance(f, _tp.FakeTensor) and isinstance(r, torch.Tensor):
            store.set(f, Known(exact=r))
    return None, True


def _every_result(store: ValueStore, func, args) -> Known | None:
    """What every element of the op's result is, when it follows from its inputs' one value each
    (or from a finiteness check, or a fill), else None."""
    check = _FINITE_CHECKS.get(func)
    if check is not None:
        return Known(every=check, assumed=True)
    if func in _FILLS and all(not isinstance(a, torch.Tensor) for a in args):
        return Known(every=_FILLS[func](args))
    ins = [_uniform(store.known(a)) for a in args if isinstance(a, torch.Tensor)]
    assumed = any(k is not None and k.assumed for k in ins)
    if func in _DECIDING and any(k is not None and bool(k.every) == _DECIDING[func] for k in ins):
        return Known(every=_DECIDING[func], assumed=assumed)
    if not ins or any(k is None for k in ins):
        return None
    values = [k.every for k in ins]
    if func in _WITH_SCALAR and len(args) > 1:
        return Known(every=_WITH_SCALAR[func](values[0], args[1]), assumed=assumed)
    if func in _COMBINE:
        return Known(every=_COMBINE[func](values), assumed=assumed)
    return None


def _uniform(k: Known | None) -> Known | None:
    """`k` as one value for every element (exact values all equal count: a fill of ``torch.full``),
    else None."""
    if k is None or k.exact is None:
        return k if k is not None and k.every is not None else None
    with _tp.modes_off():
        flat = k.exact.reshape(-1)
        if not flat.numel() or not bool((flat == flat[0]).all()):
            return None
        return Known(every=flat[0].item(), assumed=k.assumed)
