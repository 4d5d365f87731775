"""Context parallelism on ``neuron``: ring attention over a long sequence split across ranks.

A causal self-attention block (q/k/v projections, ``F.scaled_dot_product_attention``,
output projection) runs inside ``torch.distributed.tensor.experimental.context_parallel``:
each rank keeps 1/world of the sequence (in PyTorch's load-balanced head-tail order for
causal attention), and key/value blocks travel around the ranks. The script compares the
output and the weight gradients with the same block on one core and exits non-zero if they
differ by more than 1e-5 (relative) + 1e-5.

    torchrun --nproc_per_node=2 examples/context_parallel.py
    torchrun --nproc_per_node=4 examples/context_parallel.py --seq 4096 --no-causal
"""

import argparse
import os
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.experimental import context_parallel
from torch.distributed.tensor.experimental._attention import _cp_options, context_parallel_unshard


class Attention(nn.Module):
    def __init__(self, dim, heads, causal):
        super().__init__()
        self.heads, self.causal = heads, causal
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)

    def forward(self, x):  # (batch, seq, dim)
        b, s, d = x.shape
        q, k, v = self.qkv(x).view(b, s, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        o = F.scaled_dot_product_attention(q, k, v, is_causal=self.causal)  # sequence is dim 2
        return self.proj(o.transpose(1, 2).reshape(b, s, d))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--seq", type=int, default=1024, help="sequence length, a multiple of 2 * ranks")
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--no-causal", dest="causal", action="store_false")
    args = p.parse_args()

    dist.init_process_group("neuron")  # rank r runs on neuron:r
    rank, world = dist.get_rank(), dist.get_world_size()
    dev = torch.device("neuron", int(os.environ["LOCAL_RANK"]))
    mesh = init_device_mesh("neuron", (world,))
    torch.manual_seed(0)
    model = Attention(args.dim, args.heads, args.causal).to(dev)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, args.seq, args.dim, generator=g).to(dev)
    dy = torch.randn(2, args.seq, args.dim, generator=g).to(dev)

    start = time.perf_counter()
    ref = model(x)
    ref.backward(dy)
    one_core = time.perf_counter() - start
    ref_grads = [q.grad.clone() for q in model.parameters()]
    model.zero_grad()

    # Load balancing (head-tail order) applies to causal attention only.
    _cp_options.enable_load_balance = args.causal
    cp_x, cp_dy = x.clone(), dy.clone()
    start = time.perf_counter()
    with context_parallel(mesh, buffers=[cp_x, cp_dy], buffer_seq_dims=[1, 1]):  # shards in place
        y = model(cp_x)
        y.backward(cp_dy)
        (y,) = context_parallel_unshard(mesh, [y.detach()], [1])
    for q in model.parameters():  # each rank holds its sequence shard's share of the gradient
        dist.all_reduce(q.grad)
    elapsed = time.perf_counter() - start

    pairs = [(y, ref)] + list(zip((q.grad for q in model.parameters()), ref_grads))
    # Relative to each tensor's largest value: weight gradients sum over every token.
    worst = max(((a - b).abs().max() / b.abs().max()).item() for a, b in pairs)
    ok = worst <= 1e-5
    if rank == 0:
        print(
            f"{'causal' if args.causal else 'full'} attention over {args.seq} tokens on {world} ranks "
            f"({args.seq // world} each): {elapsed * 1e3:.0f} ms (one core: {one_core * 1e3:.0f} ms), "
            f"largest difference vs one core {worst:.1e} (relative)",
            flush=True,
        )
    dist.destroy_process_group()
    if not ok:
        raise SystemExit("context-parallel attention differs from the single-core run")


if __name__ == "__main__":
    main()
