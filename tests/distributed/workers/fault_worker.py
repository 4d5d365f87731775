"""Collectives that cannot complete must fail with a clear error within the
process-group timeout. Usage: fault_worker.py SCENARIO TIMEOUT_S
  kill      rank 1 dies (SIGKILL) before a collective
  hang      rank 1 stays alive but never joins the collective
  mismatch  ranks all_reduce tensors of different sizes
Rank 0 prints "FAILED-AS-EXPECTED <seconds> <error>" and exits 3."""

import datetime
import os
import signal
import sys
import time
import traceback

import torch
import torch.distributed as dist


def main():
    scenario, timeout_s = sys.argv[1], float(sys.argv[2])
    local_rank = int(os.environ["LOCAL_RANK"])
    dev = torch.device("neuron", local_rank)
    dist.init_process_group("neuron", timeout=datetime.timedelta(seconds=timeout_s))
    rank = dist.get_rank()
    x = torch.ones(1024, device=dev)
    dist.all_reduce(x)  # the group works
    assert x[0].item() == dist.get_world_size()
    if rank == 1:
        if scenario == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        if scenario == "hang":
            time.sleep(timeout_s * 1.6)
            os._exit(0)
    n = 1024 if (scenario != "mismatch" or rank == 0) else 4096
    y = torch.ones(n, device=dev)
    t0 = time.monotonic()
    try:
        dist.all_reduce(y)
        dist.all_reduce(y)
        torch.neuron.synchronize()
    except Exception as e:  # noqa: BLE001
        dt = time.monotonic() - t0
        msg = str(e).splitlines()[0][:300]
        print(f"rank {rank}: FAILED-AS-EXPECTED {dt:.1f} {type(e).__name__}: {msg}", flush=True)
        sys.stdout.flush()
        os._exit(3)
    print(f"rank {rank}: collective unexpectedly completed", flush=True)
    os._exit(0)


if __name__ == "__main__":
    try:
        main()
    except Exception:
        traceback.print_exc()
        os._exit(4)
