"""The Ray Train worker of the SDXL preference update: the hand-written loop around diffusion_dpo.py's loss.

- Methods (`settings.method`): `dpo` (Diffusion-DPO, Wallace et al.) or `bon_sft` (best-of-N SFT: the plain
  denoising loss on the preferred images only, the same noise and timesteps the DPO loss would draw).
- `scale_lr`: the learning rate times the effective batch (batch x accumulation x workers), as the paper's
  launchers (`--learning_rate 1e-8 --scale_lr`).
- Resume is exact: data order is a seeded permutation per epoch, the noise/timesteps of every micro-batch come
  from a generator seeded by its global index, and a checkpoint stores weights, optimizer, scheduler, the step
  log and the held-out state - so a resumed run consumes exactly the batches an uninterrupted one would.
- Held-out evaluation (`settings.heldout`, flywheel/train/heldout_run.py): at step 0, every `every_steps` and the
  last step the live pipeline draws held-out prompts, scored by the oracle at the sampling guidance and at a
  normal guidance (generic quality); the best state is exported, patience and the guard stop the loop.
  A share of the pairs (`heldout.pairs_fraction`, split by prompt) is never trained on: each evaluation also
  reports the implicit reward accuracy and margin on it (flywheel/train/heldout_pairs.py), as a curve only.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import shutil
from pathlib import Path

import torch

from flywheel.train.diffusion_dpo import (PairOrder, PromptCache, SDXLParts, autocast, dpo_step, encode_pairs,
                                          export, load_parts, noised, pair_batch, per_sample_mse, total_steps)
from flywheel.train.guards import check_step
from flywheel.train.heldout_pairs import HeldoutPairs, split_pairs, with_pairs

log = logging.getLogger(__name__)


def _trainable(unet) -> dict[str, torch.Tensor]:
    return {n: p.detach().contiguous().cpu() for n, p in unet.named_parameters() if p.requires_grad}


def _save(directory: str, unet, optimizer, scheduler, step: int) -> None:
    from safetensors.torch import save_file

    save_file(_trainable(unet), os.path.join(directory, "trainable.safetensors"))
    torch.save({"optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict()},
               os.path.join(directory, "optimizer.pt"))  # training state only; never registered
    Path(directory, "state.json").write_text(json.dumps({"step": step}))


def _load(directory: str, unet, optimizer, scheduler) -> int:
    from safetensors.torch import load_file

    weights = load_file(os.path.join(directory, "trainable.safetensors"))
    params = dict(unet.named_parameters())
    with torch.no_grad():
        for n, t in weights.items():
            params[n].copy_(t)
    state = torch.load(os.path.join(directory, "optimizer.pt"), weights_only=False)
    optimizer.load_state_dict(state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    return json.loads(Path(directory, "state.json").read_text())["step"]


def sft_step(parts: SDXLParts, unet: torch.nn.Module, batch: dict, prompts: PromptCache, generator: torch.Generator,
             timestep_max: int | None = None) -> tuple[torch.Tensor, dict]:
    """Best-of-N SFT: the denoising loss of the preferred images alone."""
    latents = encode_pairs(parts, batch["pixels"], generator)
    chosen = latents[: latents.shape[0] // 2]
    with autocast(parts):
        noisy, timesteps, cond, target = noised(parts, chosen, batch, prompts, generator, timestep_max, copies=1)
        mse = per_sample_mse(unet(noisy, timesteps, **cond).sample, target)
    return mse.mean(), {"mse/model_chosen": mse.detach().mean()}


def effective_lr(settings, world: int) -> float:
    if not settings.scale_lr:
        return settings.lr
    return settings.lr * settings.batch_size * settings.grad_accum_steps * world


def worker(ctx) -> None:
    import ray.train
    import ray.train.torch
    from transformers import get_scheduler

    from flywheel.train.data import read_training_data
    from flywheel.train.hf import heldout_run

    s = ctx.settings
    method = s.method or "dpo"
    data = read_training_data(ctx.job.data, "image_pref")
    h = s.heldout
    rows, held = split_pairs(data.rows, h.pairs_fraction if h else 0.0, h.pairs_max if h else None)
    base = ctx.base_path()
    device = ray.train.torch.get_device() if torch.cuda.is_available() else torch.device("cpu")
    parts = load_parts(base, s, ctx.cfg.models.generator.dtype, device)
    unet = parts.unet
    # move_to_device=device: with logical GPUs (no CUDA) Ray Train's own choice would be cuda:<i>
    model = ray.train.torch.prepare_model(unet, move_to_device=device) if ctx.world > 1 else unet
    params = [p for p in unet.parameters() if p.requires_grad]
    lr = effective_lr(s, ctx.world)
    optimizer = torch.optim.AdamW(params, lr=lr, weight_decay=s.weight_decay)
    order = PairOrder(len(rows), s.batch_size, ctx.rank, ctx.world, ctx.seed)
    steps = total_steps(s, order)
    scheduler = get_scheduler(s.lr_scheduler, optimizer, num_warmup_steps=math.ceil(s.warmup_ratio * steps),
                              num_training_steps=steps)
    prompts = PromptCache(parts.pipe)
    heldout = heldout_run(ctx)
    if heldout is not None:
        heldout.model = unet
        if held and ctx.is_main:  # rank 0 evaluates (the weights are the same on every worker)
            heldout.probe = with_pairs(heldout.probe, HeldoutPairs(
                parts, held, prompts, s.beta, h.pairs_noise_draws, ctx.seed, s.timestep_max, s.batch_size))
    log.info("diffusion_dpo: method %s, %d pairs (%d more held out), %d steps, lr %.3g%s", method, len(rows),
             len(held), steps, lr, " (scaled by the effective batch)" if s.scale_lr else "")
    ctx.metrics.log({"data/train_pairs": len(rows), "data/heldout_pairs": len(held)}, 0)
    start = 0
    restore = ctx.restore_dir()
    if restore is not None:
        start = _load(restore, unet, optimizer, scheduler)
        ctx.steps.load(restore, upto=start)
        ctx.resumed_from = start
        if heldout is not None:
            heldout.load_from(restore)
    elif heldout is not None:
        heldout.evaluate(0, parts.pipe)  # the starting model: the guard's baseline
    unet.train()
    last = {}
    since_log: list[float] = []
    done = start
    for step in range(start, steps):
        stats_sum: dict[str, float] = {}
        loss_sum = 0.0
        for a in range(s.grad_accum_steps):
            b = step * s.grad_accum_steps + a
            batch = pair_batch([rows[i] for i in order.indices(b)], parts.resolution)
            ctx.steps.record(step + 1, batch["ids"])
            sync = a == s.grad_accum_steps - 1 or ctx.world == 1
            ctxm = model.no_sync() if not sync and hasattr(model, "no_sync") else contextlib.nullcontext()
            with ctxm:
                if method == "bon_sft":
                    loss, stats = sft_step(parts, model, batch, prompts, order.generator(b), s.timestep_max)
                else:
                    loss, stats = dpo_step(parts, model, batch, prompts, s.beta, order.generator(b),
                                           s.timestep_max)
                (loss / s.grad_accum_steps).backward()
            loss_sum += float(loss.detach()) / s.grad_accum_steps
            for k, v in stats.items():
                stats_sum[k] = stats_sum.get(k, 0.0) + float(v) / s.grad_accum_steps
        check_step(step + 1, loss_sum, params)  # raises NonFiniteLossError on every worker
        grad_norm = torch.nn.utils.clip_grad_norm_(params, s.max_grad_norm)
        current_lr = scheduler.get_last_lr()[0]
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        dt = ctx.timer.tick()
        if dt is not None:
            since_log.append(dt)
        last = {"loss": loss_sum, "learning_rate": current_lr, "grad_norm": float(grad_norm), **stats_sum}
        if "implicit_acc" in last:
            last["rewards/accuracies"], last["rewards/margins"] = last.pop("implicit_acc"), last.pop("margin")
        done = step + 1
        if done % s.logging_steps == 0 or done == steps:
            if since_log:
                last["step_time_s"] = sum(since_log) / len(since_log)
                since_log = []
            ctx.metrics.log(last, done)
        stop = heldout is not None and heldout.maybe_evaluate(done, steps, parts.pipe)
        if done % s.save_steps == 0 and done < steps and not stop:
            d = os.path.join(ctx.local_dir, f"ckpt-{done}")
            os.makedirs(d)
            if ctx.is_main:
                _save(d, unet, optimizer, scheduler, done)
            if heldout is not None:
                heldout.save_into(d)
            ctx.report_checkpoint(d, done, last)
            shutil.rmtree(d, ignore_errors=True)
        if stop:
            break
    if heldout is not None:
        last |= heldout.finish(done, parts.pipe, planned=steps)  # the best state is back in the UNet
    export_dir = None
    if ctx.is_main:
        export_dir = os.path.join(ctx.local_dir, "export-build")
        fmt = export(parts, base, export_dir, ctx.cfg.train.registry.save_merged)
        meta = {**ctx.job.lineage, "adapter_base": ctx.job.base, "format": fmt, "training": ctx.job.training,
                "final_step": done, "settings": s.model_dump(mode="json"), "resolution": parts.resolution,
                "method": method, "heldout_pair_ids": [r["image_pref_id"] for r in held]}
        Path(export_dir, "flywheel.json").write_text(json.dumps(meta, indent=1, default=str))
    ctx.report_final(export_dir, last, done)
