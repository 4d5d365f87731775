"""The public Llama-3.1 configs (meta-llama/Llama-3.1-{8B,70B,405B} config.json), for the
benchmarks that run them at real size."""

from __future__ import annotations

_COMMON = dict(
    num_key_value_heads=8,
    vocab_size=128256,
    max_position_embeddings=131072,
    rms_norm_eps=1e-5,
    rope_theta=500000.0,
    rope_scaling={
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
        "rope_type": "llama3",
    },
    tie_word_embeddings=False,
    bos_token_id=128000,
    eos_token_id=128001,
)

_SIZES = {
    "8b": dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32),
    "70b": dict(hidden_size=8192, intermediate_size=28672, num_hidden_layers=80, num_attention_heads=64),
    "405b": dict(
        hidden_size=16384, intermediate_size=53248, num_hidden_layers=126, num_attention_heads=128, head_dim=128
    ),
}


def config(size: str) -> dict:
    """LlamaConfig keyword arguments of Llama-3.1 of `size` ("8b", "70b" or "405b")."""
    return dict(_SIZES[size], **_COMMON)
