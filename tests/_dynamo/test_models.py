"""Hugging Face models with backend "neuron": GPT-2 / Llama forward, static-cache
generate (transformers compiles decoding with backend "neuron"), Trainer."""

import copy
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import pytest
import torch

from helpers import tiny_llama

DEV = "neuron"


def _gpt2(n_layer=2):
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    cfg = GPT2Config(
        vocab_size=1000,
        n_positions=64,
        n_embd=64,
        n_layer=n_layer,
        n_head=4,
        bos_token_id=0,
        eos_token_id=999,
        pad_token_id=999,
    )
    return GPT2LMHeadModel(cfg).eval()


@pytest.mark.parametrize("make", [_gpt2, tiny_llama], ids=["gpt2", "llama"])
def test_forward_parity(make):
    cpu_model = make()
    model = copy.deepcopy(cpu_model).to(DEV)
    ids = torch.randint(0, 1000, (2, 16), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        ref = cpu_model(ids).logits
        out = torch.compile(model, backend="neuron", fullgraph=True)(ids.to(DEV)).logits
    assert out.device.type == DEV
    torch.testing.assert_close(out.cpu(), ref, rtol=1e-4, atol=1e-4)
    m = torch.neuron.get_dynamo_metrics()
    assert m["graphs_compiled"] == 1 and m["graph_breaks"] == 0


@pytest.mark.slow
@pytest.mark.parametrize("make", [_gpt2, tiny_llama], ids=["gpt2", "llama"])
def test_static_cache_generate_autocompiles_with_neuron_backend(make):
    cpu_model = make()
    model = copy.deepcopy(cpu_model).to(DEV)
    ids = torch.randint(1, 998, (1, 5), generator=torch.Generator().manual_seed(3))
    kw = dict(max_new_tokens=8, min_new_tokens=8, do_sample=False, cache_implementation="static")
    with torch.no_grad():
        ref = cpu_model.generate(ids, attention_mask=torch.ones_like(ids), **kw)
        out = model.generate(ids.to(DEV), attention_mask=torch.ones_like(ids).to(DEV), **kw)
    assert torch.equal(out.cpu(), ref)
    # transformers compiled the decoding step with our backend: static shapes,
    # one graph for every decode step.
    assert model._last_compile_config.backend == "neuron"
    m = torch.neuron.get_dynamo_metrics()
    assert m["graphs_compiled"] >= 1 and m["recompilations"] == [], m


@pytest.mark.slow
def test_trainer_torch_compile_trains_on_neuron(tmp_path):
    from transformers import Trainer, TrainingArguments

    model = _gpt2(n_layer=1)  # one block: compile time dominates this test
    ids = torch.randint(0, 1000, (16, 16), generator=torch.Generator().manual_seed(0))

    class DS(torch.utils.data.Dataset):
        def __len__(self):
            return len(ids)

        def __getitem__(self, i):
            return {"input_ids": ids[i], "labels": ids[i]}

    args = TrainingArguments(
        output_dir=str(tmp_path),
        per_device_train_batch_size=4,
        max_steps=6,
        learning_rate=1e-3,
        torch_compile=True,
        logging_steps=1,
        report_to=[],
        save_strategy="no",
        disable_tqdm=True,
        dataloader_pin_memory=False,
    )
    assert args.torch_compile_backend == "neuron"
    trainer = Trainer(model=model, args=args, train_dataset=DS())
    trainer.train()
    assert next(model.parameters()).device.type == DEV
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    assert len(losses) == 6 and all(torch.isfinite(torch.tensor(losses)))
    m = torch.neuron.get_dynamo_metrics()
    assert m["graphs_compiled"] >= 1 and m["fallbacks"] == []
