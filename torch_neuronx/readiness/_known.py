"""Values a dry run has after all: small tensors made from real host data, what follows from them, and
what collectives return when every rank is taken to hold this rank's values.

A dry run computes no data, but some tensors are small and made from values the script has: a
parameter count or a shape table moved to the device (DDP's check that every rank built the same
model), a seed, a flag, a factory's result (position ids made with ``arange``). For those (under
64 KiB) the dry run keeps a host copy of the value, and computes ops whose inputs it all knows on
those copies, so a library that reads them back (``item()``, ``.cpu()``, ``copy_`` into a host
tensor) gets real values. Collectives cannot know the other ranks' data; the rule a dry run
follows, listed in the report with each collective's source line, is that
**every rank holds this rank's values**: an all-gather returns this rank's input from every rank, a
broadcast leaves this rank's tensor as it is, a sum all-reduce multiplies by the group size and a
min, max or average all-reduce returns it unchanged. Object collectives (``all_gather_object``,
``broadcast_object_list``, ...) follow the same rule (``_objects``), so a script that exchanges
its config or seed goes on with its own. Point-to-point sends are not assumed: the receiver gets the
sender's value where the sender knows it (``_p2p``). A job whose ranks really differ there is caught by the
comparison of the ranks' collectives (another shape or op on some rank), not hidden by this rule.
"""

from __future__ import annotations

import collections
import weakref

import torch

from .._sites import user_site
from . import _objects, _p2p
from . import _torch_private as _tp

_LIMIT = 64 << 10  # bytes: values kept per tensor
_c10d = torch.ops.c10d
_aten = torch.ops.aten
# Factories whose values follow from their Python arguments alone (not empty, not random): a
# model's position ids (``torch.arange(seq, device=...)``) are known, as in a real run.
_FACTORIES = frozenset((
    _aten.arange.default, _aten.arange.start, _aten.arange.start_step, _aten.full.default,
    _aten.zeros.default, _aten.ones.default, _aten.scalar_tensor.default, _aten.linspace.default,
    _aten.eye.default, _aten.eye.m,
))  # fmt: skip
_ALLREDUCE = {"sum": lambda v, n: v * n, "avg": lambda v, n: v, "max": lambda v, n: v, "min": lambda v, n: v,
              "product": lambda v, n: v**n, "band": lambda v, n: v, "bor": lambda v, n: v}  # fmt: skip


def _plain(a) -> bool:
    """A plain real tensor: not fake, not a subclass (DTensor, a compiler's FunctionalTensor, Parameter)."""
    return type(a) is torch.Tensor


def _small(x) -> bool:
    ts = x if isinstance(x, (list, tuple)) else (x,)
    return all(not isinstance(t, torch.Tensor) or t.numel() * t.element_size() < _LIMIT for t in ts)


class KnownValues:
    """Host copies of the values of small fake tensors (keyed by the fake tensor, while it lives)."""

    def __init__(self):
        self._known: dict = {}  # id(fake) -> (weakref to it, its value as a host tensor)
        self.assumed: collections.Counter = collections.Counter()  # (site, collective) -> calls

    def value(self, t):
        entry = self._known.get(id(t))
        return entry[1] if entry is not None and entry[0]() is t else None

    def item(self, t):
        """The Python value of a known one-element fake tensor (None when it is not known)."""
        v = self.value(t)
        if v is None:
            return None
        with _tp.modes_off():
            return v.item()

    def _set(self, t, value) -> None:
        i = id(t)
        self._known[i] = (weakref.ref(t, lambda _r: self._known.pop(i, None)), value)

    def share(self, t, of) -> None:
        """`t` now has `of`'s storage (``t.data = of``): its values are `of`'s, when known."""
        v = self.value(of)
        if v is not None:
            self._set(t, v)

    def _forget(self, t) -> None:
        self._known.pop(id(t), None)

    def _host_args(self, args, kwargs):
        """(args, kwargs) on the host, each fake tensor replaced by its value; None if one is unknown."""
        unknown = []

        def conv(a):
            if isinstance(a, _tp.FakeTensor):
                v = self.value(a)
                unknown.append(v is None)
                return v
            if isinstance(a, torch.Tensor):  # a real tensor (torch.tensor(..., device="neuron") lifts one)
                if not _plain(a) or not _small(a):  # a subclass (a compiler's wrapper) has no value of its own
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

    def after(self, func, args, kwargs, out):
        """After an op's fake run: a real result to return instead of `out` (its results are host
        tensors, or it writes into one, made from known values), else None, having kept the values
        of `out` when they follow from known inputs."""
        if func.namespace in ("c10d", "_c10d_functional"):
            self._collective(func, args, out)
            return None
        leaves = list(_tp.leaves(args, kwargs))
        if func not in _FACTORIES and (
            func.namespace != "aten"
            or not any((id(a) in self._known) if isinstance(a, _tp.FakeTensor) else _plain(a) for a in leaves)
        ):
            return None  # the common case: nothing known among the inputs
        if any(isinstance(a, torch.nn.Parameter) for a in leaves):
            # weights are not what libraries read back; and a weak reference to a fake parameter
            # would make torch.utils.swap_tensors refuse it (Module.to swaps fake parameters)
            return None
        with _tp.modes_off():
            host = self._host_args(args, kwargs) if _small(out) else None
        if host is None:  # what it writes is no longer known
            for t in _tp.written_arguments(func, args):
                self._forget(t)
            return None
        try:
            real = _tp.run_real(func, *host)
        except Exception:  # the values cannot follow (an op with no host kernel): they are not known
            for t in _tp.written_arguments(func, args):
                self._forget(t)
            return None
        fakes = out if isinstance(out, (list, tuple)) else (out,)
        if all(not isinstance(t, _tp.FakeTensor) or t.device.type == "cpu" for t in fakes) or any(
            not isinstance(a, _tp.FakeTensor) for a in _tp.written_arguments(func, args)
        ):
            return real  # the script gets host tensors: give it the values
        reals = real if isinstance(real, (list, tuple)) else (real,)
        for f, r in zip(fakes, reals):
            if isinstance(f, _tp.FakeTensor) and isinstance(r, torch.Tensor):
                self._set(f, r)
        return None

    # -- collectives ---------------------------------------------------------------------------
    def _collective(self, func, args, out) -> None:
        """Every rank is taken to hold this rank's values (see the module's docstring)."""
        with _tp.modes_off():  # the values are host tensors: computed for real
            self._collective_values(func, args)

    def _collective_values(self, func, args) -> None:
        pg = _tp.collective_group(func, args)
        n = pg.size() if pg is not None else 1
        if func is _c10d.allgather_.default:
            (outs,), (inp,) = args[0], args[1]
            self._fill([(o, lambda v: v) for o in outs], inp, func)
        elif func is _c10d._allgather_base_.default:
            self._fill([(args[0], lambda v: torch.cat([v.reshape(-1)] * n))], args[1], func)
        elif func is _c10d.allreduce_.default:
            rule = _ALLREDUCE.get(_tp.reduce_op_name(args[2]) or "")
            for t in args[0]:
                self._fill([(t, (lambda v: rule(v, n)) if rule else None)], t, func)
        elif func is _c10d.gather_.default:  # the root's outputs; other ranks pass none
            for outs in args[0]:
                self._fill([(o, lambda v: v) for o in outs], args[1][0], func)
        elif func is _c10d.scatter_.default and args[1]:  # the root's: this rank's share
            (out,), (ins,) = args[0], args[1]
            self._fill([(out, lambda v: v)], ins[pg.rank() if pg is not None else 0], func)
        elif func is _c10d.broadcast_.default:
            for t in args[0]:
                self._fill([(t, lambda v: v)], t, func)
        elif func in (_c10d.send.default, _c10d.recv_.default) and pg is not None:
            self._point_to_point(func, pg, args)
        else:  # other collectives' results are not known: forget what they write
            for t in _tp.leaves(args, {}):
                if isinstance(t, _tp.FakeTensor):
                    self._forget(t)

    def _point_to_point(self, func, pg, args) -> None:
        """A send passes its tensor's value (where known) to the receiver, which knows it then: the
        sender's real data, not an assumption (``_p2p``)."""
        ranks = _tp.group_ranks(pg)
        me, peer = ranks[pg.rank()], ranks[args[2]]
        for t in args[0]:
            if func is _c10d.send.default:
                value = self.value(t) if isinstance(t, _tp.FakeTensor) else t
                plain = value is not None and _plain(value) and value.device.type == "cpu" and _small(value)
                _p2p.send_tensor(pg.group_name, me, peer, value if plain else None)
                continue
            value = _p2p.receive_tensor(pg.group_name, peer, me, _p2p.TIMEOUT)
            if value is None or value.numel() != t.numel():
                if isinstance(t, _tp.FakeTensor):
                    self._forget(t)
            elif isinstance(t, _tp.FakeTensor):
                self._set(t, value.reshape(t.shape).to(t.dtype))
            elif t.device.type == "cpu":
                t.copy_(value.reshape(t.shape))

    def _fill(self, targets, source, func) -> None:
        value = self.value(source) if isinstance(source, _tp.FakeTensor) else source
        if value is None or (isinstance(source, torch.Tensor) and source.device.type != "cpu"
                             and not isinstance(source, _tp.FakeTensor)):  # fmt: skip
            return
        for target, rule in targets:
            if rule is None:
                self._forget(target)
                continue
            result = rule(value).reshape(target.shape).to(target.dtype)
            if isinstance(target, _tp.FakeTensor):
                self._set(target, result.clone())
            else:  # a host tensor: the collective's result, written in place
                target.copy_(result)
        if _objects.active() is None:  # an object collective is listed once, by its name
            self.assumed[(user_site(), func.name().split("::")[1].split(".")[0].strip("_"))] += 1

    def record(self) -> list:
        """The collectives whose results were assumed, as value reads the report lists."""
        from ._record import ValueRead

        return [
            ValueRead(site, op, "every rank's data taken as this rank's", n, assumed=True)
            for (site, op), n in self.assumed.most_common()
        ]
