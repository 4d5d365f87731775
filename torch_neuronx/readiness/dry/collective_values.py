"""What a collective returns in a dry run: the value rule, applied to the value store.

Collectives cannot know the other ranks' data; the rule a dry run follows, listed in the report
with each collective's source line, is that **every rank holds this rank's values**
(``neuronsim.collectives.ValueRule``): an all-gather returns this rank's input from every rank, a
broadcast leaves this rank's tensor as it is, a sum all-reduce multiplies by the group size and a
min, max or average all-reduce returns it unchanged. Object collectives (``all_gather_object``,
``broadcast_object_list``, ...) follow the same rule (``objects``), so a script that exchanges its
config or seed goes on with its own. Point-to-point sends are not assumed: the receiver gets the
sender's value where the sender knows it (``mailbox``). A job whose ranks really differ there is
caught by the comparison of the ranks' collectives (another shape or op on some rank), not hidden
by this rule. Runs with the dispatch modes off: the values are host tensors.
"""

from __future__ import annotations

import torch

from neuronsim import collectives as _collectives
from neuronsim.collectives import ValueRule

from .. import _torch_private as _tp
from . import mailbox, objects

_c10d = torch.ops.c10d
_ALL_REDUCE = {"sum": lambda v, n: v * n, "avg": lambda v, n: v, "max": lambda v, n: v, "min": lambda v, n: v,
               "product": lambda v, n: v**n, "band": lambda v, n: v, "bor": lambda v, n: v}  # fmt: skip


def _same(v):
    return v


def apply(store, func, args) -> None:
    """The rule's results of c10d op `func` (its ``ValueRule``) written to the store; a collective
    whose results the rule does not give forgets what it writes."""
    pg = _tp.collective_group(func, args)
    n = pg.size() if pg is not None else 1
    found = _collectives.find(func.name())
    rule = found.value_rule if found is not None and func.namespace == "c10d" else ValueRule.NONE
    if rule is ValueRule.PASSED and func in (_c10d.send.default, _c10d.recv_.default) and pg is not None:
        _point_to_point(store, func, pg, args)
    elif rule is ValueRule.GATHER and func is _c10d._allgather_base_.default:
        _fill(store, [(args[0], lambda v: torch.cat([v.reshape(-1)] * n))], args[1], func)
    elif rule is ValueRule.GATHER and func is _c10d.allgather_.default:
        (outs,), (inp,) = args[0], args[1]
        _fill(store, [(o, _same) for o in outs], inp, func)
    elif rule is ValueRule.GATHER:  # gather: the root's outputs; other ranks pass none
        for outs in args[0]:
            _fill(store, [(o, _same) for o in outs], args[1][0], func)
    elif rule is ValueRule.REDUCE:
        reduce = _ALL_REDUCE.get(_tp.reduce_op_name(args[2]) or "")
        for t in args[0]:
            _fill(store, [(t, (lambda v: reduce(v, n)) if reduce else None)], t, func)
    elif rule is ValueRule.SCATTER and args[1]:  # the root's list: this rank's share
        (out,), (ins,) = args[0], args[1]
        _fill(store, [(out, _same)], ins[pg.rank() if pg is not None else 0], func)
    elif rule is ValueRule.UNCHANGED:
        for t in args[0]:
            _fill(store, [(t, _same)], t, func)
    else:
        for t in _tp.leaves(args, {}):
            if isinstance(t, _tp.FakeTensor):
                store.forget(t)


def _fill(store, targets, source, func) -> None:
    """Each target gets its rule applied to `source`'s value (a target whose rule is None, or any
    target when `source`'s value is not known, is forgotten)."""
    from .values import Known

    value = store.exact(source) if isinstance(source, _tp.FakeTensor) else source
    if value is None or (isinstance(source, torch.Tensor) and source.device.type != "cpu"
                         and not isinstance(source, _tp.FakeTensor)):  # fmt: skip
        for target, _rule in targets:
            store.forget(target)
        return
    for target, rule in targets:
        if rule is None:
            store.forget(target)
            continue
        result = rule(value).reshape(target.shape).to(target.dtype)
        if isinstance(target, _tp.FakeTensor):
            store.set(target, Known(exact=result.clone()))
        else:  # a host tensor: the collective's result, written in place
            target.copy_(result)
    if objects.active() is None:  # an object collective is listed once, by its name
        store.assume(_collectives.normalise(func.name()))


def _point_to_point(store, func, pg, args) -> None:
    """A send passes its tensor's value (where known) to the receiver, which knows it then: the
    sender's real data, not an assumption (``mailbox``). A receive with no message (its sender left
    out, ended or stuck) forgets its tensor's value: the comparison of the ranks' point-to-point
    operations names the missing send."""
    from .values import Known, plain, small

    ranks = _tp.group_ranks(pg)
    me, peer = ranks[pg.rank()], ranks[args[2]]
    for t in args[0]:
        if func is _c10d.send.default:
            value = store.exact(t) if isinstance(t, _tp.FakeTensor) else t
            plain_value = value is not None and plain(value) and value.device.type == "cpu" and small(value)
            mailbox.send_tensor(pg.group_name, me, peer, value if plain_value else None)
            continue
        value = mailbox.receive_tensor(pg.group_name, peer, me, mailbox.TIMEOUT)
        if value is None or value.numel() != t.numel():
            store.forget(t)
        elif isinstance(t, _tp.FakeTensor):
            store.set(t, Known(exact=value.reshape(t.shape).to(t.dtype)))
        elif t.device.type == "cpu":
            t.copy_(value.reshape(t.shape))
