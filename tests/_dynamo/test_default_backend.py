"""Plain torch.compile (default backend "inductor") on neuron tensors, as on CUDA."""

import pytest
import torch
from torch import nn

from helpers import run_python


def _close(a, b, tol=1e-5):
    torch.testing.assert_close(a.detach().cpu(), b.detach().cpu(), rtol=tol, atol=tol)


@pytest.mark.slow
def test_default_backend_works_first_and_import_stays_lazy():
    # Before any backend="neuron" compile, in a fresh process: `import torch` loads
    # neither Dynamo nor Inductor, and the default backend still compiles neuron code.
    r = run_python(
        "import sys, torch\n"
        "assert 'torch._dynamo' not in sys.modules and 'torch._inductor' not in sys.modules\n"
        "x = torch.randn(4, 8)\n"
        "f = lambda x: torch.nn.functional.gelu(x @ x.T).sum(-1)\n"
        "out = torch.compile(f)(x.to('neuron'))\n"
        "assert out.device.type == 'neuron'\n"
        "torch.testing.assert_close(out.cpu(), f(x))\n"
        "print('ok')\n",
        timeout=600,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.split() == ["ok"]


class _ConvNormBlock(nn.Module):
    """A ResNet block as diffusion UNets have: conv, GroupNorm, SiLU, residual."""

    def __init__(self, ch=8):
        super().__init__()
        self.conv1 = nn.Conv2d(ch, ch, 3, padding=1)
        self.norm = nn.GroupNorm(4, ch)
        self.conv2 = nn.Conv2d(ch, ch, 3, padding=1)

    def forward(self, x):
        return x + self.conv2(nn.functional.silu(self.norm(self.conv1(x))))


class _AttnBlock(nn.Module):
    def __init__(self, dim=16, heads=2):
        super().__init__()
        self.heads = heads
        self.norm = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.out = nn.Linear(dim, dim)

    def forward(self, x):
        b, n, d = x.shape
        q, k, v = self.qkv(self.norm(x)).view(b, n, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        a = nn.functional.scaled_dot_product_attention(q, k, v)
        return x + self.out(a.transpose(1, 2).reshape(b, n, d))


@pytest.mark.parametrize(
    "make, shape", [(_ConvNormBlock, (2, 8, 8, 8)), (_AttnBlock, (2, 6, 16))], ids=["conv_groupnorm", "attention"]
)
def test_default_backend_forward_backward_match_cpu(make, shape):
    torch.manual_seed(0)
    cpu = make()
    dev = make().to("neuron")
    dev.load_state_dict(cpu.state_dict())
    x = torch.randn(*shape)

    ref = cpu(x)
    ref.square().sum().backward()
    out = torch.compile(dev, fullgraph=True)(x.to("neuron"))
    out.square().sum().backward()

    assert out.device.type == "neuron"
    _close(out, ref)
    for (_name, p), q in zip(cpu.named_parameters(), dev.parameters()):
        _close(q.grad, p.grad, 1e-4)


def _tiny_unet():
    from diffusers import UNet2DConditionModel

    model = UNet2DConditionModel(
        sample_size=8,
        block_out_channels=(16, 32),
        layers_per_block=1,
        down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"),
        up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"),
        cross_attention_dim=16,
        attention_head_dim=8,
        norm_num_groups=8,
        in_channels=4,
        out_channels=4,
    )
    inputs = dict(
        sample=torch.randn(1, 4, 8, 8), timestep=torch.tensor([10]), encoder_hidden_states=torch.randn(1, 5, 16)
    )
    return model, inputs


def _tiny_flux():
    from diffusers import FluxTransformer2DModel

    model = FluxTransformer2DModel(
        patch_size=1,
        in_channels=16,
        num_layers=1,
        num_single_layers=1,
        attention_head_dim=16,
        num_attention_heads=2,
        joint_attention_dim=16,
        pooled_projection_dim=16,
        axes_dims_rope=(4, 4, 8),
    )
    inputs = dict(
        hidden_states=torch.randn(1, 16, 16),
        encoder_hidden_states=torch.randn(1, 5, 16),
        pooled_projections=torch.randn(1, 16),
        timestep=torch.tensor([0.5]),
        img_ids=torch.zeros(16, 3),
        txt_ids=torch.zeros(5, 3),
    )
    return model, inputs


@pytest.mark.slow
@pytest.mark.parametrize("build", [_tiny_unet, _tiny_flux], ids=["unet2d_condition", "flux"])
def test_diffusers_fullgraph_default_backend_matches_cpu(build):
    # What Diffusers' own compile tests do: torch.compile(model, fullgraph=True), no backend=.
    pytest.importorskip("diffusers")
    torch.manual_seed(0)
    model, inputs = build()
    model.eval()
    with torch.no_grad():
        ref = model(**inputs, return_dict=False)[0]
        model.to("neuron")
        out = torch.compile(model, fullgraph=True)(**{k: v.to("neuron") for k, v in inputs.items()}, return_dict=False)[
            0
        ]
    assert out.device.type == "neuron"
    _close(out, ref, 1e-4)
