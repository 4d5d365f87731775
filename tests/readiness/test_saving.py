"""Saving in a dry run: where the real run writes safetensors files, the dry run writes the same
files (names, index, headers byte for byte, sizes) without their data, and the report lists them;
torch.save's files are not written, and a later torch.load of one stops the run at its line."""

import json
import os
import re
import struct
import sys
import textwrap

import pytest
import torch

import torch_neuronx
from torch_neuronx.readiness.launch import cli as _cli

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning", "ignore::FutureWarning")


def _save(path, dry: bool):
    """A tiny tied-embedding Llama built on the device, saved in shards; the report's data."""
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, tie_word_embeddings=True,
    )  # fmt: skip
    with torch_neuronx.readiness(dry_run=dry) as r:
        with torch.device("neuron"):
            model = LlamaForCausalLM(cfg)
        model.save_pretrained(path, max_shard_size="100KB")  # the line the report names
    return r.report


def _header(path) -> bytes:
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        return f.read(n)


def test_a_dry_run_of_save_pretrained_writes_the_real_files_without_data(tmp_path):
    real, dry = tmp_path / "real", tmp_path / "dry"
    _save(real, dry=False)
    report = _save(dry, dry=True)
    names = sorted(os.listdir(real))
    assert sorted(os.listdir(dry)) == names
    shards = [n for n in names if n.endswith(".safetensors")]
    assert len(shards) > 1 and "model.safetensors.index.json" in names  # sharded, tied lm_head saved once
    index = json.loads((real / "model.safetensors.index.json").read_text())
    assert "lm_head.weight" not in index["weight_map"]
    assert json.loads((dry / "model.safetensors.index.json").read_text()) == index  # total_size too
    for n in shards:
        assert _header(dry / n) == _header(real / n)  # every name, dtype, shape and offset
        assert os.path.getsize(dry / n) == os.path.getsize(real / n)
        assert os.stat(dry / n).st_blocks * 512 < os.path.getsize(real / n)  # the data region is a hole
    saved = report.data["dry_run"]["saved_without_data"]
    line = next(i for i, t in enumerate(open(__file__).read().splitlines(), 1) if "the line the report names" in t)
    assert [(f["path"], f["site"]) for f in saved] == [(str(dry / n), f"{__file__}:{line} (_save)") for n in shards]
    assert sum(f["bytes"] for f in saved) == index["metadata"]["total_size"]
    assert "Files saved without data" in report.to_markdown() and str(dry / shards[0]) in str(report)


def test_a_dry_runs_tensors_have_data_pointers_as_real_ones_and_saving_warns_of_none(tmp_path):
    import warnings

    with torch_neuronx.readiness(dry_run=True):
        w = torch.empty(4, 8, device="neuron")
        row, other = w[1], torch.empty(4, 8, device="neuron")
        assert row.data_ptr() == w.data_ptr() + 8 * w.element_size() != 0  # a view: its storage's, offset
        assert other.data_ptr() != w.data_ptr()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _save(tmp_path, dry=True)  # transformers compares the tied weights' data pointers
    assert not [str(c.message) for c in caught if "data pointer of FakeTensor" in str(c.message)]


def test_safetensors_save_to_bytes_in_a_dry_run_says_why_it_cannot():
    from safetensors.torch import save

    from torch_neuronx.readiness import ValueUnknownError

    with pytest.raises(ValueUnknownError, match=r"safetensors\.torch\.save at .*test_saving\.py"):
        with torch_neuronx.readiness(dry_run=True):
            save({"w": torch.zeros(4, 4, device="neuron")})


def _line(marker: str) -> int:
    return next(i for i, t in enumerate(open(__file__).read().splitlines(), 1) if marker in t and "_line(" not in t)


def test_a_dry_run_of_a_script_ending_in_torch_save_gets_a_verdict_and_lists_the_file(tmp_path, capfd):
    # torch.save pickles the data, which a dry run does not have: the file is not written and the
    # script goes on to its verdict (before, the run "failed" at the save)
    script = tmp_path / "train.py"
    script.write_text(
        textwrap.dedent(
            """
            import sys, torch
            model = torch.nn.Linear(64, 32).to("neuron")
            opt = torch.optim.AdamW(model.parameters())
            model(torch.randn(8, 64, device="neuron")).sum().backward()
            opt.step()
            torch.save({"model": model.state_dict(), "optim": opt.state_dict()}, sys.argv[1])
            print("saved")
            """
        )
    )
    out, ckpt = tmp_path / "rep", tmp_path / "ckpt.pt"
    assert _cli.main(["--dry-run", "--out", str(out), "--", sys.executable, str(script), str(ckpt)]) == 0
    rep = json.loads((out / "report.json").read_text())
    assert rep["verdict"] == "runs natively"
    (saved,) = rep["dry_run"]["saved_without_data"]
    # weight, bias, and AdamW's step, exp_avg and exp_avg_sq of each
    params = (32 * 64 + 32) * 4
    assert saved == {
        "path": str(ckpt), "tensors": 8, "bytes": 3 * params + 2 * 4, "site": f"{script}:7 (<module>)", "written": False,
    }  # fmt: skip
    assert not ckpt.exists()
    assert "torch.save's files are not written in a dry run: a pickle holds the data" in (out / "report.md").read_text()
    captured = capfd.readouterr().out  # the script's own output: the run went on after the save
    assert "saved\n" in captured and f"not written      {ckpt}: not written (torch.save's files" in captured


def test_torch_load_of_a_file_torch_save_did_not_write_stops_at_its_line(tmp_path):
    import io

    from torch_neuronx.readiness import ValueUnknownError

    path, buf = tmp_path / "sd.pt", io.BytesIO()
    torch.save({"old": 1}, path)  # a file from before: the dry run neither overwrites it nor loads it
    with torch_neuronx.readiness(dry_run=True) as r:
        model = torch.nn.Linear(4, 4).to("neuron")
        torch.save(model.state_dict(), str(path))  # saved to a path
        torch.save(model.state_dict(), buf)  # saved to a file object
        for f, marker in ((path, "saved to a path"), (buf, "saved to a file object")):
            match = rf"torch\.load at {re.escape(__file__)}:{_line('the load')} .*torch\.save at {re.escape(__file__)}:{_line(marker)} "
            with pytest.raises(ValueUnknownError, match=match):
                torch.load(f)  # the load
    assert torch.load(path) == {"old": 1}
    saved = r.report.data["dry_run"]["saved_without_data"]
    # a file the script opens itself: Python's error, with a note on why the file is not there
    with pytest.raises(FileNotFoundError) as raised:
        with torch_neuronx.readiness(dry_run=True):
            torch.save(torch.nn.Linear(4, 4).to("neuron").state_dict(), tmp_path / "new.pt")  # never written
            open(tmp_path / "new.pt", "rb")
    assert f"torch.save at {__file__}:{_line('never written')} " in raised.value.__notes__[-1]
    assert [(f["path"], f["tensors"], f["bytes"], f["written"]) for f in saved] == [
        (str(path), 2, 20 * 4, False), ("a _io.BytesIO object", 2, 20 * 4, False),
    ]  # fmt: skip


def test_torch_save_of_objects_without_a_dry_runs_tensors_writes_as_before(tmp_path):
    path = tmp_path / "sd.pt"
    with torch_neuronx.readiness(dry_run=True) as r:
        model = torch.nn.Linear(4, 4).to("neuron")
        torch.save(model.state_dict(), path)  # not written
        torch.save({"step": 1, "lr": 0.5}, path)  # written: a later load reads it
        assert torch.load(path) == {"step": 1, "lr": 0.5}
    assert torch.load(path) == {"step": 1, "lr": 0.5}
    assert [f["written"] for f in r.report.data["dry_run"]["saved_without_data"]] == [False]


def _lora():
    import peft
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=256, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2)
    return peft.get_peft_model(LlamaForCausalLM(cfg), peft.LoraConfig(r=4, target_modules="all-linear"))


def _vae():
    from diffusers import AutoencoderKL

    return AutoencoderKL(block_out_channels=(32,), latent_channels=4, norm_num_groups=32)


@pytest.mark.parametrize("build", [_lora, _vae], ids=["peft-adapter", "diffusers-model"])
def test_peft_and_diffusers_save_pretrained_in_a_dry_run(tmp_path, build):
    written = {}
    for dry in (False, True):
        with torch_neuronx.readiness(dry_run=dry) as r:
            with torch.device("neuron"):
                model = build()
            model.save_pretrained(tmp_path / str(dry))
        written[dry] = {n: _header(tmp_path / str(dry) / n) for n in os.listdir(tmp_path / str(dry))
                        if n.endswith(".safetensors")}  # fmt: skip
    assert len(written[True]) == 1 and written[True] == written[False]
    assert [f["path"] for f in r.report.data["dry_run"]["saved_without_data"]] == [
        str(tmp_path / "True" / n) for n in written[True]
    ]
