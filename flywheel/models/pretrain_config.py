"""Settings of the from-scratch pretraining of the zoo models (kept apart so the config tree loads without torch)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class GeneratorPretrainConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    vae_steps: int = Field(800, ge=0, description="VAE reconstruction steps.")
    vae_lr: float = Field(3e-3, gt=0, description="VAE learning rate.")
    vae_batch_size: int = Field(16, ge=1, description="Images per VAE step.")
    vae_foreground_weight: float = Field(4.0, ge=0, description="Extra reconstruction weight on non-background "
                                         "pixels, so colours are learnt early (see pretrain_generator.py).")
    unet_steps: int = Field(1500, ge=0, description="UNet denoising steps.")
    unet_lr: float = Field(1e-3, gt=0, description="UNet peak learning rate (cosine to a tenth).")
    batch_size: int = Field(32, ge=1, description="Examples per step (fresh examples every step).")
    ema_decay: float = Field(0.995, ge=0, lt=1, description="EMA decay of the UNet weights that are saved.")
    prompt_dropout: float = Field(0.1, ge=0, le=1, description="Share of prompts replaced by the zero embedding "
                                  "so classifier-free guidance has an unconditional model.")
    kl_weight: float = Field(1e-6, ge=0, description="KL weight of the VAE loss (tiny: we want reconstructions).")


class PolicyPretrainConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    steps: int = Field(1500, ge=1, description="Optimizer steps (fresh examples every step).")
    batch_size: int = Field(32, ge=1, description="Examples per step.")
    lr: float = Field(5e-4, gt=0, description="Peak learning rate; 2e-3 made the tiny VLM ignore the image.")
    warmup_steps: int = Field(50, ge=0, description="Linear warm-up steps.")
    freeze_vision: bool = Field(False, description="Keep the vision encoder and projector fixed (e.g. after "
                                "their own pretraining, VisionPretrainConfig): measured on the tiny LLaVA whose "
                                "vision was pretrained, caption recall 0.34 when they trained along, 0.75 frozen.")


class VisionPretrainConfig(BaseModel):
    """Dense pretraining of a VLM's vision encoder + projector before its SFT (flywheel/models/pretrain_vision.py)."""

    model_config = ConfigDict(extra="forbid")
    steps: int = Field(2000, ge=0, description="Optimizer steps on fresh images; 0 skips the stage.")
    batch_size: int = Field(64, ge=1, description="Images per step.")
    lr: float = Field(2e-3, gt=0, description="Peak learning rate (linear warm-up, cosine to zero); on the tiny "
                      "LLaVA 2e-3 reached 0.99 of object cells by 2,000 steps, 1e-3 0.70 by 1,000.")
    warmup_steps: int = Field(50, ge=0, description="Linear warm-up steps.")
    eval_images: int = Field(256, ge=1, description="Held-out images the result is measured on.")
