"""Pretrain a zoo VLM (the tiny LLaVA policy, or the Qwen2-VL judge) from scratch by SFT (TRL's SFTTrainer) on a
world's examples.

Why: the flywheel needs a base policy that perceives its world but has faults preference optimisation is known
to fix. The examples decide the faults (e.g. captions that add an object that is not there, a yes-bias on
existence questions; see flywheel/worlds/). Rows are TRL's conversational prompt-completion format with images,
so the loss covers the answer only. Settings measured on this CPU: ../shared/notes/cpu-stack.md (lr 5e-4,
batch 32, a few minutes).
"""

from __future__ import annotations

import contextlib
import logging
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from flywheel.models.pretrain_config import PolicyPretrainConfig

log = logging.getLogger(__name__)

Examples = Callable[[np.random.Generator, int], list[dict]]  # TRL rows: images, prompt, completion


def pretrain_vlm(base: str | Path, out: str | Path, examples: Examples, cfg: PolicyPretrainConfig,
                 seed: int = 0, state_dir: str | Path | None = None) -> dict:
    """SFT the random VLM at `base` on `steps * batch_size` fresh examples; save a standard checkpoint. With
    `state_dir`, the Trainer checkpoints there ten times a run and a run killed earlier goes on from its last
    checkpoint (transformers' own resume: weights, optimizer, scheduler, RNG and the data position)."""
    from datasets import Dataset
    from transformers import AutoModelForImageTextToText, AutoProcessor
    from trl import SFTConfig, SFTTrainer

    import flywheel.models.processors  # noqa: F401  (registers the zoo judge's image-only processor: without it
    # AutoProcessor loads a bare tokenizer and TRL refuses the image rows, unless a caller happened to import it)
    from flywheel.train.hf import FullWeightsResume

    class Trainer(FullWeightsResume, SFTTrainer):
        pass

    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    t0 = time.perf_counter()
    rows = examples(rng, cfg.steps * cfg.batch_size)
    data = Dataset.from_list(rows)
    make_s = time.perf_counter() - t0
    processor = AutoProcessor.from_pretrained(str(base))
    model = AutoModelForImageTextToText.from_pretrained(str(base))
    if cfg.freeze_vision:
        from flywheel.models.vision import freeze_vision

        log.info("pretrain: vision encoder and projector frozen (%d parameters)", freeze_vision(model))
    with contextlib.ExitStack() as stack:
        output_dir = str(state_dir) if state_dir else stack.enter_context(tempfile.TemporaryDirectory())
        every = max(cfg.steps // 10, 1)
        args = SFTConfig(
            output_dir=output_dir, max_steps=cfg.steps, per_device_train_batch_size=cfg.batch_size,
            learning_rate=cfg.lr, lr_scheduler_type="cosine", warmup_steps=cfg.warmup_steps,
            bf16=False, use_cpu=True, max_length=None, activation_checkpointing=False, report_to=[],
            logging_steps=every, save_strategy="steps" if state_dir else "no", save_steps=every,
            save_total_limit=2, seed=seed, dataloader_num_workers=0,
        )
        resume = last_checkpoint(output_dir) if state_dir else None
        if resume:
            log.info("pretrain: going on from %s", resume)
        trainer = Trainer(model=model, args=args, train_dataset=data, processing_class=processor)
        result = trainer.train(resume_from_checkpoint=resume)
    model.save_pretrained(str(out))
    processor.save_pretrained(str(out))
    start = int(Path(resume).name.removeprefix("checkpoint-")) if resume else 0
    return {"sft_loss": run_loss(trainer.state.log_history, result.training_loss, start, result.global_step),
            "examples_seconds": make_s,
            "train_seconds": time.perf_counter() - t0 - make_s}


def pretrain_vlm_in_parts(base: str | Path, work: str | Path, examples: Examples, steps: int, parts: int, *,
                          batch_size: int, lr: float, freeze_vision: bool = True):
    """`pretrain_vlm` in `parts` calls of steps // parts each, yielding (steps so far, checkpoint, stats) after
    each, so a bench can evaluate the checkpoint as it trains. Warm-up only in the first part: the parts continue
    one schedule (each part's cosine restarts)."""
    start, part = Path(base), steps // parts
    for i in range(1, parts + 1):
        out = Path(work) / f"part-{i}"
        cfg = PolicyPretrainConfig(steps=part, batch_size=batch_size, lr=lr, warmup_steps=50 if i == 1 else 0,
                                   freeze_vision=freeze_vision)
        stats = pretrain_vlm(start, out, examples, cfg, seed=i)
        yield i * part, out, stats
        start = out


def run_loss(log_history: list[dict], call_loss: float, start: int, steps: int) -> float:
    """The whole run's mean training loss. transformers averages only the steps trained in this call, so a run that
    went on from step `start` adds the loss windows its checkpoint logged (their grid is the checkpoints')."""
    earlier, last = 0.0, 0
    for entry in log_history:
        if "loss" in entry and entry["step"] <= start:
            earlier, last = earlier + entry["loss"] * (entry["step"] - last), entry["step"]
    if last != start:
        raise ValueError(f"the checkpoint at step {start} logged losses only up to step {last}")
    return (earlier + float(call_loss) * (steps - start)) / max(steps, 1)


def last_checkpoint(output_dir: str | Path) -> str | None:
    """The Trainer's latest complete checkpoint in `output_dir`: trainer_state.json is the last file it writes,
    so a checkpoint killed while saving is passed over (transformers' get_last_checkpoint would take it)."""
    done = [d for d in Path(output_dir).glob("checkpoint-*") if (d / "trainer_state.json").is_file()
            and d.name.removeprefix("checkpoint-").isdigit()]
    return str(max(done, key=lambda d: int(d.name.removeprefix("checkpoint-")))) if done else None
