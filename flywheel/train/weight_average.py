"""An exponential moving average of a training's trainable weights, exported instead of the last step's
(train.<training>.weight_average). diffusers' EMAModel keeps the average (its decay ramps up as (1+t)/(10+t) to
the configured ceiling); this callback wires it into a transformers Trainer and into its checkpoints, so a
resumed training goes on with the same average.
"""

from __future__ import annotations

import os

import torch
from transformers import TrainerCallback

FILE = "weight_average.safetensors"


class WeightAverageCallback(TrainerCallback):
    """Steps the average after every optimizer step, writes it into each checkpoint folder, and copies it into the
    model when training ends (before the export). `load_from(checkpoint_dir)` restores it on resume."""

    def __init__(self, decay: float):
        self.decay = decay
        self.ema = None
        self._params: list[torch.nn.Parameter] = []
        self._restore: dict | None = None

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        from diffusers.training_utils import EMAModel

        self._params = [p for p in model.parameters() if p.requires_grad]
        self.ema = EMAModel(self._params, decay=self.decay, foreach=True)
        if self._restore is not None:
            self._load(self._restore)

    def on_step_end(self, args, state, control, **kwargs):
        self.ema.step(self._params)

    def on_save(self, args, state, control, **kwargs):
        folder = os.path.join(args.output_dir, f"checkpoint-{state.global_step}")
        if os.path.isdir(folder):  # rank 0 wrote it; every rank holds the same average
            self.save(folder)

    def on_train_end(self, args, state, control, **kwargs):
        self.ema.copy_to(self._params)

    def save(self, folder: str) -> None:
        from safetensors.torch import save_file

        save_file({str(i): t.detach().contiguous() for i, t in enumerate(self.ema.shadow_params)},
                  os.path.join(folder, FILE), metadata={"optimization_step": str(self.ema.optimization_step)})

    def load_from(self, checkpoint_dir: str) -> None:
        """Restore the average a checkpoint holds; a checkpoint written without one is an error, not a fresh
        start (the export would silently average only the resumed steps)."""
        from safetensors import safe_open

        path = os.path.join(checkpoint_dir, FILE)
        if not os.path.exists(path):
            raise FileNotFoundError(f"{checkpoint_dir} has no {FILE}: it was written without weight averaging")
        with safe_open(path, "pt") as f:
            self._restore = {"step": int(f.metadata()["optimization_step"]),
                             "shadow": [f.get_tensor(str(i)) for i in range(len(f.keys()))]}

    def _load(self, saved: dict) -> None:
        if len(saved["shadow"]) != len(self.ema.shadow_params):
            raise ValueError(f"the saved weight average holds {len(saved['shadow'])} tensors, the model "
                             f"{len(self.ema.shadow_params)} trainable ones")
        for dst, src in zip(self.ema.shadow_params, saved["shadow"]):
            dst.copy_(src)
        self.ema.optimization_step = saved["step"]
