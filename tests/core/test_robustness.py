"""Process-level behaviour: fork, interpreter exit, threads."""

import concurrent.futures
import subprocess
import sys
import textwrap

import pytest
import torch


def _run_script(tmp_path, code):
    # A file, not `python -c`: spawned children re-import the main module.
    script = tmp_path / "script.py"
    script.write_text(textwrap.dedent(code))
    return subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300)


def test_fork_after_init_raises_the_real_error(tmp_path):
    r = _run_script(
        tmp_path,
        """
        import multiprocessing as mp, torch
        def child(q):
            try:
                torch.ones(1, device="neuron"); q.put("ok")
            except RuntimeError as e:
                q.put(str(e))
        if __name__ == "__main__":
            torch.ones(1, device="neuron")
            for method in ("fork", "spawn"):
                ctx = mp.get_context(method); q = ctx.Queue()
                p = ctx.Process(target=child, args=(q,)); p.start()
                print(method, "|", q.get(timeout=120)); p.join()
    """,
    )
    assert r.returncode == 0, r.stderr
    lines = dict(line.split(" | ") for line in r.stdout.strip().splitlines())
    assert lines["fork"] == (
        "Cannot re-initialize Neuron runtime in forked subprocess. To use Neuron with "
        "multiprocessing, use the 'spawn' start method"
    )
    assert lines["spawn"] == "ok"


def test_fork_before_init_is_fine(tmp_path):
    r = _run_script(
        tmp_path,
        """
        import multiprocessing as mp, torch
        def child(q):
            q.put(str(torch.ones(1, device="neuron").device))
        if __name__ == "__main__":
            torch.manual_seed(0)
            ctx = mp.get_context("fork"); q = ctx.Queue()
            p = ctx.Process(target=child, args=(q,)); p.start(); print(q.get(timeout=120)); p.join()
    """,
    )
    assert r.stdout.strip() == "neuron:0", r.stderr


@pytest.mark.slow
def test_no_abort_at_exit_after_backward():
    script = textwrap.dedent("""
        import torch
        m = torch.nn.Linear(32, 32).to("neuron")
        m(torch.randn(4, 32, device="neuron")).sum().backward()
    """)
    procs = [subprocess.Popen([sys.executable, "-c", script], stderr=subprocess.PIPE, text=True) for _ in range(24)]
    failures = []
    for p in procs:
        _, err = p.communicate(timeout=300)
        if p.returncode != 0:
            failures.append((p.returncode, err[-300:]))
    assert not failures, failures


def test_threaded_host_to_device_copies():
    """transformers copies weights .to("neuron") from worker threads."""
    sources = [
        torch.randn(257 + i).to(dt)
        for i, dt in zip(range(200), [torch.float32, torch.bfloat16, torch.int64, torch.float16, torch.bool] * 40)
    ]
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        moved = list(pool.map(lambda t: t.to("neuron"), sources))
    for s, m in zip(sources, moved):
        assert m.device.type == "neuron" and torch.equal(s, m.cpu())
