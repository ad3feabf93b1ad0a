"""Build the base policies of the shapes world: a faulty-but-perceptive LLaVA and a recognisable-but-imperfect SDXL.

Both start from the zoo's random checkpoints, are trained on this world's examples (policy_data.py), cached in
the working directory like the zoo (folder name = hash of everything that shapes them), and measured against
the oracle so the flywheel's starting point is a number.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import shutil
from pathlib import Path

import torch
from pydantic import BaseModel

from flywheel.models.pretrain_generator import pretrain_generator
from flywheel.models.pretrain_config import PolicyPretrainConfig, VisionPretrainConfig
from flywheel.models.pretrain_vision import pretrain_vision
from flywheel.models.pretrain_vlm import pretrain_vlm
from flywheel.worlds.shapes.config import ShapesWorldConfig
from flywheel.worlds.shapes.policy_config import BasePoliciesConfig, LookupCurriculumConfig
from flywheel.worlds.shapes.policy_data import (generator_examples, llava_examples, perception_examples,
                                               question_examples, vision_task)

log = logging.getLogger(__name__)
BASE_VERSION = 1  # bump when the recipe changes (the settings themselves are in the hash)
# of the judge base's matching rows (policy_data.reading_example with compare); 3: a colour answer's colour checked
# against the image (assess_text._colour_verdict)
MATCHING_ROWS_VERSION = 3


def _hash(*parts: object) -> str:
    blob = json.dumps([p.model_dump(mode="json") if isinstance(p, BaseModel) else p for p in parts], sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


def _build(out: Path, train, resume: bool = False) -> tuple[Path, dict]:
    """`train(tmp)` builds into `out`.tmp, renamed to `out` when done. With `resume`, the temp folder a killed build
    left is kept for `train` to go on from (see _see_then_talk); otherwise a build starts from nothing."""
    if (out / ".complete").exists():
        metrics = json.loads((out / ".complete").read_text())
        built_with, here = metrics.get("torch_threads"), torch.get_num_threads()
        if built_with is not None and built_with != here:
            # reused all the same: a rebuild costs up to ~25 minutes and differs only in float summation order
            log.warning("base model %s was built with %s torch threads, this build would run %d: reused as is (a "
                        "build here would end elsewhere; delete the folder to rebuild)", out, built_with, here)
        return out, metrics
    tmp = out.with_name(out.name + ".tmp")
    if resume and tmp.is_dir():
        log.info("base model %s: going on from the build a killed run left in %s", out.name, tmp)
    else:
        shutil.rmtree(tmp, ignore_errors=True)
    # The weights of a seeded build depend on the thread count and the CPU kernels' instruction set (AVX512 vs
    # AVX2 sum in other orders): kept beside the metrics so two builds can be compared.
    metrics = train(tmp) | {"torch_threads": torch.get_num_threads(),
                            "torch_cpu_capability": torch.backends.cpu.get_cpu_capability()}
    (tmp / ".complete").write_text(json.dumps(metrics, sort_keys=True))
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return out, metrics


def _step(marker: Path, run) -> dict:
    """One step of a build, skipped when a killed build finished it: `run()` saves its model and returns its
    stats, which `marker` keeps (written last, so a step killed while saving is run again)."""
    if marker.exists():
        log.info("%s: done by an earlier run of this build", marker.parent.name)
        return json.loads(marker.read_text())
    stats = run()
    marker.write_text(json.dumps(stats, sort_keys=True))
    return stats


def _see_then_talk(zoo: Path, out: Path, task, vision: VisionPretrainConfig, examples,
                   sft: PolicyPretrainConfig, seed: int, phases: tuple = ()) -> dict:
    """Vision pretraining (skipped at 0 steps), then SFT phases (name, examples, settings) one after another,
    then the VLM SFT from their result. Resumable (a base takes up to ~2 hours on 2 cores): a step a killed build
    finished is kept, and a step killed midway goes on from its last save."""
    stats, start, done = {}, zoo, []
    if vision.steps:
        start = out / "vision"  # inside the build's temp folder, removed once the build is done
        stats |= _step(start / ".complete", lambda: pretrain_vision(zoo, start, task, vision, seed,
                                                                    state_dir=out / "vision-state"))
        done += [start, out / "vision-state"]
    for name, rows, settings in phases:
        phase = out / f"phase-{name}"
        log.info("%s: SFT phase %s (%d steps)", out.name.removesuffix(".tmp"), name, settings.steps)
        stats |= {f"{name}/{k}": v for k, v in _step(phase / ".complete", lambda: pretrain_vlm(
            start, phase, rows, settings, seed, state_dir=out / f"phase-{name}-state")).items()}
        start = phase
        done += [phase, out / f"phase-{name}-state"]
    stats |= _step(out / ".sft-complete", lambda: pretrain_vlm(start, out, examples, sft, seed,
                                                               state_dir=out / "sft-state"))
    for d in done + [out / "sft-state"]:  # the marker stays: a build killed after this point skips the SFT
        shutil.rmtree(d, ignore_errors=True)
    return stats


def policy_dir(zoo_policy: Path, root: Path, world: ShapesWorldConfig, cfg: BasePoliciesConfig, seed: int) -> Path:
    parts = [world, cfg.faults, cfg.policy_vision, cfg.policy, seed, BASE_VERSION, zoo_policy.name]
    if cfg.policy_lookup.steps:  # left out when off, so that bases built before it existed stay valid
        parts.append(cfg.policy_lookup)
    return root / f"policy-base-{_hash(*parts)}"


def generator_dir(zoo_generator: Path, root: Path, world: ShapesWorldConfig, cfg: BasePoliciesConfig,
                  seed: int) -> Path:
    return root / f"generator-base-{_hash(world, cfg.generator, seed, BASE_VERSION, zoo_generator.name)}"


def judge_dir(zoo_judge: Path, root: Path, world: ShapesWorldConfig, cfg: BasePoliciesConfig, seed: int) -> Path:
    # matching_share 0, look-up steps 0 and see_blur off stay out of the key, so that bases built before they
    # existed stay valid; a set matching_share brings the version of its rows' words (2: the teacher's own,
    # reading_example)
    unset = {k for k, on in (("matching_share", cfg.judge.matching_share), ("lookup", cfg.judge.lookup.steps),
                             ("see_blur", cfg.judge.see_blur)) if not on}
    judge = cfg.judge.model_dump(mode="json", exclude=unset or None)
    if cfg.judge.matching_share:
        judge["matching_rows"] = MATCHING_ROWS_VERSION
    return root / f"judge-base-{_hash(world, judge, seed, BASE_VERSION, zoo_judge.name)}"


def build_base_policy(zoo_policy: Path, root: Path, world: ShapesWorldConfig, cfg: BasePoliciesConfig,
                      seed: int) -> tuple[Path, dict]:
    """The base LLaVA (cached): the random zoo policy's vision pretrained, then SFT on faulty IU examples."""
    out = policy_dir(zoo_policy, root, world, cfg, seed)
    phases = _lookup_phases(world, cfg.policy_lookup, cfg.policy)
    log.info("base policy: LLaVA vision pretraining and SFT → %s", out)
    return _build(out, lambda tmp: _see_then_talk(zoo_policy, tmp, vision_task(world), cfg.policy_vision,
                                                  llava_examples(world, cfg.faults), cfg.policy, seed, phases),
                  resume=True)


def _lookup_phases(world: ShapesWorldConfig, look: LookupCurriculumConfig, sft: PolicyPretrainConfig) -> tuple:
    """One fault-free SFT phase per question sub-task, with the SFT's settings and the phases' own steps."""
    settings = sft.model_copy(update={"steps": look.steps})
    subtasks = look.subtasks if look.steps else ()
    return tuple((subtask, question_examples(world, subtask), settings) for subtask in subtasks)


def build_base_generator(zoo_generator: Path, root: Path, world: ShapesWorldConfig, cfg: BasePoliciesConfig,
                         seed: int) -> tuple[Path, dict]:
    """The base SDXL (cached): VAE then UNet trained on clean renders."""
    out = generator_dir(zoo_generator, root, world, cfg, seed)
    examples = generator_examples(world)
    log.info("base policy: SDXL pretraining → %s", out)
    return _build(out, lambda tmp: _generator_steps(zoo_generator, tmp, examples, cfg.generator, seed), resume=True)


def _generator_steps(zoo: Path, out: Path, examples, cfg, seed: int) -> dict:
    """pretrain_generator, resumable: its states inside the build's temp folder, removed once it is done."""
    metrics = pretrain_generator(zoo, out, examples, cfg, seed, state_dir=out / "state")
    shutil.rmtree(out / "state", ignore_errors=True)
    return metrics


def build_base_judge(zoo_judge: Path, root: Path, world: ShapesWorldConfig, cfg: BasePoliciesConfig,
                     seed: int) -> tuple[Path, dict]:
    """The judge base (cached): the random zoo Qwen2-VL's vision pretrained, then SFT on fault-free captions and
    questions about clean and degraded renders (JudgeBaseConfig), after look-up phases if set. It has never
    judged."""
    out = judge_dir(zoo_judge, root, world, cfg, seed)
    examples = perception_examples(world, cfg.judge)

    def train(tmp: Path) -> dict:
        from flywheel.config import GenerationConfig
        from flywheel.engines.hf import HFTextEngine
        from flywheel.worlds.shapes.policy_eval import evaluate_text_policy

        stats = _see_then_talk(zoo_judge, tmp, vision_task(world, cfg.judge), cfg.judge.vision, examples,
                               cfg.judge.pretrain, seed, _lookup_phases(world, cfg.judge.lookup, cfg.judge.pretrain))
        # How well it sees, on held-out renders (the policies' question types): its starting point as a number.
        engine = HFTextEngine(str(tmp), GenerationConfig(max_new_tokens=64, temperature=0.0, batch_size=16))
        seen = evaluate_text_policy(engine, world, n=cfg.eval_items, seed=seed)
        return stats | {f"perception/{k}": v for k, v in seen.items()  # NaN (no caption parsed) left out
                        if (k.startswith("accuracy") or k == "caption_recall") and not math.isnan(v)}

    log.info("base judge: Qwen2-VL vision pretraining and perception SFT → %s", out)
    return _build(out, train, resume=True)
