"""A training loop with a float64 op and a .item() graph break (lines checked by the test)."""

import torch

torch.manual_seed(0)
model = torch.nn.Linear(16, 16).to("neuron")
opt = torch.optim.SGD(model.parameters(), lr=0.1)


def f(x):
    y = model(x).relu()
    if y.sum().item() > -1:  # LINE_GRAPH_BREAK
        y = y * 2
    return y.mean()


cf = torch.compile(f, backend="neuron")
for _step in range(3):
    x = torch.randn(8, 16, device="neuron")
    loss = cf(x)
    loss.backward()
    opt.step()
    opt.zero_grad()
    stats = x.to(torch.float64).cumsum(0)  # LINE_FLOAT64
print("script finished")
