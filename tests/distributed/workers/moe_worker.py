"""Expert parallelism on neuron: a Mixtral / Qwen-MoE style layer (softmax router, top-k,
SwiGLU experts) whose experts are sharded across the ranks, with the token dispatch done by
uneven all_to_all_single; checked against the whole layer on one core (outputs, input and
weight gradients).

Usage (under torchrun): moe_worker.py CASE[,CASE...]
Cases: grouped (experts run as one torch._grouped_mm per projection), loop (one matmul per
expert, as transformers' Mixtral does), bad_experts (an expert count the ranks do not divide).
Prints "CASE <case> OK <max diff>" per case on every rank.
"""

import datetime
import os
import resource
import sys

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", ".."))
from examples.moe import MoE  # noqa: E402  (the layer users would write; also the example's)

DIM, HIDDEN, EXPERTS, TOP_K, TOKENS = 32, 48, 8, 2, 24
# The same per-token arithmetic in a different grouping of rows; gradients of the expert
# weights sum the tokens in another order.
RTOL, ATOL = 1e-5, 1e-6


def shard_state(full, rank, local):
    """The full layer's weights for the experts this rank holds."""
    sl = slice(rank * local, (rank + 1) * local)
    return {k: (v if k == "router.weight" else v[sl]).clone() for k, v in full.state_dict().items()}


def run_case(grouped, rank, world, dev):
    torch.manual_seed(0)
    full = MoE(DIM, HIDDEN, EXPERTS, TOP_K, grouped=grouped).to(dev)
    g = torch.Generator().manual_seed(1)
    x_all = torch.randn(world * TOKENS, DIM, generator=g).to(dev)
    w_all = torch.randn(world * TOKENS, DIM, generator=g).to(dev)  # a loss that weighs every output
    x_ref = x_all.clone().requires_grad_()
    y_ref = full(x_ref)
    (y_ref * w_all).sum().backward()

    ep = MoE(DIM, HIDDEN, EXPERTS, TOP_K, group=dist.group.WORLD, grouped=grouped).to(dev)
    ep.load_state_dict(shard_state(full, rank, ep.local))
    mine = slice(rank * TOKENS, (rank + 1) * TOKENS)
    x = x_all[mine].clone().requires_grad_()
    y = ep(x)
    (y * w_all[mine]).sum().backward()
    # Every rank routes its own tokens with a replica of the router: sum their gradients.
    dist.all_reduce(ep.router.weight.grad)

    worst = 0.0
    pairs = [("output", y, y_ref[mine]), ("input grad", x.grad, x_ref.grad[mine])]
    pairs.append(("router grad", ep.router.weight.grad, full.router.weight.grad))
    for k in ("w1", "w2", "w3"):
        pairs.append((f"{k} grad", getattr(ep, k).grad, getattr(full, k).grad[rank * ep.local : (rank + 1) * ep.local]))
    for what, a, b in pairs:
        worst = max(worst, (a - b).abs().max().item())
        torch.testing.assert_close(a.cpu(), b.cpu(), rtol=RTOL, atol=ATOL, msg=f"{what} differs from one core")
    splits = [None] * world
    dist.all_gather_object(splits, ep.last_send_splits)
    assert len({n for row in splits for n in row}) > 1, f"the dispatch was even: {splits}"
    return worst, splits


def bad_experts(rank, world, dev):
    n = world + 2 if world > 2 else 3
    try:
        MoE(DIM, HIDDEN, n, TOP_K, group=dist.group.WORLD)
    except ValueError as e:
        msg = f"ValueError: {e}"
    else:
        raise AssertionError(f"{n} experts accepted on {world} ranks")
    assert f"{n} experts cannot be split evenly over {world} expert-parallel ranks" in msg, msg
    # What PyTorch itself checks: split sizes that do not add up to the tensor's rows. On a
    # group of its own: gloo's next barrier on a group may re-raise a failed collective's error.
    group = dist.new_group()
    try:
        dist.all_to_all_single(
            torch.empty(4, device=dev), torch.ones(4, device=dev), [1] * world, [3] + [0] * (world - 1), group=group
        )
    except (RuntimeError, ValueError) as e:
        torch_msg = f"{type(e).__name__}: {e}".splitlines()[0]
    else:
        raise AssertionError("all_to_all_single accepted splits that do not add up")
    print(f"rank {rank}: BAD_EXPERTS {msg}", flush=True)
    print(f"rank {rank}: BAD_SPLITS {torch_msg}", flush=True)


def main():
    cases = sys.argv[1].split(",")
    local_rank = int(os.environ["LOCAL_RANK"])
    dev = torch.device("neuron", local_rank)
    dist.init_process_group("neuron", timeout=datetime.timedelta(seconds=120))
    rank, world = dist.get_rank(), dist.get_world_size()
    for case in cases:
        if case == "bad_experts":
            bad_experts(rank, world, dev)
            print(f"rank {rank}: CASE bad_experts OK", flush=True)
            continue
        worst, per_rank = run_case(case == "grouped", rank, world, dev)
        print(
            f"rank {rank}: CASE {case} OK {worst:.2e} token copies sent (row: from rank, column: to rank) {per_rank}",
            flush=True,
        )
    dist.barrier()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"rank {rank}: PEAK_RSS_MIB {peak:.0f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
