"""A training loop written for Accelerate: it runs as `accelerate launch` starts it (one process, DDP
or the FSDP plugin, from its flags or config file), 3 optimizer steps of a 3-layer MLP.

    accelerate launch [--num_processes 2 | --config_file fsdp2.yaml] accelerate_train.py
"""

import torch
from accelerate import Accelerator
from torch.utils.data import DataLoader, TensorDataset

accelerator = Accelerator()
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 256))  # on the host
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
data = DataLoader(TensorDataset(torch.randn(96, 256)), batch_size=16)
model, opt, data = accelerator.prepare(model, opt, data)
print(f"accelerate_train: rank {accelerator.process_index} of {accelerator.num_processes}, "
      f"{accelerator.distributed_type}, {type(model).__name__}")  # fmt: skip
for (x,) in data:
    loss = model(x).pow(2).mean()
    accelerator.backward(loss)
    opt.step()
    opt.zero_grad()
accelerator.end_training()
