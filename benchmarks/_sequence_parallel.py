"""NxD Inference's sequence parallelism for a transformers Llama, as tensor-parallel plan rules.

NxD Inference (``sequence_parallel_enabled``, on in AWS's Llama-3.1-405B run) keeps the hidden
state of a prefill split over the sequence between the tensor-parallel matmuls: each rank's
RMSNorms and residual adds touch 1/TP of the rows, an all-gather along the sequence feeds
attention and the MLP, and their row-parallel outputs are reduce-scattered back to the rank's
rows instead of all-reduced. It turns sequence parallelism off for token generation. transformers
5.23 reserves ``DistributedConfig(enable_sequence_parallel=...)`` but does not wire it up, so
``PLAN`` adds it to Llama's own tensor-parallel plan with four styles, registered by ``register()``:

- each decoder layer takes its rank's slice of a full-length prefill hidden state (the first
  layer gets the embeddings whole; the others get slices already);
- attention and the MLP all-gather their input along the sequence;
- ``o_proj`` and ``down_proj`` reduce-scatter their output along the sequence;
- the final norm all-gathers its output, so the LM head sees every position as without it.

A forward with one token per sequence (decoding) runs as Llama's plain plan does. A prefill must
be a multiple of the TP degree with at least two tokens per rank (NxD Inference pads a prompt to
its bucket): a rank holding one token could not be told from a decode step.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor
from transformers.distributed.tensor_parallel import ALL_PARALLEL_STYLES, RowwiseParallel, TensorParallelLayer

PLAN = {
    "model.layers.*": "sp_scatter_sequence",
    "model.layers.*.self_attn": "sp_gather_sequence",
    "model.layers.*.mlp": "sp_gather_sequence",
    "model.layers.*.self_attn.o_proj": "sp_rowwise_scatter",
    "model.layers.*.mlp.down_proj": "sp_rowwise_scatter",
    "model.norm": "sp_gather_output",
}


def _group(mesh):
    return mesh.get_group() if mesh.ndim == 1 else mesh.get_group("tp")


def _split(x: torch.Tensor) -> bool:
    """A rank's slice of a prefill's hidden state (batch, tokens > 1, hidden); decode has one token."""
    return x.dim() == 3 and x.shape[1] > 1


def _batch_first(rows: torch.Tensor) -> torch.Tensor:
    """(tokens, batch, ...) back to (batch, tokens, ...) with a fresh tensor's strides: matmul folds
    a 3-d input into one mm only then. With batch 1 it is a view, as on the device."""
    if rows.shape[1] == 1:
        return rows.view(1, rows.shape[0], *rows.shape[2:])
    return rows.movedim(0, 1).contiguous()


def _gather(x: torch.Tensor, group) -> torch.Tensor:
    """All-gather along the sequence (dim 1); c10d gathers along dim 0, so tokens go first."""
    n = dist.get_world_size(group)
    rows = x.movedim(1, 0).contiguous()
    out = rows.new_empty((rows.shape[0] * n, *rows.shape[1:]))
    dist.all_gather_into_tensor(out, rows, group=group)
    return _batch_first(out)


def _reduce_scatter(x: torch.Tensor, group) -> torch.Tensor:
    """Sum over the group and keep this rank's slice of the sequence (dim 1)."""
    n = dist.get_world_size(group)
    rows = x.movedim(1, 0).contiguous()
    out = rows.new_empty((rows.shape[0] // n, *rows.shape[1:]))
    dist.reduce_scatter_tensor(out, rows, group=group)
    return _batch_first(out)


def _hidden(args: tuple, kwargs: dict) -> torch.Tensor:
    """The hidden state a module was called with (positionally or as ``hidden_states``)."""
    return args[0] if args else kwargs["hidden_states"]


def _with_hidden(args: tuple, kwargs: dict, x: torch.Tensor) -> tuple:
    """The call's (args, kwargs) with `x` in place of its hidden state."""
    return ((x, *args[1:]), kwargs) if args else (args, {**kwargs, "hidden_states": x})


class _ScatterSequence(TensorParallelLayer):
    """A decoder layer: a full-length prefill hidden state enters as this rank's rows."""

    def transform_inputs_pre_forward(self, module, args, kwargs, mesh):
        x = _hidden(args, kwargs)
        cos = kwargs["position_embeddings"][0]
        tokens, n = cos.shape[-2], mesh.size()
        if tokens < 2 or x.shape[1] != tokens:  # decoding, or already this rank's rows
            return args, kwargs
        if tokens % n or tokens // n < 2:
            raise ValueError(
                f"sequence parallelism over {n} ranks needs a prefill of a multiple of {n} tokens with at "
                f"least 2 per rank, got {tokens}: pad the prompt (NxD Inference pads to its bucket)"
            )
        return _with_hidden(args, kwargs, x.narrow(1, mesh.get_local_rank() * (tokens // n), tokens // n))


class _GatherSequence(TensorParallelLayer):
    """Attention or the MLP: the rows of every rank, gathered."""

    def transform_inputs_pre_forward(self, module, args, kwargs, mesh):
        x = _hidden(args, kwargs)
        return _with_hidden(args, kwargs, _gather(x, _group(mesh))) if _split(x) else (args, kwargs)


class _RowwiseScatter(RowwiseParallel):
    """A row-parallel linear whose prefill output is reduce-scattered to the rank's rows."""

    def install_forward(self, module, mesh):
        if getattr(module, "bias", None) is not None:
            raise ValueError("sequence-parallel row-wise layers take no bias here (Llama's have none)")
        return super().install_forward(module, mesh)

    def transform_output_post_forward(self, module, output, mesh):
        # the local inference path's plain output; DTensor outputs (training) go as in Llama's plan
        if not isinstance(output, DTensor) and _split(output) and not output.requires_grad:
            return _reduce_scatter(output, _group(mesh))
        return super().transform_output_post_forward(module, output, mesh)


class _GatherOutput(TensorParallelLayer):
    """The final norm: its prefill output gathered whole for the LM head."""

    def transform_output_post_forward(self, module, output, mesh):
        return _gather(output, _group(mesh)) if _split(output) else output


def register() -> None:
    """Make ``PLAN``'s styles known to transformers (before ``from_pretrained``)."""
    ALL_PARALLEL_STYLES.register("sp_scatter_sequence", _ScatterSequence())
    ALL_PARALLEL_STYLES.register("sp_gather_sequence", _GatherSequence())
    ALL_PARALLEL_STYLES.register("sp_rowwise_scatter", _RowwiseScatter())
    ALL_PARALLEL_STYLES.register("sp_gather_output", _GatherOutput())
