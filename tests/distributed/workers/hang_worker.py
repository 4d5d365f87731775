"""A job with one distributed bug (or none) that must end, on every rank, in a typed error
naming the collective and the other ranks, within the group's timeout plus a few seconds.
Usage: hang_worker.py CASE TIMEOUT_S [--fixed]
  skip_barrier   rank 1 skips a barrier (`if rank == 0: dist.barrier()`)
  skip_branch    rank 1 skips an all_reduce inside a data-dependent branch
  swap           ranks 0 and 1 issue all_reduce and broadcast in opposite orders
  shapes         rank 1 all_reduces a tensor of another shape
  shapes_again   rank 1 all_reduces a tensor of another shape, where rank 0 repeats its last
  membership     rank 1 all_reduces on a subgroup that rank 0 uses the world group for
  send           rank 0 sends to rank 1, which never receives
  skip_then_all_gather_into_tensor, skip_then_reduce_scatter_tensor, skip_then_monitored_barrier
                 (4 ranks) rank 2 skips the second all_reduce inside a data-dependent branch and
                 goes on to that collective (FSDP2's all-gather and reduce-scatter, and
                 ProcessGroup.monitored_barrier)
With --fixed the same script runs without the bug and must complete; with --raise a rank lets
its error end the process (as a training script does; torchrun then tears the others down).
Each rank prints "RESULT <rank> <seconds> <ExceptionType>: <message>" (or "RESULT <rank> OK")."""

import datetime
import os
import sys
import time

import torch
import torch.distributed as dist


def step(case, rank, fixed, dev):
    x = torch.ones(4, 8, device=dev)
    buggy = not fixed and rank == 1
    if case == "skip_barrier":
        if rank == 0 or not buggy:
            dist.barrier()
        time.sleep(1)  # rank 1 carries on with work that issues no collective
    elif case == "skip_branch":
        loss = torch.tensor(float("nan") if buggy else 1.0)
        if torch.isfinite(loss):  # data-dependent: rank 1's batch gave a NaN
            dist.all_reduce(x)
    elif case == "swap":
        first, second = (dist.broadcast, dist.all_reduce) if buggy else (dist.all_reduce, dist.broadcast)
        for c in (first, second):
            c(x, 0) if c is dist.broadcast else c(x)
    elif case == "shapes":
        dist.all_reduce(torch.ones(8, 8, device=dev) if buggy else x)
    elif case == "shapes_again":
        dist.all_reduce(x)
        dist.all_reduce(torch.ones(8, 8, device=dev) if buggy else x)
    elif case == "membership":
        sub = dist.new_group([0, 1], timeout=datetime.timedelta(seconds=float(sys.argv[2])))
        dist.all_reduce(x, group=sub if buggy else dist.group.WORLD)
    elif case == "send":
        if rank == 0:
            dist.send(x, dst=1)
        elif not buggy:
            dist.recv(x, src=0)
        time.sleep(1)
    elif case.startswith("skip_then_"):
        n = dist.get_world_size()
        loss = torch.tensor(float("nan") if not fixed and rank == 2 else 1.0)
        dist.all_reduce(x)
        if torch.isfinite(loss):  # data-dependent: rank 2's batch gave a NaN
            dist.all_reduce(x)
        then = case.removeprefix("skip_then_")
        if then == "all_gather_into_tensor":
            dist.all_gather_into_tensor(torch.empty(n * 8, device=dev), torch.ones(8, device=dev))
        elif then == "reduce_scatter_tensor":
            dist.reduce_scatter_tensor(torch.empty(8, device=dev), torch.ones(n * 8, device=dev))
        else:  # dist.monitored_barrier refuses backends other than "gloo" by name, as it refuses NCCL
            dist.group.WORLD.monitored_barrier(datetime.timedelta(seconds=float(sys.argv[2])))
    dist.barrier()


def main():
    case, timeout_s = sys.argv[1], float(sys.argv[2])
    fixed = "--fixed" in sys.argv
    rank = int(os.environ["RANK"])
    dev = torch.device("neuron", int(os.environ["LOCAL_RANK"]))
    dist.init_process_group("neuron", timeout=datetime.timedelta(seconds=timeout_s))
    dist.all_reduce(torch.ones(2, device=dev))  # the group works
    t0 = time.monotonic()
    try:
        step(case, rank, fixed, dev)
        print(f"RESULT {rank} OK", flush=True)
        if not fixed:
            time.sleep(timeout_s + 8)  # a rank that got through stays alive, as in a real job
    except Exception as e:  # noqa: BLE001
        msg = " | ".join(str(e).splitlines())
        print(f"RESULT {rank} {time.monotonic() - t0:.1f} {type(e).__name__}: {msg}", flush=True)
        if "--raise" in sys.argv:
            raise
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
