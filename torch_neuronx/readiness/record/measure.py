"""What an op call or a compiled graph measures, in the units the time model reads: its kind
(Tensor Engine, vector, view), FLOPs, HBM bytes, DMA operands and its matmuls' shapes (from
shapes and dtypes alone: nothing here depends on a chip, which the time model applies)."""

from __future__ import annotations

import operator
import weakref

import torch

from neuronsim import collectives as _collectives

from .. import _torch_private
from .recording import GraphPart

PRIM_DEVICE = torch.ops.prim.device.default  # a tensor's device, asked from C++: nothing to record

# Ops that only allocate, or build a new view of existing memory: no data moves, no kernel runs.
METADATA_OPS = frozenset(
    {
        "aten::detach",
        "aten::lift_fresh",
        "aten::_reshape_alias",
        "aten::set_",
        "aten::_unsafe_view",
        "aten::alias",
        "aten::empty",
        "aten::empty_like",
        "aten::empty_strided",
        "aten::new_empty",
        "aten::new_empty_strided",
    }
)

# Copies and allocations run by the device's own memory kernels, never through the CPU
# fallback, so no dtype makes them fall back (a dry run must judge them as a real run does).
MEMORY_KERNEL_OPS = METADATA_OPS | frozenset(
    {
        "aten::_to_copy",
        "aten::copy_",
        "aten::_copy_from",
        "aten::_copy_from_and_resize",
        "aten::resize_",
        "aten::as_strided",
        "aten::view",
        "aten::set_",
        "aten::_local_scalar_dense",
        "aten::lift_fresh_copy",
    }
)

# Ops the simulator runs as CPU kernels whose device form (what a NeuronCore runs, what
# torch.utils.flop_counter has a formula for) takes the same leading arguments: attention on
# `neuron` tensors dispatches to the CPU flash kernel, which is a Tensor Engine op all the same.
_DEVICE_FORM = {
    "_scaled_dot_product_flash_attention_for_cpu": "_scaled_dot_product_flash_attention",
    "_scaled_dot_product_flash_attention_for_cpu_backward": "_scaled_dot_product_flash_attention_backward",
}

# Ops that write part of a tensor in place (a static KV cache's update): they move the values
# and indices they read and as many bytes written, not the whole destination.
_PARTIAL_WRITES = frozenset(
    {"aten::index_copy_", "aten::index_put_", "aten::_index_put_impl_", "aten::scatter_", "aten::slice_scatter"}
)


def tensors(args, out: list) -> list:
    """`out` extended with the tensors among `args`, one level of lists deep (ATen's schemas go no deeper)."""
    for a in args:
        if isinstance(a, torch.Tensor):
            out.append(a)
        elif isinstance(a, (list, tuple)):
            for b in a:
                if isinstance(b, torch.Tensor):
                    out.append(b)
    return out


def outputs(out) -> list:
    """The tensors an op returned."""
    return tensors((out,) if isinstance(out, torch.Tensor) else out if isinstance(out, (list, tuple)) else (), [])


def dtype_name(dtype) -> str:
    return str(dtype).replace("torch.", "")


def _composite_flops(name: str):
    """A FLOP formula for a composite op PyTorch's counter has none for (it counts what they
    decompose to), from its matmuls; such ops reach a recording whole under
    ``torch.inference_mode``, where autograd does not decompose them."""

    def flops(*args, out_val=None, **kwargs):
        return sum(2 * m * k * n * c for m, k, n, c in _matmuls(name, args))

    return flops


def _flop_formula(func):
    from torch.utils.flop_counter import flop_registry

    packet = _torch_private.overload_packet(func)
    if packet.__name__ in ("linear", "scaled_dot_product_attention"):
        return _composite_flops(packet.__name__)
    twin = _DEVICE_FORM.get(packet.__name__)
    return flop_registry.get(packet) or (flop_registry.get(getattr(torch.ops.aten, twin)) if twin else None)


WAIT_TENSOR = "_c10d_functional::wait_tensor"  # a collective's wait: it moves no data


class FuncInfo:
    """An op's name, kind and FLOP formula, computed once per op."""

    __slots__ = ("name", "kind", "flops")

    def __init__(self, func):
        self.name = func.name()
        self.flops = _flop_formula(func)
        if self.name.split("::")[0] in ("c10d", "_c10d_functional"):
            known = _collectives.find(self.name) is not None or self.name.startswith(WAIT_TENSOR)
            self.kind = "collective" if known else "other"
        elif self.name.startswith("prim::"):
            self.kind = "none"  # metadata queries (prim::device): seen only on fake tensors
        elif func.is_view or self.name.split(".")[0] in METADATA_OPS:
            self.kind = "view"
        elif self.flops is not None:
            self.kind = "tensor"  # matmul-like: the Tensor Engine
        else:
            self.kind = "vector"  # elementwise, reductions, copies: Vector/Scalar engines and DMA


_ATTENTION = frozenset(
    {
        "_scaled_dot_product_flash_attention_for_cpu",
        "_scaled_dot_product_flash_attention",
        "_scaled_dot_product_efficient_attention",
        "_scaled_dot_product_cudnn_attention",
        "_scaled_dot_product_fused_attention_overrideable",
        "flex_attention",
    }
)


def _attention_matmuls(q, k, v, backward: bool) -> list:
    """The matmuls of attention over q [..., Sq, D], k [..., Skv, D], v [..., Skv, Dv]: Q K^T and
    P V; backward: Q K^T again, dV = P^T dO, dP = dO V^T, dQ = dS K, dK = dS^T Q."""
    *batch, sq, d = q.shape
    skv, dv = k.shape[-2], v.shape[-1]
    n = 1
    for b in batch:
        n *= int(b)
    if not backward:
        return [(sq, d, skv, n), (sq, skv, dv, n)]
    return [(sq, d, skv, n), (skv, sq, dv, n), (sq, dv, skv, n), (sq, skv, d, n), (skv, sq, d, n)]


def _matmuls(name: str, args) -> list | None:
    """[(m, k, n, count)] of the matmuls a Tensor Engine op runs, where its shapes say (else None)."""
    base = name.split("::")[-1].split(".")[0]
    if base in ("mm", "addmm"):
        a, b = args[-2:] if base == "addmm" else args[:2]
        return [(a.shape[0], a.shape[1], b.shape[1], 1)]
    if base == "linear":  # x [..., K] @ weight [N, K]^T
        x, w = args[:2]
        return [(x.numel() // x.shape[-1], x.shape[-1], w.shape[0], 1)]
    if base == "scaled_dot_product_attention":
        return _attention_matmuls(*args[:3], backward=False)
    if base in ("bmm", "baddbmm"):
        a, b = args[1:3] if base == "baddbmm" else args[:2]
        return [(a.shape[1], a.shape[2], b.shape[2], a.shape[0])]
    if base in _ATTENTION:
        return _attention_matmuls(*args[:3], backward=False)
    if base.endswith("_backward") and base.removesuffix("_backward") in _ATTENTION:
        return _attention_matmuls(*args[1:4], backward=True)
    return None


def matmul_shapes(name: str, args) -> tuple:
    """((m, k, n, count), ...) of the matmuls a Tensor Engine op runs, from which the time model
    computes the tiles they occupy on a chip; () where its shapes say nothing (a convolution:
    timed at its FLOPs)."""
    try:
        mm = _matmuls(name, args)
        return tuple(tuple(int(x) for x in m) for m in mm) if mm else ()
    except (TypeError, ValueError, IndexError, AttributeError):  # symbolic or unexpected shapes
        return ()


# Ops that read only the rows their indices select from their first input (an embedding lookup):
# they move the indices, the rows (as many bytes as they write) and their output.
_GATHERS = frozenset({"aten::embedding"})


def moved_bytes(name: str, ins: list, outs: list) -> int:
    """HBM bytes an op moves: its inputs read and outputs written once (a partial in-place
    write: the values and indices it reads, and the values it writes; a lookup: the indices,
    the rows it reads and what it writes)."""
    base = name.split(".")[0]
    if base in _PARTIAL_WRITES and ins and outs and outs[0] is ins[0]:
        src = sum(t.nbytes for t in ins[1:])
        return 2 * src
    if base in _GATHERS and len(ins) >= 2 and outs:
        written = sum(t.nbytes for t in outs)
        return sum(t.nbytes for t in ins[1:]) + 2 * written
    return sum(t.nbytes for t in ins) + sum(t.nbytes for t in outs)


def _nbytes(v) -> int:
    return v.numel() * v.element_size() if isinstance(v, torch.Tensor) else 0


def _classify_nodes(gm) -> tuple:
    """({node: "input"|"output"|"mm"|"view"|"vec"|"other"}, matmul parts, vector operations,
    the first floating dtype of the vector nodes) of an ATen graph."""
    from torch.fx.node import map_arg

    cls: dict = {}
    parts, vec_ops, dtype = [], 0, None
    for node in gm.graph.nodes:
        if node.op in ("placeholder", "output"):
            cls[node] = "input" if node.op == "placeholder" else "output"
        elif node.op == "call_function" and isinstance(node.target, _torch_private.OpOverload):
            info = FuncInfo(node.target)
            kind = cls[node] = {"tensor": "mm", "view": "view", "vector": "vec"}.get(info.kind, "other")
            if kind not in ("mm", "vec"):
                continue
            args, kwargs = map_arg((node.args, node.kwargs), lambda n: n.meta.get("val"))
            out = node.meta.get("val")
            ins, outs = tensors(kwargs.values(), tensors(args, [])), outputs(out)
            d = next((t.dtype for t in ins + outs if t.is_floating_point()), None)
            if kind == "mm":
                flops = int(info.flops(*args, **kwargs, out_val=out))
                nbytes = sum(_nbytes(t) for t in ins + outs)
                mm = matmul_shapes(info.name, args)
                parts.append(
                    GraphPart("tensor", dtype_name(d or ins[0].dtype), flops, nbytes, len(ins) + len(outs), mm)
                )
            else:
                vec_ops += sum(t.numel() for t in ins + outs)  # one operation per element read or written
                dtype = dtype or d
        elif node.op == "call_function" and node.target is operator.getitem:
            cls[node] = cls.get(node.args[0], "other")  # an output of a multi-output node
        else:
            cls[node] = "other"
    return cls, parts, vec_ops, dtype


def _partial_write(node) -> bool:
    """An in-place op that writes part of its first argument (``_PARTIAL_WRITES``)."""
    name = node.target.name() if isinstance(node.target, _torch_private.OpOverload) else ""
    return name.split(".")[0] in _PARTIAL_WRITES and bool(node.args) and hasattr(node.args[0], "meta")


def graph_parts(gm) -> list:
    """The cost of one run of a compiled ATen graph, as :class:`GraphPart` s timed like ops:
    one per matmul-like node (as eager), and one ``"fused"`` part for all other nodes, as one
    kernel (its flops: vector operations).

    The fused kernel reads from HBM what its nodes take from outside it (graph inputs,
    matmul results) and writes what leaves it (graph outputs, matmul operands), each once;
    its intermediates stay on chip (an in-place partial write: the values it writes). Views cost
    nothing and are seen through.
    """
    cls, parts, vec_ops, dtype = _classify_nodes(gm)

    def root(n):  # the node whose memory a view chain aliases
        while cls.get(n) == "view" and n.all_input_nodes:
            n = n.all_input_nodes[0]
        return n

    def leaves_fusion(n) -> bool:  # some non-view user outside the fused kernel
        return any(cls[u] not in ("vec", "view") or (cls[u] == "view" and leaves_fusion(u)) for u in n.users)

    reads, writes = {}, {}
    for node, c in cls.items():
        if c != "vec":
            continue
        # an in-place partial write (a static KV cache's update) reads and writes only the values
        # it writes, as eager (``moved_bytes``): its target is not read, nor written whole
        target = node.args[0] if _partial_write(node) else None
        for i in node.all_input_nodes:
            r = root(i)
            if cls[r] != "vec" and i is not target:
                reads[r] = max(reads.get(r, 0), _nbytes(i.meta.get("val")))
        if target is not None:
            writes[node] = sum(_nbytes(i.meta.get("val")) for i in node.all_input_nodes if i is not target)
        elif isinstance(node.meta.get("val"), torch.Tensor) and leaves_fusion(node):
            writes[node] = _nbytes(node.meta["val"])
    if vec_ops or reads or writes:
        nbytes = sum(reads.values()) + sum(writes.values())
        parts.append(GraphPart("fused", dtype_name(dtype or torch.float32), vec_ops, nbytes, len(reads) + len(writes)))
    return parts


def is_dynamic(gm) -> bool:
    """A graph compiled for symbolic shapes: one run's cost depends on the sizes it gets."""
    for node in gm.graph.find_nodes(op="placeholder"):
        v = node.meta.get("val")
        if isinstance(v, torch.SymInt) or (
            isinstance(v, torch.Tensor) and any(isinstance(d, torch.SymInt) for d in v.shape)
        ):
            return True
    return False


_PARTS = weakref.WeakKeyDictionary()  # ATen graph -> graph_parts(), computed once per process


def cached_parts(gm) -> list:
    parts = _PARTS.get(gm)
    if parts is None:
        parts = _PARTS[gm] = graph_parts(gm)
    return parts
