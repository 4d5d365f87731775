"""Collectives that cannot complete end in a diagnosis, not a hang or an abort.

Three parts, each PyTorch's own machinery where it exists:

* Every multi-rank neuron group's gloo backend is wrapped in PyTorch's
  ``ProcessGroupWrapper`` (what ``TORCH_DISTRIBUTED_DEBUG=DETAIL`` does): before a
  collective reaches gloo, a monitored barrier and an all-gather of the collective's
  fingerprint (op, shapes, dtypes, sequence number) on a helper gloo group. gloo would
  abort the process on a size mismatch; the wrapper raises on every rank instead.
* The errors of a neuron group's collectives (the wrapper's, gloo's timeouts) are raised
  again as :class:`CollectiveMismatchError` / :class:`CollectiveTimeoutError`
  (``torch.distributed.DistBackendError``) naming the group, the collective's sequence
  number, op and shapes, and what each other rank was doing: each failing rank publishes
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
_GRACE_S = 3.0  # how long a failing rank waits for its peers' reports


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


def wrap_backend(backend, opts, timeout, keep):
    """`backend` (gloo) inside PyTorch's ProcessGroupWrapper, and the group registered for
    diagnoses; `keep` is given the helper gloo backend. Single-rank groups and TORCH_DISTRIBUTED_DEBUG=DETAIL (PyTorch wraps the
    backend itself then) keep the bare backend."""
    name = opts.group_id
    with _lock:
        _groups[name] = {
            "store": opts.store,
            "rank": opts.group_rank,
            "size": opts.group_size,
            "ranks": list(opts.global_ranks_in_group or range(opts.group_size)),
            "backend": backend,
            "timeout": timeout,
        }
    if opts.group_size <= 1 or dist.get_debug_level() == dist.DebugLevel.DETAIL:
        return backend
    helper_opts = dist.ProcessGroupGloo._Options()
    helper_opts._timeout = timeout
    helper_opts._devices = [dist.ProcessGroupGloo.create_default_device()]
    helper_opts.group_name = f"{name}:fingerprints"
    helper_opts.global_ranks_in_group = _groups[name]["ranks"]
    store = dist.PrefixStore(f"{_KEY}:fingerprints", opts.store)
    helper = dist.ProcessGroupGloo(store, opts.group_rank, opts.group_size, helper_opts)
    keep(helper)  # released from Python, as the group's own gloo is (backend.py)
    return torch._C._distributed_c10d._ProcessGroupWrapper(backend, helper)


def forget(name: str) -> None:
    with _lock:
        _groups.pop(name, None)


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


def _peer_reports(info: dict, seq, mine: str) -> dict[int, str | None]:
    """Each other rank's pending collective on the group, as it reported it (None: no report
    within the grace period, i.e. the rank is in no collective of this group)."""
    store, me, size = info["store"], info["rank"], info["size"]
    try:
        store.set(f"{_KEY}/pending/{me}", mine)
    except Exception:  # noqa: BLE001 - the store may be gone with rank 0; the diagnosis degrades
        return {}
    reports: dict[int, str | None] = {r: None for r in range(size) if r != me}
    deadline = time.monotonic() + _GRACE_S
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
    """The typed error for `err` raised by collective `op` of neuron group `pg`, or None."""
    name = getattr(pg, "group_name", None)
    info = _groups.get(name)
    if info is None:
        return None
    text = str(err)
    mismatch = "Detected mismatch between collectives" in text
    timeout = re.search(r"[Tt]imed out|monitoredBarrier|Connection closed by peer|Connection reset", text)
    if not (mismatch or timeout):
        return None
    try:
        seq = info["backend"]._get_sequence_number_for_group() + (0 if op in ("send", "recv") else 1)
    except Exception:  # noqa: BLE001
        seq = "?"
    mine = _describe(op, seq, _tensors(args))
    desc = getattr(pg, "group_desc", "") or ""
    where = f"neuron process group '{name}'" + (f" ({desc})" if desc else "")
    head = f"[rank {info['rank']}] {where}, collective {mine}"
    if mismatch:
        # Each rank's own account of what it issued: ProcessGroupWrapper's report of the
        # peer's fingerprint is garbled when the two collectives' tensor counts differ.
        peers = _peers(info, seq, mine, "issued")
        if "did not arrive" in peers:  # a peer's report lost (it exited with the store)
            peers = _fingerprints(text, info["ranks"])
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
    path = _dump_on_error()
    if path:
        exc.args = (f"{exc.args[0]}\nFlight Recorder dump: {path}",)
    return exc


_FP = re.compile(
    r"Rank (\d+) is running collective: CollectiveFingerPrint\(SequenceNumber=\d+,? ?OpType=(\w+)"
    r"(?:, TensorShape=(\[[^\]]*\]))?(?:, TensorDtypes=(\w+))?"
)


def _fingerprints(text: str, ranks: list[int]) -> str:
    """ProcessGroupWrapper's report of the two ranks' collectives, without the tensor options."""
    found = _FP.findall(text)
    if len(found) < 2:
        return text[text.index("Detected mismatch") :]
    return ", ".join(f"rank {ranks[int(r)]} issued {op} {shape} {dtype}".rstrip() for r, op, shape, dtype in found[:2])


def _peers(info: dict, seq, mine: str, verb: str) -> str:
    reports = _peer_reports(info, seq, mine)
    ranks = info["ranks"]
    absent = sorted(ranks[r] for r, v in reports.items() if v is None)
    elsewhere = [
        f"rank {ranks[r]} {verb} {v}" for r, v in sorted(reports.items()) if v and (v != mine or verb == "issued")
    ]
    parts = []
    if absent:
        parts.append(f"ranks {absent} did not arrive (they are in no collective of this group)")
    parts.extend(elsewhere)
    return "; ".join(parts) or "every rank is waiting in the same collective (a peer process may have died)"


def _convert(pg, op, args, err):
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
            if last is None:
                raise
            _convert(*last, e)

    wait._neuron = True
    return wait


def _patch(method: str, op: str):
    orig = getattr(dist.ProcessGroup, method)
    p2p = op in ("send", "recv", "barrier")

    @functools.wraps(orig)
    def call(self, *args, **kwargs):
        _pending.t0 = time.monotonic()
        if p2p:
            # Not fingerprinted (a send's peer issues the other half): a missing match
            # surfaces as gloo's timeout in Work.wait, which diagnoses this call.
            _pending.call = (self, op, args) if self.group_name in _groups else None
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


def _dump_on_error() -> str | None:
    if settings.get("TORCH_FR_BUFFER_SIZE") <= 0 or not settings.get("TORCH_FR_DUMP_TEMP_FILE"):
        return None
    try:
        return dump_flight_recorder()
    except OSError:
        return None


def dump_flight_recorder(prefix: str | None = None) -> str:
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
    data = torch._C._distributed_c10d._dump_fr_trace(True, True, False)
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
