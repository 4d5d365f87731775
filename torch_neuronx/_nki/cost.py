"""Estimate the unfused PyTorch op sequence a kernel replaces, with the same cost model.

The callable runs once under a ``TorchDispatchMode`` that records every ATen op. Each
op is charged as if it ran as its own kernel on one NeuronCore: its inputs are read
from and its outputs written to HBM (DMA time at the per-core HBM bandwidth), and its
compute runs on the engine that would execute it (matmul-like ops on the Tensor
Engine at the published dense rate; transcendental pointwise ops on the Scalar
Engine; other pointwise ops and reductions on the Vector Engine). An op takes
max(DMA, compute); ops run back to back. Views and metadata ops are free.
Limits: no fusion by the Neuron compiler, no kernel-launch overhead, no overlap
between consecutive ops — it estimates the *unfused* sequence, nothing more.
"""

from dataclasses import dataclass, field

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from neuronsim.nki import _cost_model as cm
from neuronsim.nki._cost_model import ENGINES, CostReport
from neuronsim.nki._jit import Kernel
from neuronsim.nki._rules import get_hardware

aten = torch.ops.aten

_MATMUL = {
    aten.mm.default,
    aten.bmm.default,
    aten.addmm.default,
    aten.baddbmm.default,
    aten.matmul.default,
    aten.linear.default,
    aten.addbmm.default,
}
_SDPA = {
    getattr(aten, n).default
    for n in (
        "_scaled_dot_product_flash_attention_for_cpu",
        "_scaled_dot_product_efficient_attention",
        "_scaled_dot_product_flash_attention",
        "scaled_dot_product_attention",
        "_scaled_dot_product_attention_math",
    )
    if hasattr(aten, n)
}
_TRANSCENDENTAL = {
    "exp",
    "exp2",
    "expm1",
    "log",
    "log1p",
    "log2",
    "tanh",
    "sigmoid",
    "gelu",
    "silu",
    "rsqrt",
    "sqrt",
    "erf",
    "sin",
    "cos",
    "pow",
    "reciprocal",
    "softplus",
    "mish",
    "elu",
    "_softmax",
    "_log_softmax",
    "logsumexp",
}
_FREE = {
    "view",
    "_unsafe_view",
    "reshape",
    "t",
    "transpose",
    "permute",
    "expand",
    "slice",
    "select",
    "unsqueeze",
    "squeeze",
    "detach",
    "alias",
    "as_strided",
    "split",
    "split_with_sizes",
    "unbind",
    "chunk",
    "narrow",
    "_reshape_alias",
    "lift_fresh",
    "empty",
    "empty_like",
    "empty_strided",
    "new_empty",
    "sym_size",
    "sym_stride",
    "sym_numel",
    "is_same_size",
    "_local_scalar_dense",
    "unflatten",
    "flatten",
    "view_as",
    "expand_as",
    "movedim",
    "diagonal",
    "contiguous",
}
_PASSES = {
    "_softmax": (3, 1),
    "_log_softmax": (3, 1),
    "native_layer_norm": (4, 1),
    "_fused_rms_norm": (3, 1),
    "native_group_norm": (4, 1),
    "var_mean": (2, 0),
}


@dataclass
class OpCost:
    """Cost of one recorded ATen op."""

    name: str
    engine: str
    dma_s: float
    compute_s: float
    hbm_bytes: int
    flops: float

    @property
    def time_s(self):
        return max(self.dma_s, self.compute_s)


@dataclass
class TorchCostReport(CostReport):
    """Estimate of an unfused op sequence: ops run back to back, each max(DMA, compute)."""

    ops: list = field(default_factory=list)

    @property
    def total_time_s(self):
        return sum(op.time_s for op in self.ops)

    @property
    def bound(self):
        mem = sum(op.time_s for op in self.ops if op.dma_s >= op.compute_s)
        if mem >= self.total_time_s / 2:
            return "memory"
        return f"compute ({max(('Tensor', 'Vector', 'Scalar'), key=self.engine_busy_s.get)})"

    def __str__(self):
        head = (
            f"Unfused PyTorch estimate on {self.hardware} (one NeuronCore): "
            f"{self.total_time_s * 1e6:.2f} us over {len(self.ops)} ops, {self.bound}-bound"
        )
        rows = [
            f"  {op.name:<40} {op.engine:<7} {op.time_s * 1e6:9.2f} us " f"({op.hbm_bytes / 1e3:.1f} kB HBM)"
            for op in self.ops[:30]
        ]
        if len(self.ops) > 30:
            rows.append(f"  ... {len(self.ops) - 30} more ops")
        return "\n".join([head] + rows)


def _tensors(tree):
    return [t for t in tree_flatten(tree)[0] if isinstance(t, torch.Tensor)]


def _nbytes(ts):
    seen, total = set(), 0
    for t in ts:
        key = (
            t.untyped_storage().data_ptr() if t.device.type != "meta" else id(t),
            t.storage_offset(),
            tuple(t.shape),
            tuple(t.stride()),
        )
        if key in seen:
            continue
        seen.add(key)
        total += t.numel() * t.element_size()
    return total


def _op_cost(hw, func, args, kwargs, out):
    base = func.overloadpacket.__name__
    if base in _FREE or base.endswith("_view") and base != "_unsafe_view":
        return None
    ins, outs = _tensors((args, kwargs)), _tensors(out)
    nbytes = _nbytes(ins) + _nbytes(outs)
    dma = cm.dma_seconds(hw, nbytes) if nbytes else 0.0
    ref = outs[0] if outs else (ins[0] if ins else None)
    numel = max([t.numel() for t in ins + outs] or [0])
    dname = str(ref.dtype).partition(".")[2] if ref is not None else "float32"
    if func in _MATMUL or func in _SDPA:
        flops = _matmul_flops(func, ins, outs)
        key = cm._TENSOR_RATE_KEY.get(dname, "bfloat16")
        return OpCost(base, "Tensor", dma, flops / hw.tensor_flops[key], nbytes, flops)
    vec_passes, act_passes = _PASSES.get(base, (1, 1) if base in _TRANSCENDENTAL else (1, 0))
    free = -(-numel // hw.pmax)  # the op's elements spread over the 128 partitions
    all_16bit = dname in ("bfloat16", "float16")
    compute = 0.0
    if base not in _TRANSCENDENTAL:
        compute += vec_passes * cm.elementwise_seconds(hw, "Vector", hw.pmax, free, all_16bit=all_16bit)
    compute += act_passes * cm.elementwise_seconds(hw, "Scalar", hw.pmax, free)
    engine = "Scalar" if act_passes and base in _TRANSCENDENTAL else "Vector"
    return OpCost(base, engine, dma, compute, nbytes, 0.0)


def _matmul_flops(func, ins, outs):
    if func in _SDPA:
        q, k = ins[0], ins[1]
        return 4.0 * q.shape[:-1].numel() * k.shape[-2] * q.shape[-1]
    out = outs[0]
    a = ins[1] if func in (aten.addmm.default, aten.baddbmm.default, aten.addbmm.default) else ins[0]
    k = a.shape[-1]
    return 2.0 * out.numel() * k


class _Recorder(TorchDispatchMode):
    def __init__(self, hw):
        super().__init__()
        self.hw = hw
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        cost = _op_cost(self.hw, func, args, kwargs, out)
        if cost is not None:
            self.ops.append(cost)
        return out


def estimate_torch(fn, *args, platform_target=None, **kwargs):
    """Run ``fn(*args, **kwargs)`` once and estimate its unfused cost on a NeuronCore.

    Returns ``(output, TorchCostReport)``.
    """
    hw = get_hardware(platform_target)
    rec = _Recorder(hw)
    with torch.no_grad(), rec:
        out = fn(*args, **kwargs)
    busy = {e: 0.0 for e in ENGINES}
    count = {e: 0 for e in ENGINES}
    for op in rec.ops:
        busy["DMA"] += op.dma_s
        busy[op.engine] += op.compute_s
        count["DMA"] += 1
        count[op.engine] += 1
    report = TorchCostReport(
        hardware=hw.name,
        engine_busy_s=busy,
        instructions=count,
        hbm_bytes=sum(op.hbm_bytes for op in rec.ops),
        flops=sum(op.flops for op in rec.ops),
        ops=rec.ops,
    )
    return out, report


@dataclass
class Comparison:
    """A kernel's estimate next to the unfused PyTorch sequence it replaces."""

    kernel: CostReport
    torch: TorchCostReport
    kernel_output: object = None
    torch_output: object = None

    @property
    def speedup(self):
        return self.torch.total_time_s / self.kernel.total_time_s

    def __str__(self):
        return (
            f"{self.kernel}\n{self.torch}\nestimated speedup of the NKI kernel over the "
            f"unfused PyTorch ops on {self.kernel.hardware}: {self.speedup:.2f}x"
        )


def compare(kernel, torch_fn, *args, platform_target=None, **kwargs):
    """Simulate ``kernel(*args)`` and estimate ``torch_fn(*args)``; see :class:`Comparison`."""
    k = kernel if isinstance(kernel, Kernel) else Kernel(kernel)
    kout, krep = k.simulate(*args, platform_target=platform_target, **kwargs)
    tout, trep = estimate_torch(torch_fn, *args, platform_target=platform_target, **kwargs)
    return Comparison(krep, trep, kout, tout)
