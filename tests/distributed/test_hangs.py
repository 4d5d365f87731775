"""Distributed bugs that would hang or abort a job end, on every waiting rank, in a typed
error naming the group, the collective and the other ranks, within the group's timeout plus
a few seconds; the same scripts without the bug run clean; PyTorch's Flight Recorder
analyzer reads the dumps. Plain processes (torchrun would tear the survivors down itself)
from workers/hang_worker.py."""

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


def _env():
    env = worker_env()
    env.pop("TORCH_DISTRIBUTED_DEBUG", None)
    return env


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _launch(case, *flags, extra_env=None, world=2):
    """Each rank's RESULT: "OK", or "<seconds> <ExceptionType>: <message>"."""
    port = _free_port()
    procs = []
    for r in range(world):
        env = _env()
        env.update(RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE=str(world), LOCAL_WORLD_SIZE=str(world))
        env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), **(extra_env or {}))
        cmd = [sys.executable, str(WORKERS / "hang_worker.py"), case, str(TIMEOUT_S), *flags]
        procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    outs = [p.communicate(timeout=60)[0] for p in procs]  # a hang fails the test here
    results = {}
    for r, out in enumerate(outs):
        line = [l for l in out.splitlines() if l.startswith(f"RESULT {r} ")]
        assert line, out[-4000:]
        results[r] = line[0].split(" ", 2)[2]
    return results


def _error(result):
    seconds, rest = result.split(" ", 1)
    assert float(seconds) <= TIMEOUT_S + 5, result
    return rest


@pytest.mark.multiprocess
@pytest.mark.slow
@pytest.mark.parametrize("case", ["skip_barrier", "skip_branch", "swap", "shapes", "membership", "send"])
def test_bug_free_script_gives_no_alarm(case):
    assert _launch(case, "--fixed") == {0: "OK", 1: "OK"}


@pytest.mark.multiprocess
@pytest.mark.slow
def test_mismatched_shapes_raise_on_every_rank_naming_both_shapes():
    res = _launch("shapes")
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


FR_TRACE = [sys.executable, "-m", "torch.distributed.flight_recorder.fr_trace"]


def _fr_dumps(case, tmp_path):
    env = {"TORCH_FR_BUFFER_SIZE": "200", "TORCH_FR_DUMP_TEMP_FILE": str(tmp_path / "rank")}
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
