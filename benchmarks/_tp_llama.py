"""One tensor-parallel rank of a Llama pipeline stage, as NeuronX Distributed lays it out.

AWS's Llama-3.1-70B pre-training (NxD, TP=32 with sequence parallelism, GQA with the KV heads
replicated 4x, fused QKV, flash attention, selective activation checkpointing) shards every
layer over the 32 cores of a trn1.32xlarge. This module is what one of those cores holds and
runs: the local shards of each weight, and the collectives NxD issues between them (an
all-gather of the sequence before each column-parallel block, a reduce-scatter after each
row-parallel one; their autograd backward issues the reverse). It is written with local
shapes and explicit collectives instead of DTensor so that one process can run it as one
rank of a fake process group of the tensor-parallel group's real size. Activations between
layers are bf16, as AWS's run script makes them (XLA_DOWNCAST_BF16=1 stores float32 tensors as
bf16 on the device); weights are float32 and cast by autocast.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as fc
import torch.nn.functional as F
from torch.distributed.nn import functional as dist_nn
from torch.utils.checkpoint import checkpoint


def _gather_seq(x: torch.Tensor, group) -> torch.Tensor:
    return fc.all_gather_single_autograd(x, 0, group)


def _scatter_seq(x: torch.Tensor, group) -> torch.Tensor:
    return fc.reduce_scatter_single_autograd(x, "sum", 0, group)


class RMSNorm(torch.nn.Module):
    def __init__(self, hidden: int, eps: float = 1e-5):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(hidden))
        self.eps = eps

    def forward(self, x):
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return (self.weight * h).to(x.dtype)


def _rotate(x):
    a, b = x.chunk(2, dim=-1)
    return torch.cat((-b, a), dim=-1)


class Layer(torch.nn.Module):
    """One decoder layer's shards on one of `tp` ranks; input and output are sequence shards."""

    def __init__(self, cfg: dict, tp: int, group):
        super().__init__()
        h, d = cfg["hidden_size"], cfg["hidden_size"] // cfg["num_attention_heads"]
        self.heads = cfg["num_attention_heads"] // tp
        # NxD's kv_replicator copies each KV head so that every rank holds at least one
        self.kv_heads = max(1, cfg["num_key_value_heads"] * cfg["kv_replicator"] // tp)
        self.d, self.group = d, group
        self.norm1, self.norm2 = RMSNorm(h), RMSNorm(h)
        self.qkv = torch.nn.Linear(h, (self.heads + 2 * self.kv_heads) * d, bias=False)
        self.o = torch.nn.Linear(self.heads * d, h, bias=False)
        self.gate_up = torch.nn.Linear(h, 2 * cfg["intermediate_size"] // tp, bias=False)
        self.down = torch.nn.Linear(cfg["intermediate_size"] // tp, h, bias=False)

    def _attention(self, q, k, v, cos, sin):
        q, k = q * cos + _rotate(q) * sin, k * cos + _rotate(k) * sin
        k = k.repeat_interleave(self.heads // self.kv_heads, dim=1)
        v = v.repeat_interleave(self.heads // self.kv_heads, dim=1)
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    @torch.compiler.disable
    def _flash_attention(self, q, k, v, cos, sin):
        # NxD runs attention as its own flash-attention kernel, outside what the compiler fuses
        # (so outside the compiled graph here too), and with selective checkpointing: the
        # attention core is recomputed in the backward, not kept.
        return checkpoint(self._attention, q, k, v, cos, sin, use_reentrant=False)

    def forward(self, x, cos, sin):
        s = x.shape[0] * dist.get_world_size(self.group)
        qkv = self.qkv(_gather_seq(self.norm1(x), self.group))
        q, k, v = qkv.view(1, s, -1, self.d).transpose(1, 2).split([self.heads, self.kv_heads, self.kv_heads], dim=1)
        a = self._flash_attention(q, k, v, cos, sin)
        x = x + _scatter_seq(self.o(a.transpose(1, 2).reshape(s, -1)), self.group)
        gate, up = self.gate_up(_gather_seq(self.norm2(x), self.group)).chunk(2, dim=-1)
        return x + _scatter_seq(self.down(F.silu(gate) * up), self.group)


class Stage(torch.nn.Module):
    """Pipeline stage `index` of `stages` on one tensor-parallel rank: its layers, and the
    vocabulary-parallel embedding (first stage) or final norm, head and loss (last stage)."""

    def __init__(self, cfg: dict, tp: int, index: int, stages: int, group):
        super().__init__()
        self.cfg, self.tp, self.group = cfg, tp, group
        self.first, self.last = index == 0, index == stages - 1
        h, vocab = cfg["hidden_size"], cfg["vocab_size"]
        self.layers = torch.nn.ModuleList(Layer(cfg, tp, group) for _ in range(cfg["num_hidden_layers"] // stages))
        if self.first:
            self.embed = torch.nn.Parameter(torch.empty(vocab // tp, h))
        if self.last:
            self.norm = RMSNorm(h)
            self.head = torch.nn.Linear(h, vocab // tp, bias=False)

    def forward(self, x, positions, labels=None):
        d = self.cfg["hidden_size"] // self.cfg["num_attention_heads"]
        inv = 1.0 / (self.cfg["rope_theta"] ** (torch.arange(0, d, 2, device=positions.device).float() / d))
        ang = torch.outer(positions.float(), inv)
        cos, sin = (
            torch.cat((ang, ang), -1).cos().to(torch.bfloat16),
            torch.cat((ang, ang), -1).sin().to(torch.bfloat16),
        )
        if self.first:  # x: token ids of the whole sequence; this rank holds one vocabulary slice
            rows = self.embed.shape[0]
            lo = dist.get_rank(self.group) * rows
            local = (x - lo).clamp(0, rows - 1)
            hit = ((x >= lo) & (x < lo + rows)).unsqueeze(-1)
            x = _scatter_seq((F.embedding(local, self.embed) * hit).to(torch.bfloat16), self.group)
        for layer in self.layers:
            x = layer(x, cos, sin)
        if not self.last:
            return x
        logits = self.head(_gather_seq(self.norm(x), self.group)).float()
        return _vocab_parallel_loss(logits, labels, self.group)


def _vocab_parallel_loss(logits, labels, group):
    """Cross entropy over a vocabulary split across the group (Megatron's parallel CE)."""
    rows = logits.shape[-1]
    lo = dist.get_rank(group) * rows
    top = logits.detach().amax(-1)
    top = dist_nn.all_reduce(top, op=dist.ReduceOp.MAX, group=group)
    shifted = logits - top.unsqueeze(-1)
    total = dist_nn.all_reduce(shifted.exp().sum(-1), group=group)
    hit = (labels >= lo) & (labels < lo + rows)
    picked = shifted.gather(-1, (labels - lo).clamp(0, rows - 1).unsqueeze(-1)).squeeze(-1) * hit
    picked = dist_nn.all_reduce(picked, group=group)
    return (total.log() - picked).mean()
