"""Held-out preference pairs of the SDXL update: a deterministic split of the pairs, and the Diffusion-DPO implicit
reward accuracy and margin on the held-out share (issue 5).

The loop logs `rewards/accuracies` on the pairs it is fitting, which rises while a run over-optimises; the same
measure on pairs it never trains on says whether the preference generalises. It is a curve beside the oracle's
held-out curves (`heldout.pairs/implicit_acc`, `heldout.pairs/margin`, `heldout.pairs/loss`), never a target or
a guarded measure (flywheel.train.config.GeneratorHeldoutConfig refuses it): the stopping signal stays the oracle score.

- `split_pairs`: a pair is held out when its prompt is, and a prompt is held out when a hash of its text falls
  below `pairs_fraction` - so a prompt's pairs all land on one side, every rank and every resume computes the
  same split, and a prompt held out once stays held out in later runs (the hash is not salted by the seed).
- `HeldoutPairs`: `pair_loss` (the training loss, no gradient) of the live UNet against its reference on those
  pairs, `draws` noise/timestep draws per pair from generators seeded identically at every evaluation, so the
  curve moves only with the weights. A model equal to its reference scores margin 0 and accuracy 0.5 (ties
  count half). Rank 0 computes it inside the held-out evaluation; it runs no collective.
"""

from __future__ import annotations

import hashlib
from collections import Counter

import numpy as np
import torch

from flywheel.train.diffusion_dpo import PromptCache, SDXLParts, autocast, encode_pairs, pair_batch, pair_loss

MIN_PAIRS = 10  # fewer pairs than this: nothing is held out (each one is needed for training)
NOISE_STREAM = 7753  # the evaluation's seed stream, apart from the training batches' (PairOrder.generator)


def prompt_share(prompt: str) -> float:
    """A fixed pseudo-random number in [0, 1) per prompt text."""
    return int.from_bytes(hashlib.sha256(prompt.encode()).digest()[:8], "big") / 2 ** 64


def split_pairs(rows: list[dict], fraction: float, max_pairs: int | None = None) -> tuple[list[dict], list[dict]]:
    """(training rows, held-out rows), both in dataset order. Prompts are taken in hash order while their share
    is below `fraction` and the held-out count stays within `max_pairs`; at least one prompt when there are
    `MIN_PAIRS` pairs or more, never every prompt. fraction 0 holds out nothing."""
    counts = Counter(r["prompt"] for r in rows)
    if fraction <= 0 or len(rows) < MIN_PAIRS or len(counts) < 2:
        return list(rows), []
    ranked = sorted(counts, key=lambda p: (prompt_share(p), p))
    held: set[str] = set()
    n = 0
    for p in ranked[:-1]:  # the last prompt always trains
        if prompt_share(p) >= fraction or (max_pairs is not None and n + counts[p] > max_pairs):
            break
        held.add(p)
        n += counts[p]
    held = held or {ranked[0]}
    return [r for r in rows if r["prompt"] not in held], [r for r in rows if r["prompt"] in held]


class HeldoutPairs:
    """Implicit reward accuracy / margin / DPO loss of `parts.unet` vs its reference on held-out pairs. The
    pairs' VAE latents are encoded once (the VAE is frozen), on the CPU, in batches of `batch_size` pairs."""

    def __init__(self, parts: SDXLParts, rows: list[dict], prompts: PromptCache, beta: float, draws: int,
                 seed: int, timestep_max: int | None = None, batch_size: int = 16):
        self.parts, self.prompts, self.beta, self.draws = parts, prompts, beta, draws
        self.seed, self.timestep_max, self.n = seed, timestep_max, len(rows)
        self.ids = [r["image_pref_id"] for r in rows]
        self.batches = []
        for i in range(0, len(rows), batch_size):
            batch = pair_batch(rows[i:i + batch_size], parts.resolution)
            latents = encode_pairs(parts, batch.pop("pixels"), self._generator(-1, i))
            self.batches.append((latents.cpu(), batch))

    def _generator(self, draw: int, batch: int) -> torch.Generator:
        state = np.random.SeedSequence([self.seed, NOISE_STREAM, draw + 1, batch]).generate_state(1)[0]
        return torch.Generator().manual_seed(int(state))

    @torch.no_grad()
    def __call__(self) -> dict[str, float]:
        from flywheel.train.heldout_probes import evaluating

        sums = {"implicit_acc": 0.0, "margin": 0.0, "loss": 0.0}
        device = self.parts.unet.device
        with evaluating(self.parts.unet):
            for d in range(self.draws):
                for b, (latents, batch) in enumerate(self.batches):
                    with autocast(self.parts):
                        loss, stats = pair_loss(self.parts, self.parts.unet, latents.to(device), batch, self.prompts,
                                                self.beta, self._generator(d, b), self.timestep_max)
                    weight = len(batch["prompts"])  # the stats are means over the batch's pairs
                    sums["implicit_acc"] += weight * float(stats["implicit_acc"])
                    sums["margin"] += weight * float(stats["margin"])
                    sums["loss"] += weight * float(loss)
        return {f"pairs/{k}": v / (self.n * self.draws) for k, v in sums.items()}


def with_pairs(probe, pairs: HeldoutPairs):
    """A held-out probe that also reports the held-out pairs' measures."""

    def measure(*args) -> dict[str, float]:
        return probe(*args) | pairs()

    return measure
