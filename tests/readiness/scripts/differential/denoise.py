"""A Diffusers denoising loop as its "understanding pipelines" tutorial writes it: a UNet and a
scheduler, `scheduler.set_timesteps`, classifier-free guidance, `scheduler.step` per timestep.
The tiny UNet2DConditionModel is built from a config in the script (no download); the text
embeddings are random stand-ins for a text encoder's.

    python denoise.py [--steps 2]
"""

import argparse

import torch
from diffusers import DDIMScheduler, UNet2DConditionModel

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=2)
args = p.parse_args()

torch.manual_seed(0)
unet = UNet2DConditionModel(
    sample_size=16,
    in_channels=4,
    out_channels=4,
    block_out_channels=(32, 64),
    layers_per_block=1,
    down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
    up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"),
    cross_attention_dim=64,
    attention_head_dim=8,
    norm_num_groups=16,
).to("neuron")
scheduler = DDIMScheduler(num_train_timesteps=1000, beta_schedule="scaled_linear", clip_sample=False)

text = torch.randn(1, 8, 64, device="neuron")
uncond = torch.zeros_like(text)
embeddings = torch.cat([uncond, text])
latents = torch.randn(1, 4, 16, 16, device="neuron") * scheduler.init_noise_sigma
scheduler.set_timesteps(args.steps)
guidance = 7.5
with torch.no_grad():
    for t in scheduler.timesteps:
        model_input = scheduler.scale_model_input(torch.cat([latents] * 2), t)
        noise = unet(model_input, t, encoder_hidden_states=embeddings).sample
        noise_uncond, noise_text = noise.chunk(2)
        noise = noise_uncond + guidance * (noise_text - noise_uncond)
        latents = scheduler.step(noise, t, latents).prev_sample
print("latents", tuple(latents.shape))
