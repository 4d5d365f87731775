"""LAMB (You et al., "Large Batch Optimization for Deep Learning: Training BERT in 76 minutes"),
written as a user writes it for PyTorch, which has none: the NVLAMB variant AWS's BERT tutorial
uses (its lamb.py, the pure-PyTorch LAMB of timm): the gradients scaled down to a global norm of at
most ``max_grad_norm``, Adam's moments with bias correction, weight decay added to the update, and
the update scaled by the layer's trust ratio ||w|| / ||update|| (1 where either norm is 0) for the
parameters with weight decay. Every decision stays on the device (``torch.where``, no ``.item()``),
as it must under XLA and in a dry run.
"""

from __future__ import annotations

import torch


class Lamb(torch.optim.Optimizer):
    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-6, weight_decay=0.01, max_grad_norm=1.0):
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))
        self.max_grad_norm = max_grad_norm

    @torch.no_grad()
    def step(self, closure=None):
        params = [p for g in self.param_groups for p in g["params"] if p.grad is not None]
        if not params:
            return None
        device = params[0].device
        one = torch.ones((), device=device)
        norm_sq = torch.zeros((), device=device)
        for p in params:
            norm_sq += p.grad.pow(2).sum()
        # divide by norm / max_grad_norm where the norm exceeds max_grad_norm
        scale = torch.where(norm_sq.sqrt() > self.max_grad_norm, norm_sq.sqrt() / self.max_grad_norm, one)
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            group["step"] = group.get("step", 0) + 1
            bc1, bc2 = 1 - beta1 ** group["step"], 1 - beta2 ** group["step"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                grad = p.grad / scale
                state = self.state[p]
                if not state:
                    state["exp_avg"] = torch.zeros_like(p)
                    state["exp_avg_sq"] = torch.zeros_like(p)
                m, v = state["exp_avg"], state["exp_avg_sq"]
                m.mul_(beta1).add_(grad, alpha=1 - beta1)
                v.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
                update = (m / bc1) / ((v / bc2).sqrt() + group["eps"])
                if group["weight_decay"]:
                    update.add_(p, alpha=group["weight_decay"])
                    w_norm, u_norm = p.norm(), update.norm()
                    trust = torch.where((w_norm > 0) & (u_norm > 0), w_norm / u_norm, one)
                    update.mul_(trust)
                p.add_(update, alpha=-group["lr"])
        return None


def bert_param_groups(model, weight_decay: float = 0.01) -> list:
    """BERT's usual groups (AWS's script's too): no weight decay (so no trust ratio) for biases
    and LayerNorm weights."""
    no_decay = ("bias", "LayerNorm.weight")
    named = list(model.named_parameters())
    return [
        {"params": [p for n, p in named if not any(k in n for k in no_decay)], "weight_decay": weight_decay},
        {"params": [p for n, p in named if any(k in n for k in no_decay)], "weight_decay": 0.0},
    ]
