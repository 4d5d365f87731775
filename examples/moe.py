"""Expert parallelism on ``neuron``: a Mixtral / Qwen-MoE style mixture-of-experts layer
whose experts are spread over the ranks.

Every rank routes its own tokens (softmax router, top-k, renormalised weights), sends each
token copy to the rank that holds its expert with an uneven ``all_to_all_single`` (the
counts are exchanged first), runs its experts as ``torch._grouped_mm`` calls (or a loop over
experts with ``--loop``), and sends the results back. The script compares the outputs and
gradients with the whole layer on one core and exits non-zero if they differ by more than
1e-5 (relative) + 1e-6.

    torchrun --nproc_per_node=2 examples/moe.py
    torchrun --nproc_per_node=4 examples/moe.py --experts 8 --tokens 256
"""

import argparse
import os
import time

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
import torch.nn.functional as F
from torch import nn


class MoE(nn.Module):
    """Top-k routed SwiGLU experts; with `group`, this rank holds experts
    [rank * E / world, (rank + 1) * E / world) and exchanges tokens with the others."""

    def __init__(self, dim, hidden, num_experts, top_k, group=None, grouped=True):
        super().__init__()
        self.group = group
        self.world = dist.get_world_size(group) if group is not None else 1
        if num_experts % self.world:
            raise ValueError(
                f"{num_experts} experts cannot be split evenly over {self.world} expert-parallel ranks; "
                f"use a number of experts that is a multiple of {self.world}, or fewer ranks"
            )
        self.num_experts, self.top_k, self.grouped = num_experts, top_k, grouped
        self.local = num_experts // self.world
        self.router = nn.Linear(dim, num_experts, bias=False)
        self.w1 = nn.Parameter(torch.randn(self.local, hidden, dim) / dim**0.5)  # gate
        self.w3 = nn.Parameter(torch.randn(self.local, hidden, dim) / dim**0.5)  # up
        self.w2 = nn.Parameter(torch.randn(self.local, dim, hidden) / hidden**0.5)  # down

    def experts(self, h, counts):
        """Rows of `h` grouped by local expert, `counts[e]` rows for expert e."""
        if self.grouped:
            offs = counts.cumsum(0).to(torch.int32)
            # _grouped_mm multiplies by (E, K, N) matrices: the transposes of the stored weights.
            g = torch._grouped_mm(h, self.w1.transpose(-2, -1), offs=offs)
            u = torch._grouped_mm(h, self.w3.transpose(-2, -1), offs=offs)
            return torch._grouped_mm(F.silu(g) * u, self.w2.transpose(-2, -1), offs=offs)
        outs = []
        for e, part in enumerate(h.split(counts.tolist())):
            outs.append((F.silu(part @ self.w1[e].T) * (part @ self.w3[e].T)) @ self.w2[e].T)
        return torch.cat(outs)

    def forward(self, x):
        probs = F.softmax(self.router(x), dim=-1, dtype=torch.float32)
        weights, chosen = probs.topk(self.top_k, dim=-1)
        weights = (weights / weights.sum(-1, keepdim=True)).to(x.dtype)
        flat = chosen.flatten()
        order = flat.argsort(stable=True)  # token copies sorted by expert
        tokens = x.repeat_interleave(self.top_k, dim=0)[order]
        counts = torch.bincount(flat, minlength=self.num_experts)
        if self.world == 1:
            out = self.experts(tokens, counts)
        else:
            # How many token copies each rank sends to each of this rank's experts.
            recv_counts = torch.empty_like(counts)
            dist.all_to_all_single(recv_counts, counts, group=self.group)
            send_splits = counts.view(self.world, self.local).sum(1).tolist()
            recv_splits = recv_counts.view(self.world, self.local).sum(1).tolist()
            self.last_send_splits = send_splits
            recv = funcol.all_to_all_single_autograd(tokens, recv_splits, send_splits, self.group)
            # Received rows are ordered by source rank, then expert: regroup them by expert.
            expert_of_row = torch.arange(self.local, device=x.device).repeat(self.world)
            expert_of_row = expert_of_row.repeat_interleave(recv_counts)
            by_expert = expert_of_row.argsort(stable=True)
            out = self.experts(recv[by_expert], recv_counts.view(self.world, self.local).sum(0))
            out = out[by_expert.argsort()]
            out = funcol.all_to_all_single_autograd(out, send_splits, recv_splits, self.group)
        out = out[order.argsort()].view(x.shape[0], self.top_k, -1)
        return (out * weights[..., None]).sum(1)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--experts", type=int, default=8, help="a multiple of the number of ranks")
    p.add_argument("--top-k", type=int, default=2)
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--tokens", type=int, default=128, help="tokens per rank")
    p.add_argument("--loop", action="store_true", help="one matmul per expert instead of torch._grouped_mm")
    args = p.parse_args()

    dist.init_process_group("neuron")  # rank r runs on neuron:r
    rank, world = dist.get_rank(), dist.get_world_size()
    dev = torch.device("neuron", int(os.environ["LOCAL_RANK"]))
    torch.manual_seed(0)
    full = MoE(args.dim, args.hidden, args.experts, args.top_k, grouped=not args.loop).to(dev)
    ep = MoE(args.dim, args.hidden, args.experts, args.top_k, group=dist.group.WORLD, grouped=not args.loop).to(dev)
    mine = slice(rank * ep.local, (rank + 1) * ep.local)  # the experts this rank holds
    ep.load_state_dict({k: v if k == "router.weight" else v[mine] for k, v in full.state_dict().items()})

    g = torch.Generator().manual_seed(1)
    x_all = torch.randn(world * args.tokens, args.dim, generator=g).to(dev)
    tokens = slice(rank * args.tokens, (rank + 1) * args.tokens)  # this rank's tokens
    for _ in range(2):  # timed the second time: the first call sets up the functional collectives
        ep.zero_grad()
        x = x_all[tokens].clone().requires_grad_()
        start = time.perf_counter()
        y = ep(x)
        y.square().mean().div(world).backward()  # this rank's share of the mean over all tokens
        dist.all_reduce(ep.router.weight.grad)  # the router is replicated
        elapsed = time.perf_counter() - start

    x_ref = x_all.clone().requires_grad_()
    y_ref = full(x_ref)
    y_ref.square().mean().backward()
    diffs = {
        "output": (y, y_ref[tokens]),
        "input grad": (x.grad, x_ref.grad[tokens]),
        "router grad": (ep.router.weight.grad, full.router.weight.grad),
        **{f"{k} grad": (getattr(ep, k).grad, getattr(full, k).grad[mine]) for k in ("w1", "w2", "w3")},
    }
    ok = all(torch.allclose(a, b, rtol=1e-5, atol=1e-6) for a, b in diffs.values())
    worst = max((a - b).abs().max().item() for a, b in diffs.values())
    print(
        f"rank {rank}: experts {mine.start}-{mine.stop - 1}, sent {ep.last_send_splits} token copies, "
        f"forward+backward {elapsed * 1e3:.0f} ms, largest difference vs one core {worst:.1e}",
        flush=True,
    )
    dist.destroy_process_group()
    if not ok:
        raise SystemExit("expert-parallel layer differs from the single-core layer")


if __name__ == "__main__":
    main()
