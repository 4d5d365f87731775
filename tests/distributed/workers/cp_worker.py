"""Context parallelism on neuron: torch.distributed.tensor.experimental.context_parallel
around F.scaled_dot_product_attention (ring attention over the sequence), checked against
the same attention on one core (outputs and the gradients of q, k, v).

Usage (under torchrun): cp_worker.py CASE[,CASE...]
A case is MASK[:OPTION...]: MASK is causal (with PyTorch's head-tail load balancing) or full
(no mask, no load balancing); options: alltoall (rotate k/v with all_to_all instead of the
default all_gather), bfloat16 (instead of float32), gqa (half as many key/value heads,
enable_gqa=True), module (the module API: _ContextParallel and _context_parallel_shard).
Or "mask" (an attn_mask, which ring attention does not take), "bad_seq" (a sequence length
the ranks do not divide), or "cpu_mesh" (PyTorch's behaviour on CPU meshes, unchanged).
Prints "CASE <case> OK <max diff>" per case on every rank.
"""

import datetime
import os
import resource
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.experimental import context_parallel
from torch.distributed.tensor.experimental._attention import (
    _context_parallel_shard,
    _ContextParallel,
    _cp_options,
    _disable_context_parallel_dispatcher,
    _enable_context_parallel_dispatcher,
    _HeadTailLoadBalancer,
    context_parallel_unshard,
    set_rotate_method,
)
from torch.distributed.tensor.parallel import parallelize_module

BATCH, HEADS, SEQ, HEAD_DIM = 2, 4, 32, 16
# Ring attention merges per-block results through their logsumexp (in float32): the same
# softmax up to rounding; bfloat16 rounds each block's output before the merge.
TOL = {torch.float32: (1e-5, 1e-5), torch.bfloat16: (2e-2, 2e-2)}


def inputs(dtype, dev):
    g = torch.Generator().manual_seed(0)
    return [torch.randn(BATCH, HEADS, SEQ, HEAD_DIM, generator=g).to(dev, dtype) for _ in range(4)]


def run_case(case, mesh, dev):
    mask, *opts = case.split(":")
    causal = mask == "causal"
    rotate = next((o for o in opts if o in ("allgather", "alltoall")), "allgather")
    dtype = torch.bfloat16 if "bfloat16" in opts else torch.float32
    gqa = "gqa" in opts
    q, k, v, dout = inputs(dtype, dev)
    if gqa:  # grouped-query attention: half as many key/value heads
        k, v = k[:, : HEADS // 2].contiguous(), v[:, : HEADS // 2].contiguous()

    ref_q, ref_k, ref_v = (t.clone().requires_grad_() for t in (q, k, v))
    ref = F.scaled_dot_product_attention(ref_q, ref_k, ref_v, is_causal=causal, enable_gqa=gqa)
    ref.backward(dout)

    set_rotate_method(rotate)
    if "module" in opts:
        full = module_wrapper(mesh, causal, gqa, q, k, v, dout)
        return compare(case, full, (ref, ref_q.grad, ref_k.grad, ref_v.grad), dtype)
    # Head-tail load balancing applies to causal attention only (PyTorch refuses it otherwise).
    _cp_options.enable_load_balance = causal
    cp_q, cp_k, cp_v, cp_dout = (t.clone() for t in (q, k, v, dout))
    with context_parallel(mesh, buffers=[cp_q, cp_k, cp_v, cp_dout], buffer_seq_dims=[2, 2, 2, 2]):
        for t in (cp_q, cp_k, cp_v):
            t.requires_grad_()
        assert cp_q.shape[2] == SEQ // mesh.size(), cp_q.shape
        assert _cp_options.enable_load_balance == causal  # context_parallel chose the head-tail layout
        out = F.scaled_dot_product_attention(cp_q, cp_k, cp_v, is_causal=causal, enable_gqa=gqa)
        out.backward(cp_dout)
        grads = [t.grad for t in (cp_q, cp_k, cp_v)]
        for t in (cp_q, cp_k, cp_v):
            t.requires_grad_(False)
        # Unshard inside the context: it undoes the load-balanced order context_parallel chose.
        full = context_parallel_unshard(mesh, [out.detach(), *grads], [2, 2, 2, 2])
    return compare(case, full, (ref, ref_q.grad, ref_k.grad, ref_v.grad), dtype)


def compare(case, got, want, dtype):
    rtol, atol = TOL[dtype]
    worst = 0.0
    for name, a, b in zip(("output", "dq", "dk", "dv"), got, want):
        worst = max(worst, (a.float() - b.float()).abs().max().item())
        torch.testing.assert_close(a.cpu(), b.detach().cpu(), rtol=rtol, atol=atol, msg=f"{case}: {name}")
    return worst


class SDPA(torch.nn.Module):
    def forward(self, q, k, v, is_causal=False, enable_gqa=False):
        return F.scaled_dot_product_attention(q, k, v, is_causal=is_causal, enable_gqa=enable_gqa)


def module_wrapper(mesh, causal, gqa, q, k, v, dout):
    """The module API (what torchtitan uses): _ContextParallel on the attention module, buffers
    sharded by _context_parallel_shard with an explicit load balancer."""
    attn = parallelize_module(
        SDPA(), mesh, _ContextParallel(seq_dim=2, attention_type=_ContextParallel.AttentionType.SDPA)
    )
    lb = _HeadTailLoadBalancer(SEQ, mesh.size(), q.device) if causal else None
    cp_q, cp_k, cp_v, cp_dout = _context_parallel_shard(mesh, [q, k, v, dout], [2, 2, 2, 2], load_balancer=lb)
    cp_q, cp_k, cp_v = (t.requires_grad_() for t in (cp_q, cp_k, cp_v))
    _enable_context_parallel_dispatcher()
    try:
        out = attn(cp_q, cp_k, cp_v, is_causal=causal, enable_gqa=gqa)
        out.backward(cp_dout)
    finally:
        _disable_context_parallel_dispatcher()
    return context_parallel_unshard(mesh, [out.detach(), cp_q.grad, cp_k.grad, cp_v.grad], [2, 2, 2, 2], lb)


def attn_mask_case(mesh, dev):
    q, k, v, _ = inputs(torch.float32, dev)
    # Sharded like q, k and v (context_parallel treats every tensor argument as a sequence
    # shard; an unsharded mask fails in PyTorch's shape checks before any attention op).
    m = torch.ones(1, 1, SEQ, SEQ, dtype=torch.bool, device=dev).tril()
    _cp_options.enable_load_balance = False
    with context_parallel(mesh, buffers=[q, k, v, m], buffer_seq_dims=[2, 2, 2, 2]):
        try:
            F.scaled_dot_product_attention(q, k, v, attn_mask=m)
        except Exception as e:  # noqa: BLE001
            msg = f"{type(e).__name__}: {e}".splitlines()[0]
        else:
            raise AssertionError("an attn_mask was accepted under context parallelism")
    print(f"MASK_MESSAGE {msg}", flush=True)


def bad_seq_case(mesh, dev):
    """A sequence the ranks do not divide: both sharding entry points refuse it on every rank,
    before any collective, and the group stays usable."""
    q, k, v, _ = (t[:, :, : SEQ - 1] for t in inputs(torch.float32, dev))
    msgs = []
    for api in ("context_parallel", "_context_parallel_shard"):
        try:
            if api == "context_parallel":
                with context_parallel(mesh, buffers=[q, k, v], buffer_seq_dims=[2, 2, 2]):
                    F.scaled_dot_product_attention(q, k, v, is_causal=True)
            else:
                _context_parallel_shard(mesh, [q, k, v], [2, 2, 2])
        except ValueError as e:
            msgs.append(f"{api}: ValueError: {e}")
        else:
            raise AssertionError(f"{api} accepted {SEQ - 1} positions on {mesh.size()} ranks")
    assert q.shape[2] == SEQ - 1, q.shape  # the buffers were left as they were
    dist.barrier()
    for m in msgs:
        print(f"BAD_SEQ {m}", flush=True)


def cpu_mesh_case(world):
    """CPU meshes keep PyTorch's behaviour: the CPU flash op is not sharded there."""
    mesh = init_device_mesh("cpu", (world,))
    q, k, v, _ = inputs(torch.float32, "cpu")
    with context_parallel(mesh, buffers=[q, k, v], buffer_seq_dims=[2, 2, 2]):
        try:
            F.scaled_dot_product_attention(q, k, v, is_causal=True)
        except NotImplementedError as e:
            assert "does not have a sharding strategy registered" in str(e), e
        else:
            raise AssertionError("context parallelism on a CPU mesh changed")


def main():
    cases = sys.argv[1].split(",")
    local_rank = int(os.environ["LOCAL_RANK"])
    dev = torch.device("neuron", local_rank)
    dist.init_process_group("neuron", timeout=datetime.timedelta(seconds=120))
    rank, world = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh("neuron", (world,))
    for case in cases:
        if case == "cpu_mesh":
            cpu_mesh_case(world)
            print(f"rank {rank}: CASE cpu_mesh OK", flush=True)
            continue
        if case in ("mask", "bad_seq"):
            {"mask": attn_mask_case, "bad_seq": bad_seq_case}[case](mesh, dev)
            print(f"rank {rank}: CASE {case} OK", flush=True)
            continue
        worst = run_case(case, mesh, dev)
        print(f"rank {rank}: CASE {case} OK {worst:.2e}", flush=True)
    dist.barrier()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"rank {rank}: PEAK_RSS_MIB {peak:.0f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
