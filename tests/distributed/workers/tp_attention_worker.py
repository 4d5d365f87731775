"""Tensor-parallel attention on neuron DTensors: F.scaled_dot_product_attention on q, k, v
sharded by heads, checked against the same module on one core (plain tensors).

Usage (under torchrun): tp_attention_worker.py CASE[,CASE...]
Module cases (colwise q/k/v with use_local_output=False, rowwise o; forward and backward):
causal, mask (an additive (batch, 1, L, S) mask, replicated), autocast (bfloat16 autocast),
compile (the parallelized module under torch.compile). Direct cases on sharded q, k, v:
heads, batch (sharded on heads or on batch), gqa (half as many key/value heads, sharded on
heads too), head_mask (a per-head mask sharded like q), bad_mask (a mask sharded on the
sequence: refused). Prints "CASE <case> OK <max diff>" per
case on every rank.
"""

import datetime
import os
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

DIM, HEADS, BATCH, SEQ = 64, 8, 2, 16
# Heads are independent in attention: each rank's heads are computed by the same kernel on
# the same values as on one core. Only the rowwise output projection sums its partial
# products in another order (and, under autocast, rounds them to bfloat16 first).
TOL = {"float32": (1e-5, 1e-6), "bfloat16": (2e-2, 2e-2)}


class Attention(nn.Module):
    """Multi-head attention as pytorch/examples' Llama writes it (global head count in view)."""

    def __init__(self):
        super().__init__()
        self.hd = DIM // HEADS
        self.wq, self.wk, self.wv = (nn.Linear(DIM, DIM) for _ in range(3))
        self.wo = nn.Linear(DIM, DIM)

    def forward(self, x, mask=None):
        b, s, _ = x.shape
        q, k, v = (w(x).view(b, s, HEADS, self.hd).transpose(1, 2) for w in (self.wq, self.wk, self.wv))
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=mask is None)
        return self.wo(o.transpose(1, 2).reshape(b, s, DIM))


def tp_attention(mesh, dev):
    torch.manual_seed(0)
    plan = {f"w{p}": ColwiseParallel(use_local_output=False) for p in "qkv"}
    plan["wo"] = RowwiseParallel()
    return parallelize_module(Attention().to(dev), mesh, plan)


def reference(dev):
    torch.manual_seed(0)
    return Attention().to(dev)


def data(dev):
    g = torch.Generator().manual_seed(1)
    x, dout = (torch.randn(BATCH, SEQ, DIM, generator=g).to(dev) for _ in range(2))
    # HF-style padding mask: batch row 1 ignores its last 4 keys
    mask = torch.zeros(BATCH, 1, SEQ, SEQ)
    mask[1, :, :, -4:] = float("-inf")
    return x, dout, mask.to(dev)


def run_module(model, x, dout, mask, autocast):
    """Output, parameter gradients and the attention's output (what wo receives; None when
    compiled: a hook keeping it would make it a graph output)."""
    seen = [None]
    if not hasattr(model, "_orig_mod"):
        hook = model.wo.register_forward_pre_hook(lambda _m, args: seen.append(args[0]), prepend=True)
    with torch.autocast("neuron", dtype=torch.bfloat16, enabled=autocast):
        out = model(x, mask)
    if not hasattr(model, "_orig_mod"):
        hook.remove()
    out.float().backward(dout)
    grads = {n: p.grad.full_tensor() if isinstance(p.grad, DTensor) else p.grad for n, p in model.named_parameters()}
    return out, grads, seen[-1]


def module_case(case, mesh, dev):
    x, dout, mask = data(dev)
    autocast = case == "autocast"
    if case != "mask":
        mask = None
    ref_out, ref_grads, ref_attn = run_module(reference(dev), x, dout, mask, autocast)
    model = tp_attention(mesh, dev)
    if case == "compile":
        model = torch.compile(model)
    tp_mask = None if mask is None else distribute_tensor(mask, mesh, [Replicate()])
    out, grads, attn = run_module(model, x, dout, tp_mask, autocast)
    assert not isinstance(out, DTensor), type(out)  # RowwiseParallel hands back a plain tensor
    if attn is not None:
        # Attention ran on each rank's heads (no gather), and equals one core's exactly.
        assert attn.placements == (Shard(2),), attn.placements
        assert torch.equal(attn.full_tensor().cpu(), ref_attn.detach().cpu()), f"{case}: attention output differs"
    tol = TOL["bfloat16" if autocast else "float32"]
    worst = compare(case, out, ref_out, tol)
    for name, g in grads.items():
        worst = max(worst, compare(f"{case}: grad {name}", g, ref_grads[name.removeprefix("_orig_mod.")], tol))
    return worst


def compare(what, got, want, tol):
    rtol, atol = tol
    torch.testing.assert_close(got.float().cpu(), want.float().cpu(), rtol=rtol, atol=atol, msg=what)
    return (got.float() - want.float()).abs().max().item()


def direct_case(case, mesh, dev):
    """SDPA itself on sharded q, k, v: heads and batch entries are independent, so each rank's
    shard equals one core's result exactly (forward and backward)."""
    g = torch.Generator().manual_seed(2)
    q, k, v, dout = (torch.randn(BATCH, HEADS, SEQ, DIM // HEADS, generator=g).to(dev) for _ in range(4))
    gqa = case == "gqa"
    if gqa:  # grouped-query attention: each rank's key/value heads serve its query heads
        k, v = k[:, : HEADS // 2].contiguous(), v[:, : HEADS // 2].contiguous()
    mask = torch.randn(1, HEADS, SEQ, SEQ, generator=g).to(dev) if case == "head_mask" else None
    ref = [t.clone().requires_grad_() for t in (q, k, v)]
    ref_out = F.scaled_dot_product_attention(*ref, attn_mask=mask, is_causal=mask is None, enable_gqa=gqa)
    ref_out.backward(dout)
    place = [Shard(0 if case == "batch" else 1)]
    dq, dk, dv = (distribute_tensor(t, mesh, place).requires_grad_() for t in (q, k, v))
    dmask = None if mask is None else distribute_tensor(mask, mesh, place)
    out = F.scaled_dot_product_attention(dq, dk, dv, attn_mask=dmask, is_causal=mask is None, enable_gqa=gqa)
    assert out.placements == tuple(place), out.placements  # computed where it lies: no gather
    out.backward(distribute_tensor(dout, mesh, place))
    got = [out, dq.grad, dk.grad, dv.grad]
    for name, a, b in zip(("output", "dq", "dk", "dv"), got, [ref_out] + [t.grad for t in ref]):
        assert a.placements == tuple(place), (name, a.placements)
        assert torch.equal(a.full_tensor().cpu(), b.detach().cpu()), f"{case}: {name} differs from one core's"
    return 0.0


def bad_mask_case(mesh, dev):
    q = distribute_tensor(torch.randn(BATCH, HEADS, SEQ, DIM // HEADS, device=dev), mesh, [Shard(1)])
    mask = distribute_tensor(torch.zeros(1, HEADS, SEQ, SEQ, device=dev), mesh, [Shard(2)])
    try:
        F.scaled_dot_product_attention(q, q, q, attn_mask=mask)
    except RuntimeError as e:
        assert isinstance(e.__cause__, ValueError), repr(e.__cause__)
        print(f"BAD_MASK {type(e.__cause__).__name__}: {e.__cause__}", flush=True)
    else:
        raise AssertionError("a mask sharded on the sequence was accepted")
    return 0.0


def main():
    cases = sys.argv[1].split(",")
    dev = torch.device("neuron", int(os.environ["LOCAL_RANK"]))
    dist.init_process_group("neuron", timeout=datetime.timedelta(seconds=120))
    rank = dist.get_rank()
    mesh = init_device_mesh("neuron", (dist.get_world_size(),))
    for case in cases:
        if case in ("heads", "batch", "gqa", "head_mask"):
            worst = direct_case(case, mesh, dev)
        elif case == "bad_mask":
            worst = bad_mask_case(mesh, dev)
        else:
            worst = module_case(case, mesh, dev)
        print(f"rank {rank}: CASE {case} OK {worst:.2e}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
