"""Settings of the shapes world's base policies (light: no torch, so the config tree loads fast)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, field_validator

from flywheel.models.pretrain_config import GeneratorPretrainConfig, PolicyPretrainConfig


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


class JudgeBaseConfig(BaseModel):
    """The judge's starting point: the zoo Qwen2-VL taught to *see* this world (captions and VQA, no judging), as a
    real flywheel starts from a pretrained VLM. Judging is left to the flywheel, which teaches it from the teacher.

    What it sees (measured 2026-11-23; how, in issue 7's notes): colours and counts, not
    shapes. A lone object's shape word in its captions is right 0.22 of the time (chance 0.33); "What colour is the
    <shape>?" 0.64, against 0.57 for naming any colour in the scene. A linear probe finds shape in its patch
    embeddings (0.70) but not in what its merger hands the language model (0.49). Shape-question SFT from the zoo
    judge stayed at chance for 1,000 steps with 14-px patches, 7-px patches merged 4x4, 10x the vision tower's
    learning rate, or a colour-x-shape tagging warm-up of the tower; yet a classification head on the tower alone
    learns a lone object's shape (0.81 after 400 steps). The tower can learn shape; the language model's loss
    did not teach it within those steps."""

    model_config = ConfigDict(extra="forbid")
    pretrain: PolicyPretrainConfig = Field(
        default_factory=lambda: PolicyPretrainConfig(steps=3000),
        description="SFT on fault-free captions and questions. The notes' judge began to see shapes after "
        "~2,000 steps of 32; 1,500 steps helped IU and NLG ranking but not generated images.")
    shape_warmup_steps: int = Field(
        0, ge=0, description="SFT steps (of `pretrain.batch_size`, at `pretrain.lr`) on 'What shape is the <colour> "
        "object?' alone, before the perception SFT. Measured from the zoo judge, shape questions alone: at chance "
        "(loss 0.122-0.126) for ~1,500 steps, then learnt; after 3,000 steps 0.54 right (a lone object 0.74).")
    shape_question_share: float = Field(
        0.0, ge=0, le=1, description="Share of the perception SFT's examples that are shape questions (clean "
        "images), so what the warm-up taught is kept. Measured with 3,000 warm-up steps and 0.2 (the base builds "
        "~13 min longer): shape questions 0.35 -> 0.87, a lone object's shape in captions 0.22 -> 0.89, caption "
        "recall 0.35 -> 0.84, but existence questions 0.78 -> 0.54; in the loop, iteration 0's judge ranked "
        "id-test gold pairs 0.589 (0.619 without). Later iterations not yet measured, so both stay off.")
    degraded_share: float = Field(
        0.5, ge=0, le=1, description="Share of images degraded the way a small generator draws (lower resolution, "
        "blur), so the judge can read generated images too; colours and shapes are untouched.")
    low_res: tuple[int, int] = Field((20, 36), description="Degraded images are drawn at a side in this range "
                                     "(px), then scaled back up.")
    max_blur: float = Field(1.5, ge=0, description="Largest Gaussian blur radius (px) of a degraded image.")

    @field_validator("low_res")
    @classmethod
    def _ordered_sides(cls, v: tuple[int, int]) -> tuple[int, int]:
        if not 1 <= v[0] <= v[1]:
            raise ValueError(f"low_res must be (smallest, largest) side in px with 1 <= smallest <= largest, got {v}")
        return v


class BasePoliciesConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    faults: PolicyFaults = Field(default_factory=PolicyFaults, description="Faults taught to the base LLaVA.")
    policy: PolicyPretrainConfig = Field(default_factory=PolicyPretrainConfig, description="LLaVA SFT settings.")
    generator: GeneratorPretrainConfig = Field(default_factory=GeneratorPretrainConfig,
                                               description="SDXL VAE + UNet pretraining settings.")
    judge: JudgeBaseConfig = Field(default_factory=JudgeBaseConfig, description="The perceiving judge base "
                                   "(`world:judge`).")
    eval_items: int = Field(200, ge=10, description="Held-out questions on which the judge base's perception is "
                            "measured when it is built.")
