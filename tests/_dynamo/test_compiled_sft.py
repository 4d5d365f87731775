"""Compiled packing SFT (the demo's --compile configuration): one graph, no recompiles after step 1."""

import os

import pytest
import torch

pytestmark = pytest.mark.slow


def test_compiled_packing_sft_compiles_once_and_counts_like_dynamo(tmp_path):
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers import LlamaForCausalLM, TrainerCallback
    from trl import SFTTrainer

    from torch_neuronx.demo.hf import corpus_dataset, load_corpus, tiny_llama_config, train_tokenizer
    from torch_neuronx.demo.sft import _sft_config, parse_args

    args = parse_args(
        [
            "--compile",
            "--steps",
            "4",
            "--layers",
            "1",
            "--hidden-size",
            "32",
            "--heads",
            "2",
            "--batch-size",
            "2",
            "--seq-len",
            "32",
            "--no-progress",
        ]
    )
    text = load_corpus()
    tokenizer = train_tokenizer(text, vocab_size=300)
    torch.manual_seed(0)
    model = LlamaForCausalLM(tiny_llama_config(tokenizer, hidden_size=32, layers=1, heads=2, max_positions=64))
    config = _sft_config(args, str(tmp_path))
    assert config.packing_strategy == "wrapped" and not config.padding_free

    per_step = []

    class Snapshot(TrainerCallback):
        def on_step_end(self, *a, **k):
            m = torch.neuron.get_dynamo_metrics()
            per_step.append((m["graphs_compiled"], m["dynamo_recompiles"], m["num_recompilations"], m["graph_breaks"]))

    trainer = SFTTrainer(
        model=model,
        args=config,
        train_dataset=corpus_dataset(text, unit="sentence"),
        processing_class=tokenizer,
        callbacks=[Snapshot()],
    )
    batch = next(iter(trainer.get_train_dataloader()))
    assert "cu_seq_lens_q" not in batch and tuple(batch["input_ids"].shape) == (2, 32), batch.keys()
    torch.neuron.reset_dynamo_metrics()
    trainer.train()

    assert len(per_step) == 4
    graphs, dynamo_recompiles, recompiles, breaks = per_step[0]
    assert graphs >= 1
    assert recompiles == dynamo_recompiles == 0, torch.neuron.get_dynamo_metrics()
    assert per_step[1:] == [per_step[0]] * 3, per_step  # nothing compiled after the first step
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    assert losses and all(torch.isfinite(torch.tensor(losses)))
