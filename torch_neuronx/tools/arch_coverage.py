"""Causal-LM architecture coverage of the ``neuron`` device.

Builds every architecture in transformers' ``MODEL_FOR_CAUSAL_LM_MAPPING_NAMES``
from a tiny config derived from its config class defaults, runs greedy
generation on CPU and on neuron (eager, and with a static cache whose decode
step transformers compiles with backend "neuron"), and compares tokens and
logits with CPU eager::

    python -m torch_neuronx.tools.arch_coverage [--compiled] [--only NAME ...] [-j out.json]

Architectures whose tiny config cannot be built or that fail on CPU itself are
listed as skipped and not counted.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import sys
import time
import traceback

import torch

from neuronsim import settings as _settings

NEW_TOKENS = 8
PROMPT_LEN = 6
VOCAB = 256
# Eager neuron runs CPU kernels on the same memory: expect exact equality.
EAGER_ATOL = 1e-4
# Compiled decode (Inductor C++ codegen, fused reductions) vs CPU eager with the same static cache.
COMPILED_ATOL = 1e-3

# Scalar fields shrunk generically (only when the default is a larger int).
_SHRINK = {
    "vocab_size": VOCAB,
    "hidden_size": 64,
    "d_model": 64,
    "n_embd": 64,
    "emb_dim": 64,
    "embedding_dim": 64,
    "embedding_size": 64,
    "d_inner": 64,
    "d_head": 16,
    "intermediate_size": 64,
    "ffn_dim": 64,
    "n_inner": 64,
    "decoder_ffn_dim": 64,
    "encoder_ffn_dim": 64,
    "moe_intermediate_size": 32,
    "shared_expert_intermediate_size": 32,
    "shared_intermediate_size": 32,
    "shared_experts_intermediate_size": 32,
    "moe_shared_expert_intermediate_size": 32,
    "dense_intermediate_size": 64,
    "prefix_dense_intermediate_size": 64,
    "expert_ffn_hidden_size": 32,
    "intermediate_size_mlp": 64,
    "ffn_hidden_size": 64,
    "feed_forward_size": 64,
    "dim_ff": 64,
    "dff": 64,
    "num_hidden_layers": 2,
    "n_layer": 2,
    "num_layers": 2,
    "n_layers": 2,
    "decoder_layers": 2,
    "encoder_layers": 2,
    "num_decoder_layers": 2,
    "num_encoder_layers": 2,
    "num_blocks": 2,
    "num_attention_heads": 4,
    "n_head": 4,
    "n_heads": 4,
    "num_heads": 4,
    "attention_heads": 4,
    "decoder_attention_heads": 4,
    "encoder_attention_heads": 4,
    "num_decoder_attention_heads": 4,
    "num_encoder_attention_heads": 4,
    "num_key_value_heads": 2,
    "num_kv_heads": 2,
    "head_dim": 16,
    "dim_head": 16,
    "attention_head_size": 16,
    "attention_head_dim": 16,
    "kv_channels": 16,
    "num_experts": 4,
    "num_local_experts": 4,
    "n_routed_experts": 4,
    "moe_num_experts": 4,
    "num_experts_per_tok": 2,
    "moe_topk": 2,
    "moe_k": 2,
    "top_k_experts": 2,
    "n_shared_experts": 1,
    "num_shared_experts": 1,
    "moe_num_shared_experts": 1,
    "n_group": 1,
    "topk_group": 1,
    "max_position_embeddings": 128,
    "n_positions": 128,
    "n_ctx": 128,
    "max_target_positions": 128,
    "max_source_positions": 128,
    "kv_lora_rank": 16,
    "q_lora_rank": 32,
    "qk_rope_head_dim": 8,
    "qk_nope_head_dim": 8,
    "v_head_dim": 16,
    "qk_head_dim": 16,
    "o_lora_rank": 16,
    "index_n_heads": 2,
    "index_head_dim": 16,
    "index_topk": 16,
    "indexer_n_heads": 2,
    "indexer_head_dim": 16,
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 4,
    "linear_key_head_dim": 16,
    "linear_value_head_dim": 16,
    "linear_head_dim": 16,
    "linear_num_heads": 4,
    "mamba_n_heads": 4,
    "mamba_d_head": 16,
    "mamba_num_heads": 4,
    "mamba_head_dim": 16,
    "mamba_d_state": 16,
    "ssm_state_size": 16,
    "state_size": 16,
    "mamba_n_groups": 1,
    "n_groups": 1,
    "mamba_ngroups": 1,
    "mamba_chunk_size": 16,
    "chunk_size": 16,
    "time_step_rank": 8,
    "mamba_dt_rank": 8,
    "mamba_d_ssm": 64,
    "lru_width": 64,
    "attention_window_size": 16,
    "sliding_window": 16,
    "sliding_window_size": 16,
    "attention_hidden_size": 64,
    "router_hidden_size": 32,
    "laurel_rank": 8,
    "hidden_size_per_layer_input": 16,
    "vocab_size_per_layer_input": VOCAB,
    "num_kv_shared_layers": 0,
    "first_k_dense_replace": 1,
    "num_dense_layers": 1,
    "num_mtp_layers": 0,
    "num_nextn_predict_layers": 0,
    "audio_vocab_size": 64,
    "num_codebooks": 2,
    "output_embedding_size": 64,
    "input_embedding_size": 64,
    "word_embed_proj_dim": 64,
    "backbone_hidden_size": 64,
    "pronunciation_vocab_size": 64,
    "shape_vocab_size": 64,
    "pronunciation_embed_dim": 16,
    "shape_embed_dim": 16,
    "type_vocab_size": 2,
    "decoder_vocab_size": VOCAB,
    "swa_num_attention_heads": 4,
    "swa_num_key_value_heads": 2,
    "swa_head_dim": 16,
    "ple_embed_dim": 16,
    "hc_count": 2,
    "ngram_vocab_size_base": 64,
    "unpadded_vocab_size": VOCAB,
    "rotary_dim": 8,
    "image_size": 32,
    "patch_size": 8,
    "num_mel_bins": 16,
    "mem_len": 0,
}

# Per-layer lists: keep one layer of every distinct kind (hybrid models keep all their kinds).
_LAYER_PATTERNS = {"layer_types", "mlp_layer_types", "layers_block_type", "block_types", "attention_types"}
_LAYER_COUNT_PATTERNS = {"layer_types", "layers_block_type", "block_types"}

# Per-architecture fixes the generic rules cannot guess (field -> value).
OVERRIDES: dict[str, dict] = {
    "lfm2_moe": {"layer_types": ["conv", "full_attention"], "num_hidden_layers": 2},
    "mamba2": {"head_dim": 32},
    "zamba": {
        "num_hidden_layers": 4,
        "attn_layer_period": 2,
        "attn_layer_offset": 1,
        "layers_block_type": ["linear_attention", "hybrid"] * 2,
    },
    "qwen4_exp_text": {
        "indexer_n_heads": 2,
        "indexer_kv_heads": 1,
        "indexer_head_dim": 16,
        "indexer_budget": 16,
        "indexer_compress_ratio": 4,
    },
    "dots1": {"n_routed_experts": 4, "n_shared_experts": 1},
    "bamba": {"mamba_d_head": 32, "attn_layer_indices": [1]},
    "granitemoehybrid": {"mamba_d_head": 32, "layer_types": ["linear_attention", "full_attention"]},
    "gpt_neo": {"attention_types": [[["global", "local"], 1]], "num_layers": 2},
    "gemma4_assistant": {"hidden_size_per_layer_input": 0},
    "reformer": {"is_decoder": True, "axial_pos_embds_dim": [16, 48], "axial_pos_shape": [8, 16]},
    "jamba": {"attn_layer_period": 2, "attn_layer_offset": 1, "expert_layer_period": 2, "expert_layer_offset": 1},
    # MptConfig defaults to use_cache=False: generate would ignore the static cache
    "mpt": {"use_cache": True},
}

# Per-architecture setup a user does after building the model (transformers API).
_POST_BUILD = {
    "xmod": lambda m: m.set_default_language("en_XX"),
}

# Compiled decode is checked for these in the fast test run (the rest are slow).
REPRESENTATIVE = ["llama", "gpt2", "mistral", "qwen3_moe", "gemma2", "phi3"]


class SkipArchitecture(Exception):
    """The architecture does not run on CPU at all: listed, not counted."""


def _shrink_value(name, default):
    if name in _SHRINK and isinstance(default, int) and not isinstance(default, bool):
        return min(default, _SHRINK[name]) if default > 0 else default
    return None


def _pattern(values, n_layers):
    """The first occurrence of every distinct entry of a per-layer list, at least n_layers long."""
    seen, out = set(), []
    for v in values:
        key = json.dumps(v, sort_keys=True, default=str)
        if key not in seen:
            seen.add(key)
            out.append(v)
    i = 0
    while len(out) < n_layers and i < len(values):
        out.append(values[len(out) % len(values)])
        i += 1
    return out


def _tiny_kwargs(cfg_cls, default) -> dict:
    fields = {f.name for f in dataclasses.fields(cfg_cls)} if dataclasses.is_dataclass(cfg_cls) else set()
    fields |= set(getattr(cfg_cls, "attribute_map", {}))
    kw = {}
    for name in fields:
        try:
            value = getattr(default, name)
        except Exception:
            continue
        new = _shrink_value(name, value)
        if new is not None and new != value:
            kw[name] = new
    fields_init = {f.name for f in dataclasses.fields(cfg_cls)} if dataclasses.is_dataclass(cfg_cls) else set()
    n_layers = kw.get("num_hidden_layers", getattr(default, "num_hidden_layers", 2))
    if not isinstance(n_layers, int):
        n_layers = 2
    n_default = getattr(default, "num_hidden_layers", None)
    for name in fields_init:
        value = getattr(default, name, None)
        if name in _LAYER_PATTERNS and isinstance(value, (list, tuple)) and value:
            pat = _pattern(list(value), n_layers)
            kw[name] = pat
            if name in _LAYER_COUNT_PATTERNS and "num_hidden_layers" in kw:
                kw["num_hidden_layers"] = n_layers = max(n_layers, len(pat))
        elif (
            name in _SHRINK and isinstance(value, list) and value and all(isinstance(x, int) for x in value)
        ):  # per-layer sizes
            kw[name] = [min(x, _SHRINK[name]) for x in value[:n_layers]]
        elif isinstance(value, list) and n_default and len(value) == n_default and n_layers < n_default:
            kw[name] = value[:n_layers]  # other per-layer lists
        elif isinstance(value, dict) and value and all(isinstance(k, int) for k in value) and n_default:
            kw[name] = {k: v for k, v in value.items() if k < n_layers}  # per-layer-index tables
    # defaults some classes leave unset (their Hub configs always set them)
    get = lambda k: kw.get(k, getattr(default, k, None))  # noqa: E731
    if "head_dim" in fields_init and get("head_dim") is None and get("hidden_size") and get("num_attention_heads"):
        kw["head_dim"] = get("hidden_size") // get("num_attention_heads")
    if "num_key_value_heads" in fields_init and get("num_key_value_heads") is None and get("num_attention_heads"):
        kw["num_key_value_heads"] = min(2, get("num_attention_heads"))
    if "num_experts_per_tok" in fields_init and default.num_experts_per_tok is None:
        kw["num_experts_per_tok"] = 2
    if "kv_lora_rank" in fields_init and get("num_attention_heads"):
        # multi-head latent attention: one K/V head per query head, head_dim is the rope part
        kw["num_key_value_heads"] = get("num_attention_heads")
        if "head_dim" in fields_init and get("qk_rope_head_dim"):
            kw["head_dim"] = get("qk_rope_head_dim")
    # sub-configs (text_config, vision_config, ...) are shrunk recursively
    for name in getattr(cfg_cls, "sub_configs", {}) or {}:
        sub = getattr(default, name, None)
        if sub is not None and hasattr(sub, "to_dict"):
            sub_kw = _tiny_kwargs(type(sub), sub)
            kw[name] = type(sub)(**{**_init_dict(sub), **sub_kw})
    return kw


def _init_dict(cfg) -> dict:
    d = cfg.to_dict()
    for k in ("transformers_version", "architectures", "_name_or_path", "model_type"):
        d.pop(k, None)
    return d


def tiny_config(model_type: str):
    """A tiny config for ``model_type``: class defaults, shrunk, then OVERRIDES."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    cfg_cls = CONFIG_MAPPING[model_type]
    default = cfg_cls()
    kw = _tiny_kwargs(cfg_cls, default)
    kw.update(OVERRIDES.get(model_type, {}))
    cfg = cfg_cls(**kw)
    _fix_token_ids(cfg)
    return cfg


def _fix_token_ids(cfg):
    """Special token ids beyond the tiny vocab move into its top 16 ids."""
    for sub in ("text_config", "decoder"):
        if getattr(cfg, sub, None) is not None and hasattr(getattr(cfg, sub), "to_dict"):
            _fix_token_ids(getattr(cfg, sub))
    vocab = getattr(cfg, "vocab_size", None)
    if not isinstance(vocab, int):
        return
    nxt = vocab - 1
    for name in sorted(vars(cfg)):
        if not (name.endswith("_token_id") or name.endswith("_token_index") or name.endswith("_index")):
            continue
        v = getattr(cfg, name)
        if isinstance(v, int) and not isinstance(v, bool) and v >= vocab:
            setattr(cfg, name, nxt)
            nxt -= 1
        elif isinstance(v, list) and any(isinstance(x, int) and x >= vocab for x in v):
            setattr(cfg, name, [x if x < vocab else vocab - 1 for x in v])


def architectures() -> list[str]:
    """Every model type of transformers' causal-LM auto mapping."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    return list(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)


def build_model(model_type: str):
    """(tiny config, model in eval mode on CPU, fp32, seeded init)."""
    import transformers
    from transformers import AutoModelForCausalLM
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    cfg = tiny_config(model_type)
    cls = getattr(transformers, MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[model_type])
    # a class built on a sub-config other than text_config (MusicgenForCausalLM: the decoder config)
    sub_cfg = None
    want = getattr(cls, "config_class", None)
    if want is not None and not isinstance(cfg, want):
        for name in getattr(cfg, "sub_configs", {}) or {}:
            if name != "text_config" and isinstance(getattr(cfg, name, None), want):
                sub_cfg = getattr(cfg, name)
                break
    torch.manual_seed(0)
    if sub_cfg is not None:
        model = cls._from_config(sub_cfg)
    else:
        # from_config, as users do: it picks the text sub-config where the class wants it
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    model = model.to(torch.float32).eval()
    if model_type in _POST_BUILD:
        _POST_BUILD[model_type](model)
    return model.config, model


def _prompt(cfg):
    vocab = getattr(cfg, "vocab_size", None) or getattr(getattr(cfg, "text_config", None), "vocab_size", VOCAB)
    g = torch.Generator().manual_seed(3)
    return torch.randint(3, max(4, min(vocab, VOCAB) - 16), (1, PROMPT_LEN), generator=g)


def _generate(model, ids, with_cache=False, **kw):
    out = model.generate(
        ids,
        attention_mask=torch.ones_like(ids),
        max_new_tokens=NEW_TOKENS,
        min_new_tokens=NEW_TOKENS,
        do_sample=False,
        output_logits=True,
        return_dict_in_generate=True,
        **kw,
    )
    logits = torch.stack([l.detach().float().cpu() for l in out.logits])
    if with_cache:
        return out.sequences.cpu(), logits, getattr(out, "past_key_values", None)
    return out.sequences.cpu(), logits


def _no_compiled_decode_reason(model, cache) -> str | None:
    """Why transformers runs no compiled static-cache decode for ``model`` on any device
    (None: it compiles one). ``cache`` is what CPU's static-cache generate returned."""
    if cache is None or not getattr(cache, "is_compileable", False):
        # generate ignores cache_implementation (no Cache support, a model-specific cache)
        return f"transformers uses no static cache for this model ({type(cache).__name__})"
    if model.get_compiled_call(model.generation_config.compile_config) == model.__call__:
        return "transformers does not compile this model's decode (get_compiled_call)"
    return None


def _short(e: BaseException) -> str:
    if e.__cause__ is not None and "validation error" in str(e).lower():
        e = e.__cause__  # huggingface_hub's strict-dataclass wrapper: the real reason is the cause
    lines = [line.strip() for line in str(e).splitlines() if line.strip()]
    return f"{type(e).__name__}: {lines[0] if lines else ''}"[:300]


def run_architecture(model_type: str, compiled: bool = False, device: str = "neuron") -> dict:
    """Check one architecture; raises SkipArchitecture if it fails on CPU itself.

    Returns {"arch", "eager_equal", "eager_max_diff", "compiled_equal",
    "compiled_max_diff", "compiled_status", "error"}."""
    res = {
        "arch": model_type,
        "cpu_ok": False,
        "eager_equal": None,
        "eager_max_diff": None,
        "compiled_equal": None,
        "compiled_max_diff": None,
        "compiled_status": None,
        "recompilations": None,
        "error": None,
    }
    try:
        cfg, cpu_model = build_model(model_type)
        ids = _prompt(cfg)
        with torch.no_grad():
            ref_tokens, ref_logits = _generate(cpu_model, ids)
    except Exception as e:  # noqa: BLE001 - any CPU failure means: not counted
        raise SkipArchitecture(_short(e)) from e
    res["cpu_ok"] = True
    try:
        model = copy.deepcopy(cpu_model).to(device)
        with torch.no_grad():
            tokens, logits = _generate(model, ids.to(device))
        res["eager_equal"] = torch.equal(tokens, ref_tokens)
        res["eager_max_diff"] = (logits - ref_logits).abs().max().item()
    except Exception as e:  # noqa: BLE001
        res["eager_equal"] = False
        res["error"] = "eager: " + _short(e)
        res["traceback"] = traceback.format_exc()
        return res
    if compiled:
        _run_compiled(model, cpu_model, ids, ref_tokens, ref_logits, device, res)
    return res


def _run_compiled(model, cpu_model, ids, ref_tokens, ref_logits, device, res):
    """Static cache, decode compiled by transformers with backend "neuron".

    The reference is CPU eager with the same static cache: for some models transformers'
    static-cache path itself changes the logits slightly (camembert: 8.6e-3 vs dynamic)."""
    try:
        with torch.no_grad():
            ref_tokens, ref_logits, cache = _generate(
                cpu_model, ids, with_cache=True, cache_implementation="static", disable_compile=True
            )
    except Exception as e:  # noqa: BLE001 - the model has no static cache on CPU either
        res["compiled_status"] = "n/a: " + _short(e)
        return
    reason = _no_compiled_decode_reason(cpu_model, cache)
    if reason is not None:
        res["compiled_status"] = "n/a: " + reason
        return
    torch._dynamo.reset()
    torch.neuron.reset_dynamo_metrics()
    try:
        with torch.no_grad():
            tokens, logits = _generate(model, ids.to(device), cache_implementation="static")
        m = torch.neuron.get_dynamo_metrics()
        res["recompilations"] = m["num_recompilations"]
        if m["graphs_compiled"] == 0:
            raise RuntimeError("static-cache decode was not compiled with backend 'neuron'")
        if m["fallbacks"]:
            raise RuntimeError("graph ran eagerly: " + m["fallbacks"][0]["error"].splitlines()[0])
        res["compiled_equal"] = torch.equal(tokens, ref_tokens)
        res["compiled_max_diff"] = (logits - ref_logits).abs().max().item()
        res["compiled_status"] = "ok"
    except Exception as e:  # noqa: BLE001
        res["compiled_equal"] = False
        res["compiled_status"] = "error"
        res["error"] = "compiled: " + _short(e)
        res["traceback"] = traceback.format_exc()
    finally:
        torch._dynamo.reset()


def eager_ok(r: dict) -> bool:
    return bool(r["eager_equal"]) and r["eager_max_diff"] is not None and r["eager_max_diff"] <= EAGER_ATOL


def compiled_ok(r: dict) -> bool:
    return r["compiled_status"] == "ok" and bool(r["compiled_equal"]) and r["compiled_max_diff"] <= COMPILED_ATOL


def _fmt(v):
    if v is None:
        return "-"
    if isinstance(v, bool):
        return "yes" if v else "NO"
    if isinstance(v, float):
        return f"{v:.1e}" if v else "0"
    return str(v)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--compiled", action="store_true", help="also static cache + compiled decode")
    p.add_argument("--only", nargs="+", metavar="NAME", help="model types to check")
    p.add_argument("-j", "--json", metavar="OUT", help="write results as JSON")
    args = p.parse_args(argv)
    # Before transformers is imported (it reads them then): tiny configs, never the Hub.
    _settings.setdefault("HF_HUB_OFFLINE", "1")
    _settings.setdefault("TRANSFORMERS_OFFLINE", "1")
    import transformers

    transformers.logging.set_verbosity_error()
    names = args.only or architectures()
    unknown = sorted(set(names) - set(architectures()))
    if unknown:
        p.error(f"not causal-LM model types: {', '.join(unknown)}")
    results, skipped = [], {}
    print(f"{'architecture':28} {'cpu':4} {'eager eq':8} {'max diff':8} {'static+compiled':16} error")
    for name in names:
        t0 = time.perf_counter()
        try:
            r = run_architecture(name, compiled=args.compiled)
        except SkipArchitecture as e:
            skipped[name] = str(e)
            print(f"{name:28} {'NO':4} {'-':8} {'-':8} {'-':16} skipped (CPU): {e}", flush=True)
            continue
        r["seconds"] = round(time.perf_counter() - t0, 2)
        results.append(r)
        comp = "-"
        if args.compiled:
            st = r["compiled_status"] or "-"
            comp = f"{_fmt(r['compiled_equal'])} {_fmt(r['compiled_max_diff'])}" if st in ("ok", "error") else "n/a"
        note = r["error"]
        if comp == "n/a" and not note:
            note = r["compiled_status"][len("n/a: ") :]  # the reason transformers has no compiled decode
        print(
            f"{name:28} {'yes':4} {_fmt(r['eager_equal']):8} {_fmt(r['eager_max_diff']):8} {comp:16} " f"{note or ''}",
            flush=True,
        )
    n = len(results)
    n_eager = sum(eager_ok(r) for r in results)
    print(f"\neager: {n_eager}/{n} architectures identical to CPU ({len(skipped)} skipped: fail on CPU)")
    summary = {
        "transformers": transformers.__version__,
        "counted": n,
        "eager_ok": n_eager,
        "skipped": skipped,
        "results": [{k: v for k, v in r.items() if k != "traceback"} for r in results],
    }
    if args.compiled:
        static = [r for r in results if r["compiled_status"] in ("ok", "error")]
        n_comp = sum(compiled_ok(r) for r in static)
        print(
            f"static+compiled: {n_comp}/{len(static)} architectures with a static cache match CPU "
            f"({n - len(static)} n/a: no static cache or no compiled decode in transformers, on CPU too)"
        )
        summary.update(static_counted=len(static), compiled_ok=n_comp)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(summary, f, indent=1)
    ok = n_eager == n and (not args.compiled or summary["compiled_ok"] == summary["static_counted"])
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
