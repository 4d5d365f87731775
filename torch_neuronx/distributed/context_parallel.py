"""Context parallelism (ring attention) for SDPA on neuron.

``F.scaled_dot_product_attention`` on neuron takes CPU's path: the same kernel choice
(``_fused_sdp_choice``) and, where CPU picks flash attention, CPU's kernel
``aten._scaled_dot_product_flash_attention_for_cpu`` (and its backward), which is what keeps
neuron's attention numerically equal to CPU's. PyTorch's context parallelism
(``torch.distributed.tensor.experimental.context_parallel`` and ``_ContextParallel``) shards
only the fused attention ops of accelerators (``_scaled_dot_product_flash_attention``,
``_efficient_attention``, ``_cudnn_attention`` and their backwards) and refuses the CPU one
("does not have a sharding strategy registered").

While context parallelism is enabled, this module adds the CPU flash op and its backward to
what it shards, for neuron meshes only: the same sequence-dimension sharding rules PyTorch
uses for flash attention, and PyTorch's own ring (``_templated_ring_attention`` and its
backward, with its rotation methods, load balancing and logsumexp merging) around the CPU
kernel. Nothing changes outside context parallelism, and other devices keep PyTorch's
behaviour. On neuron meshes, a sequence length the ranks do not divide is refused with a
``ValueError`` when the buffers are sharded (PyTorch would shard it unevenly, and the ring's
collectives would then disagree on sizes).

The hook is installed when PyTorch's context-parallel module is first imported (importing it
eagerly would load DTensor and flex attention at ``import torch``).
"""

from __future__ import annotations

import torch

from ._after_import import after_import

_CP_MODULE = "torch.distributed.tensor.experimental._context_parallel._attention"
SEQ_DIM = 2  # what PyTorch's ring attention shards: (batch, heads, sequence, head_dim)

aten = torch.ops.aten


def _fwd_strategy(op_schema):
    from torch.distributed.tensor._op_schema import OpStrategy
    from torch.distributed.tensor._ops.utils import expand_to_full_mesh_op_strategy
    from torch.distributed.tensor.placement_types import Replicate, Shard

    if not isinstance(op_schema.args_schema[0], OpStrategy):
        raise AssertionError(f"Expected OpStrategy, got {type(op_schema.args_schema[0])}")
    # [output, logsumexp, query, key, value]: replicated, split by heads (tensor
    # parallelism), or split by sequence (context parallelism); logsumexp is (B, H, L).
    strategies = [
        [Replicate()] * 5,
        [Shard(1)] * 5,
        [Shard(SEQ_DIM)] * 5,
    ]
    return expand_to_full_mesh_op_strategy(op_schema.get_mesh_from_args(), op_schema, strategies, input_index=2)


def _bwd_strategy(op_schema):
    from torch.distributed.tensor._op_schema import OpStrategy
    from torch.distributed.tensor._ops.utils import expand_to_full_mesh_op_strategy
    from torch.distributed.tensor.placement_types import Replicate, Shard

    if not isinstance(op_schema.args_schema[1], OpStrategy):
        raise AssertionError(f"Expected OpStrategy, got {type(op_schema.args_schema[1])}")
    # [grad_q, grad_k, grad_v, grad_out, query, key, value, out, logsumexp]
    strategies = [[Replicate()] * 9, [Shard(1)] * 9, [Shard(SEQ_DIM)] * 9]
    return expand_to_full_mesh_op_strategy(
        op_schema.get_mesh_from_args(validate=False), op_schema, strategies, input_index=3
    )


def _ring_forward(mesh, query, key, value, dropout_p=0.0, is_causal=False, *, attn_mask=None, scale=None):
    from torch.distributed.tensor.experimental._context_parallel._attention import _templated_ring_attention

    return _templated_ring_attention(
        mesh.get_group(),
        SEQ_DIM,
        aten._scaled_dot_product_flash_attention_for_cpu,
        query=query,
        key=key,
        value=value,
        is_causal=is_causal,
        dropout_p=dropout_p,
        scale=scale,
    )


def _ring_backward(
    mesh, grad_out, query, key, value, out, logsumexp, dropout_p, is_causal, *, attn_mask=None, scale=None
):
    from torch.distributed.tensor.experimental._context_parallel._attention import (
        _templated_ring_attention_backward,
    )

    return _templated_ring_attention_backward(
        mesh.get_group(),
        SEQ_DIM,
        aten._scaled_dot_product_flash_attention_for_cpu_backward.default,
        grad_out=grad_out,
        grad_out_name="grad_out",
        query=query,
        key=key,
        value=value,
        out=out,
        logsumexp=logsumexp,
        is_causal=is_causal,
        dropout_p=dropout_p,
        scale=scale,
    )


_RINGS = {
    aten._scaled_dot_product_flash_attention_for_cpu.default: _ring_forward,
    aten._scaled_dot_product_flash_attention_for_cpu_backward.default: _ring_backward,
}


def _sdpa_handler(op_call, args, kwargs):
    """PyTorch's CP handler (``_sdpa_handler``) for the CPU flash op, on neuron meshes."""
    from torch.distributed.tensor import DTensor

    dispatcher = DTensor._op_dispatcher
    op_info = dispatcher.unwrap_to_op_info(op_call, args, kwargs)
    if op_info.compute_mesh.device_type != "neuron":
        raise NotImplementedError(f"Operator {op_call} does not have a sharding strategy registered.")
    if op_info.local_kwargs.get("attn_mask") is not None:
        raise NotImplementedError(
            "context parallelism (ring attention) does not support attn_mask: PyTorch's ring shards only "
            "unmasked or causal attention; pass is_causal=True instead of a causal mask, or run this "
            "attention outside context_parallel()"
        )
    dispatcher.sharding_propagator.propagate(op_info)
    output_sharding = op_info.output_sharding
    if output_sharding is None or output_sharding.needs_redistribute:
        raise AssertionError(f"{op_call}: q, k and v must all be sharded on the sequence dimension")
    local_results = _RINGS[op_call](op_info.compute_mesh, *op_info.local_args, **op_info.local_kwargs)
    return dispatcher.wrap(local_results, output_sharding.output_spec)


def _even_shards(shard_buffers):
    """PyTorch's buffer sharding (``_context_parallel_buffers``, behind ``context_parallel`` and
    ``_context_parallel_shard``), refusing on neuron meshes a sequence the ranks do not divide.

    PyTorch shards such a sequence unevenly (31 positions over 2 ranks: 16 and 15), and the
    ring's collectives then disagree on sizes: gloo aborts the process, NCCL hangs or reads
    past the shorter shard. Every rank sees the same full buffers, so every rank raises here,
    before any collective."""

    def _context_parallel_buffers(mesh, buffers, buffer_seq_dims, load_balancer=None):
        n = mesh.size()
        for i, (buffer, dim) in enumerate(zip(buffers, buffer_seq_dims)):
            if mesh.device_type == "neuron" and isinstance(buffer, torch.Tensor) and buffer.shape[dim] % n:
                raise ValueError(
                    f"context parallelism over {n} ranks needs sequence lengths that are multiples of {n}, "
                    f"but buffer {i} has {buffer.shape[dim]} positions along dim {dim} (shape "
                    f"{list(buffer.shape)}), which would give the ranks shards of different lengths; pad "
                    f"the sequence to a multiple of {n} (of {2 * n} for causal load balancing)"
                )
        return shard_buffers(mesh, buffers, buffer_seq_dims, load_balancer)

    return _context_parallel_buffers


def _install(attention_module) -> None:
    """Make PyTorch's CP enable/disable also cover the CPU flash op, and its buffer sharding
    refuse uneven sequences on neuron meshes (idempotent)."""
    from torch.distributed.tensor._op_schema import RuntimeSchemaInfo
    from torch.distributed.tensor.experimental._context_parallel import _sharding_rules

    if getattr(_sharding_rules.register_cp_sharding_rules, "_neuron", False):
        return
    attention_module._context_parallel_buffers = _even_shards(attention_module._context_parallel_buffers)
    # _enable_cp_dtensor_dispatcher() installs this dict's handlers; disabling removes them.
    for op in _RINGS:
        attention_module.custom_ops[op] = _sdpa_handler
    register = _sharding_rules.register_cp_sharding_rules
    rules = [
        (aten._scaled_dot_product_flash_attention_for_cpu.default, _fwd_strategy, RuntimeSchemaInfo(3)),
        (aten._scaled_dot_product_flash_attention_for_cpu_backward.default, _bwd_strategy, None),
    ]

    def register_cp_sharding_rules():
        register()
        # Entered here and kept in PyTorch's table, so that unregister_cp_sharding_rules()
        # exits (and restores) them with its own.
        for op, strategy, schema_info in rules:
            if op not in _sharding_rules._cp_strategy_contexts:
                ctx = _sharding_rules._op_strategy_context(op, strategy, schema_info)
                _sharding_rules._original_strategies[op] = ctx.__enter__()
                _sharding_rules._cp_strategy_contexts[op] = ctx

    register_cp_sharding_rules._neuron = True
    _sharding_rules.register_cp_sharding_rules = register_cp_sharding_rules


def install_hook() -> None:
    """Cover the CPU flash op in context parallelism, now or when PyTorch's CP module loads."""
    after_import(_CP_MODULE, _install, "context parallelism for SDPA on neuron")
