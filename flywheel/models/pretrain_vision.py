"""Pretrain a zoo VLM's vision side (encoder + projector: the image features its language model reads) by dense
supervision: every image token is classified as what its cell of the image holds, through a linear head that is
thrown away afterwards.

Why: a real VLM starts from a pretrained vision encoder (LLaVA from CLIP, Qwen2-VL from a pretrained ViT); the
zoo's towers start random. Taught through the language model's loss alone, they learnt colours and counts but
not shapes (a lone object's shape named at chance after 3,000 steps of 32), and even a head on the pooled features
(which objects does the scene hold?) left shape at chance after 1,000 steps of 64. A per-token target is local
and clean: measured on the tiny LLaVA, the object cells' colour-and-shape class went 0.70 (1,000 steps, lr 1e-3)
-> 0.99 (2,000 steps, lr 2e-3). The language model then learns to read these features in the VLM SFT.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from flywheel.models.pretrain_config import VisionPretrainConfig
from flywheel.models.vision import image_features, vision_parameters

log = logging.getLogger(__name__)
IGNORE = -100  # cells whose class is not defined (cross_entropy's ignore_index)


@dataclass(frozen=True)
class CellTask:
    """What each image-token cell is to be classified as. `make(rng, n, grid)` gives n images and their labels,
    shape (n, grid * grid), raster order, class indices or IGNORE; `background` is the index of "nothing here"."""

    classes: tuple[str, ...]
    background: int
    make: Callable[[np.random.Generator, int, int], tuple[list, np.ndarray]]


def cell_accuracy(pred: torch.Tensor, labels: torch.Tensor, background: int) -> dict[str, float]:
    """Accuracy on the cells that hold something and on the empty ones (IGNORE cells left out)."""
    things = (labels != IGNORE) & (labels != background)
    empty = labels == background
    return {"object_cells": float((pred == labels)[things].float().mean()) if things.any() else float("nan"),
            "background_cells": float((pred == labels)[empty].float().mean()) if empty.any() else float("nan")}


def pretrain_vision(base: str | Path, out: str | Path, task: CellTask, cfg: VisionPretrainConfig,
                    seed: int = 0) -> dict:
    """Train the vision side of the VLM at `base` on fresh images every step; save the whole VLM to `out`."""
    from flywheel.train.hf import load_vlm

    torch.manual_seed(seed)
    model, processor = load_vlm(str(base))
    model.train()
    grid = int(round(image_features(model, processor, task.make(np.random.default_rng(seed), 1, 1)[0]
                                    ).shape[1] ** 0.5))
    head = torch.nn.Linear(model.config.text_config.hidden_size, len(task.classes))
    params = vision_parameters(model)
    opt = torch.optim.AdamW(params + list(head.parameters()), lr=cfg.lr, weight_decay=0.0)
    warm, total = max(cfg.warmup_steps, 1), max(cfg.steps, 1)
    sched = torch.optim.lr_scheduler.LambdaLR(  # linear warm-up, cosine to zero
        opt, lambda s: min(1.0, (s + 1) / warm) * 0.5 * (1 + np.cos(np.pi * min(s, total) / total)))
    held_images, held_labels = task.make(np.random.default_rng([seed, 1]), cfg.eval_images, grid)
    rng, t0, loss = np.random.default_rng([seed, 0]), time.perf_counter(), torch.tensor(float("nan"))

    for step in range(cfg.steps):
        images, labels = task.make(rng, cfg.batch_size, grid)
        logits = head(image_features(model, processor, images))
        loss = F.cross_entropy(logits.reshape(-1, len(task.classes)), torch.as_tensor(labels).reshape(-1),
                               ignore_index=IGNORE)
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        sched.step()
        if (step + 1) % max(cfg.steps // 10, 1) == 0:
            log.info("pretrain vision: step %d/%d loss %.4f", step + 1, cfg.steps, loss.item())
    model.eval()
    with torch.no_grad():
        pred = head(image_features(model, processor, held_images)).argmax(-1)
    held = cell_accuracy(pred, torch.as_tensor(held_labels), task.background)
    log.info("pretrain vision: held-out object cells %.3f, background cells %.3f", held["object_cells"],
             held["background_cells"])
    model.save_pretrained(str(out))
    processor.save_pretrained(str(out))
    return {"vision_loss": float(loss.item()), "vision_seconds": time.perf_counter() - t0,
            **{f"vision/{k}": v for k, v in held.items()}}
