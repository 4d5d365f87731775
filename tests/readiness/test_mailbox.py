"""The dry run's point-to-point mailbox on its own: a receive's clock runs only while its peer runs."""

import os
import threading
import time

import pytest

from torch_neuronx.readiness.dry import mailbox


@pytest.fixture
def rank1(tmp_path):
    """This process as rank 1 of a dry run of ranks 0 and 1; rank 0 is played by the test."""
    mailbox.configure(str(tmp_path), 1, [0, 1], None)
    yield tmp_path / "p2p"
    mailbox._dir = None


def _later(*steps):
    """Runs each (delay in seconds, action) in turn in a thread."""

    def run():
        for seconds, action in steps:
            time.sleep(seconds)
            action()

    t = threading.Thread(target=run)
    t.start()
    return t


def _touch(path, data=b""):
    return lambda: path.write_bytes(data)


def test_a_receive_does_not_time_out_while_its_peer_has_not_started(rank1):
    """A large job's last stages start long after its first waits for them (the parent starts
    --workers ranks at a time): that wait is not the peer failing to send."""
    t = _later((1.0, _touch(rank1 / "started.0")), (0.1, _touch(rank1 / "objects.g.0-1.1", b"hello")))
    assert mailbox.receive("objects", "g", 0, 1, timeout=0.5) == (b"hello", "")
    t.join()


def test_a_receive_does_not_time_out_while_its_peer_waits_itself(rank1):
    (rank1 / "started.0").touch()
    (rank1 / "waiting.0").touch()  # rank 0 waits for a message of its own (a pipeline's gradient)
    t = _later((1.0, lambda: os.remove(rank1 / "waiting.0")), (0.1, _touch(rank1 / "objects.g.0-1.1", b"grad")))
    assert mailbox.receive("objects", "g", 0, 1, timeout=0.5) == (b"grad", "")
    t.join()


def test_a_receive_times_out_after_its_peer_ran_that_long_without_sending(rank1):
    (rank1 / "started.0").touch()
    t0 = time.monotonic()
    assert mailbox.receive("objects", "g", 0, 1, timeout=0.3) == (None, "timeout")
    assert 0.3 <= time.monotonic() - t0 < 5
    reason, fix = mailbox.explain("timeout", 0)
    assert reason == f"rank 0 ran {mailbox.TIMEOUT:.0f} s without sending this message" and "rank 0" in fix


def test_a_receive_from_a_peer_that_ended_without_sending_is_told_at_once(rank1):
    (rank1 / "started.0").touch()
    (rank1.parent / "rank0.json").write_text("{}")  # its recording: it has ended
    assert mailbox.receive("objects", "g", 0, 1, timeout=60) == (None, "exited")
