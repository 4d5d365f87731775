"""The main job: fine-tune a small Llama-style model with TRL on the ``neuron`` device.

From nothing: a byte-level BPE tokenizer is trained locally on the corpus that ships with the
package (``torch_neuronx/data/corpus.txt``), a tiny ``LlamaForCausalLM`` is built from a config,
and TRL's ``SFTTrainer`` trains it on packed sequences (the Trainer's own progress bar and loss
logging). The result is saved with ``trainer.save_model`` as a standard checkpoint, reloaded on
CPU with plain transformers to prove portability (logits compared with the neuron model), and
used to generate text on neuron. A summary (tokens/s, loss before/after, compile metrics,
peak device memory) is printed and, with ``--out``, saved with a loss plot.

    torch-neuronx demo --out runs/demo            # or: python -m torch_neuronx.demo
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

from neuronsim import settings as _settings

DEFAULT_PROMPT = "The model"
# fp32 logits of the reloaded CPU checkpoint vs the trained neuron model: the simulator runs the
# CPU kernels, so they agree to rounding; anything larger means the checkpoint is not portable
PORTABILITY_ATOL = 1e-4


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="torch-neuronx demo",
        description="Fine-tune a tiny Llama-style LM with TRL's SFTTrainer on the neuron device "
        "(NeuronCore simulator), save it, reload it on CPU, and generate text.",
    )
    p.add_argument("--steps", type=int, default=150, help="training steps (default: %(default)s)")
    p.add_argument("--batch-size", type=int, default=8, help="packed sequences per step (default: %(default)s)")
    p.add_argument("--seq-len", type=int, default=128, help="tokens per packed sequence (default: %(default)s)")
    p.add_argument("--lr", type=float, default=3e-3, help="peak learning rate, cosine schedule (default: %(default)s)")
    p.add_argument(
        "--vocab-size",
        type=int,
        default=512,
        help="size of the BPE vocabulary trained on the corpus (default: %(default)s)",
    )
    p.add_argument("--hidden-size", type=int, default=128, help="Llama hidden size (default: %(default)s)")
    p.add_argument("--layers", type=int, default=2, help="Llama decoder layers (default: %(default)s)")
    p.add_argument("--heads", type=int, default=4, help="attention heads (default: %(default)s)")
    p.add_argument(
        "--bf16",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="bf16 mixed precision (the Trainer's --bf16: autocast on the device)",
    )
    p.add_argument(
        "--compile",
        action="store_true",
        help="torch.compile the training step (the Trainer's --torch_compile: backend 'neuron')",
    )
    p.add_argument(
        "--device",
        choices=["neuron", "cpu"],
        default="neuron",
        help="run on neuron, or on cpu to compare (default: %(default)s)",
    )
    p.add_argument("--prompt", default=DEFAULT_PROMPT, help="prompt for generation (default: %(default)r)")
    p.add_argument("--max-new-tokens", type=int, default=60, help="tokens to generate (default: %(default)s)")
    p.add_argument("--samples", type=int, default=3, help="texts to sample from the prompt (default: %(default)s)")
    p.add_argument("--corpus", default=None, help="train on this UTF-8 text file instead of the built-in corpus")
    p.add_argument(
        "--seed", type=int, default=0, help="seed of weights, data order and sampling (default: %(default)s)"
    )
    p.add_argument(
        "--out",
        default=None,
        help="keep the checkpoint (model/), summary.json and loss.png here (default: a temporary directory)",
    )
    p.add_argument("--no-progress", action="store_true", help="hide the progress bars")
    args = p.parse_args(argv)
    if args.steps < 1:
        p.error("--steps must be at least 1")
    if args.hidden_size % args.heads:
        p.error("--hidden-size must be divisible by --heads")
    return args


def save_loss_plot(train: list[tuple[int, float]], evals: list[tuple[int, float]], path: str, title: str) -> None:
    """Training loss (as logged by the Trainer) and corpus loss per step, as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    if train:
        ax.plot([s for s, _ in train], [v for _, v in train], lw=1.5, label="training loss (Trainer logs)")
    if evals:
        ax.plot(
            [s for s, _ in evals],
            [v for _, v in evals],
            "o",
            ms=6,
            label="loss on the corpus (evaluate, before / after)",
        )
    ax.set_xlabel("step")
    ax.set_ylabel("cross-entropy (nats / token)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _max_logit_diff(neuron_model, cpu_model, ids) -> float:
    import torch

    with torch.no_grad():
        a = neuron_model(input_ids=ids.to(neuron_model.device)).logits.float().cpu()
        b = cpu_model(input_ids=ids).logits.float()
    return (a - b).abs().max().item()


def _sft_config(args: argparse.Namespace, output_dir: str):
    """The demo's SFTConfig; with ``--compile`` every batch has one static shape."""
    from trl import SFTConfig

    return SFTConfig(
        output_dir=output_dir,
        max_steps=args.steps,
        per_device_train_batch_size=args.batch_size,
        per_device_eval_batch_size=args.batch_size,
        # eager: sentences packed whole ("bfd"): each restarts at position 0 and attends only to
        # itself. bfd turns on padding-free batches whose cu_seq_lens change every batch, a new
        # graph per batch when compiled; so compiled training packs "wrapped" rows of exactly
        # max_length tokens (the last row padded to it): one static shape, one graph
        packing=True,
        packing_strategy="wrapped" if args.compile else "bfd",
        padding_free=False,
        pad_to_multiple_of=args.seq_len if args.compile else None,
        max_length=args.seq_len,
        learning_rate=args.lr,
        lr_scheduler_type="cosine",
        warmup_steps=max(1, min(20, args.steps // 10)),
        weight_decay=0.1,
        dataloader_drop_last=True,  # every batch has the same shape: one compiled graph
        logging_steps=max(1, args.steps // 20),
        bf16=args.bf16,
        torch_compile=args.compile,
        # activation checkpointing (TRL's default) only costs time at this size
        activation_checkpointing=False,
        use_cpu=args.device == "cpu",
        save_strategy="no",
        report_to="none",
        seed=args.seed,
        disable_tqdm=args.no_progress,
    )


def _build_model(args, text):
    """A BPE tokenizer trained on `text`, the sentence dataset and a fresh tiny Llama (seeded)."""
    import torch
    from transformers import LlamaForCausalLM

    from .hf import corpus_dataset, tiny_llama_config, train_tokenizer

    tokenizer = train_tokenizer(text, vocab_size=args.vocab_size)
    dataset = corpus_dataset(text, unit="sentence")
    torch.manual_seed(args.seed)
    model = LlamaForCausalLM(
        tiny_llama_config(
            tokenizer,
            hidden_size=args.hidden_size,
            layers=args.layers,
            heads=args.heads,
            max_positions=max(256, args.seq_len + args.max_new_tokens + 16),
        )
    )
    return tokenizer, dataset, model


def _make_trainer(args, model, dataset, tokenizer, work: str, step_ends: list):
    """The SFTTrainer; it appends each step's end time to `step_ends`."""
    from transformers import TrainerCallback
    from trl import SFTTrainer

    class _StepClock(TrainerCallback):
        def on_step_end(self, *a, **k):
            step_ends.append(time.perf_counter())

    return SFTTrainer(
        model=model,
        args=_sft_config(args, os.path.join(work, "trainer")),
        train_dataset=dataset,
        eval_dataset=dataset,
        processing_class=tokenizer,
        callbacks=[_StepClock()],
    )


def _prepare_device(args, trainer, on_neuron: bool):
    """The device the trainer runs on and its name; on neuron, peak memory (and compile metrics) start afresh."""
    import torch

    if not on_neuron:
        return trainer.args.device, "cpu"
    device = torch.device("neuron", torch.neuron.current_device())
    dev_name = torch.neuron.get_device_name(device)
    torch.neuron.reset_peak_memory_stats(device)
    if args.compile:
        torch.neuron.reset_dynamo_metrics()
    return device, dev_name


def _train(args, trainer, device, on_neuron: bool) -> dict:
    """Evaluate, train, evaluate; the losses, the training curve, tokens, time, peak memory, compile metrics."""
    import torch

    loss_before = trainer.evaluate()["eval_loss"]
    result = trainer.train()
    loss_after = trainer.evaluate()["eval_loss"]
    history = trainer.state.log_history
    tokens = (
        int(max((h.get("num_tokens", 0) for h in history), default=0)) or args.steps * args.batch_size * args.seq_len
    )
    return {
        "loss_before": loss_before,
        "loss_after": loss_after,
        "train_curve": [(h["step"], h["loss"]) for h in history if "loss" in h],
        "tokens": tokens,
        "train_seconds": result.metrics["train_runtime"],
        "compile_metrics": torch.neuron.get_dynamo_metrics() if on_neuron and args.compile else None,
        "peak": torch.neuron.max_memory_allocated(device) if on_neuron else None,
    }


def _save_and_reload(args, trainer, tokenizer, text: str, model_dir: str):
    """Save a standard checkpoint, reload it on CPU with plain transformers; the trained model and the logit gap."""
    import torch
    from transformers import AutoModelForCausalLM

    trainer.save_model(model_dir)
    trained = trainer.accelerator.unwrap_model(trainer.model, keep_fp32_wrapper=False).eval()
    cpu_model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    probe = torch.tensor([tokenizer(text[:400])["input_ids"][: args.seq_len]])
    return trained, _max_logit_diff(trained, cpu_model, probe)


def _generate(args, trained, tokenizer):
    """Seeded samples on the device, each ending at <eos> (a sentence): texts, new tokens, seconds."""
    import torch

    prompt_ids = tokenizer(args.prompt, return_tensors="pt")["input_ids"].to(trained.device)
    torch.manual_seed(args.seed)
    t_gen = time.perf_counter()
    with torch.no_grad():
        out = trained.generate(
            input_ids=prompt_ids,
            attention_mask=torch.ones_like(prompt_ids),
            max_new_tokens=args.max_new_tokens,
            do_sample=True,
            temperature=0.7,
            top_k=20,
            num_return_sequences=args.samples,
            pad_token_id=tokenizer.pad_token_id,
            eos_token_id=tokenizer.eos_token_id,
        )
    gen_seconds = time.perf_counter() - t_gen
    new_ids = out[:, prompt_ids.shape[1] :]
    n_generated = int((new_ids != tokenizer.pad_token_id).sum())
    return tokenizer.batch_decode(out, skip_special_tokens=True), n_generated, gen_seconds


def _summary(args, device, dev_name, n_params, run, logit_diff, generation, step_ends) -> dict:
    """The demo's results (what summary.json holds besides the training curve)."""
    generated, n_generated, gen_seconds = generation
    tokens, train_seconds = run["tokens"], run["train_seconds"]
    summary = {
        "device": str(device),
        "device_name": dev_name,
        "parameters": n_params,
        "steps": args.steps,
        "tokens_trained": int(tokens),
        "train_seconds": round(train_seconds, 2),
        "tokens_per_second": round(tokens / train_seconds, 1),
        "loss_before": round(run["loss_before"], 4),
        "loss_after": round(run["loss_after"], 4),
        "cpu_reload_max_logit_diff": logit_diff,
        "generated_tokens": n_generated,
        "generate_tokens_per_second": round(n_generated / gen_seconds, 1),
        "generated": generated,
        "bf16": args.bf16,
        "compile": args.compile,
        "peak_memory_bytes": run["peak"],
        # steady state: the first step includes compiling (or loading) the graphs
        "seconds_per_step_after_first": (
            round((step_ends[-1] - step_ends[0]) / (len(step_ends) - 1), 4) if len(step_ends) > 1 else None
        ),
    }
    compile_metrics = run["compile_metrics"]
    if compile_metrics is not None:
        summary["compile_metrics"] = {
            k: compile_metrics[k]
            for k in (
                "graphs_compiled",
                "cache_hits",
                "cache_misses",
                "compile_seconds",
                "num_recompilations",
                "graph_breaks",
            )
        }
    return summary


def _print_summary(args, device, dev_name, run, summary: dict, logit_diff: float) -> None:
    tokens, train_seconds, train_curve = run["tokens"], run["train_seconds"], run["train_curve"]
    print("summary:")
    print(f"  device:           {device} ({dev_name})")
    print(f"  training:         {args.steps} steps, {tokens:,} tokens in {train_seconds:.1f} s")
    print(
        f"  tokens/s:         {tokens / train_seconds:,.0f} (train), "
        f"{summary['generate_tokens_per_second']} (generate)"
    )
    if summary["seconds_per_step_after_first"] is not None:
        print(f"  step time:        {summary['seconds_per_step_after_first'] * 1e3:.0f} ms per step after the first")
    print(f"  loss before:      {run['loss_before']:.4f} (on the corpus)")
    print(
        f"  loss after:       {run['loss_after']:.4f} (on the corpus; last logged training loss "
        f"{train_curve[-1][1] if train_curve else float('nan'):.4f})"
    )
    print(
        f"  CPU reload:       max |logits(cpu) - logits({device.type})| = {logit_diff:.2e} "
        f"({'ok' if logit_diff <= PORTABILITY_ATOL else 'MISMATCH'}, plain transformers on CPU)"
    )
    if run["peak"] is not None:
        print(f"  peak memory:      {run['peak'] / 2**20:.1f} MiB (torch.neuron.max_memory_allocated)")
    compile_metrics = run["compile_metrics"]
    if compile_metrics is not None:
        c = summary["compile_metrics"]
        print(
            f"  compile:          {c['graphs_compiled']} graphs, {c['compile_seconds']:.1f} s, cache hits/misses "
            f"{c['cache_hits']}/{c['cache_misses']}, recompilations {c['num_recompilations']}, "
            f"graph breaks {c['graph_breaks']}"
        )
        for r in compile_metrics["recompilations"]:
            print(f"    recompiled {r['graph']}: {r['reason'].splitlines()[0][:120]}")
        for reason, n in compile_metrics["graph_break_reasons"].items():
            print(f"    {n}x graph break: {reason.splitlines()[0][:120]}")


def main(argv=None) -> int:
    """Run the demo with command-line arguments `argv` (default: ``sys.argv[1:]``); returns the exit code."""
    args = parse_args(argv)
    # Before transformers is imported (it reads them then); the demo never needs the Hub.
    _settings.setdefault("HF_HUB_OFFLINE", "1")
    _settings.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")

    import torch
    import transformers

    from .hf import load_corpus

    transformers.logging.set_verbosity_error()
    on_neuron = args.device == "neuron"
    if on_neuron and not torch.neuron.is_available():
        print("error: no neuron device (see `neuron-ls`)", file=sys.stderr)
        return 1
    work = args.out or tempfile.mkdtemp(prefix="torch-neuronx-demo-")
    os.makedirs(work, exist_ok=True)
    t_start = time.perf_counter()

    text = load_corpus(args.corpus)
    tokenizer, dataset, model = _build_model(args, text)
    n_params = sum(p.numel() for p in model.parameters())
    step_ends: list[float] = []
    trainer = _make_trainer(args, model, dataset, tokenizer, work, step_ends)
    device, dev_name = _prepare_device(args, trainer, on_neuron)
    n_seq = len(trainer.train_dataset)
    print(
        f"torch-neuronx demo: fine-tune a Llama-style LM ({args.layers} layers, hidden {args.hidden_size}, "
        f"{n_params / 1e6:.2f}M parameters) with TRL SFTTrainer"
    )
    print(
        f"device: {device} ({dev_name}{', simulated' if on_neuron else ''}) | corpus: {len(text)} chars, "
        f"{len(dataset)} sentences -> {n_seq} packed sequences of {args.seq_len} tokens | "
        f"BPE vocab {len(tokenizer)} (trained locally) | bf16: {'on' if args.bf16 else 'off'} | "
        f"compile: {'on' if args.compile else 'off'}"
    )

    run = _train(args, trainer, device, on_neuron)
    model_dir = os.path.join(work, "model")
    trained, logit_diff = _save_and_reload(args, trainer, tokenizer, text, model_dir)
    generation = _generate(args, trained, tokenizer)

    print()
    print(f"generated on {device} (sampled, temperature 0.7):")
    print("-" * 60)
    for text_out in generation[0]:
        print(text_out)
    print("-" * 60)

    summary = _summary(args, device, dev_name, n_params, run, logit_diff, generation, step_ends)
    _print_summary(args, device, dev_name, run, summary, logit_diff)
    plot = os.path.join(work, "loss.png")
    save_loss_plot(
        run["train_curve"],
        [(0, run["loss_before"]), (args.steps, run["loss_after"])],
        plot,
        f"SFT of a tiny Llama on {device} ({dev_name})",
    )
    with open(os.path.join(work, "summary.json"), "w", encoding="utf-8") as f:
        json.dump(dict(summary, train_curve=run["train_curve"]), f, indent=1)
    print(f"  saved:            checkpoint {model_dir}, summary.json and loss.png in {work}")
    print(f"  total time:       {time.perf_counter() - t_start:.0f} s")
    return 0 if logit_diff <= PORTABILITY_ATOL else 1


if __name__ == "__main__":
    sys.exit(main())
