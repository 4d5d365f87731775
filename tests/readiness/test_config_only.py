"""Directories without their weights in a dry run, beyond a transformers config.json: diffusers models
and pipelines, PEFT adapters, sharded checkpoints with absent shards, and a config no library claims.
Each stand-in's header-only files name the tensors a real save would write (same names, shapes,
dtypes), and a dry run that loads the stand-in peaks where a real run with the real weights does."""

import gc
import json
import os
import struct

import pytest
import torch

import torch_neuronx
from torch_neuronx.readiness.dry.checkpoints import stand_ins as _stand_ins
from torch_neuronx.readiness.report.render import absent_text

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning")


def _header(path) -> dict:
    """name -> (dtype, shape) of a safetensors file's header."""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
    return {k: (v["dtype"], v["shape"]) for k, v in header.items() if k != "__metadata__"}


def _peak(load) -> tuple:
    """(peak bytes on core 0 of a real run of `load`, of a dry run of it)."""
    peaks = []
    for dry in (False, True):
        # A peak counts what was already allocated: device tensors an earlier test left in reference
        # cycles would count in whichever run comes before the collector frees them (CI once saw
        # 444 KiB more in the real run than the dry one)
        gc.collect()
        with torch_neuronx.readiness(dry_run=dry) as r:
            load(dry)
        peaks.append(r.report.data["memory"][0]["peak_allocated"])
    return tuple(peaks)


def _unet():
    from diffusers import UNet2DConditionModel

    return UNet2DConditionModel(
        sample_size=8, layers_per_block=1, block_out_channels=(32, 64), norm_num_groups=32, cross_attention_dim=32,
        down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"), up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"),
    )  # fmt: skip


def _diffusers_models():
    from diffusers import AutoencoderKL, FluxTransformer2DModel

    flux = FluxTransformer2DModel(
        patch_size=1, in_channels=4, num_layers=1, num_single_layers=1, attention_head_dim=16, num_attention_heads=2,
        joint_attention_dim=32, pooled_projection_dim=32, axes_dims_rope=(4, 6, 6),
    )  # fmt: skip
    return [flux, _unet(), AutoencoderKL(block_out_channels=(32,), latent_channels=4, norm_num_groups=32)]


def test_a_diffusers_model_directory_with_only_its_config(tmp_path):
    models = _diffusers_models()
    dirs = []
    for m in models:
        real, cfg = tmp_path / f"{type(m).__name__}-real", tmp_path / type(m).__name__
        m.save_pretrained(real)
        m.save_config(cfg)
        dirs.append((real, cfg))
    out, absent = _stand_ins(["python", "x.py"] + [str(c) for _, c in dirs], str(tmp_path / "stand-ins"))
    assert [(a["path"], a["class"], a["dtype"]) for a in absent] == [
        (str(c), type(m).__name__, "float32") for m, (_, c) in zip(models, dirs)
    ]
    assert "the config names no dtype" in absent_text(absent[0])
    for (real, cfg), stand_in in zip(dirs, out[2:]):
        name = "diffusion_pytorch_model.safetensors"
        assert _header(os.path.join(stand_in, name)) == _header(real / name)  # what save_pretrained writes
        assert os.listdir(cfg) == ["config.json"]  # the user's directory is untouched
    flux_cls, (flux_real, _) = type(models[0]), dirs[0]

    def load(dry):
        flux_cls.from_pretrained(out[2] if dry else str(flux_real)).to("neuron")

    real_peak, dry_peak = _peak(load)
    assert dry_peak == real_peak > 0


def _sd_pipeline(path):
    """A tiny Stable Diffusion pipeline saved with all its weights; its unet and text encoder."""
    from diffusers import AutoencoderKL, DDIMScheduler, StableDiffusionPipeline
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTokenizer

    vocab = path.parent / "vocab.json"
    vocab.write_text(json.dumps({"<|startoftext|>": 0, "<|endoftext|>": 1, "a</w>": 2, "a": 3}))
    (path.parent / "merges.txt").write_text("#version: 0.2\n")
    text = CLIPTextConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, vocab_size=4,
        max_position_embeddings=16,
    )  # fmt: skip
    pipe = StableDiffusionPipeline(
        vae=AutoencoderKL(block_out_channels=(32,), latent_channels=4, norm_num_groups=32),
        text_encoder=CLIPTextModel(text), tokenizer=CLIPTokenizer(str(vocab), str(path.parent / "merges.txt")),
        unet=_unet(), scheduler=DDIMScheduler(), safety_checker=None, feature_extractor=None,
        requires_safety_checker=False,
    )  # fmt: skip
    pipe.save_pretrained(path)


def test_a_diffusers_pipeline_whose_unet_and_text_encoder_have_no_weights(tmp_path):
    from diffusers import DiffusionPipeline

    real, cfg = tmp_path / "real", tmp_path / "pipe"
    _sd_pipeline(real)
    os.system(f"cp -r {real} {cfg}")
    os.remove(cfg / "unet" / "diffusion_pytorch_model.safetensors")
    os.remove(cfg / "text_encoder" / "model.safetensors")
    (_, stand_in), absent = _stand_ins(["python", str(cfg)], str(tmp_path / "stand-ins"))
    assert sorted((a["path"], a["class"]) for a in absent) == [
        (str(cfg / "text_encoder"), "CLIPTextModel"),
        (str(cfg / "unet"), "UNet2DConditionModel"),
    ]
    assert stand_in != str(cfg)
    # only the components without weights stood in for; the VAE's weights and the rest are the user's
    assert os.path.realpath(os.path.join(stand_in, "vae")) == str(cfg / "vae")
    assert os.path.realpath(os.path.join(stand_in, "tokenizer")) == str(cfg / "tokenizer")
    for sub, name in (("unet", "diffusion_pytorch_model.safetensors"), ("text_encoder", "model.safetensors")):
        assert _header(os.path.join(stand_in, sub, name)) == _header(real / sub / name)

    def load(dry):
        pipe = DiffusionPipeline.from_pretrained(stand_in if dry else str(real))
        pipe.to("neuron")

    real_peak, dry_peak = _peak(load)
    assert dry_peak == real_peak > 0


def _llama(path, **kw):
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, vocab_size=256,
        tie_word_embeddings=False, **kw,
    )  # fmt: skip
    model = LlamaForCausalLM(config)
    return model


def test_a_peft_adapter_without_weights_on_a_config_only_base(tmp_path):
    from peft import AutoPeftModelForCausalLM, LoraConfig, get_peft_model

    base_real, base_cfg, adapter_real, adapter_cfg = (tmp_path / n for n in ("base-real", "base", "lora-real", "lora"))
    model = _llama(base_real)
    model.save_pretrained(base_real)
    model.config.save_pretrained(base_cfg)
    lora = get_peft_model(model, LoraConfig(r=4, target_modules=["q_proj", "v_proj"]))
    lora.peft_config["default"].base_model_name_or_path = str(base_real)
    lora.save_pretrained(adapter_real)
    os.makedirs(adapter_cfg)
    config = json.loads((adapter_real / "adapter_config.json").read_text())
    (adapter_cfg / "adapter_config.json").write_text(json.dumps(config | {"base_model_name_or_path": str(base_cfg)}))
    (stand_in,), absent = (lambda o: (o[0][1:], o[1]))(_stand_ins(["python", str(adapter_cfg)], str(tmp_path / "s")))
    assert [(a["path"], a["class"]) for a in absent] == [
        (str(base_cfg), "LlamaForCausalLM"),  # the base has no weights either: it stands in too
        (str(adapter_cfg), "LORA adapter of LlamaForCausalLM"),
    ]
    assert "adapter_config.json and no adapter weights" in absent_text(absent[1])
    name = "adapter_model.safetensors"
    assert _header(os.path.join(stand_in, name)) == _header(adapter_real / name)
    base_stand_in = json.loads(open(os.path.join(stand_in, "adapter_config.json")).read())["base_model_name_or_path"]
    assert os.path.isfile(os.path.join(base_stand_in, "model.safetensors"))
    assert json.loads((adapter_cfg / "adapter_config.json").read_text())["base_model_name_or_path"] == str(base_cfg)

    def load(dry):
        AutoPeftModelForCausalLM.from_pretrained(stand_in if dry else str(adapter_real)).to("neuron")

    real_peak, dry_peak = _peak(load)
    assert dry_peak == real_peak > 0


def test_an_adapter_with_its_weights_on_a_config_only_base(tmp_path):
    from peft import LoraConfig, get_peft_model

    base, adapter = tmp_path / "base", tmp_path / "lora"
    model = _llama(base)
    model.config.save_pretrained(base)
    lora = get_peft_model(model, LoraConfig(r=4, target_modules=["q_proj"]))
    lora.peft_config["default"].base_model_name_or_path = str(base)
    lora.save_pretrained(adapter)
    (_, stand_in), absent = _stand_ins(["python", str(adapter)], str(tmp_path / "s"))
    assert [(a["path"], a["class"]) for a in absent] == [(str(base), "LlamaForCausalLM")]  # only the base stands in
    name = "adapter_model.safetensors"
    assert os.path.realpath(os.path.join(stand_in, name)) == str(adapter / name)
    base_stand_in = json.loads(open(os.path.join(stand_in, "adapter_config.json")).read())["base_model_name_or_path"]
    assert os.path.isfile(os.path.join(base_stand_in, "model.safetensors"))


def test_a_sharded_checkpoint_whose_index_names_absent_shards(tmp_path):
    from transformers import AutoModelForCausalLM

    real, part = tmp_path / "real", tmp_path / "part"
    _llama(real, dtype="bfloat16").to(torch.bfloat16).save_pretrained(real, max_shard_size="60KB")
    shards = sorted(p.name for p in real.glob("model-*.safetensors"))
    assert len(shards) >= 3
    os.system(f"cp -r {real} {part}")
    for s in shards[1:]:
        os.remove(part / s)
    (_, stand_in), absent = _stand_ins(["python", str(part)], str(tmp_path / "s"))
    (a,) = absent
    assert (a["class"], a["dtype"], a["dtype_from"]) == ("LlamaForCausalLM", "bfloat16", "the shards present")
    assert a["absent"].startswith(f"{len(shards) - 1} of the {len(shards)} shards model.safetensors.index.json names")
    assert os.path.realpath(os.path.join(stand_in, shards[0])) == str(part / shards[0])  # present: the user's
    for s in shards[1:]:
        assert _header(os.path.join(stand_in, s)) == _header(real / s)  # the index's tensors, their shapes

    def load(dry):
        AutoModelForCausalLM.from_pretrained(stand_in if dry else str(real)).to("neuron")

    real_peak, dry_peak = _peak(load)
    assert dry_peak == real_peak > 0


def test_a_config_no_library_claims_is_named_not_replaced(tmp_path):
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "config.json").write_text(json.dumps({"hidden": 4}))
    cmd = ["python", "x.py", f"--model={tmp_path / 'mine'}"]
    out, absent = _stand_ins(cmd, str(tmp_path / "s"))
    assert out == cmd
    (a,) = absent
    assert a["class"] is None and a["path"] == str(tmp_path / "mine")
    text = absent_text(a)
    assert f"{tmp_path / 'mine' / 'config.json'} names no model of a library a dry run knows" in text
    assert all(lib in text for lib in ("transformers", "diffusers", "peft"))


def test_a_sharded_diffusers_checkpoint_whose_index_names_absent_shards(tmp_path):
    real, part = tmp_path / "real", tmp_path / "part"
    _unet().save_pretrained(real, max_shard_size="1MB")
    shards = sorted(p.name for p in real.glob("diffusion_pytorch_model-*.safetensors"))
    assert len(shards) >= 3
    os.system(f"cp -r {real} {part}")
    os.remove(part / shards[-1])
    (_, stand_in), (a,) = _stand_ins(["python", str(part)], str(tmp_path / "s"))
    assert (a["class"], a["dtype"], a["dtype_from"]) == ("UNet2DConditionModel", "float32", "the shards present")
    assert f"diffusion_pytorch_model.safetensors.index.json names ({shards[-1]})" in a["absent"]
    assert _header(os.path.join(stand_in, shards[-1])) == _header(real / shards[-1])


@pytest.mark.slow
def test_check_dry_run_of_a_pipeline_without_unet_weights_and_a_config_no_library_claims(tmp_path, capsys):
    import sys
    import textwrap

    from torch_neuronx.readiness.launch import cli as _cli

    pipe, other = tmp_path / "pipe", tmp_path / "other"
    _sd_pipeline(pipe)
    os.remove(pipe / "unet" / "diffusion_pytorch_model.safetensors")
    other.mkdir()
    (other / "config.json").write_text(json.dumps({"hidden": 4}))
    script = tmp_path / "load.py"
    script.write_text(
        textwrap.dedent(
            """
            import sys
            from diffusers import DiffusionPipeline
            DiffusionPipeline.from_pretrained(sys.argv[1]).to("neuron")
            """
        )
    )
    out = tmp_path / "rep"
    assert _cli.main(["--dry-run", "--out", str(out), "--", sys.executable, str(script), str(pipe), str(other)]) == 0
    rep = json.loads((out / "report.json").read_text())
    unet, unclaimed = rep["dry_run"]["absent_weights"]
    assert (unet["path"], unet["class"]) == (str(pipe / "unet"), "UNet2DConditionModel")
    assert unclaimed["path"] == str(other) and unclaimed["class"] is None
    captured = capsys.readouterr()
    assert f"{other}: no stand-in ({other / 'config.json'} names no model of a library" in captured.err
    assert f"weights absent   {pipe / 'unet'}: config.json and no weight files; loaded as UNet2DC" in captured.out
    assert rep["memory"][0]["peak_allocated"] >= unet["bytes"]


def _save_bin_shards(model, path, n=3, **save_kw) -> list:
    """``model``'s config and its weights as ``n`` ``.bin`` shards with ``pytorch_model.bin.index.json``, as
    transformers before 5 saved them (``safe_serialization=False``; 5 writes safetensors only); the shard names."""
    model.config.save_pretrained(path)
    state = model.state_dict()
    names, weight_map, shards = list(state), {}, []
    per = -(-len(names) // n)
    for i in range(n):
        shards.append(f"pytorch_model-{i + 1:05d}-of-{n:05d}.bin")
        part = {k: state[k].clone() for k in names[i * per : (i + 1) * per]}
        torch.save(part, path / shards[-1], **save_kw)
        weight_map.update(dict.fromkeys(part, shards[-1]))
    total = sum(t.numel() * t.element_size() for t in state.values())
    (path / "pytorch_model.bin.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map})
    )
    return shards


def _loaded(path) -> dict:
    """name -> (dtype, shape) of every parameter of the causal LM transformers loads from ``path``."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path)
    return {k: (v.dtype, tuple(v.shape)) for k, v in model.state_dict().items()}


@pytest.mark.parametrize("kept", [0, 1], ids=["all-absent", "one-present"])
def test_a_sharded_bin_checkpoint_whose_index_names_absent_shards(tmp_path, kept):
    real, part = tmp_path / "real", tmp_path / "part"
    real.mkdir()
    # with one shard present the config names no dtype: transformers takes the first shard's, so must the stand-in
    model = _llama(real, **({} if kept else {"dtype": "bfloat16"})).to(torch.bfloat16)
    if kept:
        model.config.dtype = None
    shards = _save_bin_shards(model, real)
    os.system(f"cp -r {real} {part}")
    for s in shards[kept:]:
        os.remove(part / s)
    (_, stand_in), absent = _stand_ins(["python", str(part)], str(tmp_path / "s"))
    (a,) = absent
    source = "the shards present" if kept else "the config"
    assert (a["class"], a["dtype"], a["dtype_from"]) == ("LlamaForCausalLM", "bfloat16", source)
    assert a["absent"].startswith(f"{3 - kept} of the 3 shards pytorch_model.bin.index.json names")
    assert "header-only safetensors under model.safetensors.index.json" in absent_text(a)
    index = json.loads(open(os.path.join(stand_in, "model.safetensors.index.json")).read())["weight_map"]
    bin_index = json.loads((real / "pytorch_model.bin.index.json").read_text())["weight_map"]
    assert index == {
        t: s.replace("pytorch_model", "model").replace(".bin", ".safetensors") for t, s in bin_index.items()
    }
    assert sorted(os.listdir(part)) == sorted(["config.json", "pytorch_model.bin.index.json"] + shards[:kept])
    with torch_neuronx.readiness(dry_run=True):
        dry = _loaded(stand_in)
    assert dry == _loaded(str(real))  # the names, dtypes and shapes loading the real .bin shards gives

    def load(dry):
        from transformers import AutoModelForCausalLM

        AutoModelForCausalLM.from_pretrained(stand_in if dry else str(real)).to("neuron")

    real_peak, dry_peak = _peak(load)
    assert dry_peak == real_peak > 0


def test_a_bin_index_a_dry_run_cannot_stand_in_for_is_named_with_the_fix(tmp_path):
    legacy, unet = tmp_path / "legacy", tmp_path / "unet"
    legacy.mkdir()
    # a present shard in torch.save's pre-zip format cannot be read without reading its data
    shards = _save_bin_shards(_llama(legacy), legacy, _use_new_zipfile_serialization=False)
    os.remove(legacy / shards[-1])
    _unet().save_pretrained(unet, safe_serialization=False, max_shard_size="1MB")
    os.remove(unet / "diffusion_pytorch_model-00001-of-00004.bin")
    cmd = ["python", str(legacy), str(unet)]
    out, (a, b) = _stand_ins(cmd, str(tmp_path / "s"))
    assert out == cmd  # neither replaced: the script gets its own directories
    assert a["class"] is None and a["absent"].startswith("1 of the 3 shards pytorch_model.bin.index.json names")
    assert f"ValueError: {legacy / shards[0]} cannot be read without its data" in absent_text(a)
    assert "save the checkpoint again with torch.save, or as safetensors" in a["reason"]
    assert b["class"] is None and b["path"] == str(unet)
    assert "diffusion_pytorch_model.bin.index.json only with from_pretrained(..., use_safetensors=False)" in b["reason"]


def test_an_absent_bin_shard_a_script_reads_gets_the_way_out(tmp_path):
    from transformers import AutoModelForCausalLM

    part = tmp_path / "part"
    part.mkdir()
    shards = _save_bin_shards(_llama(part), part)
    os.remove(part / shards[1])
    (_, stand_in), _ = _stand_ins(["python", str(part)], str(tmp_path / "s"))
    # in process no stand-in is made; on the stand-in, use_safetensors=False reads the .bin index
    for path, kw in ((part, {}), (stand_in, {"use_safetensors": False})):
        with pytest.raises(FileNotFoundError, match=shards[1]) as info:
            with torch_neuronx.readiness(dry_run=True):
                AutoModelForCausalLM.from_pretrained(str(path), **kw)
        assert any("check --dry-run" in n and "use_safetensors=False" in n for n in info.value.__notes__)
