"""Collectives that cannot complete end in a diagnosis, not a hang or an abort.

Three parts, each PyTorch's own machinery where it exists:

* Before a collective of a multi-rank neuron group reaches gloo, its ranks all-gather
  the collective's fingerprint (op, shapes, dtypes) on a helper gloo group, as
  ``TORCH_DISTRIBUTED_DEBUG=DETAIL``'s ``ProcessGroupWrapper`` does (see ``_check`` for
  why not that wrapper itself). gloo would abort the process on a size mismatch; the
  check raises on every rank instead.
* The errors of a neuron group's collectives (the wrapper's, gloo's timeouts) are raised
  again as :class:`CollectiveMismatchError` / :class:`CollectiveTimeoutError`
  (``torch.distributed.DistBackendError``) naming the group, the collective's sequence
  number (gloo's, as the Flight Recorder numbers it), op and shapes, and what each other
  rank was doing: each failing rank publishes
  its pending collective in the group's store, so a waiting rank can tell a rank that is
  stuck in another collective from one that never joined.
* PyTorch's Flight Recorder for CPU process groups (which gloo records into when
  ``TORCH_FR_BUFFER_SIZE`` > 0) is dumped, one file per rank
  (``TORCH_FR_DUMP_TEMP_FILE`` + rank), on such an error and on demand
  (:func:`dump_flight_recorder`), for ``torchfrtrace``.
"""

from __future__ import annotations

import datetime
import functools
import re
import threading
import time
import zlib

import torch
import torch.distributed as dist

from neuronsim import settings


class CollectiveTimeoutError(dist.DistBackendError):
    """A collective of a neuron group that some rank did not join within the group's timeout."""


class CollectiveMismatchError(dist.DistBackendError):
    """Ranks of a neuron group issued different collectives (op, shapes or dtypes) at the same point."""


# group name -> what a diagnosis needs (filled when the backend is created)
_groups: dict[str, dict] = {}
_lock = threading.Lock()
_KEY = "neuron_hang"
_GRACE_S = 2.0  # how long a failing rank waits for the reports of peers that may be elsewhere
# After a mismatch every rank took part in the check's exchange, so every rank will report;
# on a loaded machine that can take longer than the grace period above.
_MISMATCH_GRACE_S = 30.0


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


def register(backend, opts, timeout, keep) -> None:
    """Register a neuron group's gloo `backend` for checks and diagnoses; `keep` is given the
    helper gloo backend the check runs on. Single-rank groups and
    TORCH_NEURONX_CHECK_COLLECTIVES=0 get no check."""
    name = opts.group_id
    helper = None
    if opts.group_size > 1 and settings.get("TORCH_NEURONX_CHECK_COLLECTIVES"):
        helper_opts = dist.ProcessGroupGloo._Options()
        helper_opts._timeout = timeout
        helper_opts._devices = [dist.ProcessGroupGloo.create_default_device()]
        helper_opts.group_name = f"{name}:fingerprints"
        helper_opts.global_ranks_in_group = list(opts.global_ranks_in_group or range(opts.group_size))
        store = dist.PrefixStore(f"{_KEY}:fingerprints", opts.store)
        helper = dist.ProcessGroupGloo(store, opts.group_rank, opts.group_size, helper_opts)
        keep(helper)  # released from Python, as the group's own gloo is (backend.py)
    with _lock:
        _groups[name] = {
            "store": opts.store,
            "rank": opts.group_rank,
            "size": opts.group_size,
            "ranks": list(opts.global_ranks_in_group or range(opts.group_size)),
            "backend": backend,
            "timeout": timeout,
            "helper": helper,
        }
    if opts.group_size > 1:
        _start_watcher(opts.store)  # the first multi-rank group: the default one


# Which argument of each ProcessGroup method holds the tensors every rank must agree on
# (the others legitimately differ: a root's gather list, all_to_all's splits).
_AGREED_ARG = {
    "all_gather": 1,
    "all_gather_into_tensor": 1,
    "all_gather_coalesced": 1,
    "all_gather_into_tensor_coalesced": 1,
    "gather": 1,
    "scatter": 0,
    "reduce_scatter": 0,
    "reduce_scatter_tensor": 0,
    "reduce_scatter_tensor_coalesced": 0,
}


def _fingerprint(op: str, args) -> int:
    """What every rank must agree on: the op, and the element counts and dtypes of the
    tensors that must match (as NCCL: shapes may differ where the counts agree)."""
    if op in ("all_to_all", "all_to_all_single", "barrier"):
        agreed = []
    elif op in _AGREED_ARG:
        agreed = _tensors(args[_AGREED_ARG[op] : _AGREED_ARG[op] + 1])
    else:
        agreed = _tensors(args)
    text = op + ";" + ";".join(f"{t.numel()}{t.dtype}" for t in agreed)
    return zlib.crc32(text.encode())


def _check(pg, info: dict, op: str, args) -> None:
    """Before collective `op` reaches gloo: every rank of the group issues the same one (op,
    element counts, dtypes), or every rank raises CollectiveMismatchError; a rank that does not come
    makes the others' exchange time out (CollectiveTimeoutError). One all-gather of two
    integers on a helper gloo group. (PyTorch's ProcessGroupWrapper does this for
    TORCH_DISTRIBUTED_DEBUG=DETAIL with a barrier besides, and compares gloo's sequence
    numbers, which point-to-point ops advance unevenly across ranks: a false alarm as soon
    as a pipeline has run.)"""
    mine = torch.tensor([_fingerprint(op, args), info.setdefault("checked", 0)], dtype=torch.int64)
    info["checked"] += 1
    out = torch.empty(info["size"] * 2, dtype=torch.int64)
    _pending.checking = True
    try:
        info["helper"]._allgather_base(out, mine).wait()
    except RuntimeError as e:
        _convert(pg, op, args, e)
    finally:
        _pending.checking = False
    if not bool((out.view(-1, 2) == mine).all()):
        err = RuntimeError("Detected mismatch between collectives on ranks")
        # Every rank saw the same fingerprints, so every rank is here: each one's account of
        # what it issued goes over the same helper group (not the store, which the rank
        # hosting it takes down when it exits first).
        err.neuron_accounts = _exchange_accounts(info, op, args)
        _convert(pg, op, args, err)


_ACCOUNT_BYTES = 1024


def _sequence(info: dict, op: str):
    """The collective's number in its group, as gloo (and the Flight Recorder) count them."""
    try:
        return info["backend"]._get_sequence_number_for_group() + (0 if op in ("send", "recv") else 1)
    except Exception:  # noqa: BLE001
        return "?"


def _exchange_accounts(info: dict, op: str, args) -> dict | None:
    """{group rank: what it issued} of the other ranks, by an all-gather on the helper group."""
    text = _describe(op, _sequence(info, op), _tensors(args)).encode()[:_ACCOUNT_BYTES]
    mine = torch.zeros(_ACCOUNT_BYTES, dtype=torch.uint8)
    mine[: len(text)] = torch.tensor(list(text), dtype=torch.uint8)
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


def _describe(op: str, seq, tensors) -> str:
    shapes = ", ".join(f"{list(t.shape)} {str(t.dtype).removeprefix('torch.')}" for t in tensors)
    return f"{op} #{seq}" + (f" [{shapes}]" if shapes else "")


def _tensors(args) -> list:
    out = []
    for a in args:
        if isinstance(a, torch.Tensor):
            out.append(a)
        elif isinstance(a, (list, tuple)):
            out.extend(_tensors(a))
    return out


def _peer_reports(info: dict, seq, mine: str, grace_s: float) -> dict[int, str | None]:
    """Each other rank's pending collective on the group, as it reported it (None: no report
    within `grace_s`)."""
    store, me, size = info["store"], info["rank"], info["size"]
    try:
        store.set(f"{_KEY}/pending/{me}", mine)
    except Exception:  # noqa: BLE001 - the store may be gone with rank 0; the diagnosis degrades
        return {}
    reports: dict[int, str | None] = {r: None for r in range(size) if r != me}
    deadline = time.monotonic() + grace_s
    while True:
        for r in [r for r, v in reports.items() if v is None]:
            key = f"{_KEY}/pending/{r}"
            try:
                if store.check([key]):
                    reports[r] = store.get(key).decode()
            except Exception:  # noqa: BLE001
                return reports
        if all(v is not None for v in reports.values()) or time.monotonic() > deadline:
            return reports
        time.sleep(0.1)


def _diagnose(pg, op: str, args, err: BaseException) -> BaseException | None:
    """The typed error for `err` raised by collective `op` of neuron group `pg` (or by its
    check), or None for other errors."""
    name = getattr(pg, "group_name", None)
    info = _groups.get(name)
    if info is None:
        return None
    text = str(err)
    mismatch = "Detected mismatch between collectives" in text
    timeout = re.search(r"[Tt]imed out|Connection closed by peer|Connection reset", text)
    if not (mismatch or timeout):
        return None
    seq = _sequence(info, op)
    tensors = _tensors(args)
    mine = _describe(op, seq, tensors)
    _dumped.set()
    _request_dumps()
    desc = getattr(pg, "group_desc", "") or ""
    where = f"neuron process group '{name}'" + (f" ({desc})" if desc else "")
    head = f"[rank {info['rank']}] {where}, collective {mine}"
    if mismatch:
        # Each rank's own account of what it issued.
        peers = _peers(info, seq, mine, "issued", getattr(err, "neuron_accounts", None))
        exc = CollectiveMismatchError(f"{head}: Detected mismatch between collectives on ranks: {peers}")
    else:
        peers = _peers(info, seq, mine, "is waiting in")
        cause = text.strip().splitlines()[-1][:300] if text.strip() else ""
        elapsed = time.monotonic() - getattr(_pending, "t0", 0.0)
        what = (
            f"did not complete within {info['timeout']}"
            if elapsed >= info["timeout"].total_seconds() - 0.5
            else "failed: a peer's connection closed (its process exited or died)"
        )
        exc = CollectiveTimeoutError(f"{head} {what}: {peers} ({cause})")
    # The check stopped the collective before gloo recorded it: the dump gets it as
    # issued, not started, as the recorder has collectives whose peers never came.
    stopped = mismatch or getattr(_pending, "checking", False)
    path = _dump_on_error(_entry(pg, name, desc, op, tensors, info) if stopped else None)
    if path:
        exc.args = (f"{exc.args[0]}\nFlight Recorder dump: {path}",)
    return exc


def _peers(info: dict, seq, mine: str, verb: str, reports: dict | None = None) -> str:
    issued = verb == "issued"  # a mismatch: every rank joined the check's exchange
    if reports is None:
        reports = _peer_reports(info, seq, mine, _MISMATCH_GRACE_S if issued else _GRACE_S)
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


def _convert(pg, op, args, err):
    if isinstance(err, (CollectiveTimeoutError, CollectiveMismatchError)):
        raise err
    try:
        exc = _diagnose(pg, op, args, err)
    except Exception:  # noqa: BLE001 - a failed diagnosis must not hide the collective's error
        exc = None
    if exc is None:
        raise err
    raise exc from err


_OPS = {
    "allreduce": "all_reduce",
    "allreduce_coalesced": "all_reduce_coalesced",
    "broadcast": "broadcast",
    "reduce": "reduce",
    "allgather": "all_gather",
    "_allgather_base": "all_gather_into_tensor",
    "allgather_coalesced": "all_gather_coalesced",
    "allgather_into_tensor_coalesced": "all_gather_into_tensor_coalesced",
    "gather": "gather",
    "scatter": "scatter",
    "reduce_scatter": "reduce_scatter",
    "_reduce_scatter_base": "reduce_scatter_tensor",
    "reduce_scatter_tensor_coalesced": "reduce_scatter_tensor_coalesced",
    "alltoall_base": "all_to_all_single",
    "alltoall": "all_to_all",
    "send": "send",
    "recv": "recv",
    "recv_anysource": "recv",
    "barrier": "barrier",
}


_pending = threading.local()  # the last send/recv/barrier this thread issued on a neuron group


def _wait(orig):
    @functools.wraps(orig)
    def wait(self, *args, **kwargs):
        try:
            return orig(self, *args, **kwargs)
        except RuntimeError as e:
            last = getattr(_pending, "call", None)
            if last is None or last[0].group_name not in _groups:
                raise
            # (any other wait of this thread: the error is converted only if it is a timeout,
            # and then describes the last p2p op or barrier, which is what blocks)
            _convert(*last, e)

    wait._neuron = True
    return wait


def _patch(method: str, op: str):
    orig = getattr(dist.ProcessGroup, method)
    p2p = op in ("send", "recv")

    @functools.wraps(orig)
    def call(self, *args, **kwargs):
        _pending.t0 = time.monotonic()
        info = _groups.get(self.group_name)
        if p2p or op == "barrier":
            # p2p is not fingerprinted (a send's peer issues the other half): a missing
            # match surfaces as gloo's timeout in Work.wait, which diagnoses this call.
            _pending.call = (self, op, args) if info is not None else None
        if not p2p and info is not None and info["helper"] is not None:
            _check(self, info, op, args)
        try:
            return orig(self, *args, **kwargs)
        except RuntimeError as e:
            _convert(self, op, args, e)

    call._neuron = True
    setattr(dist.ProcessGroup, method, call)


def install() -> None:
    """Route the errors of neuron groups' collectives through the diagnosis (idempotent)."""
    if getattr(dist.ProcessGroup.allreduce, "_neuron", False):
        return
    for method, op in _OPS.items():
        if hasattr(dist.ProcessGroup, method):
            _patch(method, op)
    dist.Work.wait = _wait(dist.Work.wait)


# ---------------------------------------------------------------------------
# Flight Recorder


def _fr_on() -> bool:
    return settings.get("TORCH_FR_BUFFER_SIZE") > 0 and bool(settings.get("TORCH_FR_DUMP_TEMP_FILE"))


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
        time.sleep(1.0)
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
            _watcher = threading.Thread(target=_watch, args=(store,), name="neuron-fr-dump", daemon=True)
            _watcher.start()


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
    prefix = prefix or settings.get("TORCH_FR_DUMP_TEMP_FILE")
    if not prefix:
        raise ValueError("dump_flight_recorder: no path prefix given and TORCH_FR_DUMP_TEMP_FILE is unset")
    if settings.get("TORCH_FR_BUFFER_SIZE") <= 0:
        raise RuntimeError(
            "dump_flight_recorder: the Flight Recorder is off; set TORCH_FR_BUFFER_SIZE (e.g. 2000) "
            "before the first process group is created"
        )
    # Without the recorder's stack traces: symbolizing them takes seconds at a timeout
    # (the collective the check stopped carries its Python stack).
    data = torch._C._distributed_c10d._dump_fr_trace(True, False, False)
    data = _edited(data, _pending_entry)
    rank = dist.get_rank() if dist.is_initialized() else settings.get("RANK")
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
