"""Collectives compared across ranks: where ranks would hang or disagree, before the hardware.

Each rank's recording holds, per process group, the collectives it issued in order
(``GroupLog``). Ranks that are members of a group must issue the same collectives in the
same order, by the matching rule of ``neuronsim.collectives`` (the one the real run's check
uses): the same collective, dtype and reduce op, and the same element count and dtype of each
tensor of its agreed argument. For each group, the first place where the ranks run differ is
found and explained as a :class:`Finding`:

- a rank issues a collective the others never issue, or never issues one they do: the
  ones that issued it would wait for it (``hang``);
- ranks issue different collectives at the same place (another op, shape or order), or
  disagree on who the group's members are (``disagree``);
- a ``send`` with no matching ``recv`` (or the reverse) between two ranks (``hang``);
- data-parallel ranks run different compiled graphs in the same optimizer step (``graphs``):
  on Trainium such workers hang in their collectives (the Neuron runtime's "CCOM WARN Timeout
  waiting for RX"); e.g. a last batch of another length. Data-parallel ranks are the members of
  the default group, or of a DeviceMesh dimension named for data parallelism; graphs are told
  apart only when they have the same structure (inputs, their dtypes and ranks) and other sizes,
  so pipeline stages, which run other programs, are not compared.

Only the ranks that ran are compared (a dry run of some ranks says nothing of the others),
and a rank whose run ended with an error is not said to hang: its error is the finding.
"""

from __future__ import annotations

import dataclasses
import enum
import math

from neuronsim import collectives as _vocabulary

from .text import ranges

_LOOKAHEAD = 3  # collectives compared past a divergence to tell a skipped one from a different one


class FindingKind(str, enum.Enum):
    """What comparing the ranks found."""

    HANG = "hang"  # a rank waits for a collective (or a send or receive) its peers never issue
    DISAGREE = "disagree"  # ranks issue different collectives at one place, or differ on a group's members
    GRAPHS = "graphs"  # data-parallel ranks run different compiled graphs in one step (they hang on Trainium)


@dataclasses.dataclass
class Finding:
    """The first place one process group's ranks differ (or the data-parallel ranks' graphs)."""

    kind: FindingKind
    group: str
    message: str
    ranks: list = dataclasses.field(default_factory=list)  # the ranks it names as the cause
    sites: list = dataclasses.field(default_factory=list)  # the source lines it names

    def as_data(self) -> dict:
        return {**dataclasses.asdict(self), "kind": self.kind.value}


def _sig(e) -> tuple:
    return _vocabulary.signature(e.op, e.dtype, e.reduce_op, e.agreed)


def _point_to_point(e) -> bool:
    found = _vocabulary.find(e.op)
    return found is not None and found.point_to_point


def _numel(e) -> int:
    return sum(math.prod(s) for s in e.shapes)


def describe(e) -> str:
    """``allreduce #12 [4096, 4096] bfloat16 (sum) at train.py:77 (main)``."""
    shapes = " ".join(str(list(s)) for s in e.shapes)
    op = f" ({e.reduce_op})" if e.reduce_op else ""
    return f"{e.op} #{e.seq} {shapes} {e.dtype}{op} at {e.site}".replace("  ", " ")


def _who(ranks) -> str:
    ranks = sorted(ranks)
    return f"rank{'s' if len(ranks) > 1 else ''} {ranges(ranks)}"


def find(recordings) -> list:
    """The findings of the recorded ranks (:class:`Finding`), at most one per process group (the
    first place its ranks differ), then the data-parallel ranks' compiled graphs."""
    by_group: dict = {}
    for r in recordings:
        for name, log in r.groups.items():
            by_group.setdefault(name, {})[int(r.rank)] = log
    ran = {int(r.rank) for r in recordings}
    failed = {int(r.rank) for r in recordings if r.error}
    out = []
    for name, logs in sorted(by_group.items(), key=lambda kv: _group_order(kv[0])):
        finding = _membership(name, logs) or _sequence(name, logs, ran, failed) or _p2p(name, logs, failed)
        if finding is not None:
            out.append(finding)
    return out + _graph_findings(recordings, by_group)


# -- compiled graphs of data-parallel ranks ----------------------------------------------------------
_DP_DIMS = ("dp", "dp_shard", "dp_replicate", "fsdp", "ddp", "data_parallel", "dp_cp", "dp_shard_cp", "batch")


def _data_parallel_groups(by_group: dict) -> list:
    """The member lists of the groups whose ranks hold replicas of one program."""
    out = []
    for logs in by_group.values():
        desc = next(iter(logs.values())).desc
        if desc == "default_pg" or desc.removeprefix("mesh_") in _DP_DIMS:
            out.append(next(iter(logs.values())).ranks)
    return out


def _step_graphs(rec) -> list:
    """Per bucket (optimizer step): the sorted (shapes, site) of each compiled graph that ran in it."""
    compiled = {g["graph"]: g for g in rec.compile.graphs}
    steps = []
    for b in rec.buckets:
        names = {n.removeprefix("compiled graph ").rsplit(" ", 1)[0].rstrip("'") for n in b.graphs}
        graphs = [compiled[n] for n in sorted(names) if n in compiled]
        steps.append(sorted((_without_device(g["shapes"]), g.get("site") or "?") for g in graphs))
    return steps


def _without_device(shapes) -> tuple:
    """A graph's tensor inputs as (shape, dtype), without the device (ranks differ in it) and without
    its size inputs (a graph recompiled for dynamic shapes takes them; its tensors' shapes tell)."""
    return tuple(_frozen(s[:2]) for s in shapes if isinstance(s, (list, tuple)) and len(s) == 3)


def _frozen(x):
    return tuple(_frozen(v) for v in x) if isinstance(x, (list, tuple)) else x


def _structure(graphs: list) -> tuple:
    """What must match for two steps' graphs to be one program's: inputs, dtypes and ranks."""
    return tuple(tuple((len(shape), dtype) for shape, dtype in shapes) for shapes, _ in graphs)


def _graph_findings(recordings, by_group: dict) -> list:
    per_rank = {int(r.rank): _step_graphs(r) for r in recordings}
    for members in _data_parallel_groups(by_group):
        ranks = [r for r in members if r in per_rank]
        for step in range(min((len(per_rank[r]) for r in ranks), default=0)):
            seen: dict = {}
            for r in ranks:
                seen.setdefault(tuple(per_rank[r][step]), []).append(r)
            if len(seen) < 2 or len({_structure(list(g)) for g in seen}) > 1:
                continue
            (common, ra), (other, rb) = sorted(seen.items(), key=lambda kv: -len(kv[1]))[:2]
            sites = sorted({site for _, site in other} - {site for _, site in common})
            message = _graphs_message(step, ra, common, rb, other)
            return [Finding(FindingKind.GRAPHS, "data-parallel ranks", message, sorted(rb), sites)]
    return []


def _graphs_message(step: int, ra, common, rb, other) -> str:
    differ = [(a, b) for a, b in zip(common, other) if a != b]
    (shapes_a, site_a), (shapes_b, site_b) = differ[0] if differ else (common[0], other[0])
    return (
        f"in optimizer step {step + 1}, {_who(rb)} ran a compiled graph for inputs {_fmt_shapes(shapes_b)} "
        f"({site_b}) where {_who(ra)} ran it for {_fmt_shapes(shapes_a)} ({site_a}): data-parallel ranks must run "
        "the same compiled graphs on Trainium (give every rank batches of one size: pad the last one, or drop it)"
    )


def _fmt_shapes(shapes) -> str:
    return ", ".join(f"{list(shape)} {dtype}" for shape, dtype in shapes)


def _group_order(name: str):
    return (0, int(name)) if name.isdigit() else (1, name)


def _label(name: str, logs: dict) -> str:
    desc = next(iter(logs.values())).desc
    return f"group {name}" + (f" ({desc})" if desc and desc not in (name, "undefined") else "")


def _membership(name: str, logs: dict):
    views: dict = {}
    for rank, log in logs.items():
        views.setdefault(tuple(log.ranks), []).append(rank)
    if len(views) < 2:
        return None
    parts = "; ".join(f"{_who(r)} made it with members {list(m)}" for m, r in views.items())
    fewest = min(views.values(), key=len)
    message = f"{_label(name, logs)}: the ranks disagree on its members: {parts}"
    return Finding(FindingKind.DISAGREE, name, message, sorted(fewest))


def _collectives_of(log) -> list:
    return [e for e in log.entries if not _point_to_point(e)]


def _sequence(name: str, logs: dict, ran: set, failed: set):
    """The first place the members' sequences differ (members that ran but never used the group
    count as empty sequences)."""
    members = set(next(iter(logs.values())).ranks) & ran
    seqs = {r: _collectives_of(logs[r]) if r in logs else [] for r in members}
    if len(seqs) < 2:
        return None
    for i in range(max(len(s) for s in seqs.values())):
        at = {r: (_sig(s[i]) if i < len(s) else None) for r, s in seqs.items()}
        if len(set(at.values())) > 1:
            return _explain(name, logs, seqs, i, failed)
    return None


def _classes(seqs: dict, i: int) -> list:
    """Ranks grouped by what they issued at `i` (None: nothing), the largest group first."""
    classes: dict = {}
    for r, s in seqs.items():
        classes.setdefault(_sig(s[i]) if i < len(s) else None, []).append(r)
    return sorted(classes.items(), key=lambda kv: (-len(kv[1]), kv[0] is None))


def _tail(seq: list, start: int) -> list:
    return [_sig(e) for e in seq[start : start + _LOOKAHEAD]]


def _explain(name: str, logs: dict, seqs: dict, i: int, failed: set) -> dict:
    label = _label(name, logs)
    (_, ranks_a), (_, ranks_b), *_ = _classes(seqs, i)
    a, b = seqs[ranks_a[0]], seqs[ranks_b[0]]
    for x, rx, y, ry in ((a, ranks_a, b, ranks_b), (b, ranks_b, a, ranks_a)):
        # `y` never issues x[i]: y's sequence goes on as x's does after it
        skipped = i >= len(y) or _tail(y, i) == _tail(x, i + 1)
        if i < len(x) and skipped and not set(ry) & failed:
            message = (
                f"{label}: {_who(ry)} never issue{'s' if len(ry) == 1 else ''} {describe(x[i])}, which "
                f"{_who(rx)} issue{'s' if len(rx) == 1 else ''}: {_who(rx)} would wait for it"
            )
            sites = [y[i].site] if i < len(y) else []  # where the ranks that skip it went on instead
            return Finding(FindingKind.HANG, name, message, sorted(ry), [x[i].site] + sites)
    if not (i < len(a) and i < len(b)):
        ended = ranks_a if i >= len(a) else ranks_b
        if set(ended) & failed:
            return None  # their run ended with an error: that is the finding
    issued = lambda s, r: f"{_who(r)} issued {describe(s[i])}" if i < len(s) else f"{_who(r)} issued nothing"  # noqa: E731
    message = f"{label}: {issued(b, ranks_b)} while {issued(a, ranks_a)}"
    sites = [s[i].site for s in (b, a) if i < len(s)]
    return Finding(FindingKind.DISAGREE, name, message, sorted(ranks_b), sites)


def _p2p(name: str, logs: dict, failed: set):
    """Sends and receives between each pair of ranks that ran, matched in order."""
    sends, recvs = {}, {}
    for rank, log in logs.items():
        for e in log.entries:
            kind = _vocabulary.canonical(e.op)
            if kind == "send" and e.peer is not None:
                sends.setdefault((rank, e.peer), []).append(e)
            elif kind == "recv" and e.peer is not None:
                recvs.setdefault((e.peer, rank), []).append(e)
    for src, dst in sorted(set(sends) | set(recvs)):
        if src not in logs or dst not in logs or {src, dst} & failed:
            continue  # a side that did not run (or failed) cannot be judged
        s, r = sends.get((src, dst), []), recvs.get((src, dst), [])
        for k in range(max(len(s), len(r))):
            finding = _p2p_pair(name, logs, src, dst, s[k] if k < len(s) else None, r[k] if k < len(r) else None)
            if finding is not None:
                return finding
    return None


def _p2p_pair(name: str, logs: dict, src: int, dst: int, send, recv) -> Finding | None:
    """The finding of the k-th send from `src` to `dst` against the k-th receive (None: they match)."""
    if send is None:
        msg = f"rank {dst} waits in {describe(recv)} from rank {src}, which rank {src} never sends"
        return Finding(FindingKind.HANG, name, f"{_label(name, logs)}: {msg}", [src], [recv.site])
    if recv is None:
        msg = f"rank {src} waits in {describe(send)} to rank {dst}, which rank {dst} never receives"
        return Finding(FindingKind.HANG, name, f"{_label(name, logs)}: {msg}", [dst], [send.site])
    if _numel(send) != _numel(recv) or send.dtype != recv.dtype:  # as gloo and NCCL match them
        msg = f"rank {src}'s {describe(send)} does not match rank {dst}'s {describe(recv)}"
        return Finding(FindingKind.DISAGREE, name, f"{_label(name, logs)}: {msg}", [dst], [send.site, recv.site])
    return None
