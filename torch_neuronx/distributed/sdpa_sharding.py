"""DTensor sharding of SDPA on neuron: tensor parallelism over heads, and batch sharding.

``F.scaled_dot_product_attention`` on neuron runs CPU's fused kernel,
``aten._scaled_dot_product_flash_attention_for_cpu`` (and its backward): that is what keeps
neuron's attention numerically equal to CPU's. PyTorch's DTensor shards only the accelerator
attention ops (``_scaled_dot_product_flash_attention``, ``_efficient_attention``,
``_cudnn_attention``), so attention on neuron DTensors (``ColwiseParallel`` q/k/v, the
pytorch/examples tensor-parallel Llama) raised "does not have a sharding strategy registered".

This module gives the CPU op and its backward the strategies PyTorch gives CUDA's flash
attention, through PyTorch's own ``register_op_strategy``: everything replicated; q, k, v,
output and logsumexp sharded on the heads dim (tensor parallelism); or on the batch dim. The
CPU op also takes an ``attn_mask``, which follows q's sharding on the dims it does not
broadcast, and is replicated on those it does.

The strategies are registered for the op, not for a device, so CPU DTensors get them too:
SDPA on a CPU mesh then shards where it used to raise ``NotImplementedError``. We accept that:
heads and batch entries are independent in attention, so each shard computes PyTorch's own
CPU result, and nothing that ran before changes. A torch whose DTensor already shards the CPU
op keeps its own strategies. Context parallelism (``context_parallel.py``) swaps in its
sequence-sharding strategies while enabled and restores these when it exits.

Installed when ``torch.distributed.tensor`` is first imported (importing it eagerly would load
DTensor at ``import torch``).
"""

from __future__ import annotations

import torch

from ._after_import import after_import

_DTENSOR_MODULE = "torch.distributed.tensor"
HEADS_DIM, BATCH_DIM = 1, 0  # of q, k, v and the output: (batch, heads, sequence, head_dim)

aten = torch.ops.aten
FORWARD = aten._scaled_dot_product_flash_attention_for_cpu.default
BACKWARD = aten._scaled_dot_product_flash_attention_for_cpu_backward.default


def _mask_placement(query, mask, dim):
    """The attn_mask's placement when q is sharded on `dim` (replicated when `dim` is None).

    The mask broadcasts against (batch, heads, L, S) from the right, so q's `dim` is the mask's
    ``dim - (q.ndim - mask.ndim)``: sharded like q where the mask has that dim in full, and
    replicated where it broadcasts (size 1) or lacks it (a 2-D (L, S) mask)."""
    from torch.distributed.tensor.placement_types import Replicate, Shard

    if mask is None:
        return []
    mask_dim = None if dim is None else dim - (query.ndim - mask.ndim)
    if mask_dim is not None and mask_dim >= 0 and mask.shape[mask_dim] != 1:
        return [Shard(mask_dim)]
    return [Replicate()]


def _expand(op_schema, query_index, n_tensors, input_index, validate_mesh):
    """All replicated, or the `n_tensors` fixed tensors (outputs, then q, k, v and the others)
    all sharded on heads or all on batch; an attn_mask last, as :func:`_mask_placement` says."""
    from torch.distributed.tensor._op_schema import OpStrategy
    from torch.distributed.tensor._ops.utils import expand_to_full_mesh_op_strategy
    from torch.distributed.tensor.placement_types import Replicate, Shard

    query = op_schema.args_schema[query_index]
    if not isinstance(query, OpStrategy):
        raise AssertionError(f"{op_schema.op}: expected an OpStrategy for query, got {type(query)}")
    mask = op_schema.kwargs_schema.get("attn_mask")
    mask = mask if isinstance(mask, OpStrategy) else None
    strategies = [[Replicate()] * n_tensors + _mask_placement(query, mask, None)]
    for dim in (HEADS_DIM, BATCH_DIM):
        strategies.append([Shard(dim)] * n_tensors + _mask_placement(query, mask, dim))
    keeps_mask = None
    if mask is not None:
        # DTensor redistributes positional args only, never kwargs (as for out= args): keep
        # the strategies that take the mask as it is placed.
        held = mask.strategies[0].output_spec.placements
        keeps_mask = lambda input_specs, _outputs: input_specs[-1].placements == held  # noqa: E731
    mesh = op_schema.get_mesh_from_args(validate=validate_mesh)
    result = expand_to_full_mesh_op_strategy(
        mesh, op_schema, strategies, input_index=input_index, is_valid_strategy_cb=keeps_mask
    )
    if not result.strategies:  # only a mask can rule out the all-replicated strategy
        raise ValueError(
            f"{op_schema.op}: attn_mask of shape {list(mask.shape)} placed {held} fits no sharding of "
            f"query (shape {list(query.shape)}): DTensor does not redistribute a keyword argument, so the "
            f"mask must be replicated, or sharded like query on the heads or batch dim it has in full"
        )
    return result


def forward_strategy(op_schema):
    """PyTorch's flash-attention strategies for the CPU op: [output, logsumexp, q, k, v, mask?]."""
    # logsumexp is (batch, heads, L): sharded on the same dims as the output.
    return _expand(op_schema, query_index=0, n_tensors=5, input_index=2, validate_mesh=True)


def backward_strategy(op_schema):
    """[grad_q, grad_k, grad_v, grad_out, q, k, v, out, logsumexp, mask?]: as the forward's."""
    # As PyTorch's flash backward: the forward already validated the mesh.
    return _expand(op_schema, query_index=1, n_tensors=9, input_index=3, validate_mesh=False)


def _install(_module) -> None:
    """Register the strategies with DTensor's sharding propagator (idempotent)."""
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor._op_schema import RuntimeSchemaInfo
    from torch.distributed.tensor._ops.utils import register_op_strategy

    registered = DTensor._op_dispatcher.sharding_propagator.op_strategy_funcs
    # DTensor's sharding cache keys on tensor args but on kwargs only when named here: without
    # it, a call would reuse the sharding computed for a mask placed otherwise, or for no mask.
    schema_info = RuntimeSchemaInfo(static_kwargkey=["attn_mask"])
    for op, strategy in ((FORWARD, forward_strategy), (BACKWARD, backward_strategy)):
        if op not in registered:
            register_op_strategy(op, schema_info=schema_info)(strategy)


def install_hook() -> None:
    """Register the strategies now, or when torch.distributed.tensor is first imported."""
    after_import(_DTENSOR_MODULE, _install, "tensor-parallel SDPA (DTensor) on neuron")
