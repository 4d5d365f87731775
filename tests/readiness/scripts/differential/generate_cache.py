"""`generate` of a tiny Llama (built from a config) with transformers' dynamic cache (the default)
or its static cache, whose decode step transformers compiles by itself.

    python generate_cache.py dynamic|static
"""

import sys

import torch
from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

cache = sys.argv[1]
torch.manual_seed(0)
config = LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                     num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)  # fmt: skip
model = LlamaForCausalLM(config).to("neuron").eval()
ids = torch.randint(0, 128, (2, 8), generator=torch.Generator().manual_seed(1)).to("neuron")
gen = GenerationConfig(max_new_tokens=4, min_new_tokens=4, do_sample=False, pad_token_id=0, eos_token_id=None)
if cache == "static":
    gen.cache_implementation = "static"
out = model.generate(ids, attention_mask=torch.ones_like(ids), generation_config=gen)
print("generated", tuple(out.shape))
