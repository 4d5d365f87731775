"""LoRA fine-tuning with PEFT as its quicktour writes it: `get_peft_model` on a causal LM, a plain
PyTorch loop over a DataLoader. The tiny Llama is built from a config (no download).

    python peft_lora.py
"""

import torch
from peft import LoraConfig, TaskType, get_peft_model
from torch.utils.data import DataLoader
from transformers import LlamaConfig, LlamaForCausalLM

torch.manual_seed(0)
config = LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                     num_attention_heads=4, num_key_value_heads=2)  # fmt: skip
model = LlamaForCausalLM(config)
lora = LoraConfig(
    task_type=TaskType.CAUSAL_LM, r=8, lora_alpha=16, lora_dropout=0.0, target_modules=["q_proj", "v_proj"]
)
model = get_peft_model(model, lora).to("neuron")
model.print_trainable_parameters()

data = [torch.randint(0, 128, (32,), generator=torch.Generator().manual_seed(i)) for i in range(8)]
loader = DataLoader(data, batch_size=4)
opt = torch.optim.AdamW((p for p in model.parameters() if p.requires_grad), lr=1e-4)
model.train()
for step, ids in enumerate(loader):
    ids = ids.to("neuron")
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    opt.step()
    opt.zero_grad()
    print(f"step {step} loss {loss.item():.4f}")
