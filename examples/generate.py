"""Text generation on the ``neuron`` device with plain transformers.

Loads a causal LM from a local checkpoint with
``AutoModelForCausalLM.from_pretrained(path, device_map="neuron")`` (transformers'
async weight loading stays on), then generates greedily and with seeded
sampling, eagerly and with ``cache_implementation="static"``, whose decode step
transformers compiles with backend "neuron" by itself. Prints the compile
metrics and checks that the number of compilations does not grow with the
generated length. Under ``torchrun`` the model is loaded with ``tp_plan="auto"``
(tensor parallel over all processes).

    python examples/generate.py --make-tiny /tmp/tiny-llama        # build a tiny Llama + tokenizer, then generate
    python examples/generate.py --model /tmp/tiny-llama --max-new-tokens 32
    torchrun --nproc_per_node=2 examples/generate.py --model /tmp/tiny-llama   # tensor parallel
    python examples/generate.py --model /tmp/tiny-llama --device cpu           # the same on CPU
    python examples/generate.py --model /tmp/tiny-llama --cpu-equal-rng        # sample CPU's stream on neuron

``--json OUT`` writes the generated token ids of every mode and the metrics.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")

import torch

PROMPTS = ["The model", "Trainium is a"]
MODES = ["greedy", "sample"]


def make_tiny(directory: str, seed: int = 0) -> str:
    """Write a tiny Llama checkpoint and a byte-level BPE tokenizer trained on the bundled corpus."""
    from importlib import resources

    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    text = resources.files("torch_neuronx").joinpath("data/corpus.txt").read_text(encoding="utf-8")
    bpe = Tokenizer(models.BPE(unk_token=None))
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=512,
        special_tokens=["<pad>", "<s>", "</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train_from_iterator(text.splitlines(), trainer)
    tok = PreTrainedTokenizerFast(tokenizer_object=bpe, pad_token="<pad>", bos_token="<s>", eos_token="</s>")
    config = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        pad_token_id=tok.pad_token_id,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        tie_word_embeddings=False,
    )
    torch.manual_seed(seed)
    LlamaForCausalLM(config).save_pretrained(directory)
    tok.save_pretrained(directory)
    return directory


def load(path: str, device: str):
    """Model and tokenizer from a local checkpoint; tensor parallel under torchrun."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(path)
    tok.padding_side = "left"
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        if device != "neuron":
            raise ValueError("tensor parallel generation (torchrun) needs --device neuron")
        from transformers.distributed import DistributedConfig

        # transformers initialises process group "neuron" and shards while loading
        # (DistributedConfig(tp_plan=...) is the current spelling of from_pretrained(tp_plan="auto"))
        model = AutoModelForCausalLM.from_pretrained(
            path, distributed_config=DistributedConfig(tp_plan="auto"), dtype=torch.float32
        )
    else:
        model = AutoModelForCausalLM.from_pretrained(path, device_map=device, dtype=torch.float32)
    return model.eval(), tok


def generate(
    model, tok, mode: str, static: bool, max_new_tokens: int, seed: int, max_cache_len: int | None = None
) -> list[list[int]]:
    """Token ids (prompt + new) for PROMPTS, left-padded in one batch."""
    enc = tok(PROMPTS, return_tensors="pt", padding=True).to(model.device)
    kw = dict(max_new_tokens=max_new_tokens, min_new_tokens=max_new_tokens, pad_token_id=tok.pad_token_id)
    if mode == "sample":
        kw.update(do_sample=True, top_k=50, top_p=0.95, temperature=0.9)
        torch.manual_seed(seed)  # seeds CPU and every neuron core
    else:
        kw.update(do_sample=False)
    if static:
        kw["cache_implementation"] = "static"
        if max_cache_len:
            kw["max_cache_len"] = max_cache_len  # one cache shape for every length: no recompiles
    with torch.no_grad():
        out = model.generate(**enc, **kw)
    return out.cpu().tolist()


def _print(rank0: bool, *a):
    if rank0:
        print(*a, flush=True)


class _Parser(argparse.ArgumentParser):
    def _print_message(self, message, file=None):
        # argparse prints usage, help and errors here: once under torchrun, not once per rank
        if int(os.environ.get("RANK", "0")) == 0:
            super()._print_message(message, file)


def main(argv=None) -> int:
    p = _Parser(description=__doc__.split("\n\n")[0])
    src = p.add_mutually_exclusive_group()
    src.add_argument("--model", help="local checkpoint directory")
    src.add_argument("--make-tiny", metavar="DIR", help="write a tiny Llama checkpoint + tokenizer to DIR and use it")
    p.add_argument("--device", default="neuron", choices=["neuron", "cpu"])
    p.add_argument("--max-new-tokens", type=int, default=16)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--no-static", action="store_true", help="skip the static-cache (compiled) runs")
    p.add_argument("--json", metavar="OUT", help="write tokens and metrics as JSON")
    p.add_argument(
        "--cpu-equal-rng",
        action="store_true",
        help="sample with CPU's random stream on neuron (torch_neuronx.cpu_equal_rng), so seeded sampling "
        "gives CPU's tokens; neuron's own generator draws other numbers",
    )
    args = p.parse_args(argv)
    if args.max_new_tokens < 1:
        p.error("--max-new-tokens must be >= 1")
    import transformers

    transformers.logging.set_verbosity_error()
    rank = int(os.environ.get("RANK", "0"))
    rank0 = rank == 0
    path = args.model
    if path is None:
        path = args.make_tiny or os.path.join(os.getcwd(), "tiny-llama")
        if rank0 and not os.path.exists(os.path.join(path, "config.json")):
            make_tiny(path)
            _print(rank0, f"wrote a tiny Llama checkpoint and tokenizer to {path}")
        if int(os.environ.get("WORLD_SIZE", "1")) > 1:
            while not os.path.exists(os.path.join(path, "tokenizer_config.json")):
                time.sleep(0.2)
    _print(rank0, f"async weight loading: {'off' if os.environ.get('HF_DEACTIVATE_ASYNC_LOAD') else 'on'}")
    t0 = time.perf_counter()
    model, tok = load(path, args.device)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    _print(
        rank0,
        f"loaded {path} on {model.device} in {time.perf_counter() - t0:.1f} s"
        + (f" (tensor parallel over {world} processes, tp_plan='auto')" if world > 1 else ""),
    )
    result = {
        "device": args.device,
        "world_size": world,
        "seed": args.seed,
        "max_new_tokens": args.max_new_tokens,
        "cpu_equal_rng": args.cpu_equal_rng,
        "tokens": {},
    }
    caches = [False] if args.no_static else [False, True]
    metrics = None
    for static in caches:
        if static and args.device == "neuron":
            torch.neuron.reset_dynamo_metrics()
        for mode in MODES:
            name = f"{mode}/{'static' if static else 'dynamic'}"
            t0 = time.perf_counter()
            with _rng_mode(args):
                ids = generate(model, tok, mode, static, args.max_new_tokens, args.seed)
            dt = time.perf_counter() - t0
            result["tokens"][name] = ids
            _print(rank0, f"\n[{name}] {dt:.2f} s")
            for row in ids:
                _print(rank0, "  " + repr(tok.decode(row, skip_special_tokens=True)))
        if static and args.device == "neuron":
            metrics = _check_bounded_compiles(model, tok, args, rank0)
    if metrics is not None:
        result["metrics"] = metrics
    if args.json and rank0:
        with open(args.json, "w") as f:
            json.dump(result, f)
    if world > 1:
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()
    return 0


def _rng_mode(args):
    """The random stream seeded sampling draws on neuron: its own, or CPU's (--cpu-equal-rng)."""
    if args.cpu_equal_rng and args.device == "neuron":
        import torch_neuronx

        return torch_neuronx.cpu_equal_rng()
    return contextlib.nullcontext()


def _check_bounded_compiles(model, tok, args, rank0) -> dict:
    """Compilations are a per-shape cost: generating 4x as many tokens compiles nothing new."""
    first = torch.neuron.get_dynamo_metrics()
    _print(rank0, "\n" + str(first))
    short = first["graphs_compiled"]
    # one cache length for both runs, so the decode graph's shapes are the same
    cache = 8 + 4 * args.max_new_tokens + 8
    torch.neuron.reset_dynamo_metrics()
    generate(model, tok, "greedy", True, args.max_new_tokens, args.seed, max_cache_len=cache)
    a = torch.neuron.get_dynamo_metrics()
    generate(model, tok, "greedy", True, 4 * args.max_new_tokens, args.seed, max_cache_len=cache)
    b = torch.neuron.get_dynamo_metrics()
    grown = b["graphs_compiled"] - a["graphs_compiled"]
    _print(
        rank0,
        f"\ncompilations: {short} for the runs above (greedy + sampled, {args.max_new_tokens} new tokens); "
        f"with max_cache_len={cache}: {a['graphs_compiled']} for {args.max_new_tokens} new tokens, "
        f"+{grown} for {4 * args.max_new_tokens} new tokens; recompilations {b['num_recompilations']}; "
        f"graph breaks {b['graph_breaks']}",
    )
    if grown != 0 or b["num_recompilations"] > a["num_recompilations"]:
        raise RuntimeError(f"compilations grew with the generated length: {a} -> {b}")
    if b["fallbacks"]:
        raise RuntimeError(f"graphs fell back to eager: {b['fallbacks']}")
    return {
        "graphs_compiled_first": short,
        "num_recompilations_first": first["num_recompilations"],
        "graphs_compiled_short": a["graphs_compiled"],
        "graphs_compiled_added_long": grown,
        "num_recompilations": b["num_recompilations"],
        "graph_breaks": b["graph_breaks"],
        "compile_seconds": round(first["compile_seconds"] + b["compile_seconds"], 2),
    }


if __name__ == "__main__":
    sys.exit(main())
