"""Small text-to-image Diffusers pipelines built entirely from local configs (no Hub).

Every pipeline is a real Diffusers pipeline class with real components: a denoiser
(UNet or transformer), a VAE, scheduler, and real transformers text encoders with
tokenizers built in code over a byte-level vocabulary (so any prompt tokenizes, no
files needed). Weights are random but seeded, so two builds with the same seed are
identical on every rank and every device.

`build_pipeline(name, size)` is the entry point; `PIPELINES` lists the names. Sizes:
"tiny" (tests, a few seconds per image) and "bench" (big enough that the denoiser's
matmuls dominate a step). Imported by `examples/diffusion.py`,
`benchmarks/diffusion.py` and the tests under `tests/hf/`.
"""

from __future__ import annotations

import dataclasses

import torch

PIPELINES = ("sd", "flux", "flux2", "qwenimage", "qwenimage21")

# Pipelines whose denoiser class has a `_tp_plan` in diffusers 0.42.1.
TP_PIPELINES = ("flux", "flux2", "qwenimage", "qwenimage21")


@dataclasses.dataclass(frozen=True)
class _Size:
    heads: int  # divisible by 8 so TP=2/4/8 all split heads evenly
    head_dim: int
    layers: int
    text_hidden: int
    image: int  # output height = width in pixels


_SIZES = {
    "tiny": _Size(heads=8, head_dim=8, layers=1, text_hidden=32, image=32),
    "bench": _Size(heads=8, head_dim=64, layers=4, text_hidden=64, image=128),
}

_QWEN_SPECIALS = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|image_pad|>",
    "<|video_pad|>",
    "<think>",
    "</think>",
]

_QWEN_CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}{% if part['type'] == 'text' %}{{ part['text'] }}"
    "{% endif %}{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and not enable_thinking %}<think>\n\n</think>\n\n{% endif %}{% endif %}"
)


def _byte_chars() -> list[str]:
    """The 256 printable stand-ins that byte-level BPE (GPT-2, CLIP, Qwen) uses for raw bytes."""
    from tokenizers.pre_tokenizers import ByteLevel

    return sorted(ByteLevel.alphabet())


def clip_tokenizer(max_length: int = 77):
    """A CLIP tokenizer over single bytes: no merges, every byte is a token."""
    from transformers import CLIPTokenizer

    chars = _byte_chars()
    tokens = ["<|startoftext|>", "<|endoftext|>"] + chars + [c + "</w>" for c in chars]
    tok = CLIPTokenizer(vocab={t: i for i, t in enumerate(tokens)}, merges=[])
    tok.model_max_length = max_length
    return tok


def t5_tokenizer(max_length: int = 64):
    """A T5 (Unigram) tokenizer whose pieces are single characters."""
    from transformers import T5TokenizerFast

    pieces = [("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0), ("\u2581", -1.0)]
    pieces += [(chr(c), -2.0) for c in range(32, 127)]
    tok = T5TokenizerFast(vocab=pieces, extra_ids=0)
    tok.model_max_length = max_length
    return tok


def qwen_tokenizer():
    """A Qwen2 byte-level BPE tokenizer with Qwen's special tokens and a chat template."""
    from transformers import Qwen2TokenizerFast

    chars = _byte_chars()
    tok = Qwen2TokenizerFast(vocab={c: i for i, c in enumerate(chars)}, merges=[])
    tok.add_special_tokens({"additional_special_tokens": _QWEN_SPECIALS[1:]})
    tok.chat_template = _QWEN_CHAT_TEMPLATE
    return tok


def _text_processor_class():
    from transformers import ProcessorMixin

    class TextProcessor(ProcessorMixin):
        """A processor with only a tokenizer: what a text-to-image call of QwenImage-2.1 uses.

        Qwen3VLProcessor also needs image and video processors, which need torchvision
        (not installed here); text-to-image never calls them.
        """

        def __init__(self, tokenizer=None, chat_template=None, **kwargs):
            super().__init__(tokenizer, chat_template=chat_template)

        def __call__(self, text=None, **kwargs):
            # Like Qwen3VLProcessor: a single string is a batch of one.
            return super().__call__(text=[text] if isinstance(text, str) else text, **kwargs)

    return TextProcessor


def _TextProcessor(tokenizer, chat_template):
    return _text_processor_class()(tokenizer, chat_template=chat_template)


# Every VAE here: two small blocks, 4 latent channels (the denoiser, not the VAE, is the workload).
_SMALL_VAE = dict(
    block_out_channels=(8, 16),
    down_block_types=("DownEncoderBlock2D",) * 2,
    up_block_types=("UpDecoderBlock2D",) * 2,
    latent_channels=4,
    norm_num_groups=8,
)


def _flux_blocks(s: _Size) -> dict:
    """The size of a Flux-family transformer: as many dual- as single-stream blocks."""
    return dict(
        patch_size=1,
        in_channels=16,
        num_layers=s.layers,
        num_single_layers=s.layers,
        attention_head_dim=s.head_dim,
        num_attention_heads=s.heads,
    )


def _flow_scheduler():
    from diffusers import FlowMatchEulerDiscreteScheduler

    return FlowMatchEulerDiscreteScheduler()


def _build_sd(s: _Size):
    from diffusers import AutoencoderKL, DDIMScheduler, StableDiffusionPipeline, UNet2DConditionModel
    from transformers import CLIPTextModel

    tok = clip_tokenizer()
    ch = s.heads * s.head_dim // 2
    unet = UNet2DConditionModel(
        sample_size=s.image // 2,
        block_out_channels=(ch, 2 * ch),
        layers_per_block=1,
        down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"),
        up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"),
        cross_attention_dim=s.text_hidden,
        attention_head_dim=s.head_dim,
        norm_num_groups=8,
        in_channels=4,
        out_channels=4,
    )
    vae = AutoencoderKL(
        **_SMALL_VAE,
    )
    text_encoder = CLIPTextModel(_clip_config(tok, s))
    scheduler = DDIMScheduler(beta_schedule="scaled_linear", clip_sample=False, set_alpha_to_one=False, steps_offset=1)
    pipe = StableDiffusionPipeline(
        vae=vae,
        text_encoder=text_encoder,
        tokenizer=tok,
        unet=unet,
        scheduler=scheduler,
        safety_checker=None,
        feature_extractor=None,
        requires_safety_checker=False,
    )
    return pipe, dict(height=s.image, width=s.image, guidance_scale=5.0)


def _clip_config(tok, s: _Size):
    from transformers import CLIPTextConfig

    return CLIPTextConfig(
        vocab_size=len(tok),
        hidden_size=s.text_hidden,
        intermediate_size=2 * s.text_hidden,
        num_hidden_layers=2,
        num_attention_heads=4,
        max_position_embeddings=tok.model_max_length,
        projection_dim=s.text_hidden,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )


def _build_flux(s: _Size):
    from diffusers import AutoencoderKL, FluxPipeline, FluxTransformer2DModel
    from transformers import CLIPTextModel, T5Config, T5EncoderModel

    tok = clip_tokenizer()
    tok_2 = t5_tokenizer()
    text_encoder = CLIPTextModel(_clip_config(tok, s))
    text_encoder_2 = T5EncoderModel(
        T5Config(
            vocab_size=len(tok_2),
            d_model=s.text_hidden,
            d_ff=2 * s.text_hidden,
            d_kv=8,
            num_layers=2,
            num_heads=4,
            pad_token_id=tok_2.pad_token_id,
            eos_token_id=tok_2.eos_token_id,
        )
    )
    quarter = s.head_dim // 4
    transformer = FluxTransformer2DModel(
        **_flux_blocks(s),
        joint_attention_dim=s.text_hidden,
        pooled_projection_dim=s.text_hidden,
        axes_dims_rope=(quarter, quarter, 2 * quarter),
    )
    vae = AutoencoderKL(
        **_SMALL_VAE,
        use_quant_conv=False,
        use_post_quant_conv=False,
        shift_factor=0.0609,
        scaling_factor=1.5035,
    )
    pipe = FluxPipeline(
        scheduler=_flow_scheduler(),
        vae=vae,
        text_encoder=text_encoder,
        tokenizer=tok,
        text_encoder_2=text_encoder_2,
        tokenizer_2=tok_2,
        transformer=transformer,
    )
    return pipe, dict(height=s.image, width=s.image, guidance_scale=3.5, max_sequence_length=32)


def _build_flux2(s: _Size):
    """FLUX.2 [klein]: the Flux2 transformer with a Qwen3 text encoder."""
    from diffusers import AutoencoderKLFlux2, Flux2KleinPipeline, Flux2Transformer2DModel
    from transformers import Qwen3Config, Qwen3ForCausalLM

    tok = qwen_tokenizer()
    text_encoder = Qwen3ForCausalLM(
        Qwen3Config(
            vocab_size=len(tok),
            hidden_size=s.text_hidden,
            intermediate_size=2 * s.text_hidden,
            num_hidden_layers=3,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=s.text_hidden // 4,
            max_position_embeddings=512,
            pad_token_id=tok.pad_token_id,
        )
    )
    quarter = s.head_dim // 4
    transformer = Flux2Transformer2DModel(
        **_flux_blocks(s),
        joint_attention_dim=3 * s.text_hidden,
        timestep_guidance_channels=32,
        axes_dims_rope=(quarter,) * 4,
        guidance_embeds=False,
    )
    vae = AutoencoderKLFlux2(
        **_SMALL_VAE,
        sample_size=s.image,
    )
    pipe = Flux2KleinPipeline(
        scheduler=_flow_scheduler(), vae=vae, text_encoder=text_encoder, tokenizer=tok, transformer=transformer
    )
    return pipe, dict(
        height=s.image, width=s.image, guidance_scale=4.0, max_sequence_length=32, text_encoder_out_layers=(1, 2, 3)
    )


def _qwen_text_config(tok, s: _Size, head_dim: int) -> dict:
    return dict(
        vocab_size=len(tok),
        hidden_size=s.text_hidden,
        intermediate_size=2 * s.text_hidden,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=head_dim,
        max_position_embeddings=512,
        pad_token_id=tok.pad_token_id,
        bos_token_id=tok.convert_tokens_to_ids("<|im_start|>"),
        eos_token_id=tok.convert_tokens_to_ids("<|im_end|>"),
    )


def _build_qwenimage(s: _Size):
    from diffusers import AutoencoderKLQwenImage, QwenImagePipeline, QwenImageTransformer2DModel
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    tok = qwen_tokenizer()
    text = _qwen_text_config(tok, s, s.text_hidden // 4)
    text["rope_scaling"] = {"type": "mrope", "mrope_section": [1, 1, 2]}
    config = Qwen2_5_VLConfig(
        text_config=text,
        vision_config=dict(depth=1, hidden_size=16, intermediate_size=16, num_heads=2, out_hidden_size=s.text_hidden),
        vision_start_token_id=tok.convert_tokens_to_ids("<|vision_start|>"),
        image_token_id=tok.convert_tokens_to_ids("<|image_pad|>"),
        video_token_id=tok.convert_tokens_to_ids("<|video_pad|>"),
    )
    text_encoder = Qwen2_5_VLForConditionalGeneration(config)
    quarter = s.head_dim // 4
    transformer = QwenImageTransformer2DModel(
        patch_size=2,
        in_channels=16,
        out_channels=4,
        num_layers=s.layers,
        attention_head_dim=s.head_dim,
        num_attention_heads=s.heads,
        joint_attention_dim=s.text_hidden,
        axes_dims_rope=(quarter, quarter, 2 * quarter),
    )
    z_dim = 4
    vae = AutoencoderKLQwenImage(
        base_dim=8,
        z_dim=z_dim,
        dim_mult=[1, 2, 4],
        num_res_blocks=1,
        temperal_downsample=[False, True],
        latents_mean=[0.0] * z_dim,
        latents_std=[1.0] * z_dim,
    )
    pipe = QwenImagePipeline(
        scheduler=_flow_scheduler(), vae=vae, text_encoder=text_encoder, tokenizer=tok, transformer=transformer
    )
    return pipe, dict(height=s.image, width=s.image, true_cfg_scale=1.0, max_sequence_length=32)


def _build_qwenimage21(s: _Size):
    from diffusers import AutoencoderKLQwenImage21, QwenImage21Pipeline, QwenImage21Transformer2DModel
    from transformers import Qwen3VLConfig, Qwen3VLForConditionalGeneration

    tok = qwen_tokenizer()
    processor = _TextProcessor(tok, chat_template=_QWEN_CHAT_TEMPLATE)
    head_dim = s.text_hidden // 4
    text = _qwen_text_config(tok, s, head_dim)
    text["rope_scaling"] = {"rope_type": "default", "mrope_section": [1, 1, 2], "mrope_interleaved": True}
    config = Qwen3VLConfig(
        text_config=text,
        vision_config=dict(
            depth=1,
            hidden_size=16,
            intermediate_size=16,
            num_heads=2,
            out_hidden_size=s.text_hidden,
            deepstack_visual_indexes=[],
        ),
        vision_start_token_id=tok.convert_tokens_to_ids("<|vision_start|>"),
        image_token_id=tok.convert_tokens_to_ids("<|image_pad|>"),
        video_token_id=tok.convert_tokens_to_ids("<|video_pad|>"),
    )
    text_encoder = Qwen3VLForConditionalGeneration(config)
    quarter = s.head_dim // 4
    z_dim = 16
    transformer = QwenImage21Transformer2DModel(
        patch_size=1,
        in_channels=z_dim,
        out_channels=z_dim,
        num_layers=s.layers,
        attention_head_dim=s.head_dim,
        num_attention_heads=s.heads,
        context_in_dim=s.text_hidden,
        axes_dims_rope=(quarter, quarter, 2 * quarter),
    )
    vae = AutoencoderKLQwenImage21(
        base_dim=8,
        decoder_base_dim=8,
        z_dim=z_dim,
        dim_mult=[1, 1, 1, 1, 1],
        num_res_blocks=1,
        temperal_downsample=[False, True, True, True],
        latents_mean=[0.0] * z_dim,
        latents_std=[1.0] * z_dim,
    )
    pipe = QwenImage21Pipeline(
        scheduler=_flow_scheduler(), vae=vae, text_encoder=text_encoder, processor=processor, transformer=transformer
    )
    return pipe, dict(height=s.image, width=s.image, output_resolution=s.image)


_BUILDERS = {
    "sd": _build_sd,
    "flux": _build_flux,
    "flux2": _build_flux2,
    "qwenimage": _build_qwenimage,
    "qwenimage21": _build_qwenimage21,
}


def build_pipeline(name: str, size: str = "tiny", seed: int = 0):
    """Build pipeline `name` on CPU with seeded random weights.

    Returns `(pipe, call_kwargs)`: the kwargs a text-to-image call needs for this
    model (height/width matching the tiny VAE, guidance, sequence length).
    """
    if name not in _BUILDERS:
        raise ValueError(f"unknown pipeline {name!r}; expected one of {PIPELINES}")
    if size not in _SIZES:
        raise ValueError(f"unknown size {size!r}; expected one of {tuple(_SIZES)}")
    torch.manual_seed(seed)
    pipe, kwargs = _BUILDERS[name](_SIZES[size])
    pipe.set_progress_bar_config(disable=False)
    return pipe, kwargs


def denoiser(pipe) -> torch.nn.Module:
    """The pipeline's denoising model: `transformer` or `unet`."""
    return pipe.transformer if hasattr(pipe, "transformer") else pipe.unet


def add_unet_tp_plan(unet) -> dict:
    """Give a UNet (no `_tp_plan` in diffusers) a tensor-parallel plan; returns the plan.

    The worked example of the README's guide. Megatron-style MLP sharding of every
    `BasicTransformerBlock`: the GEGLU input projection is column-parallel and the output
    projection row-parallel, so each rank holds 1/N of each feed-forward and one
    all-reduce per block restores the full activation. GEGLU's projection packs
    [hidden, gate] halves that are split with `chunk(2)`, so it must be sharded per half
    (`PackedColwiseParallel([1, 1])`); a plain "colwise" would give rank 0 all of
    `hidden` and rank 1 all of `gate`. Attention stays replicated: the UNet's
    `AttnProcessor2_0` reshapes by `attn.heads`, so it is not head-shard-agnostic the
    way Flux's and Qwen's processors are.

    The plan's keys are explicit module paths (diffusers allows one `*` per key, and
    these blocks sit two `ModuleList`s deep). It is set as an instance attribute, which
    `enable_parallelism` reads exactly like a class attribute.
    """
    from diffusers.hooks.tensor_parallel import PackedColwiseParallel

    plan = {}
    for name, module in unet.named_modules():
        if type(module).__name__ == "BasicTransformerBlock":
            plan[f"{name}.ff.net.0.proj"] = PackedColwiseParallel([1, 1])
            plan[f"{name}.ff.net.2"] = "rowwise"
    if not plan:
        raise ValueError("this UNet has no BasicTransformerBlock to shard")
    unet._tp_plan = plan
    return plan
