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

import json
import logging
import shutil
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
                    seed: int = 0, state_dir: str | Path | None = None) -> dict:
    """Train the vision side of the VLM at `base` on fresh images every step; save the whole VLM to `out`. With
    `state_dir`, the state is saved there ten times a run and a run killed earlier goes on from the last save,
    ending where an uninterrupted run would."""
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
    state = _State(Path(state_dir), model, head, opt, sched, rng) if state_dir else None
    first = state.restore() if state else 0
    every = max(cfg.steps // 10, 1)

    for step in range(first, cfg.steps):
        images, labels = task.make(rng, cfg.batch_size, grid)
        logits = head(image_features(model, processor, images))
        loss = F.cross_entropy(logits.reshape(-1, len(task.classes)), torch.as_tensor(labels).reshape(-1),
                               ignore_index=IGNORE)
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        sched.step()
        if (step + 1) % every == 0:
            log.info("pretrain vision: step %d/%d loss %.4f", step + 1, cfg.steps, loss.item())
            if state and step + 1 < cfg.steps:
                state.save(step + 1)
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


@dataclass
class _State:
    """What a run of pretrain_vision needs to go on exactly: the trained weights (the vision side and the head, as
    safetensors), the optimizer and scheduler (torch.save of their state dicts, read back with weights_only), the
    torch RNG and the image stream's numpy generator. One folder per save, renamed into place when complete."""

    root: Path
    model: torch.nn.Module
    head: torch.nn.Module
    opt: torch.optim.Optimizer
    sched: object
    rng: np.random.Generator

    def _weights(self) -> dict[str, torch.Tensor]:
        trained = {id(p) for g in self.opt.param_groups for p in g["params"]}
        return {f"model.{n}": p for n, p in self.model.named_parameters() if id(p) in trained} | {
            f"head.{n}": p for n, p in self.head.named_parameters()}

    def save(self, step: int) -> None:
        from safetensors.torch import save_file

        tmp, final = self.root / f".step-{step}", self.root / f"step-{step}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        save_file({k: v.detach().contiguous() for k, v in self._weights().items()}, str(tmp / "weights.safetensors"))
        torch.save(_plain({"opt": self.opt.state_dict(), "sched": self.sched.state_dict(),
                           "torch_rng": torch.get_rng_state()}), tmp / "train_state.pt")
        (tmp / "numpy_rng.json").write_text(json.dumps(self.rng.bit_generator.state))
        tmp.rename(final)
        for old in self.root.glob("step-*"):
            if old != final:
                shutil.rmtree(old)

    def restore(self) -> int:
        """The step the last save was made after (0: none), everything put back as it was then."""
        from safetensors.torch import load_file

        saves = sorted(self.root.glob("step-*"), key=lambda d: int(d.name.removeprefix("step-")))
        if not saves:
            return 0
        last = saves[-1]
        weights, loaded = self._weights(), load_file(str(last / "weights.safetensors"))
        if weights.keys() != loaded.keys():
            raise ValueError(f"{last}: saved weights {sorted(loaded)[:3]}... do not match this run's")
        with torch.no_grad():
            for name, p in weights.items():
                p.copy_(loaded[name])
        train_state = torch.load(last / "train_state.pt", weights_only=True)
        self.opt.load_state_dict(train_state["opt"])
        self.sched.load_state_dict(train_state["sched"])
        torch.set_rng_state(train_state["torch_rng"])
        self.rng.bit_generator.state = json.loads((last / "numpy_rng.json").read_text())
        step = int(last.name.removeprefix("step-"))
        log.info("pretrain vision: going on from step %d (%s)", step, last)
        return step


def _plain(x):
    """numpy scalars (the schedule's learning rates) as Python numbers: torch.load(weights_only) refuses them."""
    if isinstance(x, dict):
        return {k: _plain(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return type(x)(_plain(v) for v in x)
    return x.item() if isinstance(x, np.generic) else x
