"""Distributed bugs that would hang or abort a job end, on every waiting rank, in a typed
error naming the group, the collective and the other ranks, within the group's timeout plus
a few seconds; the same scripts without the bug run clean; PyTorch's Flight Recorder
analyzer reads the dumps. Plain processes (torchrun would tear the survivors down itself)
from workers/hang_worker.py, with the store hosted by the launcher (this process), as
torchrun's agent hosts it; one test runs torchrun itself.

TORCH_NEURONX_CHECK_COLLECTIVES: the default (1) records each collective and names a
mismatch when the collective fails (at the timeout, or when gloo aborts a rank); 2 checks
before each collective, so every rank raises at once."""

import datetime
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch.distributed as dist

from helpers import worker_env

WORKERS = Path(__file__).parent / "workers"

TIMEOUT_S = 5


CHECK = {"TORCH_NEURONX_CHECK_COLLECTIVES": "2"}  # the check before each collective


def _env():
    env = worker_env()
    env.pop("TORCH_DISTRIBUTED_DEBUG", None)
    env.pop("TORCH_NEURONX_CHECK_COLLECTIVES", None)
    return env


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run_ranks(cmd, world, extra_env=None) -> list:
    """(returncode, output) of each of `world` processes running `cmd` as the ranks of one job."""
    # The job's store, hosted here as torchrun's agent hosts it: it outlives every rank.
    store = dist.TCPStore("127.0.0.1", 0, world, True, wait_for_workers=False, timeout=datetime.timedelta(seconds=60))
    procs = []
    for r in range(world):
        env = _env()
        env.update(RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE=str(world), LOCAL_WORLD_SIZE=str(world))
        env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(store.port), TORCHELASTIC_USE_AGENT_STORE="True")
        env.update(extra_env or {})
        procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    outs = [p.communicate(timeout=90)[0] for p in procs]  # a hang fails the test here
    return [(p.returncode, out) for p, out in zip(procs, outs)]


def _launch(case, *flags, extra_env=None, world=2, aborts=()):
    """Each rank's RESULT: "OK", or "<seconds> <ExceptionType>: <message>"; for the ranks in
    `aborts`, which may end without one (gloo aborts the process), their whole output."""
    cmd = [sys.executable, str(WORKERS / "hang_worker.py"), case, str(TIMEOUT_S), *flags]
    results = {}
    for r, (_, out) in enumerate(_run_ranks(cmd, world, extra_env)):
        line = [l for l in out.splitlines() if l.startswith(f"RESULT {r} ")]
        assert line or r in aborts, out[-4000:]
        results[r] = line[0].split(" ", 2)[2] if line else out
    return results


def _error(result):
    seconds, rest = result.split(" ", 1)
    assert float(seconds) <= TIMEOUT_S + 5, result
    return rest


SKIPS = ["skip_then_all_gather_into_tensor", "skip_then_reduce_scatter_tensor", "skip_then_monitored_barrier"]


@pytest.mark.multiprocess
@pytest.mark.slow
@pytest.mark.parametrize("case", ["skip_barrier", "skip_branch", "swap", "shapes", "membership", "send"])
def test_bug_free_script_gives_no_alarm(case):
    assert _launch(case, "--fixed") == {0: "OK", 1: "OK"}


@pytest.mark.multiprocess
@pytest.mark.slow
@pytest.mark.parametrize("case", ["swap", "send", "skip_then_all_gather_into_tensor"])
def test_bug_free_script_gives_no_alarm_with_the_check(case):
    world = 4 if case in SKIPS else 2
    assert _launch(case, "--fixed", extra_env=CHECK, world=world) == dict.fromkeys(range(world), "OK")


@pytest.mark.multiprocess
@pytest.mark.slow
@pytest.mark.parametrize("case", SKIPS)
def test_bug_free_script_of_four_ranks_gives_no_alarm(case):
    assert _launch(case, "--fixed", world=4) == dict.fromkeys(range(4), "OK")


@pytest.mark.multiprocess
@pytest.mark.slow
@pytest.mark.parametrize("case", SKIPS)
def test_collective_skipped_before_another_names_the_rank_and_every_ranks_collective(case):
    # 4 ranks; rank 2 skips the second all_reduce and goes on to `then` (torch 2.13 issues
    # all_gather_into_tensor / reduce_scatter_tensor as ProcessGroup.all_gather_single /
    # reduce_scatter_single): every rank, the one that skipped included, names it
    then = case.removeprefix("skip_then_")
    res = _launch(case, world=4)
    for r in range(4):
        err = _error(res[r])
        assert err.startswith("CollectiveMismatchError:") and "'0' (default_pg)" in err, err
        assert f"Detected mismatch between collectives on ranks: rank 2 issued {then} #3" in err, err
        assert "ranks [0, 1, 3] issued all_reduce #3 [[4, 8] float32]" in err, err
    assert (
        f"[rank 2] neuron process group '0' (default_pg), collective {'barrier #4' if 'reduce' in then else then}"
        in res[2]
    )


@pytest.mark.multiprocess
@pytest.mark.slow
def test_skipped_collective_under_torchrun_is_named_by_the_first_rank_to_fail():
    # torchrun tears the other ranks down when the first one fails: that one has the whole account
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=4"]
    cmd += [str(WORKERS / "hang_worker.py"), SKIPS[0], str(TIMEOUT_S), "--raise"]
    p = subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=120)
    assert p.returncode != 0
    lines = [l for l in (p.stdout + p.stderr).splitlines() if l.startswith("RESULT ")]
    assert lines, (p.stdout + p.stderr)[-4000:]
    for line in lines:
        assert "CollectiveMismatchError" in line and "rank 2 issued all_gather_into_tensor #3" in line, line
        assert "ranks [0, 1, 3] issued all_reduce #3" in line, line


@pytest.mark.multiprocess
@pytest.mark.slow
@pytest.mark.parametrize("case", ["shapes", "shapes_again"])
def test_mismatched_shapes_are_named_by_default_where_gloo_aborts_the_receiving_rank(case):
    # Rank 0 all_reduces 32 elements, rank 1 64: gloo aborts rank 0 when rank 1's data comes
    # in; rank 1 names both shapes from rank 0's record, at once, not at the timeout. In
    # "shapes_again" rank 0's collective repeats its previous one (which it published).
    res = _launch(case, aborts=(0,))
    assert "Received data size doesn't match expected size" in res[0], res[0][-4000:]
    err = _error(res[1])
    assert float(res[1].split()[0]) < TIMEOUT_S, res[1]
    n = 2 if case == "shapes" else 3
    assert err.startswith("CollectiveMismatchError: [rank 1] neuron process group '0' (default_pg), ")
    assert f"collective all_reduce #{n} [[8, 8] float32] failed: a peer's connection closed" in err, err
    assert f"rank 0 issued all_reduce #{n} [[4, 8] float32]" in err, err
    assert f"rank 1 issued all_reduce #{n} [[8, 8] float32]" in err, err
    assert "TORCH_NEURONX_CHECK_COLLECTIVES=2 raises on every rank instead" in err, err


@pytest.mark.multiprocess
@pytest.mark.slow
def test_mismatched_shapes_raise_on_every_rank_naming_both_shapes():
    res = _launch("shapes", extra_env=CHECK)
    for r in (0, 1):
        err = _error(res[r])
        assert err.startswith("CollectiveMismatchError:"), err
        assert "all_reduce" in err and "'0' (default_pg)" in err, err
        assert "Detected mismatch between collectives on ranks" in err, err
        other, mine, theirs = (
            (1, "[[4, 8] float32]", "[[8, 8] float32]") if r == 0 else (0, "[[8, 8] float32]", "[[4, 8] float32]")
        )
        assert f"collective all_reduce #2 {mine}: " in err and f"rank {other} issued all_reduce #2 {theirs}" in err, err


@pytest.mark.multiprocess
@pytest.mark.slow
def test_swapped_collectives_raise_on_every_rank():
    res = _launch("swap")
    assert "collective all_reduce #2" in _error(res[0]) and "rank 1 issued broadcast #2" in _error(res[0]), res
    assert "collective broadcast #2" in _error(res[1]) and "rank 0 issued all_reduce #2" in _error(res[1]), res


@pytest.mark.multiprocess
@pytest.mark.slow
def test_collective_skipped_in_a_branch_raises_on_every_rank():
    res = _launch("skip_branch")
    assert "collective all_reduce #2 [[4, 8] float32]" in _error(res[0]), res
    assert "rank 1 issued barrier #2" in _error(res[0]), res
    assert "CollectiveMismatchError" in _error(res[1]) and "rank 0 issued all_reduce #2" in _error(res[1]), res


@pytest.mark.multiprocess
@pytest.mark.slow
def test_skipped_barrier_times_out_naming_the_absent_rank():
    res = _launch("skip_barrier")
    err = _error(res[0])
    assert float(res[0].split()[0]) >= TIMEOUT_S - 0.5, res[0]
    assert err.startswith(
        "CollectiveTimeoutError: [rank 0] neuron process group '0' (default_pg), collective barrier #"
    )
    assert f"did not complete within 0:00:0{TIMEOUT_S}: ranks [1] did not arrive" in err, err
    assert issubclass(_exc("CollectiveTimeoutError"), dist.DistBackendError)


@pytest.mark.multiprocess
@pytest.mark.slow
def test_send_without_recv_times_out_on_both_ranks_each_naming_the_other():
    res = _launch("send")
    assert "collective send #" in _error(res[0]) and "rank 1 is waiting in barrier #" in _error(res[0]), res
    assert "collective barrier #" in _error(res[1]) and "rank 0 is waiting in send #" in _error(res[1]), res
    assert "[[4, 8] float32]" in _error(res[1])


@pytest.mark.multiprocess
@pytest.mark.slow
def test_wrong_group_ends_on_every_rank():
    res = _launch("membership")
    assert "CollectiveTimeoutError: [rank 0] neuron process group '0'" in _error(res[0]), res
    assert "ranks [1] did not arrive" in _error(res[0]), res
    # new_group's own timeout is honoured
    assert "CollectiveTimeoutError: [rank 1] neuron process group '1'" in _error(res[1]), res
    assert "collective all_reduce #1 [[4, 8] float32] did not complete within 0:00:05: ranks [0]" in _error(res[1])


def _exc(name):
    from torch_neuronx.distributed import hangs

    return getattr(hangs, name)


@pytest.mark.parametrize("seconds", [0, -1])
def test_zero_or_negative_timeout_is_refused(seconds):
    store = dist.HashStore()
    with pytest.raises(ValueError, match="timeout must be a positive datetime.timedelta"):
        dist.init_process_group(
            "neuron", rank=0, world_size=1, store=store, timeout=datetime.timedelta(seconds=seconds)
        )
    assert not dist.is_initialized()


@pytest.mark.multiprocess
def test_record_threads_end_before_python_finalises(tmp_path):
    # A daemon thread still inside a store call when Python finalises aborts the process as it
    # re-takes the GIL ("terminate called without an active exception", seen at the end of
    # multi-rank jobs): the publisher and the dump watcher are ended and joined at exit. The
    # hook registered first runs last, after the package's own.
    code = """
import atexit, threading
atexit.register(lambda: print("LEFT", sorted(t.name for t in threading.enumerate() if t.daemon)))
import torch, torch.distributed as dist
dist.init_process_group("neuron")
dist.all_reduce(torch.ones(4, device="neuron"))
print("RUNNING", sorted(t.name for t in threading.enumerate() if t.daemon))
"""
    fr = {"TORCH_FR_BUFFER_SIZE": "20", "TORCH_FR_DUMP_TEMP_FILE": str(tmp_path / "rank")}
    for rc, out in _run_ranks([sys.executable, "-c", code], 2, fr):
        assert rc == 0, out[-3000:]
        assert "RUNNING ['neuron-collective-records', 'neuron-fr-dump']" in out, out[-3000:]
        assert "LEFT []" in out, out[-3000:]


FR_TRACE = [sys.executable, "-m", "torch.distributed.flight_recorder.fr_trace"]


def _fr_dumps(case, tmp_path):
    env = {"TORCH_FR_BUFFER_SIZE": "200", "TORCH_FR_DUMP_TEMP_FILE": str(tmp_path / "rank")}
    if case == "shapes":
        env.update(CHECK)  # every rank survives the mismatch (by default gloo aborts one) and dumps
    res = _launch(case, extra_env=env)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rank0", "rank1"], res
    out = subprocess.run([*FR_TRACE, str(tmp_path), "-p", "rank"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr[-3000:]
    return res, out.stdout + out.stderr


@pytest.mark.multiprocess
@pytest.mark.slow
def test_fr_trace_names_the_rank_that_skipped_a_barrier(tmp_path):
    res, report = _fr_dumps("skip_barrier", tmp_path)
    assert f"Flight Recorder dump: {tmp_path / 'rank0'}" in res[0], res
    assert "Not all ranks joining collective, sequence number: 3" in report, report
    assert "collective: gloo:barrier" in report and "missing ranks: {1}" in report, report


@pytest.mark.multiprocess
@pytest.mark.slow
def test_fr_trace_names_the_culprit_of_mismatched_shapes(tmp_path):
    _, report = _fr_dumps("shapes", tmp_path)
    assert "Culprit rank" in report and "SIZE_OR_SYNTAX_MISMATCH" in report, report
    assert "[[8, 8]]" in report and "[[4, 8]]" in report, report
    assert "hang_worker.py" in report  # the stack of the collective the check stopped


def test_dump_on_demand_and_bad_dumps(tmp_path, monkeypatch):
    import pickle

    from torch_neuronx.distributed import dump_flight_recorder, load_flight_recorder

    monkeypatch.delenv("TORCH_FR_BUFFER_SIZE", raising=False)
    with pytest.raises(RuntimeError, match="TORCH_FR_BUFFER_SIZE"):
        dump_flight_recorder(str(tmp_path / "rank"))
    monkeypatch.setenv("TORCH_FR_BUFFER_SIZE", "10")
    path = dump_flight_recorder(str(tmp_path / "rank"))
    d = load_flight_recorder(path)
    assert {"version", "pg_config", "entries"} <= set(d), d.keys()
    data = (tmp_path / "rank0").read_bytes()
    (tmp_path / "truncated").write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match="truncated or corrupt"):
        load_flight_recorder(str(tmp_path / "truncated"))
    (tmp_path / "other").write_bytes(pickle.dumps({"entries": []}))
    with pytest.raises(ValueError, match=r"lacks \['version', 'pg_config'\]"):
        load_flight_recorder(str(tmp_path / "other"))


@pytest.mark.multiprocess
@pytest.mark.slow
def test_fr_trace_entry_point_names_a_truncated_dump(tmp_path):
    _fr_dumps("shapes", tmp_path)
    ours = [sys.executable, "-m", "torch_neuronx.distributed.fr_trace", str(tmp_path), "-p", "rank"]
    ok = subprocess.run(ours, capture_output=True, text=True, timeout=60, env=_env())
    assert ok.returncode == 0 and "Culprit rank" in ok.stdout + ok.stderr, ok.stderr[-3000:]
    data = (tmp_path / "rank1").read_bytes()
    (tmp_path / "rank1").write_bytes(data[: len(data) // 3])
    bad = subprocess.run(ours, capture_output=True, text=True, timeout=60, env=_env())
    assert bad.returncode == 2, bad.stderr[-3000:]
    assert f"fr_trace: {tmp_path / 'rank1'} is not a Flight Recorder dump (truncated or corrupt" in bad.stderr
    assert "Traceback" not in bad.stderr, bad.stderr[-3000:]
