"""Activation checkpointing of a tensor-parallel layer under torch.compile(backend="neuron").

    torchrun --nproc_per_node=2 checkpoint_mesh_worker.py

The layer: a column-parallel projection (a DTensor weight on a 1-D mesh) feeding
scaled_dot_product_attention, an op tagged ``nondeterministic_seeded``. Checkpointed in full,
torch 2.13's AOTAutograd saves the DeviceMesh for the backward, stashes the RNG state of the
recomputed SDPA after it, and then fails its own saved-tensors check (the same on CPU with
gloo and Inductor). Checkpointed with a selective policy that saves SDPA's outputs (TRL's
``{"selective": True}``), nothing random is recomputed: the compiled gradients must equal the
eager, uncheckpointed ones. Rank 0 prints "CHECKPOINT MESH OK".
"""

import functools

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

SDPA_OPS = {torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default}
UPSTREAM_ERROR = "expected all tensors_saved_with_vc_check to be Tensors"


def _save_attention(ctx, op, *args, **kwargs):
    return CheckpointPolicy.MUST_SAVE if op in SDPA_OPS else CheckpointPolicy.PREFER_RECOMPUTE


def main():
    dist.init_process_group("neuron")
    rank = dist.get_rank()
    dev = torch.device("neuron", rank)
    torch.neuron.set_device(dev)
    mesh = init_device_mesh("neuron", (dist.get_world_size(),))
    torch.manual_seed(0)
    w = torch.nn.Parameter(distribute_tensor(torch.randn(16, 8, device=dev), mesh, [Shard(0)]))
    x0 = torch.randn(4, 8, device=dev)

    def layer(x):
        q = F.linear(DTensor.from_local(x, mesh, [Replicate()], run_check=False), w).to_local()
        q = q.view(1, 1, 4, 8)
        return F.scaled_dot_product_attention(q, q, q)

    def grads(fn):
        w.grad = None
        x = x0.clone().requires_grad_()
        fn(x).square().sum().backward()
        return x.grad, w.grad.to_local()

    ref = grads(layer)

    full = torch.compile(lambda x: checkpoint(layer, x, use_reentrant=False), backend="neuron")
    try:
        grads(full)
    except AssertionError as e:
        assert UPSTREAM_ERROR in str(e) and "DeviceMesh" in str(e), e
    else:
        raise AssertionError("full checkpointing compiled: the upstream bug is fixed, update docs/huggingface.md")

    context_fn = functools.partial(create_selective_checkpoint_contexts, _save_attention)
    torch._dynamo.reset()
    selective = torch.compile(
        lambda x: checkpoint(layer, x, use_reentrant=False, context_fn=context_fn), backend="neuron"
    )
    got = grads(selective)
    for a, b in zip(got, ref):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    dist.barrier()
    if rank == 0:
        print(f"CHECKPOINT MESH OK |grad w| {ref[1].norm().item():.4f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
