"""Settings of the shapes world's base policies (light: no torch, so the config tree loads fast)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from flywheel.models.pretrain_config import GeneratorPretrainConfig, PolicyPretrainConfig, VisionPretrainConfig


class PolicyFaults(BaseModel):
    model_config = ConfigDict(extra="forbid")
    caption_hallucination: float = Field(
        0.6, ge=0, le=1, description="Share of training captions that add an object not in the image (60% made "
        "the tiny LLaVA hallucinate in 99.7% of greedy captions while keeping recall 0.97).")
    yes_bias: float = Field(0.5, ge=0, le=1, description="Share of 'No' existence answers flipped to 'Yes'.")
    wrong_answer: float = Field(0.0, ge=0, le=1, description="Share of colour/count answers replaced by a "
                                "random wrong one (plain label noise, on top of the behavioural faults).")
    caption_share: float = Field(0.4, ge=0, le=1, description="Share of examples that are captions; the rest "
                                 "split evenly over colour, count and existence questions.")


class LookupCurriculumConfig(BaseModel):
    """Fault-free SFT phases of one question type each, between the LLaVA's vision pretraining and its faulty SFT.

    The base's mixed SFT left it naming the asked shape's colour at chance (~300 colour steps among captions,
    counts and existence), and 8,000 mixed steps did not change that: mixed with other rows the tiny LM never forms
    the look-up (bench/lookup_probe.py, text alone). Colour questions alone, 3,000 steps from the built base (vision
    frozen), took held-out colour accuracy from 0.68 to 0.98 (400 items; count and existence, untrained, fell).
    In the loop (docs/results.md, runs/t9: colour then existence, 3,000 steps each; a 24-minute build instead of 11)
    the gate's items started at 0.558 instead of 0.450 (colour 1.000). DPO alone then added +6.7 (captions only);
    with an SFT term on the chosen answers (train.policy_dpo methods [dpo_sft], lr 1e-3) +9.2 (runs/t10: counts
    and existence moved too), which is why configs/local.yaml turns both on."""

    model_config = ConfigDict(extra="forbid")
    steps: int = Field(0, ge=0, description="SFT steps per sub-task, with the LLaVA SFT's other settings "
                       "(`policy`: batch 32, lr 5e-4, vision frozen); 0: no look-up phases (the base as built before "
                       "they existed).")
    subtasks: list[Literal["iu_color", "iu_count", "iu_existence"]] = Field(
        ["iu_color", "iu_existence"], min_length=1, description="The question sub-tasks, one phase each, in order.")


class JudgeBaseConfig(BaseModel):
    """The judge's starting point: the zoo Qwen2-VL taught to *see* this world, as a real flywheel starts from a
    pretrained VLM: first its vision encoder and projector (dense cell classification, `vision`), then captions and
    questions with them frozen (`pretrain`), a share of them asking what a quoted answer says (`reading_share`).
    No judging: the flywheel teaches that from the teacher.

    Why two stages (measured 2026-11-23/24, issue 7's notes): taught through the language model alone it saw
    colours and counts but named a lone object's shape at chance (0.22, three shapes) after 3,000 steps; shape
    questions alone stayed at chance for ~1,500 steps. Dense supervision of the image tokens learns shape."""

    model_config = ConfigDict(extra="forbid")
    vision: VisionPretrainConfig = Field(default_factory=VisionPretrainConfig,
                                         description="Dense pretraining of the vision encoder and projector.")
    pretrain: PolicyPretrainConfig = Field(
        default_factory=lambda: PolicyPretrainConfig(steps=3000, freeze_vision=True),
        description="SFT on fault-free captions and questions, the vision side frozen.")
    reading_share: float = Field(
        0.25, ge=0, le=1, description="Share of examples that ask which value a quoted answer gives, right or wrong "
        "(policy_data.reading_example): a pretrained VLM can read, the tiny one must be taught. Measured with 600 "
        "judge-SFT steps on a run's IU rows (bench/judge_learning.py, then bench/judge_reads_answers.py on 104 "
        "wrong policy answers), 0 -> 0.25: the analysis names the wrong answer's own value 0.68 -> 0.93 and calls "
        "it right 0.59 -> 0.40 (without reading rows 2,400 steps gave 0.95 and 0.31); perception 0.505 -> 0.52.")
    matching_share: float = Field(
        0.25, ge=0, le=1, description="Share of examples that say what holds, what a quoted answer says and whether "
        "the two match, in the teacher's own words up to its verdict (policy_data.reading_example with compare), "
        "taken from the captions and questions; reading_share + matching_share <= 1; 0 leaves the base's cache key "
        "as before this field. Measured (bench/judge_learning.py, 1,167 steps on a run's iteration-0 rows, then "
        "bench/judge_reads_answers.py on 360 policy answers), 0 -> 0.25: id/ood ranking 0.634/0.636 -> "
        "0.678/0.705, IU ranking 0.724 -> 0.805, verdicts that follow the judge's own two values: existence 0.57 -> "
        "1.00, count 0.88 -> 0.99, colour 0.65 -> 0.68 (the base itself tells colours apart 0.69 of the time, "
        "counts and yes/no every time).")
    lookup: LookupCurriculumConfig = Field(
        default_factory=LookupCurriculumConfig, description="Look-up phases before the perception SFT, with its "
        "settings (`pretrain`) and their own steps: fault-free questions of one sub-task each, as the LLaVA's "
        "(`policy_lookup`). 0 steps (off) leaves the base's cache key as before. Measured (runs/j1, colour then "
        "existence, 3,000 steps each; a 46-minute build instead of ~25): the base's perception colour 0.58 -> 1.00 "
        "(existence 0.58 -> 0.50), but in the loop the judge did not check captions better (id-test caption "
        "ranking 0.57/0.48/0.48/0.61 against 0.57/0.57/0.57/0.52, iterations 0-3) nor rank better overall "
        "(0.767/0.752/0.757/0.797 against 0.698/0.777/0.748/0.822): so it stays off.")
    degraded_share: float = Field(
        0.5, ge=0, le=1, description="Share of images degraded the way a small generator draws (lower resolution, "
        "blur), so the judge can read generated images too; colours and shapes are untouched.")
    low_res: tuple[int, int] = Field((20, 36), description="Degraded images are drawn at a side in this range "
                                     "(px), then scaled back up.")
    max_blur: float = Field(1.5, ge=0, description="Largest Gaussian blur radius (px) of a degraded image.")
    see_blur: bool = Field(
        False, description="The vision pretraining tells degraded objects apart (their cells get classes of their "
        "own) instead of only reading through the degradation. Measured by bench/judge_vision_probe.py (linear "
        "probes on 1,500 of runs/fr3's generated images): blur from the features 0.663 -> 0.649 balanced accuracy "
        "(the pixels' statistics 0.829), noise 0.812 -> 0.899: the degradation drawn here is not the tiny SDXL's "
        "blur, but judges trained from it on runs/fr3's pooled rows (6,290 steps, bench/judge_learning.py) ranked "
        "id-test gold 0.823 -> 0.853, drawings 0.697 -> 0.803, ood 0.562 -> 0.801; after one iteration's 1,258 "
        "steps 0.766 -> 0.723. In the loop (runs/fb, 8 iterations) ood 0.56 -> 0.80 (McNemar p=5e-7), id-test "
        "0.79 -> 0.80 (p=0.32), iteration 0 worse; seed 1 (3 iterations) agrees: id-test level, ood Pearson "
        "0.78-0.80 vs -0.08-0.28 (docs/tuning.md `judge`). False leaves the base's cache key as before this field.")

    @model_validator(mode="after")
    def _shares_fit(self) -> "JudgeBaseConfig":
        if self.reading_share + self.matching_share > 1:
            raise ValueError(f"reading_share + matching_share = {self.reading_share} + {self.matching_share} "
                             "exceeds 1: they are shares of the same examples")
        return self

    @field_validator("low_res")
    @classmethod
    def _ordered_sides(cls, v: tuple[int, int]) -> tuple[int, int]:
        if not 1 <= v[0] <= v[1]:
            raise ValueError(f"low_res must be (smallest, largest) side in px with 1 <= smallest <= largest, got {v}")
        return v


class BasePoliciesConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    faults: PolicyFaults = Field(default_factory=PolicyFaults, description="Faults taught to the base LLaVA.")
    policy_vision: VisionPretrainConfig = Field(default_factory=VisionPretrainConfig, description="Dense "
                                                "pretraining of the LLaVA's CLIP tower and projector.")
    policy: PolicyPretrainConfig = Field(
        default_factory=lambda: PolicyPretrainConfig(freeze_vision=True),
        description="LLaVA SFT on the faulty examples, the vision side frozen. Without its own vision pretraining "
        "(1,500 or 5,000 steps, measured) the LLaVA named a third of a scene's objects (caption recall 0.32, "
        "0.38), so its errors were perception DPO cannot fix; with it, 0.75.")
    policy_lookup: LookupCurriculumConfig = Field(default_factory=LookupCurriculumConfig, description="Look-up "
                                                  "phases of the LLaVA's SFT, before its faulty examples.")
    generator: GeneratorPretrainConfig = Field(default_factory=GeneratorPretrainConfig,
                                               description="SDXL VAE + UNet pretraining settings.")
    judge: JudgeBaseConfig = Field(default_factory=JudgeBaseConfig, description="The perceiving judge base "
                                   "(`world:judge`).")
    eval_items: int = Field(200, ge=10, description="Held-out questions on which the judge base's perception is "
                            "measured when it is built.")
