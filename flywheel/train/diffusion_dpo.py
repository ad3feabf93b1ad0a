"""SDXL Diffusion-DPO (Wallace et al. 2023, "Diffusion Model Alignment Using Direct Preference Optimization").

Why hand-written: no maintained library has it. TRL removed its diffusion trainers; the reference is the diffusers
*research example* (examples/research_projects/diffusion_dpo/train_diffusion_dpo_sdxl.py), a script, not an API.
This module follows that example's maths and SDXL conditioning, inside the shared Ray Train launcher:

- both images of a pair get the same noise and the same timestep;
- loss = -log sigmoid(-beta/2 * ((mse_w - mse_l) - (ref_mse_w - ref_mse_l))), with mse the per-image denoising
  error of the trained UNet and of the frozen reference (`diffusion_dpo_loss`, a pure function);
- the reference is the base UNet: with LoRA, the same UNet with its adapters disabled; for a full fine-tune,
  a frozen copy;
- SDXL conditioning: both text encoders' penultimate hidden states concatenated and text_encoder_2's pooled
  projection (the pipeline's own `encode_prompt`, so training and sampling condition identically), and the
  micro-conditioning `add_time_ids` = (original size, crop top-left, target size) per image;
- tracked: the loss, implicit reward accuracy (share of pairs where the model's mse_w - mse_l is below the
  reference's) and the implicit reward margin (the mean of the sigmoid's argument), per step; the same on
  held-out pairs at every held-out evaluation (flywheel/train/heldout_pairs.py).

Unlike the example, resume is exact: data order is a seeded permutation per epoch, the noise/timesteps of every
micro-batch are drawn from a generator seeded by its global index, and a checkpoint stores weights, optimizer,
scheduler and the step log - so a resumed run consumes exactly the batches an uninterrupted one would (the
example restarts the interrupted epoch from its first batch). It also drops the example's random flips, which
would make that order depend on Python's global RNG.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

LORA_WEIGHTS = "pytorch_lora_weights.safetensors"
# The training loop, its checkpoints and held-out evaluation: flywheel/train/diffusion_loop.py


# ------------------------------------------------------------------------------------------- the loss (pure)
def diffusion_dpo_loss(model_mse_w: torch.Tensor, model_mse_l: torch.Tensor, ref_mse_w: torch.Tensor,
                       ref_mse_l: torch.Tensor, beta: float) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Diffusion-DPO loss of a batch of pairs from per-pair denoising errors (w = preferred, l = dispreferred).

    Returns (loss, stats): `implicit_acc` is the share of pairs whose implicit reward prefers w (the model's
    mse_w - mse_l below the reference's; ties count half), `margin` the mean implicit reward margin
    r_w - r_l = -beta/2 * ((mse_w - ref_mse_w) - (mse_l - ref_mse_l)).
    """
    model_diff = model_mse_w - model_mse_l
    ref_diff = ref_mse_w - ref_mse_l
    inside = -0.5 * beta * (model_diff - ref_diff)
    loss = -F.logsigmoid(inside).mean()
    acc = (inside > 0).float().mean() + 0.5 * (inside == 0).float().mean()
    return loss, {"implicit_acc": acc.detach(), "margin": inside.detach().mean()}


def per_sample_mse(pred: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return F.mse_loss(pred.float(), target.float(), reduction="none").mean(dim=list(range(1, pred.ndim)))


# ------------------------------------------------------------------------------------------- the model side
@dataclass
class SDXLParts:
    pipe: object
    unet: torch.nn.Module
    vae: torch.nn.Module
    noise_scheduler: object
    lora: bool
    ref_unet: torch.nn.Module | None  # a frozen copy for a full fine-tune; None with LoRA (adapters disabled)
    resolution: int


def load_parts(base: str, settings, dtype: str = "float32", device: str | torch.device = "cpu") -> SDXLParts:
    """The SDXL pipeline with a frozen VAE and text encoders, a trainable UNet (LoRA or full) and a reference."""
    from diffusers import DDPMScheduler, StableDiffusionXLPipeline

    torch_dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[dtype]
    if torch.device(device).type == "cpu":
        torch_dtype = torch.float32
    pipe = StableDiffusionXLPipeline.from_pretrained(base, dtype=torch_dtype).to(device)
    pipe.set_progress_bar_config(disable=True)
    for m in (pipe.vae, pipe.text_encoder, pipe.text_encoder_2, pipe.unet):
        m.requires_grad_(False)
    if pipe.vae.dtype != torch.float32:
        pipe.vae.to(torch.float32)  # as the reference: the VAE in float32 avoids NaNs
    unet = pipe.unet
    ref = None
    if settings.lora.enabled:
        from peft import LoraConfig

        targets = settings.lora.target_modules
        if targets == "all-linear":
            targets = ["to_q", "to_k", "to_v", "to_out.0"]
        unet.add_adapter(LoraConfig(r=settings.lora.r, lora_alpha=settings.lora.alpha,
                                    lora_dropout=settings.lora.dropout, init_lora_weights="gaussian",
                                    target_modules=targets))
        for p in unet.parameters():  # trainable LoRA weights stay float32 under mixed precision
            if p.requires_grad:
                p.data = p.data.float()
    else:
        import copy

        unet.to(torch.float32)  # a full fine-tune keeps float32 weights (no master copy otherwise)
        ref = copy.deepcopy(unet).eval()
        unet.requires_grad_(True)
    noise_scheduler = DDPMScheduler.from_config(pipe.scheduler.config)
    vae_scale = 2 ** (len(pipe.vae.config.block_out_channels) - 1)
    resolution = settings.resolution or unet.config.sample_size * vae_scale
    return SDXLParts(pipe, unet, pipe.vae, noise_scheduler, settings.lora.enabled, ref, resolution)


def preprocess_pair(chosen, rejected, resolution: int) -> tuple[torch.Tensor, tuple, tuple]:
    """(pixels [2,3,R,R] in [-1,1], original size (h, w), crop top-left (y, x)) - the example's preprocessing
    without its random flip: the rejected image is resized to the chosen's size, both are resized so the short
    side is R and centre-cropped."""
    chosen, rejected = chosen.convert("RGB"), rejected.convert("RGB")
    original = (chosen.height, chosen.width)
    rejected = rejected.resize(chosen.size)
    out = []
    for img in (chosen, rejected):
        scale = resolution / min(img.size)
        w, h = max(resolution, round(img.width * scale)), max(resolution, round(img.height * scale))
        img = img.resize((w, h), resample=2)  # bilinear
        top, left = max(0, round((h - resolution) / 2.0)), max(0, round((w - resolution) / 2.0))
        img = img.crop((left, top, left + resolution, top + resolution))
        arr = torch.from_numpy(np.asarray(img, dtype=np.float32) / 255.0).permute(2, 0, 1)
        out.append(arr * 2.0 - 1.0)
    return torch.stack(out), original, (top, left)


def time_ids(original: tuple, crop: tuple, resolution: int) -> torch.Tensor:
    """SDXL micro-conditioning: (original size, crop top-left, target size), as the pipeline builds it."""
    return torch.tensor([*original, *crop, resolution, resolution], dtype=torch.float32)


class PromptCache:
    """Both text encoders' embeddings per prompt, computed once (the encoders are frozen)."""

    def __init__(self, pipe):
        self.pipe, self._cache = pipe, {}

    @torch.no_grad()
    def __call__(self, prompts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        for p in sorted({p for p in prompts if p not in self._cache}):
            # one prompt at a time: its embedding must not depend on which prompts shared a batch (or resume
            # would drift from an uninterrupted run in the last bits)
            embeds, _, pooled, _ = self.pipe.encode_prompt(p, device=self.pipe.unet.device, num_images_per_prompt=1,
                                                           do_classifier_free_guidance=False)
            self._cache[p] = (embeds[0], pooled[0])
        return (torch.stack([self._cache[p][0] for p in prompts]),
                torch.stack([self._cache[p][1] for p in prompts]))


def pair_batch(rows: list[dict], resolution: int) -> dict:
    from flywheel.images import load_image

    pixels, tids = [], []
    for r in rows:
        px, original, crop = preprocess_pair(load_image(r["chosen"][0]), load_image(r["rejected"][0]), resolution)
        pixels.append(px)
        tids.append(time_ids(original, crop, resolution))
    return {"pixels": torch.stack(pixels), "time_ids": torch.stack(tids), "prompts": [r["prompt"] for r in rows],
            "ids": [r["image_pref_id"] for r in rows]}


def encode_pairs(parts: SDXLParts, pixels: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """VAE latents of a batch of pairs [B, 2, 3, R, R] -> [2B, C, h, w], preferred images first."""
    feed = torch.cat([pixels[:, 0], pixels[:, 1]]).to(parts.unet.device, torch.float32)
    with torch.no_grad():
        latents = parts.vae.encode(feed).latent_dist.sample(generator)
    return (latents * parts.vae.config.scaling_factor).to(parts.unet.dtype)


def noised(parts: SDXLParts, latents: torch.Tensor, batch: dict, prompts: PromptCache, generator: torch.Generator,
           timestep_max: int | None = None, copies: int = 2) -> tuple[torch.Tensor, torch.Tensor, dict, torch.Tensor]:
    """(noisy latents, timesteps, UNet conditioning, target) for `copies` images per row of the batch (latents
    [copies*B, ...]: a pair's images first all preferred, then all dispreferred). The noise and timestep are
    drawn once per row and shared by its images."""
    bsz = latents.shape[0] // copies
    device = parts.unet.device
    noise = torch.randn(latents[:bsz].shape, generator=generator).to(latents).repeat(copies, 1, 1, 1)
    t_max = min(timestep_max or parts.noise_scheduler.config.num_train_timesteps,
                parts.noise_scheduler.config.num_train_timesteps)
    timesteps = torch.randint(0, t_max, (bsz,), generator=generator).repeat(copies).to(device)
    noisy = parts.noise_scheduler.add_noise(latents, noise, timesteps)
    embeds, pooled = prompts(batch["prompts"])
    cond = {"encoder_hidden_states": embeds.repeat(copies, 1, 1).to(latents.dtype),
            "added_cond_kwargs": {"text_embeds": pooled.repeat(copies, 1).to(latents.dtype),
                                  "time_ids": batch["time_ids"].repeat(copies, 1).to(device, latents.dtype)}}
    if parts.noise_scheduler.config.prediction_type == "epsilon":
        target = noise
    elif parts.noise_scheduler.config.prediction_type == "v_prediction":
        target = parts.noise_scheduler.get_velocity(latents, noise, timesteps)
    else:
        raise ValueError(f"unsupported prediction type {parts.noise_scheduler.config.prediction_type}")
    return noisy, timesteps, cond, target


def pair_loss(parts: SDXLParts, unet: torch.nn.Module, latents: torch.Tensor, batch: dict, prompts: PromptCache,
              beta: float, generator: torch.Generator, timestep_max: int | None = None) -> tuple[torch.Tensor, dict]:
    """Diffusion-DPO loss of pairs given their latents ([w..., l...]); `unet` may be the DDP-wrapped parts.unet.
    The noise and timestep are drawn once per pair and shared by its two images."""
    noisy, timesteps, cond, target = noised(parts, latents, batch, prompts, generator, timestep_max)
    model_mse = per_sample_mse(unet(noisy, timesteps, **cond).sample, target)
    with torch.no_grad():
        if parts.lora:
            parts.unet.disable_adapters()
            try:
                ref_pred = parts.unet(noisy, timesteps, **cond).sample
            finally:
                parts.unet.enable_adapters()
        else:
            ref_pred = parts.ref_unet(noisy, timesteps, **cond).sample
        ref_mse = per_sample_mse(ref_pred, target)
    mw, ml = model_mse.chunk(2)
    rw, rl = ref_mse.chunk(2)
    loss, stats = diffusion_dpo_loss(mw, ml, rw, rl, beta)
    stats.update({"mse/model_chosen": mw.detach().mean(), "mse/model_rejected": ml.detach().mean(),
                  "mse/ref_chosen": rw.mean(), "mse/ref_rejected": rl.mean()})
    return loss, stats


def dpo_step(parts: SDXLParts, unet: torch.nn.Module, batch: dict, prompts: PromptCache, beta: float,
             generator: torch.Generator, timestep_max: int | None = None) -> tuple[torch.Tensor, dict]:
    """Loss and stats of one batch of pairs: encode both images, then `pair_loss` (under autocast when the
    frozen weights are half precision on a GPU, as the example's mixed precision; the LoRA stays float32)."""
    latents = encode_pairs(parts, batch["pixels"], generator)
    with autocast(parts):
        return pair_loss(parts, unet, latents, batch, prompts, beta, generator, timestep_max)


def autocast(parts: SDXLParts) -> torch.autocast:
    """Mixed precision when the frozen weights are half precision on a GPU (the example's); off otherwise."""
    device = parts.unet.device
    half = device.type == "cuda" and parts.unet.dtype != torch.float32
    return torch.autocast(device_type=device.type, dtype=parts.unet.dtype, enabled=half)


# ------------------------------------------------------------------------------------------- data order
class PairOrder:
    """Deterministic, resumable order: micro-batch b of this rank is a slice of a seeded per-epoch permutation."""

    def __init__(self, n: int, batch_size: int, rank: int, world: int, seed: int):
        self.n, self.bs, self.rank, self.world, self.seed = n, batch_size, rank, world, seed
        self.per_rank = n // world
        self.batches_per_epoch = self.per_rank // batch_size
        if self.batches_per_epoch == 0:
            raise ValueError(f"{n} pairs cannot fill one batch of {batch_size} on each of {world} workers")

    def indices(self, b: int) -> list[int]:
        epoch, k = divmod(b, self.batches_per_epoch)
        perm = np.random.default_rng([self.seed, epoch]).permutation(self.n)
        mine = perm[self.rank::self.world][: self.per_rank]
        return [int(i) for i in mine[k * self.bs:(k + 1) * self.bs]]

    def generator(self, b: int) -> torch.Generator:
        return torch.Generator().manual_seed(
            int(np.random.SeedSequence([self.seed, b, self.rank]).generate_state(1)[0]))


def total_steps(settings, order: PairOrder) -> int:
    if settings.max_steps is not None:
        return settings.max_steps
    return max(1, math.ceil(settings.epochs * order.batches_per_epoch / settings.grad_accum_steps))


# ------------------------------------------------------------------------------------------- export
def lora_state(unet) -> dict:
    from diffusers.utils import convert_state_dict_to_diffusers
    from peft.utils import get_peft_model_state_dict

    return convert_state_dict_to_diffusers(get_peft_model_state_dict(unet))


def merge_lora_into_pipeline(base: str, adapter_dir: str | Path, out: str | Path) -> None:
    """The stock diffusers path: load the pipeline, load and fuse the LoRA, save the fused pipeline."""
    from diffusers import StableDiffusionXLPipeline

    pipe = StableDiffusionXLPipeline.from_pretrained(base)
    pipe.load_lora_weights(str(adapter_dir))
    pipe.fuse_lora()
    pipe.unload_lora_weights()
    pipe.save_pretrained(out)


def export(parts: SDXLParts, base: str, out: str, save_merged: bool) -> str:
    from diffusers import StableDiffusionXLPipeline

    Path(out).mkdir(parents=True, exist_ok=True)
    if parts.lora:
        adapter = os.path.join(out, "adapter")
        StableDiffusionXLPipeline.save_lora_weights(adapter, unet_lora_layers=lora_state(parts.unet))
        if save_merged:
            merge_lora_into_pipeline(base, adapter, os.path.join(out, "model"))
        return "lora"
    parts.pipe.save_pretrained(os.path.join(out, "model"))
    return "full"
