"""Point-to-point messages between the ranks of one dry run: what a rank sends, its peer receives.

The receiver of a ``send``/``recv`` has no value of its own to take for the sender's (the rule of
the other collectives, ``collective_values``), so a dry run passes the real message. The ranks of a dry run
of a torchrun job are forked from one parent (``launch.scheduler``) and share a directory: each send writes
its message to a file named by (group, source, destination, sequence number), and the matching
receive waits for that file. A message is what the sender has: the pickled objects of
``send_object_list`` (always), or a tensor's value where the dry run knows it (a flag, a vote, a
size), else a marker that it is not known. Sends never wait, as the fake process group's do not.

A receive waits for at most ``TIMEOUT`` of its peer's running: the clock stops while the peer has
not started (the parent starts at most ``--workers`` ranks at once, and a large job's last stages
start long after its first waits for them) or itself waits for a message (a pipeline's first stage
waits for a gradient the whole pipeline computes). A rank that waits tells the parent, which does
not count it among the ranks running at once: a pipeline's stages wait for each other, and all
must run. Why a message did not come is told by ``receive`` (and ``explain``): ``"absent"`` (its
sender does not run in this dry run: ``--ranks``, or a single process), ``"exited"`` (it ended
without sending it), ``"stuck"`` (every rank running waits for another's message, none of which is
there: the job would hang) or ``"timeout"``.
"""

from __future__ import annotations

import collections
import io
import os
import pickle
import time

_NOT_KNOWN = b"not known"
TIMEOUT = 600.0  # seconds a receive waits for its message: c10d's default for NCCL groups

_dir: str | None = None  # the shared directory, in a rank of a dry run of a torchrun job
_ranks: frozenset = frozenset()  # the global ranks this dry run runs with this one (see running())
_notify = None  # tells the parent this rank waits (True) or runs again (False)
_sequence: collections.Counter = collections.Counter()  # (kind, group, src, dst) -> messages so far


RUNNING = "running.json"  # in the shared directory: the ranks running with each other now, when it exists


def set_running(raw_dir: str, ranks, decided: bool = True) -> None:
    """In the parent: the ranks that run together from now on (a dry run by classes runs them in
    rounds); not `decided` while it plans them (a receive then waits for its peer to start)."""
    import json

    os.makedirs(os.path.join(raw_dir, "p2p"), exist_ok=True)
    path = os.path.join(raw_dir, "p2p", RUNNING)
    with open(path + ".tmp", "w") as f:
        json.dump({"ranks": sorted(ranks), "decided": decided}, f)
    os.replace(path + ".tmp", path)


def _running() -> frozenset | None:
    """The ranks that may send to this one: the parent's latest word (set_running; None while it
    is deciding), else the ranks it was forked with."""
    import json

    try:
        with open(os.path.join(_dir, RUNNING)) as f:
            d = json.load(f)
    except (OSError, ValueError):
        return _ranks
    return frozenset(d["ranks"]) if d["decided"] else None


def _absent(src: int) -> bool:
    running = _running()
    return running is not None and src not in running


def configure(raw_dir: str, rank: int, ranks, notify) -> None:
    """In a forked rank: the directory the ranks share, this rank, the ranks that run, how to tell
    the parent."""
    global _dir, _ranks, _notify
    _dir = os.path.join(raw_dir, "p2p")
    _ranks, _notify = frozenset(ranks), notify
    _sequence.clear()
    os.makedirs(_dir, exist_ok=True)
    with open(os.path.join(_dir, f"started.{rank}"), "w"):  # its receivers' clocks run from now
        pass


def _peer_runs(src: int) -> bool:
    """Whether `src` has started and is not waiting for a message itself (its receivers' clock runs)."""
    started, waits = (os.path.join(_dir, f"{what}.{src}") for what in ("started", "waiting"))
    return os.path.exists(started) and not os.path.exists(waits)


def _path(kind: str, group: str, src: int, dst: int) -> str:
    key = (kind, group, src, dst)
    _sequence[key] += 1
    safe = "".join(c if c.isalnum() or c in "-_" else "_" for c in group)
    return os.path.join(_dir, f"{kind}.{safe}.{src}-{dst}.{_sequence[key]}")


def send(kind: str, group: str, src: int, dst: int, payload: bytes) -> None:
    """Leaves `payload` for `dst` (the next message of this kind from `src` in `group`)."""
    if _dir is None:
        return
    path = _path(kind, group, src, dst)
    with open(path + ".tmp", "wb") as f:
        f.write(payload)
    os.replace(path + ".tmp", path)


def send_tensor(group: str, src: int, dst: int, value) -> None:
    """A tensor's value (a host tensor), or None when the dry run does not know it."""
    if _dir is None:
        return
    if value is None:
        send("tensor", group, src, dst, _NOT_KNOWN)
        return
    import torch

    buf = io.BytesIO()
    torch.save(value, buf)
    send("tensor", group, src, dst, buf.getvalue())


def receive(kind: str, group: str, src: int, dst: int, timeout: float) -> tuple[bytes | None, str]:
    """The next message of this kind from `src` to `dst` in `group`: (payload, "") or (None, why)."""
    if _dir is None or _absent(src):
        return None, "absent"
    path = _path(kind, group, src, dst)
    if not os.path.exists(path):
        why = _wait(path, src, dst, timeout)
        if why:
            return None, why
    with open(path, "rb") as f:
        payload = f.read()
    os.remove(path)  # read once: a long run leaves no message behind
    return payload, ""


def _wait(path: str, src: int, dst: int, timeout: float) -> str:
    """Waits for `path`; "" once it is there, else why it will not be."""
    mine, stuck = os.path.join(_dir, f"waiting.{dst}"), os.path.join(_dir, f"stuck.{dst}")
    with open(mine, "w") as f:  # what this rank waits for: the parent tells a deadlock by it
        f.write(path)
    if _notify is not None:
        _notify(True)
    deadline = time.monotonic() + timeout
    try:
        while not os.path.exists(path):
            if not _peer_runs(src):
                deadline = time.monotonic() + timeout
            # the peer writes its messages before its recording: an exit is seen after its last message
            if os.path.exists(os.path.join(os.path.dirname(_dir), f"rank{src}.json")) and not os.path.exists(path):
                return "exited"
            if _reads(stuck) == path and not os.path.exists(path):
                return "stuck"
            if _absent(src) and not os.path.exists(path):  # a dry run by classes left it out
                return "absent"
            if time.monotonic() > deadline:
                return "timeout"
            time.sleep(0.02)
        return ""
    finally:
        os.remove(mine)  # before the parent hears it runs again
        if _notify is not None:
            _notify(False)


NO_MESSAGE = {  # why a message is not there: (what happened, the way out)
    "absent": ("rank {src} does not run in this dry run", "Include rank {src} in --ranks"),
    "exited": ("rank {src} ended without sending this message (a real run would hang here)", "See rank {src}'s output"),
    "stuck": ("every rank running waits for another's message: the job would hang here", "See the ranks' output"),
    "timeout": ("rank {src} ran {timeout:.0f} s without sending this message", "See rank {src}'s output"),
}


def explain(why: str, src: int) -> tuple:
    """What happened to the message `src` did not send (`why`, from ``receive``), and the way out."""
    return tuple(m.format(src=src, timeout=TIMEOUT) for m in NO_MESSAGE[why])


def _reads(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read()
    except FileNotFoundError:
        return None


def find_deadlock(raw_dir: str, waiting) -> None:
    """In the parent, once every rank running waits and none is left to start: if none of the messages
    they wait for is there, none will be (no rank runs to send it), so each is told (``stuck``)."""
    awaited = {r: _reads(os.path.join(raw_dir, "p2p", f"waiting.{r}")) for r in waiting}
    if not awaited or any(p is None or os.path.exists(p) for p in awaited.values()):
        return
    for r, p in awaited.items():
        with open(os.path.join(raw_dir, "p2p", f"stuck.{r}.tmp"), "w") as f:
            f.write(p)
        os.replace(os.path.join(raw_dir, "p2p", f"stuck.{r}.tmp"), os.path.join(raw_dir, "p2p", f"stuck.{r}"))


def receive_tensor(group: str, src: int, dst: int, timeout: float):
    """The sender's value of the tensor it sent (a host tensor), or None when it is not known."""
    payload, _why = receive("tensor", group, src, dst, timeout)
    if payload is None or payload == _NOT_KNOWN:
        return None
    import torch

    return torch.load(io.BytesIO(payload), weights_only=True)


def pickle_objects(objects: list) -> bytes:
    """The objects as c10d pickles them (its pickler), as one message."""
    from .. import _torch_private

    return pickle.dumps([_torch_private.c10d_pickle(obj) for obj in objects])


def unpickle_objects(payload: bytes) -> list:
    """The sender's objects, each unpickled as c10d does; and their pickled sizes."""
    from .. import _torch_private

    parts = pickle.loads(payload)
    return [_torch_private.c10d_unpickle(p) for p in parts], [len(p) for p in parts]
