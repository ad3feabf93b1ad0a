"""What a training's held-out probe reads from the user's files, read by the driver (the workers may run on other
nodes, where the paths mean nothing) and checked before any worker starts: the judge's held-out labels
(`heldout.gold_file`) and the policies' held-out prompts (`heldout.prompts_file`), the probes of real data."""

from __future__ import annotations

import hashlib
import json
import logging

import numpy as np

from flywheel import storage
from flywheel.config import Config

log = logging.getLogger(__name__)

TASKS = {"policy_dpo": ("iu", "nlg"), "diffusion_dpo": ("ig",)}  # the prompts each role answers


def heldout_inputs(cfg: Config, training: str, settings, judge: str | None = None) -> dict:
    """TrainJob's held-out fields (`heldout_gold`, `heldout_prompts`); empty when the probe reads no file.
    `judge`: the resolved heldout.judge, without which held-out prompts have nobody to rate their answers."""
    h = settings.heldout
    if h is None:
        return {}
    if h.gold_file:
        return {"heldout_gold": read_heldout_gold(training, h.gold_file)}
    if h.prompts_file:
        if judge is None:
            raise ValueError(f"train.{training}.heldout.prompts_file: its answers are rated by heldout.judge "
                             f"({h.judge!r}), and there is none yet (no champion judge): train a judge first, or "
                             "name a model")
        return {"heldout_prompts": read_heldout_prompts(cfg, training, h.prompts_file, h.items)}
    return {}


def inputs_digest(inputs: dict) -> str | None:
    """What the training's run key keeps of them: a file edited in place trains again."""
    if not inputs:
        return None
    text = inputs.get("heldout_gold") or json.dumps([p["prompt_id"] for p in inputs["heldout_prompts"]])
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def read_heldout_gold(training: str, path: str) -> str:
    """The text of the judge's held-out labeled set (a file with no valid item is refused, by name)."""
    from flywheel.train.heldout_probes import labeled_heldout

    try:
        text = storage.read_bytes(path).decode("utf-8")
    except FileNotFoundError:
        raise FileNotFoundError(f"train.{training}.heldout.gold_file: no file at {path}") from None
    labeled_heldout(text, path)
    return text


def read_heldout_prompts(cfg: Config, training: str, path: str, items: int) -> list[dict]:
    """`items` prompts of the role's tasks from the file (a seeded draw, in file order), none of them in
    preferences.sources: a prompt the update trains on, or the gate then scores, would tell the probe nothing."""
    from flywheel.aspects import AspectTree
    from flywheel.records import with_ids
    from flywheel.sources import read_source

    where = f"train.{training}.heldout.prompts_file"
    if not storage.exists(path):
        raise FileNotFoundError(f"{where}: no file at {path}")
    kind = "parquet" if path.endswith(".parquet") else "jsonl"
    tree = AspectTree.load()
    rows, bad = read_source({"type": kind, "path": path}, tree)
    if bad:
        log.warning("held-out: %d rows of %s quarantined, e.g. %s", len(bad), path, bad[0]["reason"])
    rows = [r for r in with_ids("prompt", rows) if r["task"] in TASKS[training]]
    if not rows:
        raise ValueError(f"{where}: {path} holds no prompt of the tasks {list(TASKS[training])}")
    used = set()
    for spec in cfg.preferences.sources:
        used |= {_content(r) for r in read_source(spec.model_dump(exclude_none=True), tree)[0]}
    if shared := [r["query"] for r in rows if _content(r) in used]:
        raise ValueError(f"{where}: {len(shared)} of its prompts are in preferences.sources (trained on or gated "
                         f"on), e.g. {shared[0]!r}: hold out other prompts")
    take = np.random.default_rng([cfg.run.seed, 7919]).permutation(len(rows))[:items]
    return [rows[i] for i in sorted(take)]


def _content(row: dict) -> str:
    """A prompt's id without its source: the same prompt in two files (whose names the ids carry) is one."""
    from flywheel.records import make_id

    return make_id("prompt", {**row, "source": ""})
