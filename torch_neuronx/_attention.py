"""FlexAttention and varlen attention on neuron.

PyTorch's flex_attention higher-order op is device-neutral underneath (its math
implementation is registered for CompositeExplicitAutograd, which PrivateUse1
reaches), but the front end refuses every device outside a fixed allow-list and
the op has no AutocastPrivateUse1 kernel. varlen_attn's custom ops call CUDA's
flash/cuDNN kernels; a kernel for neuron goes through torch.library.register_kernel,
the documented route. Each piece installs right after the torch module it needs is
imported (see torch_neuronx._dynamo.register), so ``import torch`` stays cheap.
"""

from __future__ import annotations

import itertools
import sys

import torch

DEVICE = "neuron"


class FlexAttentionNeuronError(RuntimeError):
    """A FlexAttention request that the neuron device cannot serve."""


def _hop_module():
    # `from torch._higher_order_ops import flex_attention` gives the op, not the module.
    return sys.modules["torch._higher_order_ops.flex_attention"]


def install_flex(fa_module) -> None:
    """Let flex_attention run on neuron: front-end check, autocast, device kernel (idempotent)."""
    if getattr(fa_module, "_neuron_installed", False):
        return
    fa_module._neuron_installed = True
    from . import _compat

    _compat.relax_flex_attention_device_check(fa_module)
    _register_hop_kernels(_hop_module())


def _check_kernel_options(kernel_options) -> None:
    if (kernel_options or {}).get("BACKEND") == "FLASH":
        raise FlexAttentionNeuronError(
            "flex_attention with kernel_options={'BACKEND': 'FLASH'} (torchtitan's 'flex_flash') runs "
            "the CUDA-only FlashAttention CuTe kernels (compute capability 9.0+); neuron has none. "
            "Drop BACKEND (or use 'AUTO'), or in torchtitan choose attn_backend 'flex' or 'varlen'."
        )


def _register_hop_kernels(hop_module) -> None:
    from torch._C import DispatchKey

    flex, flex_backward = hop_module.flex_attention, hop_module.flex_attention_backward
    dense = hop_module.sdpa_dense

    def _neuron_flex(query, key, value, score_mod, block_mask, scale, kernel_options, *buffers):
        _check_kernel_options(kernel_options)
        return dense(query, key, value, score_mod, block_mask, scale, kernel_options, *buffers)

    def _autocast_flex(query, key, value, score_mod, block_mask, scale, kernel_options, *buffers):
        # As PyTorch's AutocastCUDA kernel does: cast q/k/v to the autocast dtype and
        # redispatch below autocast. The backward op needs no cast: it falls through.
        dtype = torch.get_autocast_dtype(DEVICE)
        cast = torch.amp.autocast_mode._cast
        query, key, value = (cast(t, DEVICE, dtype) for t in (query, key, value))
        with torch._C._ExcludeDispatchKeyGuard(torch._C.DispatchKeySet(DispatchKey.AutocastPrivateUse1)):
            return flex(query, key, value, score_mod, block_mask, scale, kernel_options, *buffers)

    if DispatchKey.PrivateUse1 not in flex.py_kernels:
        flex.py_impl(DispatchKey.PrivateUse1)(_neuron_flex)
    if DispatchKey.AutocastPrivateUse1 not in flex.py_kernels:
        flex.py_impl(DispatchKey.AutocastPrivateUse1)(_autocast_flex)
        flex_backward.fallthrough(DispatchKey.AutocastPrivateUse1)
    flex._dispatch_cache.clear()
    flex_backward._dispatch_cache.clear()


# --------------------------------------------------------------------------- #
# Compiled graphs: Inductor lowers flex_attention with Triton (GPU) or a CPU template
# (forward only); on neuron both HOPs are replaced by the math they run eagerly, which
# Inductor then compiles to C++ kernels like any other neuron graph.
# --------------------------------------------------------------------------- #


def decompose_flex_nodes(gm: torch.fx.GraphModule) -> None:
    """Replace neuron flex_attention (and backward) nodes of a post-grad graph by their math."""
    hop_module = _hop_module() if "torch._higher_order_ops.flex_attention" in sys.modules else None
    if hop_module is None:
        return
    # op -> (its math, the position of kernel_options among its arguments)
    dense = {
        torch.ops.higher_order.flex_attention: (hop_module.sdpa_dense, 6),
        torch.ops.higher_order.flex_attention_backward: (hop_module.sdpa_dense_backward, 12),
    }
    replaced = False
    for node in list(gm.graph.nodes):
        if node.op == "call_function" and node.target in dense:
            query = node.args[0].meta.get("val")
            if isinstance(query, torch.Tensor) and query.device.type == DEVICE:
                _check_kernel_options(node.args[dense[node.target][1]])
                _inline_math(gm, node, dense[node.target][0])
                replaced = True
    if replaced:
        gm.graph.lint()
        gm.recompile()


def _inline_math(gm, node, dense) -> None:
    # Traced and copied in by hand: the pattern matcher's replace_by_example cannot carry the
    # tensor constants the math creates (its -inf fill value).
    import torch.utils._pytree as pytree

    from ._dynamo import _inductor_glue

    leaves, spec = pytree.tree_flatten((node.args, node.kwargs))
    tensor_at = [i for i, x in enumerate(leaves) if isinstance(x, torch.fx.Node) and x.op != "get_attr"]
    consts = [getattr(gm, x.target) if isinstance(x, torch.fx.Node) and x.op == "get_attr" else x for x in leaves]

    def math(*tensors):
        values = list(consts)
        for i, t in zip(tensor_at, tensors):
            values[i] = t
        args, kwargs = pytree.tree_unflatten(values, spec)
        return dense(*args, **kwargs)

    sub = _inductor_glue.trace_in_compiling_graph(math, [leaves[i].meta["val"] for i in tensor_at])
    env = {}
    placeholders = iter(leaves[i] for i in tensor_at)
    with gm.graph.inserting_before(node):
        for n in sub.graph.nodes:
            if n.op == "placeholder":
                env[n] = next(placeholders)
            elif n.op == "get_attr":
                name = f"_neuron_flex_const{next(_const_ids)}"
                gm.register_buffer(name, getattr(sub, n.target))
                env[n] = gm.graph.get_attr(name)
                env[n].meta.update(n.meta)
            elif n.op == "output":
                _replace_uses(node, pytree.tree_map(lambda x: env[x] if isinstance(x, torch.fx.Node) else x, n.args[0]))
            else:
                env[n] = gm.graph.node_copy(n, lambda x: env[x])
    gm.graph.erase_node(node)


_const_ids = itertools.count()


def _replace_uses(node, value) -> None:
    import operator

    if isinstance(value, torch.fx.Node):
        node.replace_all_uses_with(value)
        return
    for user in list(node.users):
        if user.op != "call_function" or user.target is not operator.getitem:
            raise AssertionError(f"unexpected use of flex_attention output: {user.format_node()}")
        _replace_uses(user, value[user.args[1]])
        user.graph.erase_node(user)


# --------------------------------------------------------------------------- #
# varlen_attn: kernels for torch_attn::_varlen_attn and its backward
# --------------------------------------------------------------------------- #


def install_varlen(_module=None) -> None:
    """Register neuron kernels for varlen_attn's custom ops (idempotent)."""
    global _varlen_installed
    if _varlen_installed:
        return
    _varlen_installed = True
    torch.library.register_kernel("torch_attn::_varlen_attn", DEVICE, _varlen_forward)
    torch.library.register_kernel("torch_attn::_varlen_attn_backward", DEVICE, _varlen_backward)


_varlen_installed = False


def _varlen_mask(len_q, len_k, is_causal, window_size, device):
    # FlashAttention's conventions: causal and windows align the last query with the last key.
    i = torch.arange(len_q, device=device).unsqueeze(1) + (len_k - len_q)
    j = torch.arange(len_k, device=device).unsqueeze(0)
    keep = torch.ones(len_q, len_k, dtype=torch.bool, device=device)
    left, right = window_size if window_size is not None else (-1, -1)
    if is_causal:
        right = 0 if right < 0 else min(right, 0)
    if left >= 0:
        keep &= j >= i - left
    if right >= 0:
        keep &= j <= i + right
    return keep


def _varlen_sequences(query, key, value, cu_seq_q, cu_seq_k):
    """Per sequence: (query rows, key rows, q, k, v) as float32 (heads, length, dim), k/v GQA-expanded."""
    heads = query.shape[1]
    bounds_q, bounds_k = cu_seq_q.tolist(), cu_seq_k.tolist()
    for s in range(len(bounds_q) - 1):
        rows_q, rows_k = slice(bounds_q[s], bounds_q[s + 1]), slice(bounds_k[s], bounds_k[s + 1])
        q, k, v = (t[rows].transpose(0, 1).float() for t, rows in ((query, rows_q), (key, rows_k), (value, rows_k)))
        k, v = (t.repeat_interleave(heads // t.shape[0], dim=0) for t in (k, v))
        yield rows_q, rows_k, q, k, v


def _varlen_probs(q, k, scale, is_causal, window_size):
    scores = (q @ k.transpose(-1, -2)) * scale
    keep = _varlen_mask(q.shape[1], k.shape[1], is_causal, window_size, q.device)
    scores = scores.masked_fill(~keep, float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)
    # Rows with no key left produce zeros, as FlashAttention's do (not NaN).
    return torch.exp(scores - lse.unsqueeze(-1)).nan_to_num(0.0), lse


def _varlen_forward(
    query,
    key,
    value,
    cu_seq_q,
    cu_seq_k,
    max_q,
    max_k,
    is_causal=False,
    scale=None,
    window_size=None,
    enable_gqa=False,
    seqused_k=None,
    block_table=None,
    num_splits=None,
):
    if seqused_k is not None or block_table is not None:
        raise NotImplementedError(
            "varlen_attn on neuron does not take seqused_k or block_table (paged KV caches); "
            "pass the keys of each sequence contiguously with cu_seq_k."
        )
    cu_seq_k = cu_seq_q if cu_seq_k is None else cu_seq_k
    scale = query.shape[-1] ** -0.5 if scale is None else scale
    out = torch.empty_like(query)
    lse = torch.empty(query.shape[1], query.shape[0], dtype=torch.float32, device=query.device)
    for rows_q, _, q, k, v in _varlen_sequences(query, key, value, cu_seq_q, cu_seq_k):
        probs, lse[:, rows_q] = _varlen_probs(q, k, scale, is_causal, window_size)
        out[rows_q] = (probs @ v).transpose(0, 1).to(query.dtype)
    # Dropout is always 0 here (as in PyTorch's kernel): the RNG state is zeros.
    return out, lse, torch.zeros(2, dtype=torch.int64, device=query.device).view(torch.uint64)


def _varlen_backward(
    grad_out,
    query,
    key,
    value,
    out,
    lse,
    cu_seq_q,
    cu_seq_k,
    max_q,
    max_k,
    is_causal,
    rng_state,
    scale=None,
    window_size=None,
):
    # FlashAttention's backward: recompute the probabilities, then the softmax gradient.
    cu_seq_k = cu_seq_q if cu_seq_k is None else cu_seq_k
    scale = query.shape[-1] ** -0.5 if scale is None else scale
    grads = [torch.zeros(t.shape, dtype=torch.float32, device=t.device) for t in (query, key, value)]
    group = query.shape[1] // key.shape[1]
    for rows_q, rows_k, q, k, v in _varlen_sequences(query, key, value, cu_seq_q, cu_seq_k):
        probs, _ = _varlen_probs(q, k, scale, is_causal, window_size)
        d_out = grad_out[rows_q].transpose(0, 1).float()
        o = out[rows_q].transpose(0, 1).float()
        d_scores = probs * (d_out @ v.transpose(-1, -2) - (d_out * o).sum(-1, keepdim=True)) * scale
        dq, dk, dv = d_scores @ k, d_scores.transpose(-1, -2) @ q, probs.transpose(-1, -2) @ d_out
        grads[0][rows_q] = dq.transpose(0, 1)
        # Grouped-query attention: a key/value head's gradient sums over the heads sharing it.
        for i, d in ((1, dk), (2, dv)):
            grads[i][rows_k] = d.unflatten(0, (-1, group)).sum(1).transpose(0, 1)
    return tuple(g.to(t.dtype) for g, t in zip(grads, (query, key, value)))
