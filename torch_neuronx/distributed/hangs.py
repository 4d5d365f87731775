"""Collectives that cannot complete end in a diagnosis, not a hang or an abort.

What a multi-rank neuron group does, by ``TORCH_NEURONX_CHECK_COLLECTIVES``:

* ``1`` (the default) **records**. Each operation (any ``ProcessGroup`` method that
  ``neuronsim.collectives`` names) is recorded in this process as it is issued: its place in
  the group, op, sequence number, shapes, and the signature of ``neuronsim.collectives``'
  matching rule. The group's store learns of it only when it differs from the rank's previous
  operation (a TCPStore ``set``, a write that waits for no reply), before it reaches gloo, and
  a thread publishes the rank's latest operation five times a second. Nothing is compared
  while collectives complete. When one fails (gloo's timeout, or a peer's connection closing,
  as when gloo aborts a rank that receives more data than its collective expects), the failing
  rank reads the other ranks' records, at once, without waiting for their own failures, and
  raises :class:`CollectiveMismatchError` if two ranks issued different collectives at the
  same place of the group, else :class:`CollectiveTimeoutError` naming the ranks that did not
  arrive and what the others are in. The first rank to fail has the whole account, so a
  launcher that then tears the others down loses nothing.
* ``2``, or ``TORCH_DISTRIBUTED_DEBUG=DETAIL``, **checks** besides: before each collective its
  ranks all-gather its signature on a helper gloo group, as DETAIL's ``ProcessGroupWrapper``
  does (see ``_check`` for why not that wrapper itself), so ranks that disagree raise
  :class:`CollectiveMismatchError` before any data moves (gloo would abort the process on a
  size mismatch, or run a reduce-op or same-size dtype mismatch to a wrong result). One round
  trip per collective.
* ``0``: neither; a failed collective still raises :class:`CollectiveTimeoutError`, naming
  what the peers that fail too report within a grace period.

The errors (``torch.distributed.DistBackendError``) name the group, the collective's sequence
number (gloo's, as the Flight Recorder numbers it), op and shapes, and each other rank's part.
PyTorch's Flight Recorder for CPU process groups (which gloo records into when
``TORCH_FR_BUFFER_SIZE`` > 0) is dumped, one file per rank (``TORCH_FR_DUMP_TEMP_FILE`` +
rank), on such an error and on demand (:func:`dump_flight_recorder`), for ``torchfrtrace``.
"""

from __future__ import annotations

import atexit
import bisect
import collections
import contextlib
import datetime
import functools
import itertools
import re
import threading
import time
import weakref
import zlib
from typing import NamedTuple

import torch
import torch.distributed as dist

from neuronsim import collectives as _collectives
from neuronsim import settings as _settings


class CollectiveTimeoutError(dist.DistBackendError):
    """A collective of a neuron group that some rank did not join within the group's timeout."""


class CollectiveMismatchError(dist.DistBackendError):
    """Ranks of a neuron group issued different collectives (op, shapes or dtypes) at the same point."""


OFF, RECORD, CHECK = 0, 1, 2  # TORCH_NEURONX_CHECK_COLLECTIVES

# group name -> what records, checks and diagnoses need (filled when the backend is created)
_groups: dict[str, dict] = {}
_lock = threading.Lock()
_KEY = "neuron_hang"
# How long a failing rank waits for the report of a peer whose record cannot say whether it
# is still in its last operation (a send or recv), and, with the records off, for every peer's.
_GRACE_S = 2.0
# After a mismatch the check found, every rank took part in its exchange, so every rank will
# report; on a loaded machine that can take longer than the grace period above.
_MISMATCH_GRACE_S = 30.0
_PUBLISH_S = 0.2  # how often a rank's latest operation reaches the store
_WINDOW = 16  # a rank's last changes of operation kept in the store per group
_HISTORY = 64  # a rank's last operations kept in memory per group
_SHAPES = 8  # tensors described per operation


def check_mode() -> int:
    """The check of collectives asked for: TORCH_NEURONX_CHECK_COLLECTIVES (0 off, 1 record,
    2 check), 1 raised to 2 by TORCH_DISTRIBUTED_DEBUG=DETAIL."""
    mode = _settings.get("TORCH_NEURONX_CHECK_COLLECTIVES")
    if mode not in (OFF, RECORD, CHECK):
        raise ValueError(
            f"TORCH_NEURONX_CHECK_COLLECTIVES={mode}: use 0 (off), 1 (record each collective and name "
            "a failed one's mismatch or absent ranks; the default) or 2 (check before each collective)"
        )
    if mode == RECORD and (_settings.get("TORCH_DISTRIBUTED_DEBUG") or "").upper() == "DETAIL":
        return CHECK
    return mode


def check_timeout(timeout) -> datetime.timedelta:
    """The group's timeout as a timedelta; zero or negative ones are refused (gloo enforces >= 0;
    a zero timeout would fail every collective at once)."""
    if not isinstance(timeout, datetime.timedelta):
        timeout = datetime.timedelta(seconds=float(timeout))
    if timeout <= datetime.timedelta(0):
        raise ValueError(
            f"process group timeout must be a positive datetime.timedelta, got {timeout!r}; "
            "pass e.g. timeout=datetime.timedelta(minutes=10)"
        )
    return timeout


class _Record(NamedTuple):
    """One operation a rank issued on a group."""

    index: int  # the rank's operations of the group so far, this one included (point-to-point too)
    position: int  # its collectives (not point-to-point) so far, this one included when it is one
    p2p: bool
    time: float  # time.time() when issued
    match: int  # crc32 of the matching rule's signature (neuronsim.collectives.signature)
    seq: int | str  # gloo's sequence number
    op: str  # canonical name
    tail: str  # " [[4, 8] float32]": shapes and dtypes, and a send's or recv's peer

    @property
    def text(self) -> str:
        return f"{self.op} #{self.seq}{self.tail}"

    def at(self, position: int) -> str:
        """The text of the same collective repeated up to `position` (its sequence number
        counted on)."""
        seq = self.seq + position - self.position if isinstance(self.seq, int) else self.seq
        return f"{self.op} #{seq}{self.tail}"

    def encode(self) -> str:
        return (
            f"{self.index} {self.position} {int(self.p2p)} {self.time:.3f} {self.match} {self.seq} "
            f"{self.op}|{self.tail}"
        )

    @classmethod
    def decode(cls, raw: bytes) -> _Record:
        index, position, p2p, t, match, seq, rest = raw.decode(errors="replace").split(" ", 6)
        op, tail = rest.split("|", 1)
        seq = int(seq) if seq.isdigit() else seq
        return cls(int(index), int(position), p2p == "1", float(t), int(match), seq, op, tail)


_JOINED = _Record(0, 0, False, 0.0, 0, 0, "(joined the group)", "")


class _Spec(NamedTuple):
    """A ProcessGroup method, by the vocabulary of neuronsim.collectives."""

    op: str  # canonical name
    p2p: bool
    agreed: int | None  # position of the agreed argument
    peer: int | None  # position of a point-to-point op's peer


class _Call(NamedTuple):
    """One call of a ProcessGroup method on a neuron group."""

    pg: object
    spec: _Spec
    args: tuple
    seq: int | str | None  # gloo's sequence number of the operation (None: not taken, records off)
    t0: float  # time.monotonic() when issued
    record: _Record | None  # None with the records off


def register(backend, opts, timeout, keep) -> None:
    """Register a neuron group's gloo `backend` for records, checks and diagnoses; `keep` is
    given the helper gloo backend the check (mode 2) runs on. Single-rank groups get neither."""
    name = opts.group_id
    mode = check_mode() if opts.group_size > 1 else OFF
    helper = None
    if mode == CHECK:
        helper_opts = dist.ProcessGroupGloo._Options()
        helper_opts._timeout = timeout
        helper_opts._devices = [dist.ProcessGroupGloo.create_default_device()]
        helper_opts.group_name = f"{name}:fingerprints"
        helper_opts.global_ranks_in_group = list(opts.global_ranks_in_group or range(opts.group_size))
        store = dist.PrefixStore(f"{_KEY}:fingerprints", opts.store)
        helper = dist.ProcessGroupGloo(store, opts.group_rank, opts.group_size, helper_opts)
        keep(helper)  # released from Python, as the group's own gloo is (backend.py)
    info = {
        "store": opts.store,
        "rank": opts.group_rank,
        "size": opts.group_size,
        "ranks": list(opts.global_ranks_in_group or range(opts.group_size)),
        "backend": backend,
        "timeout": timeout,
        "helper": helper,
        "mode": mode,
        "index": 0,  # operations issued
        "position": 0,  # collectives issued
        "changes": 0,  # operations that differed from the one before
        "history": collections.deque([_JOINED], maxlen=_HISTORY),
        "published": 0,  # the index of the latest operation in the store
        "publish": mode != OFF,
    }
    if mode != OFF:
        # Every key holds a record from the start: a reader never waits for one.
        joined = _JOINED._replace(time=time.time()).encode()
        for key in _keys(opts.group_rank):
            _publish(info, key, joined)
    with _lock:
        _groups[name] = info
    if opts.group_size > 1:
        _start_watcher(opts.store)  # the first multi-rank group: the default one
    if mode != OFF:
        _start_publisher()


def _keys(rank: int) -> list[str]:
    """A rank's keys in its group's store: its latest operation, then its last changes."""
    return [f"{_KEY}/now/{rank}"] + [f"{_KEY}/change/{rank}/{i}" for i in range(_WINDOW)]


def _publish(info: dict, key: str, value: str) -> None:
    try:
        info["store"].set(key, value)  # a TCPStore set waits for no reply
    except Exception:  # noqa: BLE001 - the store is gone (with its host): stop publishing, run on
        info["publish"] = False


def _publish_latest(info: dict) -> None:
    rec = info["history"][-1]
    if rec.index != info["published"] and info["publish"]:
        info["published"] = rec.index
        _publish(info, f"{_KEY}/now/{info['rank']}", rec.encode())


_publisher: threading.Thread | None = None
_exiting = threading.Event()  # set at exit: this module's threads leave their loops


def _publish_loop() -> None:
    """Each group's latest operation into its store, when it changed (a rank waiting in a
    collective, or idle, has it there within _PUBLISH_S)."""
    while not _exiting.wait(_PUBLISH_S):
        for info in list(_groups.values()):
            if info["mode"] != OFF:
                _publish_latest(info)


def _start_publisher() -> None:
    global _publisher
    with _lock:
        if _publisher is None:
            _publisher = _started(_publish_loop, "neuron-collective-records")


def _started(loop, name: str, *args) -> threading.Thread:
    """A daemon thread running `loop`, ended and joined at exit (see _end_threads)."""
    t = threading.Thread(target=loop, args=args, name=name, daemon=True)
    t.start()
    return t


def _end_threads() -> None:
    # Before Python finalises. Daemon threads are left running into finalisation, and one that
    # returns from a store call then (the call released the GIL) is ended as it re-takes the GIL,
    # inside a destructor that may not throw: the process aborts ("terminate called without an
    # active exception"), seen at the end of multi-rank jobs on loaded machines. Bounded: a
    # store call that hangs costs the wait, not the exit.
    _exiting.set()
    for t in (_publisher, _watcher):
        if t is not None:
            t.join(timeout=5.0)


atexit.register(_end_threads)


# ---------------------------------------------------------------------------
# Records


_NAMES: dict = {}  # torch.dtype or RedOpType -> its name


def _name(x) -> str:
    """A dtype's name ("float32") or a reduce op's, as neuronsim.collectives writes them ("sum")."""
    name = _NAMES.get(x)
    if name is None:
        name = _NAMES[x] = str(x).removeprefix("torch.") if isinstance(x, torch.dtype) else x.name.lower()
    return name


def _tensors(args) -> list:
    out = []
    for a in args:
        if isinstance(a, torch.Tensor):
            out.append(a)
        elif isinstance(a, (list, tuple)):
            for b in a:  # one level inline: the common [tensor] costs no call
                if isinstance(b, torch.Tensor):
                    out.append(b)
                elif isinstance(b, (list, tuple)):
                    out.extend(_tensors(b))
    return out


# the options that carry a reduce op (all_reduce's, reduce's, reduce_scatter's), by type
_OPTIONS = frozenset(
    getattr(dist, n)
    for n in ("AllreduceOptions", "AllreduceCoalescedOptions", "ReduceOptions", "ReduceScatterOptions")
    if hasattr(dist, n)
)
_REDUCE_OPS = frozenset((dist.ReduceOp, dist.ReduceOp.RedOpType))  # an overload's op argument


def _reduce_op(args, kwargs) -> str | None:
    for a in itertools.chain(reversed(args), kwargs.values()):  # the options come last
        kind = type(a)
        if kind in _OPTIONS:
            return _name(a.reduceOp.op)
        if kind in _REDUCE_OPS:
            return _name(getattr(a, "op", a))
    return None


_KNOWN: dict = {}  # a call's op, reduce op, agreed slice, shapes and dtypes -> (match, description)


def _walk(args, agreed: int | None) -> tuple[list, int, int]:
    """The tensors of a call's arguments, and the slice of them its agreed argument holds."""
    out, lo, hi = [], 0, 0
    for i, a in enumerate(args):
        if i == agreed:
            lo = len(out)
        if isinstance(a, torch.Tensor):
            out.append(a)
        elif isinstance(a, (list, tuple)):
            out.extend(_tensors(a))
        if i == agreed:
            hi = len(out)
    return out, lo, hi


def _known(op: str, reduce_op, tensors: list, lo: int, hi: int) -> tuple[int, str]:
    """(crc32 of neuronsim.collectives' signature, the shapes' description) of a call whose
    agreed argument holds tensors[lo:hi], cached by the call's shapes and dtypes."""
    key = (op, reduce_op, lo, hi, *[(t.shape, t.dtype) for t in tensors])
    known = _KNOWN.get(key)
    if known is None:
        if len(_KNOWN) > 4096:
            _KNOWN.clear()
        agreed = tensors[lo:hi]
        first = agreed or tensors
        signature = _collectives.signature(
            op, _name(first[0].dtype) if first else "-", reduce_op, [(t.numel(), _name(t.dtype)) for t in agreed]
        )
        known = _KNOWN[key] = (zlib.crc32(repr(signature).encode()), _shapes(tensors))
    return known


def _shapes(tensors) -> str:
    """ " [[4, 8] float32, [8] float32]": the tensors' shapes and dtypes."""
    text = ", ".join(f"{list(t.shape)} {_name(t.dtype)}" for t in tensors[:_SHAPES])
    if len(tensors) > _SHAPES:
        text += f", ... ({len(tensors)} tensors)"
    return f" [{text}]" if text else ""


def _peer(info: dict, spec: _Spec, args) -> str:
    to = "to" if spec.op == "send" else "from"
    if spec.peer is None or spec.peer >= len(args):
        return f" {to} any rank"
    r = args[spec.peer]
    return f" {to} rank {info['ranks'][r] if isinstance(r, int) and 0 <= r < len(info['ranks']) else r}"


def _sequence(info: dict):
    """The operation's number in its group, as gloo (and the Flight Recorder) count them, for
    an operation about to be issued."""
    try:
        return info["backend"]._get_sequence_number_for_group() + 1
    except Exception:  # noqa: BLE001
        return "?"


def _record(info: dict, spec: _Spec, seq, args, kwargs) -> _Record:
    """This rank's record of the operation it issues now; the store learns of it when it
    differs from the one before (so that a rank gloo aborts in it is named)."""
    tensors, lo, hi = _walk(args, spec.agreed)
    if kwargs:
        tensors += _tensors(kwargs.values())
    match, shapes = _known(spec.op, _reduce_op(args, kwargs), tensors, lo, hi)
    info["index"] += 1
    if not spec.p2p:
        info["position"] += 1
    tail = shapes + _peer(info, spec, args) if spec.p2p else shapes
    rec = _Record(info["index"], info["position"], spec.p2p, time.time(), match, seq, spec.op, tail)
    history = info["history"]
    previous = history[-1]
    history.append(rec)
    if (match != previous.match or spec.p2p != previous.p2p) and info["publish"]:
        info["changes"] += 1
        info["published"] = rec.index  # a reader takes the latest of the changes and of "now"
        _publish(info, f"{_KEY}/change/{info['rank']}/{info['changes'] % _WINDOW}", rec.encode())
    return rec


def _text(c: _Call, info: dict) -> str:
    if c.record is not None:
        return c.record.text
    seq = c.seq
    if seq is None:  # numbered now, gloo having counted it (unless this thread issued more since)
        seq = _sequence(info)
        seq = seq - 1 if isinstance(seq, int) else seq
    tail = _shapes(_tensors(c.args)) + (_peer(info, c.spec, c.args) if c.spec.p2p else "")
    return f"{c.spec.op} #{seq}{tail}"


# ---------------------------------------------------------------------------
# The check (mode 2)


def _check(c: _Call, info: dict) -> None:
    """Before collective `c` reaches gloo: every rank of the group issues the same one (the
    matching rule of neuronsim.collectives, at the same place of the group), or every rank
    raises CollectiveMismatchError; a rank that does not come makes the others' exchange time
    out (CollectiveTimeoutError). One all-gather of two integers on a helper gloo group.
    (PyTorch's ProcessGroupWrapper does this for TORCH_DISTRIBUTED_DEBUG=DETAIL with a barrier
    besides, and compares gloo's sequence numbers, which point-to-point ops advance unevenly
    across ranks: a false alarm as soon as a pipeline has run.)"""
    rec = c.record
    mine = torch.tensor([rec.match, rec.position], dtype=torch.int64)
    out = torch.empty(info["size"] * 2, dtype=torch.int64)
    _pending.checking = True
    try:
        info["helper"]._allgather_base(out, mine).wait()
    except RuntimeError as e:
        _convert(c, e)
    finally:
        _pending.checking = False
    if not bool((out.view(-1, 2) == mine).all()):
        err = RuntimeError("Detected mismatch between collectives on ranks")
        # Every rank saw the same fingerprints, so every rank is here: each one's account of
        # what it issued goes over the same helper group (not the store, which the rank
        # hosting it takes down when it exits first).
        err.neuron_accounts = _exchange_accounts(info, rec.text)
        _convert(c, err)


_ACCOUNT_BYTES = 1024


def _exchange_accounts(info: dict, text: str) -> dict | None:
    """{group rank: what it issued} of the other ranks, by an all-gather on the helper group."""
    raw = text.encode()[:_ACCOUNT_BYTES]
    mine = torch.zeros(_ACCOUNT_BYTES, dtype=torch.uint8)
    mine[: len(raw)] = torch.tensor(list(raw), dtype=torch.uint8)
    out = torch.empty(info["size"] * _ACCOUNT_BYTES, dtype=torch.uint8)
    try:
        info["helper"]._allgather_base(out, mine).wait()
    except RuntimeError:
        return None  # a peer left: the store's accounts are the way left
    rows = out.view(info["size"], _ACCOUNT_BYTES)
    return {
        r: bytes(rows[r].tolist()).rstrip(b"\0").decode(errors="replace")
        for r in range(info["size"])
        if r != info["rank"]
    }


# ---------------------------------------------------------------------------
# Diagnosis


class _Account:
    """What a rank's records tell of it: its changes of operation and latest operation from the
    store (another rank's), or its history (this rank's)."""

    def __init__(self, records):
        records = sorted({x.index: x for x in records}.values(), key=lambda x: x.index)
        self.latest = records[-1] if records else None
        self.collectives = [x for x in records if not x.p2p and x.position]
        self.positions = [x.position for x in self.collectives]
        # the rank issued collectives up to `reached` (more, if it was still issuing repeats
        # when it last published); what it issued is known from `earliest` on
        self.reached = max((x.position for x in records), default=0)
        self.earliest = records[0].position if records else 0

    def at(self, position: int) -> _Record | None:
        """The record of the collective the rank issued at `position` of the group (None: not
        issued, or no longer kept)."""
        if not self.earliest <= position <= self.reached or position < 1:
            return None
        i = bisect.bisect_right(self.positions, position) - 1
        return self.collectives[i] if i >= 0 else None

    def current(self) -> str:
        """The operation the rank is in, or issued last."""
        last = self.latest
        return last.text if last.p2p or not last.position else last.at(self.reached)


def _read_accounts(info: dict) -> dict[int, _Account] | None:
    """{group rank: its account} of every rank, this one's from its history (None: the store
    is gone)."""
    store, me = info["store"], info["rank"]
    keys = {r: _keys(r) for r in range(info["size"]) if r != me}
    try:
        flat = [k for ks in keys.values() for k in ks]
        if store.check(flat):
            values = dict(zip(flat, store.multi_get(flat)))
        else:  # a rank that never published (it died before joining): read the others
            values = {}
            for ks in keys.values():
                if store.check(ks):
                    values.update(zip(ks, store.multi_get(ks)))
    except Exception:  # noqa: BLE001 - the store went with its host
        return None
    accounts = {me: _Account(info["history"])}
    for r, ks in keys.items():
        try:
            accounts[r] = _Account([_Record.decode(values[k]) for k in ks if k in values])
        except ValueError:
            accounts[r] = _Account([])
    return accounts


def _ranks(ranks: list) -> str:
    return f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {ranks}"


def _ago(rec: _Record) -> str:
    return f"{max(0.0, time.time() - rec.time):.1f} s ago"


def _mismatch(info: dict, accounts: dict, me: _Record, closed: bool) -> str | None:
    """The first place of the group where two ranks issued different collectives (by
    neuronsim.collectives' matching rule), as each rank's part there ("rank 1 issued barrier #2;
    rank 0 issued all_reduce #2 [[4, 8] float32]"), or None."""
    places = sorted({x.position for a in accounts.values() for x in a.collectives})
    first, at = None, {}
    for p in places:
        at = {r: x for r, a in accounts.items() if (x := a.at(p)) is not None}
        if len({x.match for x in at.values()}) > 1:
            first = p
            break
    guessed = set()
    if first is None and closed and not me.p2p:
        # A rank that died repeating its last collective (which it does not publish) up to this
        # one: if that differs from this rank's collective, gloo aborted it here (it received
        # more than its collective expects). After a send or recv a collective is a change,
        # which it publishes: then it has not come this far.
        first = me.position
        at = {r: x for r, a in accounts.items() if (x := a.at(first)) is not None}
        for r, a in accounts.items():
            last = a.collectives[-1] if a.collectives else None
            if r not in at and a.reached < first and last is not None and last is a.latest and last.match != me.match:
                at[r] = a.collectives[-1]
                guessed.add(r)
        if not guessed:
            return None
    if first is None:
        return None
    g = info["ranks"]
    issued: dict[str, list] = {}
    absent, passed = [], []
    for r, a in sorted(accounts.items()):
        x = at.get(r)
        if x is not None:
            text = x.at(first) + (f" (a repeat of its #{x.seq}, by its record)" if r in guessed else "")
            if r not in guessed and (a.latest.index > x.index or a.reached > first):
                text += f" (then {a.current()})"
            issued.setdefault(text, []).append(g[r])
        elif a.reached < first:
            absent.append(g[r])
        else:
            passed.append(g[r])
    # the odd ones first
    parts = [f"{_ranks(rs)} issued {t}" for t, rs in sorted(issued.items(), key=lambda kv: (len(kv[1]), kv[1]))]
    if absent:
        parts.append(f"{_ranks(absent)} did not arrive (they are in no collective of this group)")
    if passed:
        parts.append(f"{_ranks(passed)} went past it (their record of it is gone)")
    return "; ".join(parts)


def _states(info: dict, me: _Record, accounts: dict, closed: bool) -> str:
    """What each other rank is in when this rank's operation `me` failed and the records show
    no mismatch: "ranks [1] did not arrive (...)", "rank 1 is waiting in barrier #2", ..."""
    g = info["ranks"]
    absent, waiting, idle, unsure, silent = [], [], [], {}, []
    for r, a in sorted(accounts.items()):
        if r == info["rank"]:
            continue
        last = a.latest
        if last is None:
            silent.append(g[r])
        elif a.reached > me.position and not last.p2p:
            waiting.append(f"rank {g[r]} is waiting in {a.current()}")  # a collective this rank has not joined
        elif last.p2p:
            unsure[r] = a  # a send or recv: whether it is still in it, its own report says
        elif me.p2p or a.reached < me.position:
            (idle if me.p2p else absent).append((g[r], a))
        # else: the same collective as this rank's
    parts = []
    if absent:
        lasts = ", ".join(_last(r, a) for r, a in absent[:8])
        ranks = [r for r, _ in absent]
        parts.append(f"ranks {ranks} did not arrive (they are in no collective of this group; {lasts})")
    parts += waiting
    if idle:
        lasts = ", ".join(_last(r, a) for r, a in idle[:8])
        parts.append(
            f"{_ranks([r for r, _ in idle])} {'is' if len(idle) == 1 else 'are'} in no collective of this group ({lasts})"
        )
    if unsure:
        reports = _reports(info, set(unsure), _GRACE_S)
        for r, a in unsure.items():
            if reports.get(r):
                parts.append(f"rank {g[r]} is waiting in {reports[r]}")
            else:
                parts.append(
                    f"rank {g[r]}'s last operation of this group is {a.current()}, issued {_ago(a.latest)} "
                    "(it did not report whether it is still in it)"
                )
    if silent:
        parts.append(f"{_ranks(silent)} published no record")
    if not parts:
        return "every rank is waiting in the same collective" + (" (a peer process may have died)" if closed else "")
    return "; ".join(parts)


def _last(rank: int, a: _Account) -> str:
    if not a.latest.index:
        return f"rank {rank} has issued nothing in it"
    return f"rank {rank} last issued {a.current()}, {_ago(a.latest)}"


def _reports(info: dict, ranks, grace_s: float) -> dict[int, str | None]:
    """The operation each of `ranks` (group ranks) reported it failed in, within `grace_s`
    (None: no report)."""
    store = info["store"]
    reports: dict[int, str | None] = dict.fromkeys(ranks)
    deadline = time.monotonic() + grace_s
    while True:
        for r in [r for r, v in reports.items() if v is None]:
            key = f"{_KEY}/pending/{r}"
            try:
                if store.check([key]):
                    reports[r] = store.get(key).decode()
            except Exception:  # noqa: BLE001 - the store is gone
                return reports
        if all(v is not None for v in reports.values()) or time.monotonic() > deadline:
            return reports
        time.sleep(0.1)


def _reported(info: dict, mine: str, verb: str, accounts: dict | None = None) -> str:
    """The other ranks' parts from their own reports (the check's accounts, or with the records
    off, what the peers that fail too report within the grace period)."""
    issued = verb == "issued"  # a mismatch the check found: every rank joined its exchange
    reports = accounts
    if reports is None:
        others = [r for r in range(info["size"]) if r != info["rank"]]
        reports = _reports(info, others, _MISMATCH_GRACE_S if issued else _GRACE_S)
    ranks = info["ranks"]
    absent = sorted(ranks[r] for r, v in reports.items() if v is None)
    elsewhere = [f"rank {ranks[r]} {verb} {v}" for r, v in sorted(reports.items()) if v and (v != mine or issued)]
    parts = []
    if absent and issued:
        parts.append(f"ranks {absent} did not report what they issued within {_MISMATCH_GRACE_S:.0f} s")
    elif absent:
        parts.append(f"ranks {absent} did not arrive (they are in no collective of this group)")
    parts.extend(elsewhere)
    return "; ".join(parts) or "every rank is waiting in the same collective (a peer process may have died)"


def _diagnose(c: _Call, err: BaseException) -> BaseException | None:
    """The typed error for `err` raised by call `c` on a neuron group (or by its check), or
    None for other errors."""
    name = getattr(c.pg, "group_name", None)
    info = _groups.get(name)
    if info is None:
        return None
    text = str(err)
    checked = hasattr(err, "neuron_accounts")  # the check (mode 2) found a mismatch
    failed = re.search(r"[Tt]imed out|Connection closed by peer|Connection reset", text)
    if not (checked or failed):
        return None
    mine = _text(c, info)
    _dumped.set()
    _request_dumps()
    desc = getattr(c.pg, "group_desc", "") or ""
    where = f"neuron process group '{name}'" + (f" ({desc})" if desc else "")
    head = f"[rank {info['rank']}] {where}, collective {mine}"
    if checked:
        peers = _reported(info, mine, "issued", err.neuron_accounts)
        exc = CollectiveMismatchError(f"{head}: Detected mismatch between collectives on ranks: {peers}")
    else:
        cause = text.strip().splitlines()[-1][:300] if text.strip() else ""
        timed_out = "imed out" in text or time.monotonic() - c.t0 >= info["timeout"].total_seconds() - 0.5
        what = (
            f"did not complete within {info['timeout']}"
            if timed_out
            else "failed: a peer's connection closed (its process exited or died)"
        )
        # What this rank is in: for the peers whose records cannot tell (a send or recv), and
        # its latest record for every peer (the publisher may not have run since).
        _publish(info, f"{_KEY}/pending/{info['rank']}", mine)
        if c.record is not None:
            _publish_latest(info)
        accounts = _read_accounts(info) if c.record is not None else None
        if accounts is not None and not timed_out and any(a.reached < c.record.position for a in accounts.values()):
            # A peer that died a moment ago: its last record may still be on its way to the store.
            time.sleep(0.05)
            accounts = _read_accounts(info) or accounts
        mismatch = _mismatch(info, accounts, c.record, not timed_out) if accounts is not None else None
        if mismatch:
            hint = (
                ""
                if timed_out
                else "; gloo aborts a rank that receives more data than its collective expects "
                "(TORCH_NEURONX_CHECK_COLLECTIVES=2 raises on every rank instead)"
            )
            exc = CollectiveMismatchError(
                f"{head} {what}: Detected mismatch between collectives on ranks: {mismatch}{hint} ({cause})"
            )
        else:
            if accounts is not None:
                peers = _states(info, c.record, accounts, not timed_out)
            elif c.record is not None:
                peers = "the other ranks' records are unavailable (the group's store went with its host process)"
            else:
                peers = _reported(info, mine, "is waiting in")
            exc = CollectiveTimeoutError(f"{head} {what}: {peers} ({cause})")
    # The check stopped the collective before gloo recorded it: the dump gets it as
    # issued, not started, as the recorder has collectives whose peers never came.
    stopped = checked or getattr(_pending, "checking", False)
    entry = _entry(c.pg, name, desc, c.spec.op, _tensors(c.args), info) if stopped else None
    path = _dump_on_error(entry)
    if path:
        exc.args = (f"{exc.args[0]}\nFlight Recorder dump: {path}",)
    return exc


def _convert(c: _Call, err):
    if isinstance(err, (CollectiveTimeoutError, CollectiveMismatchError)):
        raise err
    try:
        exc = _diagnose(c, err)
    except Exception:  # noqa: BLE001 - a failed diagnosis must not hide the collective's error
        exc = None
    if exc is None:
        raise err
    raise exc from err


# ---------------------------------------------------------------------------
# The ProcessGroup methods


_pending = threading.local()  # the last call this thread issued on a neuron group
_works: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # Work -> the call that returned it


def _wait(orig):
    @functools.wraps(orig)
    def wait(self, *args, **kwargs):
        try:
            return orig(self, *args, **kwargs)
        except RuntimeError as e:
            # The call that returned this Work; else (a Work made elsewhere, as the one over a
            # coalesced window) the last call of this thread, which is what blocks (described
            # without its shapes when the records are off: the thread keeps no tensor alive).
            c = _works.get(self) or getattr(_pending, "call", None)
            if c is None or c.pg.group_name not in _groups:
                raise
            _convert(c, e)

    wait._neuron = True
    return wait


def _spec(method: str) -> _Spec | None:
    found = _collectives.find(method)
    if found is None:
        return None
    peer = _collectives.peer_argument(method)
    # neuronsim.collectives gives the c10d op's position; a ProcessGroup method takes it one place earlier
    return _Spec(
        found.name, found.point_to_point, _collectives.agreed_argument(method), None if peer is None else peer - 1
    )


def _patch(method: str, spec: _Spec):
    orig = getattr(dist.ProcessGroup, method)

    @functools.wraps(orig)
    def call(self, *args, **kwargs):
        info = _groups.get(self.group_name)
        if info is None:
            return orig(self, *args, **kwargs)
        seq = rec = None  # with the records off, the diagnosis numbers the call
        if info["mode"]:
            seq = _sequence(info)
            rec = _record(info, spec, seq, args, kwargs)
        t0 = time.monotonic()
        c = _Call(self, spec, args, seq, t0, rec)
        _pending.call = _Call(self, spec, (), seq, t0, rec)  # no tensor: memory is freed when the caller drops it
        if info["helper"] is not None and not spec.p2p:
            _check(c, info)
        try:
            work = orig(self, *args, **kwargs)
        except RuntimeError as e:
            _convert(c, e)
        if work is not None:
            _works[work] = c
        return work

    call._neuron = True
    setattr(dist.ProcessGroup, method, call)


def collective_methods() -> dict[str, _Spec]:
    """ProcessGroup's collective methods: each one neuronsim.collectives names."""
    methods = {}
    for method in dir(dist.ProcessGroup):
        spec = None if method.startswith("__") else _spec(method)
        if spec is not None and callable(getattr(dist.ProcessGroup, method)):
            methods[method] = spec
    return methods


@contextlib.contextmanager
def _as_mode(group_name: str, mode: int):
    """Record and check the group's collectives as `mode` asks while the block runs, on the
    group's own gloo connections (benchmarks/collectives.py --check-cost: two groups'
    connections can differ in speed for the life of the processes by more than the cost it
    measures). Every rank of the group must enter it at the same point; mode 2 needs a group
    made in mode 2 (its helper group)."""
    info = _groups[group_name]
    saved = info["mode"], info["helper"], info["publish"]
    if mode == CHECK and saved[1] is None:
        raise ValueError(f"group {group_name!r} was made without the check (TORCH_NEURONX_CHECK_COLLECTIVES=2)")
    info["mode"], info["helper"], info["publish"] = mode, saved[1] if mode == CHECK else None, mode != OFF and saved[2]
    try:
        yield
    finally:
        info["mode"], info["helper"], info["publish"] = saved


def install() -> None:
    """Record, check and diagnose neuron groups' collectives (idempotent)."""
    if getattr(dist.ProcessGroup.allreduce, "_neuron", False):
        return
    for method, spec in collective_methods().items():
        _patch(method, spec)
    dist.Work.wait = _wait(dist.Work.wait)


# ---------------------------------------------------------------------------
# Flight Recorder


def _fr_on() -> bool:
    return _settings.get("TORCH_FR_BUFFER_SIZE") > 0 and bool(_settings.get("TORCH_FR_DUMP_TEMP_FILE"))


def _dump_on_error(pending: dict | None = None) -> str | None:
    if not _fr_on():
        return None
    try:
        return dump_flight_recorder(_pending_entry=pending)
    except OSError:
        return None


def _fr_dtype(t) -> str:
    return t.new_empty(0, device="cpu").type().rsplit(".", 1)[-1].removesuffix("Tensor")


def _entry(pg, name: str, desc: str, op: str, tensors: list, info: dict) -> dict | None:
    """The Flight Recorder entry of a collective the check stopped, numbered after the
    group's last recorded one."""
    if not _fr_on():
        return None
    sizes = [list(t.shape) for t in tensors]
    dtypes = [_fr_dtype(t) for t in tensors]
    return {
        "pg_name": name,
        "process_group": (name, desc),
        "thread_name": threading.current_thread().name,
        "thread_id": str(threading.get_ident()),
        "p2p_seq_id": 0,
        "profiling_name": f"gloo:{op}",
        "time_created_ns": time.time_ns(),
        "input_sizes": sizes,
        "input_dtypes": dtypes,
        "output_sizes": sizes,
        "output_dtypes": dtypes,
        "state": "scheduled",
        "time_discovered_started_ns": None,
        "time_discovered_completed_ns": None,
        "retired": False,
        "timeout_ms": int(info["timeout"].total_seconds() * 1000),
        "is_p2p": False,
        "frames": [{"name": f.name, "filename": f.filename, "line": f.lineno} for f in reversed(_stack())],
    }


def _stack():
    import traceback

    return traceback.extract_stack()[:-4]


def _edited(data: bytes, pending: dict | None) -> bytes:
    """The recorder's dump without the check's helper groups (an implementation detail whose
    all-gathers would be reported in place of the collective they guard), plus `pending`."""
    import pickle

    d = pickle.loads(data)
    helper = [n for n in d.get("pg_config", {}) if n.endswith(":fingerprints")]
    for n in helper:
        d["pg_config"].pop(n)
        d.get("pg_status", {}).pop(n, None)
    entries = d["entries"] = [e for e in d.get("entries", []) if e["process_group"][0] not in helper]
    if pending is None:
        return pickle.dumps(d)
    name = pending.pop("pg_name")
    last = max(
        (e for e in entries if e["process_group"][0] == name), key=lambda e: e["collective_seq_id"], default=None
    )
    pending["collective_seq_id"] = (last["collective_seq_id"] if last else 0) + 1
    pending["op_id"] = (last["op_id"] if last else 0) + 1
    pending["pg_id"] = last["pg_id"] if last else 0
    pending["record_id"] = max((e["record_id"] for e in entries), default=-1) + 1
    entries.append(pending)
    return pickle.dumps(d)


_DUMP_KEY = f"{_KEY}/dump"
_watcher: threading.Thread | None = None
_watched_store = None  # the default group's store, which the watcher polls


def _request_dumps() -> None:
    """Ask every rank to dump its Flight Recorder (ranks not waiting in any collective too)."""
    if _fr_on() and _watched_store is not None:
        try:
            _watched_store.set(_DUMP_KEY, "1")
        except Exception:  # noqa: BLE001
            pass


_dumped = threading.Event()  # this process has dumped (once per job)


def _watch(store) -> None:
    while True:
        try:
            if store.check([_DUMP_KEY]):
                break
        except Exception:  # noqa: BLE001 - the store went away: this job is over
            _stop_watching(store)
            return
        if _exiting.wait(1.0):
            return
    if _dumped.is_set():  # this rank's error path dumps, with its pending collective
        return
    try:
        dump_flight_recorder()
    except OSError:
        pass


def _start_watcher(store) -> None:
    """One thread per process that dumps the Flight Recorder when a rank asks for it (through
    the store, as NCCL's watchdog does): a rank that never joined a collective has the
    record of what it did instead."""
    global _watcher, _watched_store
    with _lock:
        if _watcher is None and _fr_on():
            _watched_store = store
            _watcher = _started(_watch, "neuron-fr-dump", store)


def _stop_watching(store) -> None:
    global _watcher, _watched_store
    with _lock:
        if _watched_store is store:  # a later job in this process gets a watcher of its own
            _watcher = _watched_store = None


def dump_flight_recorder(prefix: str | None = None, *, _pending_entry: dict | None = None) -> str:
    """Write this rank's Flight Recorder (the recent collectives of its CPU/neuron process
    groups) to ``prefix + global rank``, in the format ``torchfrtrace`` reads; returns the path.

    `prefix` defaults to ``TORCH_FR_DUMP_TEMP_FILE``. Recording needs ``TORCH_FR_BUFFER_SIZE``
    > 0 in the environment before the first process group is created.
    """
    prefix = prefix or _settings.get("TORCH_FR_DUMP_TEMP_FILE")
    if not prefix:
        raise ValueError("dump_flight_recorder: no path prefix given and TORCH_FR_DUMP_TEMP_FILE is unset")
    if _settings.get("TORCH_FR_BUFFER_SIZE") <= 0:
        raise RuntimeError(
            "dump_flight_recorder: the Flight Recorder is off; set TORCH_FR_BUFFER_SIZE (e.g. 2000) "
            "before the first process group is created"
        )
    # Without the recorder's stack traces: symbolizing them takes seconds at a timeout
    # (the collective the check stopped carries its Python stack).
    data = torch._C._distributed_c10d._dump_fr_trace(True, False, False)
    data = _edited(data, _pending_entry)
    rank = dist.get_rank() if dist.is_initialized() else _settings.get("RANK")
    path = f"{prefix}{rank}"
    with open(path, "wb") as f:
        f.write(data)
    return path


def load_flight_recorder(path: str) -> dict:
    """One rank's dump as a dict (``version``, ``pg_config``, ``entries``, ...), with a clear
    error for a file that is not a complete Flight Recorder dump."""
    import pickle

    try:
        with open(path, "rb") as f:
            d = pickle.load(f)
    except (pickle.UnpicklingError, EOFError, ValueError, AttributeError, IndexError) as e:
        raise ValueError(f"{path} is not a Flight Recorder dump (truncated or corrupt: {e})") from None
    missing = [k for k in ("version", "pg_config", "entries") if not isinstance(d, dict) or k not in d]
    if missing:
        raise ValueError(f"{path} is not a Flight Recorder dump: it lacks {missing}")
    return d
