"""A training loop with `torch.compile(model, backend="neuron")`: a small transformer-style block
stack, AdamW, a few steps; the loss is logged with a print inside the model (a graph break).

    python compiled_train.py
"""

import torch
import torch.nn as nn


class Block(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.attn = nn.MultiheadAttention(dim, 4, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x):
        h = self.norm(x)
        x = x + self.attn(h, h, h, need_weights=False)[0]
        return x + self.mlp(x)


class Model(nn.Module):
    def __init__(self, dim=64, layers=2):
        super().__init__()
        self.blocks = nn.Sequential(*[Block(dim) for _ in range(layers)])
        self.out = nn.Linear(dim, 1)

    def forward(self, x):
        h = self.blocks(x)
        print("hidden", tuple(h.shape))  # a graph break: two graphs each way
        return self.out(h)


torch.manual_seed(0)
model = torch.compile(Model().to("neuron"), backend="neuron")
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
for step in range(2):
    x = torch.randn(4, 16, 64, device="neuron")
    loss = model(x).pow(2).mean()
    loss.backward()
    opt.step()
    opt.zero_grad()
    print(f"step {step} loss {loss.item():.4f}")
