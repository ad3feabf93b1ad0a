"""Held-out evaluation inside a training: the schedule, the best state on disk, MLflow curves, every worker
stopping together, and the state carried through checkpoints. The decisions are HeldoutTracker's
(flywheel/train/heldout.py); the measures are the probes' (heldout_probes.py).

Rank 0 evaluates (the weights are the same on every DDP worker) and broadcasts its stop decision with one
all-reduce (guards.any_rank); whether an evaluation is due depends only on the step, so every worker takes
part in the same collectives. `HeldoutCallback` wires this into a TRL trainer; the Diffusion-DPO loop calls
`HeldoutRun` itself.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
from pathlib import Path

import torch
from transformers import TrainerCallback

from flywheel.train.guards import any_rank
from flywheel.train.heldout import HeldoutTracker, due

log = logging.getLogger(__name__)
STATE_DIR = "heldout"  # inside a checkpoint
BEST_FILE, STATE_FILE = "best.safetensors", "state.json"


def trainable_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The weights an update changes (LoRA adapters, or every weight of a full fine-tune)."""
    return {n: p.detach().contiguous().cpu() for n, p in model.named_parameters() if p.requires_grad}


class HeldoutRun:
    """One training's held-out evaluations. `probe(*args)` measures the live model; `model` is the module whose
    trainable weights are the state kept (the best is written to local disk, never held twice in memory)."""

    def __init__(self, ctx, probe, model: torch.nn.Module):
        self.ctx, self.probe, self.model = ctx, probe, model
        self.h = ctx.settings.heldout
        self.tracker = HeldoutTracker.from_config(self.h)
        self.dir = Path(ctx.local_dir, STATE_DIR)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.last_evaluated: int | None = None
        self.stopped = False

    # ---- evaluation
    def evaluate(self, step: int, *probe_args) -> bool:
        """Evaluate now (every worker calls this at the same step); True when training must stop."""
        stop = False
        if self.ctx.is_main:
            t0 = time.perf_counter()
            metrics = self.probe(*probe_args)
            verdict = self.tracker.observe(step, metrics)
            seconds = time.perf_counter() - t0
            self.ctx.metrics.log({f"heldout.{k}": v for k, v in metrics.items()} | {"heldout.seconds": seconds},
                                 step)
            if verdict.improved:
                self._save_best()
            shown = ", ".join(f"{k} {metrics[k]:.3f}" for k in [self.h.target, *self.tracker.guard.measures,
                                                                  "pairs/implicit_acc"] if k in metrics)
            log.info("held-out @ step %d (%.1f s): %s%s%s", step, seconds, shown,
                     " [best]" if verdict.improved else "", f" -> stop ({verdict.reason})" if verdict.stop else "")
            stop = verdict.stop
        self.last_evaluated = step
        self.stopped = any_rank(stop)
        if self.ctx.timer is not None:
            self.ctx.timer.restart()  # the evaluation's time is not a training step's
        return self.stopped

    def maybe_evaluate(self, step: int, last: int | None, *probe_args) -> bool:
        if not due(step, self.h.every_steps, last) or self.last_evaluated == step:
            return False
        return self.evaluate(step, *probe_args)

    def finish(self, step: int, *probe_args, planned: int | None = None) -> dict:
        """After training: evaluate the last step if it was not, put the best state back into the model (what
        gets exported), and return the decision for the final metrics (rank 0; {} elsewhere)."""
        resumed_at_end = self.ctx.resumed_from is not None and step <= self.ctx.resumed_from
        if self.last_evaluated != step and not self.stopped and not resumed_at_end:
            self.evaluate(step, *probe_args)
        if not self.ctx.is_main:
            return {}
        self._restore_best()
        summary = {**self.tracker.summary(planned), "heldout.curves": self.tracker.curves()}
        log.info("held-out: best step %s (%s %s), stopped early %s, guard fired %s; exporting the best state%s",
                 summary["heldout.best_step"], self.h.target, summary["heldout.best_value"],
                 summary["heldout.stopped_early"], summary["heldout.guard_fired"],
                 f"; update refused: {summary['heldout.reason']}" if summary["heldout.refused"] else "")
        return summary

    def curves(self) -> list[dict]:
        return self.tracker.curves()

    # ---- the best state
    def _save_best(self) -> None:
        from safetensors.torch import save_file

        save_file(trainable_state(self.model), str(self.dir / BEST_FILE))

    def _restore_best(self) -> None:
        from safetensors.torch import load_file

        path = self.dir / BEST_FILE
        if not path.exists():
            return
        params = dict(self.model.named_parameters())
        with torch.no_grad():
            for name, t in load_file(str(path)).items():
                params[name].copy_(t)

    # ---- resume: the tracker and the best weights travel inside each checkpoint
    def save_into(self, checkpoint_dir: str | Path) -> None:
        if not self.ctx.is_main:
            return
        target = Path(checkpoint_dir, STATE_DIR)
        target.mkdir(parents=True, exist_ok=True)
        (target / STATE_FILE).write_text(json.dumps({**self.tracker.state_dict(),
                                                     "last_evaluated": self.last_evaluated}))
        if (self.dir / BEST_FILE).exists():
            shutil.copy2(self.dir / BEST_FILE, target / BEST_FILE)

    def load_from(self, checkpoint_dir: str | Path) -> None:
        source = Path(checkpoint_dir, STATE_DIR)
        if not (source / STATE_FILE).exists():
            return
        state = json.loads((source / STATE_FILE).read_text())
        self.last_evaluated = state.pop("last_evaluated")
        self.tracker.load_state_dict(state)
        if (source / BEST_FILE).exists():
            shutil.copy2(source / BEST_FILE, self.dir / BEST_FILE)


class HeldoutCallback(TrainerCallback):
    """TRL/transformers: evaluate at step 0 and every `every_steps`, stop every worker on the decision, carry
    the state through checkpoints. Must come before the Ray checkpoint callback (which copies the folder)."""

    def __init__(self, run: HeldoutRun, processor):
        self.run, self.processor = run, processor

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        if self.run.ctx.resumed_from is None:  # the starting model: the guard's baseline and first best
            if self.run.evaluate(0, model, self.processor):
                control.should_training_stop = True

    def on_step_end(self, args, state, control, model=None, **kwargs):
        if self.run.maybe_evaluate(state.global_step, state.max_steps, model, self.processor):
            control.should_training_stop = True

    def on_save(self, args, state, control, **kwargs):
        self.run.save_into(os.path.join(args.output_dir, f"checkpoint-{state.global_step}"))
