"""Knobs of the oracle teacher (mounted as `teacher:`) and of the gold meta-eval sets (mounted as `world.gold`).

Light on purpose (pydantic only): flywheel.config imports it.
"""
from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

ERROR_KINDS: tuple[str, ...] = ("score_jitter", "verdict_flip", "wrong_analysis")
SPLITS: tuple[str, ...] = ("train", "id-test", "ood-test")
PROTOCOL_NAMES: tuple[str, ...] = ("pointwise", "pairwise", "aspects", "rubric", "decomposed", "claims")
TASK_NAMES: tuple[str, ...] = ("nlg", "iu", "ig", "itig")


class TeacherConfig(BaseModel):
    """The oracle world's noisy teacher, an imperfect GPT-4o or human annotator. With error_rate 0 it is the gold.
    These fields, and only these, name its version (flywheel/worlds/shapes/teacher.py); the flywheel's `teacher`
    section (flywheel/config.py) adds the choice of another backend."""

    model_config = ConfigDict(extra="forbid")
    engine: Literal["oracle", "http"] = Field(
        "oracle", description="Backend of the teacher. oracle: answers every judge protocol from the shapes "
        "world's checkers (flywheel/worlds/shapes/teacher.py), with the error fields below; http: a model behind "
        "an OpenAI-compatible endpoint (`teacher.http`: GPT-4o, a vLLM server), whose answers are parsed as the "
        "judge's are (the error fields do not apply).")
    error_rate: float = Field(
        0.1, ge=0.0, le=1.0,
        description="Probability that one answer (one request, one sample k) carries an error, for requests where "
        "a configured error kind applies (rubric drafting and the decomposed extraction / answering steps never "
        "err). Every drawn error changes the answer, so the realised rate equals this one "
        "(bench/teacher_error_rate.py measures it).")
    error_kinds: dict[str, float] = Field(
        {"score_jitter": 1.0, "verdict_flip": 1.0, "wrong_analysis": 1.0},
        description="Relative weights of the error kinds, renormalised over the kinds that apply to a request. "
        "score_jitter: a score moves by 1..max_jitter (pointwise rating, one aspect score, the decomposed overall "
        "score); verdict_flip: a pairwise verdict changes, or one rubric item's grade flips, the analysis kept, or "
        "a claim check's verdict flips between stated and not stated, its analysis with it; "
        "wrong_analysis: a misperception - one statement of the analysis is replaced by its false counterpart "
        "and the decision follows it (rating / aspect / question score shifts, verdict or grade flips).")
    max_jitter: int = Field(1, ge=1, le=4, description="Largest score change of one error on the 1-5 scales "
                            "(twice this on the decomposed protocol's 0-10 scale).")
    seed: int = Field(0, description="Seed of the error draws; each (item, sample k) draws from its own stream.")

    @field_validator("error_kinds")
    @classmethod
    def _kinds(cls, v: dict[str, float]) -> dict[str, float]:
        unknown = set(v) - set(ERROR_KINDS)
        if unknown:
            raise ValueError(f"unknown error kinds {sorted(unknown)}; known: {list(ERROR_KINDS)}")
        if any(w < 0 for w in v.values()):
            raise ValueError("error kind weights must be >= 0")
        return v

    @model_validator(mode="after")
    def _some_kind(self) -> TeacherConfig:
        if self.error_rate > 0 and not any(w > 0 for w in self.error_kinds.values()):
            raise ValueError("error_rate > 0 needs at least one error kind with a positive weight")
        return self


class GoldConfig(BaseModel):
    """Gold meta-eval sets: deliberately varied outputs for the suites' prompts, labelled by the noiseless
    oracle (flywheel/worlds/shapes/gold.py, flywheel/stages/gold.py)."""

    model_config = ConfigDict(extra="forbid")
    splits: list[Literal["train", "id-test", "ood-test"]] = Field(
        list(SPLITS), description="Splits to make a gold set for (one prompts/candidates/judgments triple each).")
    prompts_per_subtask: int = Field(6, ge=1, description="Prompts taken per sub-task and split (fewer when the "
                                     "split has fewer).")
    protocols: dict[str, list[str]] = Field(
        {"nlg": ["pointwise", "pairwise"], "iu": ["pointwise", "pairwise"],
         "ig": ["pointwise", "pairwise", "decomposed"], "itig": ["pointwise", "pairwise", "rubric"]},
        description="Gold judgments made per task category. pointwise: every output with its gold score; "
        "pairwise: pairs of outputs with the gold winner, shown once (AB), ties excluded; the others give the "
        "gold of the judges that use them (decomposed: 0-10 overall score, rubric: fraction met, claims: the "
        "verdict on each claim of a description, scored by meta-eval claim by claim).")
    max_pairs_per_prompt: int = Field(6, ge=1, description="Pairwise gold items kept per prompt (non-tie pairs, "
                                      "chosen by a seeded draw).")
    noise_sigma: float = Field(32.0, gt=0, description="Pixel-noise std (0-255) of the 'noise' render variant.")
    blur_radius: float = Field(1.5, gt=0, description="Gaussian blur radius (px) of the 'blur' render variant.")
    text_variants: list[str] = Field(
        ["correct", "verbose", "near_miss", "wrong", "unreadable", "missing", "wrong_colour", "extra", "swapped",
         "other_scene"],
        description="Text outputs to make, when the sub-task allows them: correct, verbose (right but long), "
        "near_miss (count off by one), wrong, unreadable (answers QA); correct, missing (an object left out), "
        "wrong_colour, extra (a hallucinated object), swapped (two objects' positions), other_scene (describes "
        "another scene) (captions and descriptions).")
    image_variants: list[str] = Field(
        ["correct", "wrong_colour", "wrong_shape", "swapped", "missing", "extra", "noise", "blur", "wrong_text"],
        description="Render outputs to make (IG, ITIG): a correct render; one object with a wrong colour or "
        "shape; the related objects swapped (relation prompts only); an object missing; an extra object; pixel "
        "noise; blur; and for ITIG a correct render with a text that describes another scene (wrong_text).")

    @field_validator("protocols")
    @classmethod
    def _protocols(cls, v: dict[str, list[str]]) -> dict[str, list[str]]:
        return check_protocols(v)


def check_protocols(v: dict[str, list[str]]) -> dict[str, list[str]]:
    """A task -> protocols map: known tasks, known protocols, no repeats."""
    unknown = set(v) - set(TASK_NAMES)
    if unknown:
        raise ValueError(f"unknown tasks {sorted(unknown)}; known: {list(TASK_NAMES)}")
    for task, protos in v.items():
        bad = [p for p in protos if p not in PROTOCOL_NAMES]
        if bad or len(set(protos)) != len(protos):
            raise ValueError(f"{task}: protocols must be distinct values of {list(PROTOCOL_NAMES)}, got {protos}")
    return v
