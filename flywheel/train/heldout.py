"""Held-out early stopping and the over-optimisation guard of a policy update: the pure decisions, no models.

A training evaluates the model it is updating on held-out items every few steps (flywheel/train/heldout_probes.py
measures; heldout_hf.py and diffusion_loop.py call them) and hands each evaluation to `HeldoutTracker.observe`:

- the first evaluation (step 0, before any update) is the *starting model*: the guard's baseline and the first
  best state, so an update that never beats the start exports the start;
- `EarlyStopper`: the best state is the one with the highest `target`; after `patience` evaluations in a row
  without a gain above `min_delta`, training stops;
- `Guard`: a guarded measure that falls further below the start than its `max_drop` (or rises further above it
  than its `max_rise`) stops training at once and marks the update refused; the best state is only ever taken
  from evaluations the guard passed, so the kept checkpoint is the one before the collapse.

Training-pair reward accuracy never enters here: it reaches 0.97-0.99 while a run over-optimises
(../shared/notes/cpu-stack.md), which is why the stopping signal is a held-out measure.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

# The decision's reasons, as logged and tagged (a refused update carries `reason` to the gate)
GUARD, PATIENCE, NO_GAIN = "guard", "patience", "no_gain"


def due(step: int, every: int, last: int | None = None) -> bool:
    """Is an evaluation due after `step` optimizer steps? At the start, every `every` steps and at the last."""
    return step == 0 or step % every == 0 or (last is not None and step == last)


def _finite(x: float | None) -> bool:
    return x is not None and not math.isnan(x)


@dataclass
class Verdict:
    """What to do after one evaluation."""

    step: int
    improved: bool  # a new best state: save it
    stop: bool  # stop training now (every worker)
    guard_fired: bool = False
    reason: str | None = None
    violations: list[str] = field(default_factory=list)


class EarlyStopper:
    """Best state by a target measure (mode max: higher is better; min: lower), patience counted in evaluations."""

    def __init__(self, target: str, patience: int, min_delta: float = 0.0, min_steps: int = 0, mode: str = "max"):
        self.target, self.patience, self.min_delta, self.min_steps = target, patience, min_delta, min_steps
        self.sign = 1.0 if mode == "max" else -1.0
        self.best_value: float | None = None
        self.best_step: int | None = None
        self.bad = 0

    def observe(self, step: int, metrics: dict[str, float]) -> tuple[bool, bool]:
        """(improved, patience exhausted). A missing or NaN target never improves; patience is never exhausted
        before `min_steps`."""
        value = metrics.get(self.target)
        if self.best_step is None or (_finite(value) and (
                not _finite(self.best_value) or self.sign * (value - self.best_value) > self.min_delta)):
            self.best_value, self.best_step, self.bad = value, step, 0
            return True, False
        self.bad += 1
        return False, self.bad >= self.patience and step >= self.min_steps


class Guard:
    """Guarded measures against the starting model's values. A measure the start has (finite) that becomes
    NaN - e.g. recall when no caption parses any more - counts as a violation: the measure collapsed."""

    def __init__(self, max_drop: dict[str, float], max_rise: dict[str, float]):
        self.max_drop, self.max_rise = dict(max_drop), dict(max_rise)
        self.baseline: dict[str, float] | None = None

    @property
    def measures(self) -> list[str]:
        return sorted({*self.max_drop, *self.max_rise})

    def set_baseline(self, metrics: dict[str, float]) -> None:
        self.baseline = {m: metrics.get(m, math.nan) for m in self.measures}

    def violations(self, metrics: dict[str, float]) -> list[str]:
        if self.baseline is None:
            raise RuntimeError("Guard.violations before the starting model's baseline was set")
        out = []
        for name, limits in (("drop", self.max_drop), ("rise", self.max_rise)):
            for m, tol in limits.items():
                start, now = self.baseline.get(m, math.nan), metrics.get(m, math.nan)
                if not _finite(start):
                    continue  # nothing to guard against (the start never produced this measure)
                if not _finite(now):
                    out.append(f"{m} undefined (start {start:.4g})")
                    continue
                change = start - now if name == "drop" else now - start
                if change > tol:
                    out.append(f"{m} {start:.4g} -> {now:.4g} ({name} {change:.4g} > tolerated {tol:g})")
        return out


@dataclass
class Evaluation:
    step: int
    metrics: dict[str, float]


class HeldoutTracker:
    """Early stopping plus guard over a run's held-out evaluations; its state survives a checkpoint resume."""

    def __init__(self, target: str, patience: int, min_delta: float, max_drop: dict[str, float],
                 max_rise: dict[str, float], on_guard: str = "refuse", min_steps: int = 0, mode: str = "max"):
        self.stopper = EarlyStopper(target, patience, min_delta, min_steps, mode)
        self.mode = mode
        self.guard = Guard(max_drop, max_rise)
        self.on_guard = on_guard
        self.history: list[Evaluation] = []
        self.stopped_at: int | None = None
        self.guard_fired = False
        self.reason: str | None = None

    @classmethod
    def from_config(cls, h) -> HeldoutTracker:
        """From a HeldoutConfig (flywheel.train.config)."""
        return cls(h.target, h.patience, h.min_delta, h.max_drop, h.max_rise, h.on_guard, h.min_steps,
                   h.target_mode)

    @property
    def target(self) -> str:
        return self.stopper.target

    def check_names(self, metrics: dict[str, float]) -> None:
        """Raise if the target or a guarded measure is not something the evaluation produces (a typo in the
        config would otherwise guard nothing)."""
        unknown = [m for m in [self.target, *self.guard.measures] if m not in metrics]
        if unknown:
            raise ValueError(f"held-out measures {unknown} are not produced by this evaluation; it reports "
                             f"{sorted(metrics)}")

    def observe(self, step: int, metrics: dict[str, float]) -> Verdict:
        metrics = {k: float(v) for k, v in metrics.items()}
        if not self.history:
            self.check_names(metrics)
            self.guard.set_baseline(metrics)
        self.history.append(Evaluation(step, metrics))
        bad = self.guard.violations(metrics)
        if bad:
            self.guard_fired, self.stopped_at = True, step
            self.reason = f"{GUARD}: " + "; ".join(bad)
            return Verdict(step, improved=False, stop=True, guard_fired=True, reason=self.reason, violations=bad)
        improved, exhausted = self.stopper.observe(step, metrics)
        if exhausted:
            self.stopped_at = step
            self.reason = (f"{PATIENCE}: {self.target} did not improve on {self.stopper.best_value:.4g} "
                           f"(step {self.stopper.best_step}) for {self.stopper.patience} evaluations")
            return Verdict(step, improved=False, stop=True, reason=self.reason)
        return Verdict(step, improved=improved, stop=False)

    # ---- the outcome
    @property
    def best_step(self) -> int | None:
        return self.stopper.best_step

    @property
    def refused(self) -> bool:
        """The update must not be promoted: the guard fired (with on_guard=refuse), or nothing beat the start."""
        return (self.guard_fired and self.on_guard == "refuse") or self.best_step in (None, 0)

    def refusal(self) -> str | None:
        if self.guard_fired and self.on_guard == "refuse":
            return self.reason
        if self.best_step in (None, 0):
            return f"{NO_GAIN}: no held-out evaluation beat the starting model on {self.target}"
        return None

    def summary(self, planned_steps: int | None = None) -> dict:
        """The decision, for the final metrics / tags (numbers and short strings only). `stopped_early`: stopped
        before `planned_steps` (when given)."""
        start = self.history[0].metrics if self.history else {}
        best = next((e.metrics for e in self.history if e.step == self.best_step), {})
        out: dict = {"heldout.best_step": self.best_step, "heldout.target": self.target,
                     "heldout.target_mode": self.mode,
                     "heldout.best_value": self.stopper.best_value, "heldout.start_value": start.get(self.target),
                     "heldout.stopped_early": self.stopped_at is not None and (planned_steps is None
                                                                    or self.stopped_at < planned_steps),
               "heldout.stopped_at": self.stopped_at,
                     "heldout.guard_fired": self.guard_fired, "heldout.refused": self.refused,
                     "heldout.reason": self.refusal() or self.reason, "heldout.evaluations": len(self.history)}
        out |= {f"heldout.start.{k}": v for k, v in start.items()}
        out |= {f"heldout.best.{k}": v for k, v in best.items()}
        return out

    def curves(self) -> list[dict]:
        return [{"step": e.step, **e.metrics} for e in self.history]

    # ---- resume
    def state_dict(self) -> dict:
        return {"history": [asdict(e) for e in self.history], "best_value": self.stopper.best_value,
                "best_step": self.stopper.best_step, "bad": self.stopper.bad, "baseline": self.guard.baseline,
                "stopped_at": self.stopped_at, "guard_fired": self.guard_fired, "reason": self.reason}

    def load_state_dict(self, state: dict) -> None:
        self.history = [Evaluation(**e) for e in state["history"]]
        self.stopper.best_value, self.stopper.best_step = state["best_value"], state["best_step"]
        self.stopper.bad = state["bad"]
        self.guard.baseline = state["baseline"]
        self.stopped_at, self.guard_fired, self.reason = state["stopped_at"], state["guard_fired"], state["reason"]
