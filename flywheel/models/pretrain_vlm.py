"""Pretrain a zoo VLM (the tiny LLaVA policy, or the Qwen2-VL judge) from scratch by SFT (TRL's SFTTrainer) on a
world's examples.

Why: the flywheel needs a base policy that perceives its world but has faults preference optimisation is known
to fix. The examples decide the faults (e.g. captions that add an object that is not there, a yes-bias on
existence questions; see flywheel/worlds/). Rows are TRL's conversational prompt-completion format with images,
so the loss covers the answer only. Settings measured on this CPU: ../shared/notes/cpu-stack.md (lr 5e-4,
batch 32, a few minutes).
"""

from __future__ import annotations

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
                    seed: int = 0) -> dict:
    """SFT the random VLM at `base` on `steps * batch_size` fresh examples; save a standard checkpoint."""
    from datasets import Dataset
    from transformers import AutoModelForImageTextToText, AutoProcessor
    from trl import SFTConfig, SFTTrainer

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
    with tempfile.TemporaryDirectory() as tmp:
        args = SFTConfig(
            output_dir=tmp, max_steps=cfg.steps, per_device_train_batch_size=cfg.batch_size,
            learning_rate=cfg.lr, lr_scheduler_type="cosine", warmup_steps=cfg.warmup_steps,
            bf16=False, use_cpu=True, max_length=None, activation_checkpointing=False, report_to=[],
            logging_steps=max(cfg.steps // 10, 1), save_strategy="no", seed=seed, dataloader_num_workers=0,
        )
        trainer = SFTTrainer(model=model, args=args, train_dataset=data, processing_class=processor)
        result = trainer.train()
    model.save_pretrained(str(out))
    processor.save_pretrained(str(out))
    return {"sft_loss": float(result.training_loss), "examples_seconds": make_s,
            "train_seconds": time.perf_counter() - t0 - make_s}
