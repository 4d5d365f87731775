"""Pre-train a Llama-3.1 model with 3-D parallelism (TP x PP x DP), written with PyTorch's own APIs.

The layout AWS publishes for Llama-3.1-70B pre-training on Trn1 is the default: 32 trn1.32xlarge
(1,024 NeuronCores), tensor parallel 32 x pipeline parallel 8 x data parallel 4, sequences of 8192
tokens, 1,024 sequences per step (256 micro-batches of one sequence per pipeline). Here:

* tensor parallelism with sequence parallelism through DTensor (``parallelize_module``, torchtitan's
  Llama plan), attention with ``F.scaled_dot_product_attention`` on each rank's heads;
* pipeline parallelism with ``torch.distributed.pipelining``: the model split by hand, one stage per
  rank (the embedding on the first, the final norm and output on the last), ``Schedule1F1B``;
* FSDP2 (``fully_shard``) over dp, bf16 parameters and fp32 gradient reduction
  (``MixedPrecisionPolicy``), fp32 master weights and AdamW state;
* activation checkpointing of every decoder layer (``--checkpointing``: ``full`` recomputes the whole layer,
  ``selective`` keeps the projections' outputs and recomputes the rest, as NxD's selective checkpointing and
  Megatron's sequence parallelism do); synthetic tokens from a seeded generator;
* ``--compile``: each decoder layer compiled on its own (``torch.compile``, torchtitan's per-block compile).

The device is whatever ``torch.accelerator`` reports (``neuron`` with torch-neuronx, ``cuda`` on
GPUs). Every weight is drawn on the host from a generator seeded by its name, so every layout trains
the same model on the same data, one core included:

    TINY="--config tiny --seq 32 --global-batch 8 --steps 3 --lr 1e-3 --precision fp32"
    torchrun --nproc-per-node 1 examples/llama_3d.py $TINY --tp 1 --pp 1 --dp 1
    torchrun --nproc-per-node 8 examples/llama_3d.py $TINY --tp 2 --pp 2 --dp 2    # the same losses
    torchrun --nnodes 32 --nproc-per-node 32 ... examples/llama_3d.py --model DIR  # DIR: Llama-3.1-70B's config.json
"""

import argparse
import contextlib
import functools
import math
import os
import time
import zlib

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.pipelining import PipelineStage, Schedule1F1B
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_module
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    ParallelStyle,
    PrepareModuleInput,
    RowwiseParallel,
    SequenceParallel,
    loss_parallel,
    parallelize_module,
)
from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts
from transformers import LlamaConfig

LLAMA3_ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0}
PRESETS = {  # LlamaConfig fields; --model DIR reads a config.json instead
    "tiny": dict(vocab_size=256, hidden_size=64, intermediate_size=160, num_hidden_layers=4, num_attention_heads=4,
                 num_key_value_heads=2, max_position_embeddings=256, rope_theta=500000.0,
                 rope_scaling={**LLAMA3_ROPE, "original_max_position_embeddings": 64}),
    "llama-3.1-8b": dict(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                         num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=131072,
                         rope_theta=500000.0, rope_scaling={**LLAMA3_ROPE, "original_max_position_embeddings": 8192}),
    "llama-3.1-70b": dict(vocab_size=128256, hidden_size=8192, intermediate_size=28672, num_hidden_layers=80,
                          num_attention_heads=64, num_key_value_heads=8, max_position_embeddings=131072,
                          rope_theta=500000.0, rope_scaling={**LLAMA3_ROPE, "original_max_position_embeddings": 8192}),
}  # fmt: skip


# ---- the model: transformers' LlamaForCausalLM, with its module names (without the "model." prefix) ----


def rope_table(cfg, seq_len):
    """cos and sin of the rotary angles of positions 0..seq_len-1, shape (2, seq_len, head_dim),
    with Llama 3.1's scaling of the low frequencies (rope_type "llama3") as transformers computes it."""
    rope, dim = cfg.rope_parameters, cfg.head_dim
    inv_freq = 1.0 / rope["rope_theta"] ** (torch.arange(0, dim, 2, dtype=torch.float) / dim)
    if rope["rope_type"] == "llama3":
        old, lo, hi, factor = (rope[k] for k in ("original_max_position_embeddings", "low_freq_factor",
                                                 "high_freq_factor", "factor"))  # fmt: skip
        wavelen = 2 * math.pi / inv_freq
        smooth = (old / wavelen - lo) / (hi - lo)
        mid = (1 - smooth) * inv_freq / factor + smooth * inv_freq
        inv_freq = torch.where(wavelen > old / lo, inv_freq / factor, torch.where(wavelen < old / hi, inv_freq, mid))
    elif rope["rope_type"] != "default":
        raise ValueError(f"rope_type {rope['rope_type']!r} is not supported by this example")
    angles = torch.outer(torch.arange(seq_len, dtype=torch.float), inv_freq).repeat(1, 2)
    return torch.stack([angles.cos(), angles.sin()])


def rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([-x2, x1], dim=-1)


class Attention(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.head_dim, dim, bias = cfg.head_dim, cfg.hidden_size, cfg.attention_bias
        self.q_proj = nn.Linear(dim, cfg.num_attention_heads * self.head_dim, bias=bias)
        self.k_proj = nn.Linear(dim, cfg.num_key_value_heads * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(dim, cfg.num_key_value_heads * self.head_dim, bias=bias)
        self.o_proj = nn.Linear(cfg.num_attention_heads * self.head_dim, dim, bias=bias)

    def forward(self, x, rope):
        b, s, _ = x.shape
        # -1 heads: under tensor parallelism each rank holds some of the query and key/value heads.
        q, k, v = (p(x).view(b, s, -1, self.head_dim).transpose(1, 2) for p in (self.q_proj, self.k_proj, self.v_proj))
        cos, sin = rope[:, :s].to(q.dtype)
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        return self.o_proj(out.transpose(1, 2).reshape(b, s, -1))


class MLP(nn.Module):  # SwiGLU
    def __init__(self, cfg):
        super().__init__()
        dim, hidden, bias = cfg.hidden_size, cfg.intermediate_size, cfg.mlp_bias
        self.gate_proj, self.up_proj = nn.Linear(dim, hidden, bias=bias), nn.Linear(dim, hidden, bias=bias)
        self.down_proj = nn.Linear(hidden, dim, bias=bias)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.input_layernorm = nn.RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)
        self.self_attn = Attention(cfg)
        self.post_attention_layernorm = nn.RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)
        self.mlp = MLP(cfg)

    def forward(self, x, rope):
        h = x + self.self_attn(self.input_layernorm(x), rope)
        return h + self.mlp(self.post_attention_layernorm(h))


class Llama(nn.Module):
    """The whole model, or (after `pipeline_stage`) one stage of it: its forward takes tokens on the
    first stage and hidden states on the others, and returns logits on the last."""

    def __init__(self, cfg, seq_len):
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        # A ModuleDict keyed by the layer's index: the stages keep the names of the whole model.
        self.layers = nn.ModuleDict({str(i): DecoderLayer(cfg) for i in range(cfg.num_hidden_layers)})
        self.norm = nn.RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        self.register_buffer("rope", torch.empty(2, seq_len, cfg.head_dim), persistent=False)

    def forward(self, x):
        h = self.embed_tokens(x) if self.embed_tokens is not None else x
        for layer in self.layers.values():
            h = layer(h, self.rope)
        return self.lm_head(self.norm(h)) if self.lm_head is not None else h


def pipeline_stage(model, stage, num_stages):
    """Keep this stage's share of the decoder layers (torchtitan's manual split)."""
    n = len(model.layers)
    per = n // num_stages
    for i in range(n):
        if not stage * per <= i < (stage + 1) * per:
            del model.layers[str(i)]
    if stage > 0:
        model.embed_tokens = None
    if stage < num_stages - 1:
        model.norm = model.lm_head = None
    return model


# ---- tensor and sequence parallelism ----


class ReplicatedKV(ParallelStyle):
    """k_proj/v_proj when the tp ranks outnumber the key/value heads (Llama-3.1-70B has 8 for TP=32).
    The weight stays whole on every tp rank; each rank computes the one key/value head its query heads
    share, and passes gradients as Partial: FSDP2 sums them over tp like any replicated parameter's."""

    def __init__(self, num_kv_heads, head_dim):
        super().__init__()
        self.num_kv_heads, self.head_dim = num_kv_heads, head_dim

    def _apply(self, module, mesh):
        head = mesh.get_local_rank() * self.num_kv_heads // mesh.size()
        rows = slice(head * self.head_dim, (head + 1) * self.head_dim)
        distribute_module(module, mesh)  # parameters become Replicate DTensors

        def forward(x):  # x: the attention's input, replicated over tp
            x, w = (t.to_local(grad_placements=[Partial()]) for t in (x, module.weight))
            bias = module.bias.to_local(grad_placements=[Partial()])[rows] if module.bias is not None else None
            return F.linear(x, w[rows], bias)

        module.forward = forward
        return module


def apply_tp(model, tp_mesh, cfg):
    """torchtitan's Llama plan: activations between layers (and between stages) are sharded on the
    sequence; attention and MLP gather them, and their last projection reduce-scatters them again."""
    tp = tp_mesh.size()
    plan = {}
    if model.embed_tokens is not None:
        # Column-wise (torchtitan shards the vocabulary, row-wise): DTensor has no vocabulary-sharded
        # backward for a sequence-sharded output, so every tp rank would compute the whole
        # vocab x hidden gradient (Llama-3.1-70B: 2 GiB in bf16, then a 4 GiB fp32 copy).
        plan["embed_tokens"] = ColwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1))
    if model.lm_head is not None:
        plan["norm"] = SequenceParallel()
        # Logits stay sharded on the vocabulary: the loss runs under loss_parallel().
        plan["lm_head"] = ColwiseParallel(input_layouts=Shard(1), output_layouts=Shard(-1), use_local_output=False)
    if plan:
        parallelize_module(model, tp_mesh, plan)
    kv_heads = cfg.num_key_value_heads
    kv = ColwiseParallel() if kv_heads % tp == 0 else ReplicatedKV(kv_heads, cfg.head_dim)
    for layer in model.layers.values():
        plan = {
            "input_layernorm": SequenceParallel(),
            "self_attn": PrepareModuleInput(input_layouts=(Shard(1), None), desired_input_layouts=(Replicate(), None)),
            "self_attn.q_proj": ColwiseParallel(),
            "self_attn.k_proj": kv,
            "self_attn.v_proj": kv,
            "self_attn.o_proj": RowwiseParallel(output_layouts=Shard(1)),
            "post_attention_layernorm": SequenceParallel(),
            "mlp": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
            "mlp.gate_proj": ColwiseParallel(),
            "mlp.up_proj": ColwiseParallel(),
            "mlp.down_proj": RowwiseParallel(output_layouts=Shard(1)),
        }
        parallelize_module(layer, tp_mesh, plan)


@torch.no_grad()
def init_weights(model, cfg, seed):
    """transformers' Llama initialisation (normal(0, initializer_range), norms 1, biases 0), each weight
    drawn whole on the host from a generator seeded by its name; a rank keeps its tensor-parallel part.
    So the model is the same for every layout, and no device holds more than its own shards."""
    for name, p in model.named_parameters():
        gen = torch.Generator().manual_seed(seed + zlib.crc32(name.encode()))
        full = torch.empty(p.shape).normal_(0.0, cfg.initializer_range, generator=gen)
        if name.endswith("bias") or "norm" in name:
            full.fill_(0.0 if name.endswith("bias") else 1.0)
        if isinstance(p, DTensor):  # on the tp mesh: Shard(dim) or Replicate
            mesh, (placement,) = p.device_mesh, p.placements
            if placement.is_shard():
                full = full.chunk(mesh.size(), placement.dim)[mesh.get_local_rank()]
            p = p.to_local()
        p.copy_(full)
    model.rope.copy_(rope_table(cfg, model.rope.shape[1]))


def keep_projections(ctx, op, *args, **kwargs):
    """The policy of ``--checkpointing selective`` (PyTorch's selective activation checkpointing): keep the
    outputs of the matmuls that read the gathered sequence (q, k, v, gate, up), recompute everything else in
    the backward: the sequence all-gathers (Megatron's sequence parallelism gathers again rather than keep the
    whole sequence), attention's core (NxD's selective checkpointing) and the element-wise ops. A row-parallel
    projection's output (o_proj, down_proj: partial sums over tp, the whole sequence wide) is not kept; the
    recomputation stops before it, at the last tensor the backward needs."""
    out = ctx.op_output
    partial = isinstance(out, DTensor) and any(p.is_partial() for p in out.placements)
    keep = op in (torch.ops.aten.mm.default, torch.ops.aten.addmm.default) and not partial
    return CheckpointPolicy.MUST_SAVE if keep else CheckpointPolicy.PREFER_RECOMPUTE


def apply_checkpointing(model, mode):
    """Activation checkpointing of every decoder layer: "full" recomputes the layer in the backward; "selective"
    checkpoints attention and MLP apart, with `keep_projections` as the policy, so that each recomputation ends
    at the block's last projection's input; "none" keeps every activation."""
    if mode == "full":
        for name, layer in model.layers.items():
            model.layers[name] = checkpoint_wrapper(layer, preserve_rng_state=False)
    elif mode == "selective":
        context_fn = functools.partial(create_selective_checkpoint_contexts, keep_projections)
        for layer in model.layers.values():
            for name in ("self_attn", "mlp"):
                block = checkpoint_wrapper(getattr(layer, name), preserve_rng_state=False, context_fn=context_fn)
                setattr(layer, name, block)


def clip_grad_norm_(params, max_norm, pp_group):
    """torch.nn.utils.clip_grad_norm_ over all stages: the norm of DTensor gradients covers dp and tp,
    the stages' norms are summed over pp."""
    norm = torch.nn.utils.get_total_norm([p.grad for p in params if p.grad is not None])
    if isinstance(norm, DTensor):
        norm = norm.full_tensor()
    norm = norm**2
    dist.all_reduce(norm, group=pp_group)
    norm = norm.sqrt()
    torch.nn.utils.clip_grads_with_norm_(params, max_norm, norm)
    return norm


def loss_fn(logits, labels):
    return F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(0, 1))


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    model = p.add_mutually_exclusive_group()
    model.add_argument("--model", help="a directory with the model's config.json (no weights needed)")
    model.add_argument("--config", choices=PRESETS, default="llama-3.1-70b", help="a preset (default llama-3.1-70b)")
    p.add_argument("--tp", type=int, default=32)
    p.add_argument("--pp", type=int, default=8)
    p.add_argument("--dp", type=int, default=4)
    p.add_argument("--seq", type=int, default=8192, help="tokens per sequence")
    p.add_argument("--global-batch", type=int, default=1024, help="sequences per step, over all dp replicas")
    p.add_argument("--micro-batch", type=int, default=1, help="sequences per pipeline micro-batch")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--lr", type=float, default=1.5e-4)
    p.add_argument("--max-norm", type=float, default=1.0, help="gradient clipping")
    p.add_argument("--precision", choices=["bf16", "fp32"], default="bf16", help="bf16: bf16 compute, fp32 master")
    p.add_argument("--checkpointing", choices=["full", "selective", "none"], default="full",
                   help="activation checkpointing of each decoder layer: recompute all of it (default), all but "
                        "the projections' outputs (keep_projections; eager only), or none")  # fmt: skip
    p.add_argument("--compile", action="store_true", help="torch.compile each decoder layer (per-block)")
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args()


def main():
    args = parse_args()
    if "LOCAL_RANK" not in os.environ:
        raise SystemExit("llama_3d.py: run it with torchrun (torchrun --nproc-per-node 1 ... for one process)")
    cfg = LlamaConfig.from_pretrained(args.model) if args.model else LlamaConfig(**PRESETS[args.config])
    world, tp = int(os.environ["WORLD_SIZE"]), args.tp
    heads, kv_heads = cfg.num_attention_heads, cfg.num_key_value_heads
    per_replica = args.global_batch // args.dp
    n_micro = per_replica // args.micro_batch
    for ok, message in [
        (tp * args.pp * args.dp == world, f"--tp x --pp x --dp must be the {world} processes"),
        (heads % tp == 0 and (kv_heads % tp == 0 or tp % kv_heads == 0), f"{heads} heads, {kv_heads} kv heads, tp {tp}"),
        (cfg.num_hidden_layers % args.pp == 0, f"{cfg.num_hidden_layers} layers do not split into {args.pp} stages"),
        (args.seq % tp == 0, f"sequence parallelism needs --seq a multiple of tp {tp}"),
        (per_replica % args.micro_batch == 0 and n_micro >= args.pp, "1F1B needs pp or more micro-batches per replica"),
        (not cfg.tie_word_embeddings, "tied embeddings are not supported (they live on the first and last stages)"),
        (not (args.compile and args.checkpointing == "selective"), "--compile needs --checkpointing full or none: "
         "PyTorch 2.13 cannot compile through a selective checkpoint of DTensor layers (AOTAutograd saves the "
         "DeviceMesh among the tensors for the backward)"),
    ]:  # fmt: skip
        if not ok:
            raise SystemExit(f"llama_3d.py: {message}")

    device_type = torch.accelerator.current_accelerator().type
    device = torch.device(device_type, int(os.environ["LOCAL_RANK"]))
    torch.accelerator.set_device_index(device)
    mesh = init_device_mesh(device_type, (args.dp, args.pp, args.tp), mesh_dim_names=("dp", "pp", "tp"))
    dp_rank, stage, tp_rank = (mesh[d].get_local_rank() for d in ("dp", "pp", "tp"))
    first, last = stage == 0, stage == args.pp - 1

    # Build on the meta device (no memory), keep this stage, shard it over tp, then allocate and initialise.
    with torch.device("meta"):
        model = Llama(cfg, args.seq)
    n_params = sum(p.numel() for p in model.parameters())
    model = pipeline_stage(model, stage, args.pp)
    if tp > 1:
        apply_tp(model, mesh["tp"], cfg)
    model.to_empty(device=device)
    init_weights(model, cfg, args.seed)
    if args.compile:  # each layer on its own (one graph for all, the layers being alike)
        for layer in model.layers.values():
            # inside its checkpoint: PyTorch 2.13 cannot compile checkpoint_wrapper around DTensor
            # layers (AOTAutograd saves the DeviceMesh among the tensors for backward, and asserts)
            layer.compile(fullgraph=True)
    apply_checkpointing(model, args.checkpointing)
    # FSDP2 over dp; reshard_after_forward=False keeps a stage's parameters gathered between the
    # micro-batches of a step (torchtitan's choice with pipelining).
    mp = MixedPrecisionPolicy()  # fp32
    if args.precision == "bf16":  # bf16 copies of the parameters for compute; gradients reduced in fp32
        mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for layer in model.layers.values():
        fully_shard(layer, mesh=mesh["dp"], mp_policy=mp, reshard_after_forward=False)
    fully_shard(model, mesh=mesh["dp"], mp_policy=mp, reshard_after_forward=False)

    pp_stage = PipelineStage(model, stage, args.pp, device, group=mesh["pp"].get_group())
    schedule = Schedule1F1B(pp_stage, n_microbatches=n_micro, loss_fn=loss_fn)
    params = list(model.parameters())
    optimizer = torch.optim.AdamW(params, lr=args.lr, betas=(0.9, 0.95), weight_decay=0.1)
    # Under tp the last stage's logits are sharded on the vocabulary: the loss and its backward (inside
    # schedule.step) compute cross-entropy on the shards.
    loss_context = loss_parallel if tp > 1 else contextlib.nullcontext
    report = last and dp_rank == 0 and tp_rank == 0
    if dist.get_rank() == 0:
        size = f"{n_params / 1e9:.1f}B" if n_params >= 1e9 else f"{n_params / 1e6:.2f}M"
        print(f"llama_3d.py: {size} parameters ({cfg.num_hidden_layers} layers, hidden "
              f"{cfg.hidden_size}, {cfg.num_attention_heads} heads, {cfg.num_key_value_heads} kv heads, vocab "
              f"{cfg.vocab_size}); TP {args.tp} x PP {args.pp} x DP {args.dp} on {device_type}; {n_micro} "
              f"micro-batches of {args.micro_batch} x {args.seq} tokens per replica and step; {args.precision}, {args.checkpointing} checkpointing",
              flush=True)  # fmt: skip

    data = torch.Generator().manual_seed(args.seed)  # the same global batches for every layout
    mine = slice(dp_rank * per_replica, (dp_rank + 1) * per_replica)
    for step in range(args.steps):
        start = time.perf_counter()
        tokens = torch.randint(cfg.vocab_size, (args.global_batch, args.seq + 1), generator=data)[mine]
        inputs, labels = tokens[:, :-1].to(device), tokens[:, 1:].to(device)
        losses = []
        with loss_context():  # the first stage feeds the inputs, the last computes the losses
            # return_outputs=False: else the last stage keeps every micro-batch's logits until the
            # step ends, to merge them (at 70B, 256 of 63 MiB per rank: out of memory)
            step_args = dict(target=labels, losses=losses) if last else {}
            schedule.step(*[inputs] if first else [], return_outputs=False, **step_args)
        norm = clip_grad_norm_(params, args.max_norm, mesh["pp"].get_group())
        optimizer.step()
        optimizer.zero_grad()
        if last:
            loss = torch.stack(losses).detach().mean()
            if isinstance(loss, DTensor):  # under loss_parallel, replicated over tp
                loss = loss.full_tensor()
            dist.all_reduce(loss, op=dist.ReduceOp.AVG, group=mesh["dp"].get_group())
            if report:
                print(f"step {step + 1}/{args.steps}  loss {loss.item():.6f}  grad norm {norm.item():.6f}  "
                      f"({time.perf_counter() - start:.1f} s)", flush=True)  # fmt: skip

    peak = torch.tensor(torch.accelerator.max_memory_allocated(device) / 2**20, device=device)
    dist.all_reduce(peak, op=dist.ReduceOp.MAX)
    if dist.get_rank() == 0:
        print(f"peak memory allocated, largest over the ranks: {peak.item():,.1f} MiB", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
