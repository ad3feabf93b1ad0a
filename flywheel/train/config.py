"""Training knobs (the `train:` section): shared defaults and one section per training (judge SFT, judge DPO,
policy DPO, Diffusion-DPO), each inheriting what it leaves null; `TrainConfig.resolved` gives one training's
effective settings. Light: no torch, so the config tree loads fast."""
from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from flywheel.strict_model import StrictModel


class LoraConfig(StrictModel):
    enabled: bool = Field(True, description="Train LoRA adapters; false fine-tunes all weights.")
    r: int = Field(8, ge=1, description="LoRA rank.")
    alpha: int = Field(16, ge=1, description="LoRA alpha (the update is scaled by alpha / r).")
    dropout: float = Field(0.0, ge=0, lt=1, description="Dropout on the LoRA branch.")
    target_modules: list[str] | str = Field(
        "all-linear", description="Modules that get adapters: a list of module-name suffixes or PEFT's "
        "'all-linear' (every linear layer but the output head). For the SDXL UNet use its attention projections, "
        "e.g. [to_q, to_k, to_v, to_out.0].")


LrScheduler = Literal["constant", "constant_with_warmup", "linear", "cosine"]


class TrainingOverrides(StrictModel):
    """Settings of one training; every null falls back to the same-named field of the `train` section."""

    lr: float | None = Field(None, gt=0, description="Learning rate; null uses train.lr.")
    epochs: float | None = Field(None, gt=0, description="Passes over the data; null uses train.epochs.")
    max_steps: int | None = Field(None, ge=1, description="Optimizer steps (overrides epochs); null uses "
                                  "train.max_steps.")
    batch_size: int | None = Field(None, ge=1, description="Per-worker batch size (pairs for DPO); null uses "
                                   "train.batch_size.")
    grad_accum_steps: int | None = Field(None, ge=1, description="Gradient accumulation; null uses "
                                         "train.grad_accum_steps.")
    micro_batches: int | None = Field(None, ge=1, description="Length-sorted micro-batches per batch; null uses "
                                      "train.micro_batches.")
    lr_scheduler: LrScheduler | None = Field(None, description="Learning-rate schedule; null uses "
                                             "train.lr_scheduler.")
    lora: LoraConfig | None = Field(None, description="LoRA settings; null uses train.lora.")
    warmup_ratio: float | None = Field(None, ge=0, lt=1, description="Warm-up share of the steps; null uses "
                                       "train.warmup_ratio.")
    weight_decay: float | None = Field(None, ge=0, description="AdamW weight decay; null uses train.weight_decay.")


class SFTTrainingConfig(TrainingOverrides):
    completion_only_loss: bool = Field(
        True, description="Loss on the final assistant turn only (the judge's analysis and rating), not on the "
        "prompt; false trains on every token of the conversation.")


# ---- policy updates that cannot silently go wrong (issue 8): held-out evaluation, early stopping, the guard,
# update methods and the reference of each round. Logic: flywheel/train/heldout.py and its callers.
UpdateMethod = Literal["dpo", "dpo_sft", "bon_sft"]


# What a probe on held-out prompts of the user's (heldout.prompts_file) measures besides the judge's `judge/...`
PROMPTS_MEASURES = {"policy_dpo": {"repetition_rate", "mean_words", "items"}, "diffusion_dpo": {"items"}}


class HeldoutConfig(StrictModel):
    """Held-out evaluation during an update: every `every_steps` the model being trained answers `items` seeded
    oracle-world items disjoint from its training prompts (and from the gate's); the best state by `target`
    is kept and exported, training stops after `patience` evaluations without improvement, and the update is
    refused when a guarded measure falls beyond its tolerance against the starting model."""

    every_steps: int = Field(25, ge=1, description="Evaluate every this many optimizer steps (and at step 0 "
                             "and the last step).")
    items: int = Field(48, ge=1, description="Held-out items per evaluation (spread evenly over question types / "
                       "prompt kinds / gold protocols).")
    target: str = Field("accuracy", description="Held-out measure kept best and early-stopped on (see "
                        "target_mode): text policy `accuracy` (or `accuracy/caption`, `caption_recall`, ...), "
                        "generator `score10`, judge `pairwise/accuracy` or `pointwise/accuracy`; with `judge` set, "
                        "`judge/pointwise/score` (the judge's mean rating). Training-pair reward "
                        "accuracy is never a target: it rises while a run over-optimises.")
    target_mode: Literal["max", "min"] = Field("max", description="max: a higher target is better; min: lower "
                                               "(e.g. caption_hallucination_rate).")
    patience: int = Field(3, ge=1, description="Stop after this many evaluations in a row without a target "
                          "improvement above min_delta.")
    min_delta: float = Field(0.0, ge=0, description="Smallest target gain that counts as an improvement.")
    min_steps: int = Field(0, ge=0, description="No patience stop before this many steps (a preference update "
                           "can take a while to move the target; the guard may stop it any time).")
    max_drop: dict[str, float] = Field({}, description="Guarded measures (higher is better) and the largest drop "
                                       "below the starting model's value tolerated, e.g. {caption_recall: 0.05, "
                                       "format_valid: 0.05}; beyond it training stops and the update is refused.")
    max_rise: dict[str, float] = Field({}, description="Guarded measures (lower is better, e.g. repetition_rate, "
                                       "mean_words) and the largest rise above the starting model's value "
                                       "tolerated.")
    on_guard: Literal["refuse", "keep_best"] = Field(
        "refuse", description="When the guard fires: refuse the update (nothing is promoted; the reason is "
        "logged), or keep_best: export and offer the best state seen before the guard fired.")
    judge: str | None = Field(None, description="Also score held-out outputs with a judge (`judge/<protocol>/"
                              "score`, with parse failures counted: a curve, or the target where no oracle says "
                              "what is right, e.g. `target: judge/pointwise/score`): `champion` (the registry's "
                              "champion judge, skipped when there is none), `oracle` (the oracle world's "
                              "teacher), a model reference; null: no judge curve.")
    max_new_tokens: int | None = Field(None, ge=1, description="Text models: longest held-out answer; null uses "
                                       "the role's generation.max_new_tokens.")
    prompts_file: str | None = Field(None, description="Text policy and generator: a JSONL or Parquet prompt file "
                                     "(flywheel/sources.py's formats, by suffix) whose prompts of the role's tasks "
                                     "(`items` of them, a seeded draw) the model answers at each evaluation instead "
                                     "of the oracle world's items, rated by `judge` (required): the probe for real "
                                     "data. Measures: `judge/<protocol>/score` and `/parse_failure_rate`; text also "
                                     "`repetition_rate` and `mean_words`. None of its prompts may be in "
                                     "preferences.sources (the training's and the gate's). Read by the driver.")
    gold_file: str | None = Field(None, description="Judge DPO only: a labeled set in `flywheel eval --data`'s "
                                  "format (human labels, held out from meta_eval.gold_files) the judge rates "
                                  "instead of fresh oracle-world gold: the probe for real data, where the oracle "
                                  "world has none. Each evaluation rates every output of the file (`items` does not "
                                  "apply), and a labelled pair is ordered by its two ratings. Read by the driver, "
                                  "which sends its items to the workers.")


class GeneratorHeldoutConfig(HeldoutConfig):
    """Held-out evaluation of the image generator: the oracle score at the guidance the flywheel samples with,
    and a generic-quality probe (the oracle score at normal guidance) guarded against over-optimisation."""

    target: str = Field("score10", description="Held-out measure kept best (see target_mode): `score10` at the "
                        "sampling guidance, or `probe/score10` at the probe guidance.")
    guidance_scale: float | None = Field(None, ge=0, description="Guidance of the target measure; null uses "
                                         "generator.generation.guidance_scale (the flywheel's sampling).")
    probe_guidance_scale: float | None = Field(4.0, ge=0, description="Guidance of the generic-quality probe "
                                               "(measures prefixed `probe/`); null: no probe.")
    inference_steps: int | None = Field(None, ge=1, description="Denoising steps of held-out samples; null uses "
                                        "generator.generation.num_inference_steps.")
    pairs_fraction: float = Field(0.1, ge=0, lt=1, description="Share of the preference pairs held out of "
                                  "training, chosen by a hash of the prompt (a prompt's pairs stay together; at "
                                  "least one prompt from 10 pairs up); each evaluation reports the implicit "
                                  "reward accuracy and margin on them (`pairs/implicit_acc`, `pairs/margin`, a "
                                  "curve, never the target). 0: no held-out pairs.")
    pairs_max: int = Field(256, ge=1, description="At most this many held-out pairs (whole prompts in hash "
                           "order); the rest of the data trains.")
    pairs_noise_draws: int = Field(4, ge=1, description="Noise/timestep draws per held-out pair (fixed seeds, the "
                                   "same at every evaluation); more draws, less variance.")

    @field_validator("target", "max_drop", "max_rise")
    @classmethod
    def _pairs_never_stop(cls, v):
        names = [v] if isinstance(v, str) else list(v)
        if any(n.startswith("pairs/") for n in names):
            raise ValueError("the held-out pairs' implicit reward is a curve to watch, not a stopping signal "
                             "(it measures the fit to the preferences, not the images): use the oracle measures")
        return v


class DPOTrainingConfig(TrainingOverrides):
    beta: float | None = Field(None, gt=0, description="DPO beta (strength of the KL anchor to the reference); "
                               "null uses train.dpo_beta.")
    loss_type: list[str] = Field(["sigmoid"], min_length=1, description="TRL DPO loss terms, e.g. [sigmoid] or "
                                 "[sigmoid, sft] (RPO-style, with loss_weights).")
    loss_weights: list[float] | None = Field(None, description="Weight of each loss_type term; null weighs all 1.")
    methods: list[UpdateMethod] = Field(["dpo"], min_length=1, description="Update methods trained on the same "
                                        "pairs; with several, the iteration promotes the best by the held-out "
                                        "target. dpo: loss_type as set; dpo_sft: loss_type plus an SFT term on "
                                        "the chosen answer (weight sft_weight); bon_sft: SFT on the chosen "
                                        "answers only (best-of-N / rejection-sampling fine-tuning).")
    sft_weight: float = Field(1.0, gt=0, description="Weight of the SFT term added by method dpo_sft.")
    reference: Literal["previous", "original"] = Field(
        "previous", description="DPO reference: previous = the model the update starts from (the previous "
        "round's policy, reset every round); original = the adapter's base, kept across rounds (a registered "
        "LoRA start only).")
    heldout: HeldoutConfig | None = Field(None, description="Held-out evaluation, early stopping and the guard; "
                                          "null: train blind for the configured steps.")


class DiffusionDPOTrainingConfig(TrainingOverrides):
    beta: float = Field(5000.0, gt=0, description="Diffusion-DPO beta_dpo (Wallace et al. 2023 use 5000 for "
                        "SDXL); larger keeps the model closer to the reference.")
    resolution: int | None = Field(None, ge=8, description="Side of the square training images; null uses the "
                                   "generator's native size (UNet sample size x VAE scale).")
    timestep_max: int | None = Field(None, ge=1, description="Sample training timesteps below this; null uses "
                                     "the scheduler's num_train_timesteps.")
    scale_lr: bool = Field(False, description="Multiply lr by the effective batch (batch_size x grad_accum_steps "
                           "x workers), as Wallace et al.'s launchers (--learning_rate 1e-8 --scale_lr).")
    methods: list[Literal["dpo", "bon_sft"]] = Field(["dpo"], min_length=1, description="Update methods trained "
                                                     "on the same pairs (dpo: Diffusion-DPO; bon_sft: denoising "
                                                     "loss on the chosen images only); with several, the "
                                                     "iteration promotes the best by the held-out target.")
    heldout: GeneratorHeldoutConfig | None = Field(None, description="Held-out evaluation, early stopping and "
                                                   "the guard; null: train blind for the configured steps.")


class TrainRegistryConfig(StrictModel):
    judge: str = Field("judge", description="Registered model name of the trained judge (SFT and DPO versions).")
    policy: str = Field("policy-llava", description="Registered model name of the DPO-trained text policy.")
    generator: str = Field("policy-sdxl", description="Registered model name of the Diffusion-DPO generator.")
    save_merged: bool = Field(
        True, description="Also store LoRA merged into the base weights, so a version loads with plain "
        "from_pretrained (and vLLM) without its base; false stores the adapter alone.")


class TrainConfig(StrictModel):
    """Shared training settings; the four trainings (judge_sft, judge_dpo, policy_dpo, diffusion_dpo) inherit
    every field they leave null. Ray Train workers and their CPUs/GPUs come from resources.train."""

    lr: float = Field(1e-4, gt=0, description="Default learning rate.")
    epochs: float = Field(1.0, gt=0, description="Default passes over the training set.")
    max_steps: int | None = Field(None, ge=1, description="Default optimizer-step budget; overrides epochs "
                                  "when set.")
    batch_size: int = Field(8, ge=1, description="Default per-worker batch size.")
    grad_accum_steps: int = Field(1, ge=1, description="Default gradient-accumulation steps.")
    micro_batches: int = Field(
        1, ge=1, description="Split each randomly drawn batch into this many micro-batches of rows of similar "
        "length (sorted within the batch), whose gradients accumulate into one optimizer step: the step sees the "
        "same rows as one batch would (same loss: completion tokens summed over the whole batch, divided by their "
        "count), with less padding. Unlike group_by_length, batches stay mixed. batch_size must divide by it. "
        "Does not apply to diffusion_dpo.")
    lr_scheduler: LrScheduler = Field("linear", description="Default learning-rate schedule.")
    warmup_ratio: float = Field(0.0, ge=0, lt=1, description="Share of the steps spent warming up the lr.")
    weight_decay: float = Field(0.0, ge=0, description="AdamW weight decay.")
    max_grad_norm: float = Field(1.0, gt=0, description="Gradient clipping norm.")
    dpo_beta: float = Field(0.1, gt=0, description="Default DPO beta of the judge and policy DPO.")
    lora: LoraConfig = Field(LoraConfig(), description="Default parameter-efficient fine-tuning.")
    logging_steps: int = Field(1, ge=1, description="Log losses, lr, reward margins/accuracies and step time "
                               "to MLflow every this many steps.")
    save_steps: int = Field(50, ge=1, description="Checkpoint to storage every this many optimizer steps "
                            "(and at the end); resume continues from the latest.")
    keep_checkpoints: int = Field(2, ge=1, description="Checkpoints kept per run on storage (older ones are "
                                  "deleted).")
    prune_registered: bool = Field(
        True, description="Once a training's model version is registered, delete its run's checkpoints but the "
        "final one: they are kept to resume the run, which a registered training never is (an identical training "
        "reuses the registered version). A recurring flywheel of 7B trainings keeps ~keep_checkpoints full "
        "states (weights and optimizer) less per training. Not for runs named by hand (`--run-name`).")
    max_failures: int = Field(1, ge=-1, description="Ray Train FailureConfig: times a failed worker group is "
                              "restarted from the latest checkpoint (-1: forever).")
    seed: int | None = Field(None, description="Seed of data order, LoRA init and noise; null uses run.seed.")
    group_by_length: bool = Field(
        False, description="Batch rows of similar length (transformers' length grouping, batches shuffled, seeded "
        "per epoch): less padding, but each batch holds one kind of row. Measured on the local judge SFT (8,324 "
        "rows, batch 16): token utilisation 0.61 -> 0.91, step 0.29 -> 0.18 s, iteration 0 664 -> 570 s; but "
        "the judge of iteration 1 ordered id-test gold pairs 0.599 instead of 0.738 (iteration 0: 0.614 vs "
        "0.619), and unshuffled (transformers' order) 0.455. Off until a grouping keeps batches mixed. Does not "
        "apply to diffusion_dpo.")
    freeze_vision: bool = Field(
        True, description="VLM trainings keep the vision encoder and projector fixed (a full fine-tune freezes them; "
        "LoRA puts no adapter there), as LLaVA's instruction tuning and LLaMA-Factory's defaults do: the judge and "
        "policy learn to judge and answer from features that already see. Measured on the tiny LLaVA whose vision "
        "was pretrained: an SFT that trained them along lost what they saw (caption recall 0.75 frozen, 0.34 not). "
        "Does not apply to diffusion_dpo.")
    image_feature_cache_mb: int = Field(
        1024, ge=0, description="With freeze_vision, each image's vision features are computed once per training "
        "and kept (least recently used dropped beyond this size, on the model's device); 0 turns it off. Measured "
        "by bench/train_settings.py (cache off vs on, one run, per-step losses bit-identical): local judge SFT "
        "0.227 -> 0.219 s per step (62% hits over 300 steps), policy DPO 0.137 -> 0.117 s (98%). A 7B VLM's "
        "image is ~1-2 MB of features: size it to the accelerator's spare memory.")
    dataloader_workers: int = Field(
        0, ge=0, description="Processes per training worker that collate its batches (the processor resizing and "
        "normalising images, tokenising) while it trains; 0 collates in the training loop. The batches, and so "
        "the training, are the same either way (not part of a training's identity). On 2 cores a process for it "
        "gains nothing (both are busy: docs/results.md); on a GPU node with spare cores it keeps the GPU from "
        "waiting. Does not apply to diffusion_dpo.")
    judge_sft: SFTTrainingConfig = Field(SFTTrainingConfig(), description="Judge SFT (TRL SFTTrainer).")
    judge_dpo: DPOTrainingConfig = Field(DPOTrainingConfig(), description="Judge DPO from the SFT result "
                                         "(TRL DPOTrainer).")
    policy_dpo: DPOTrainingConfig = Field(DPOTrainingConfig(), description="LLaVA policy DPO (TRL DPOTrainer).")
    diffusion_dpo: DiffusionDPOTrainingConfig = Field(DiffusionDPOTrainingConfig(), description="SDXL "
                                                      "Diffusion-DPO (hand-written loop).")
    registry: TrainRegistryConfig = Field(TrainRegistryConfig(), description="Where trained models are "
                                          "registered (MLflow model registry).")

    @model_validator(mode="after")
    def _every_training_resolves(self) -> TrainConfig:
        for training in TRAININGS:  # a setting that cannot work fails at load, not minutes into a run
            self.resolved(training)
            heldout = getattr(getattr(self, training), "heldout", None)
            if heldout is None:
                continue
            if training != "judge_dpo" and heldout.gold_file:
                raise ValueError(f"train.{training}.heldout.gold_file: labeled sets are the judge's held-out "
                                 "probe (train.judge_dpo.heldout); a policy's takes heldout.prompts_file, rated "
                                 "by heldout.judge")
            if heldout.prompts_file and (training == "judge_dpo" or heldout.judge in (None, "oracle")):
                raise ValueError(f"train.{training}.heldout.prompts_file: " + (
                    "the judge's probe takes labels (heldout.gold_file)" if training == "judge_dpo" else
                    f"its prompts have no ground truth, so heldout.judge must name a judge (it is "
                    f"{heldout.judge!r}): champion, or a model reference"))
            named = [heldout.target, *heldout.max_drop, *heldout.max_rise]
            if heldout.prompts_file and (oracle := [m for m in named if not m.startswith("judge/")
                                                    and m not in PROMPTS_MEASURES[training]]):
                raise ValueError(f"train.{training}.heldout: {oracle} are the oracle world's measures, which its "
                                 f"prompts_file's prompts have none of: use judge/<protocol>/score or "
                                 f"{sorted(PROMPTS_MEASURES[training])}")
        return self

    def resolved(self, training: str, method: str | None = None) -> ResolvedTraining:
        """The effective settings of one training (judge_sft | judge_dpo | policy_dpo | diffusion_dpo): its own
        fields, with every null filled from this section. `method` picks one of its update methods (default:
        the first configured)."""
        own = getattr(self, training, None) if training in TRAININGS else None
        if not isinstance(own, TrainingOverrides):
            raise ValueError(f"unknown training {training!r}; expected one of {', '.join(TRAININGS)}")
        out = own.model_dump()
        methods = out.pop("methods", None)  # the list is the iteration's choice; one training runs one method
        if methods is not None:
            out["method"] = method or methods[0]
            out["heldout"] = own.heldout  # the typed section (text or generator)
        elif method is not None:
            raise ValueError(f"{training} has no update methods (got method {method!r})")
        for key in TrainingOverrides.model_fields:
            if out[key] is None:
                value = getattr(self, key)
                out[key] = value.model_dump() if isinstance(value, BaseModel) else value
        if isinstance(own, DPOTrainingConfig) and out["beta"] is None:
            out["beta"] = self.dpo_beta
        for key in ResolvedTraining.model_fields:
            if key not in out and key in TrainConfig.model_fields:
                out[key] = getattr(self, key)
        return ResolvedTraining(training=training, **out)


TRAININGS = ("judge_sft", "judge_dpo", "policy_dpo", "diffusion_dpo")
# Settings that change how a training runs, not what it learns: left out of its identity (flywheel/train/api.py
# run_key), so changing them does not train again what is registered.
HOW_NOT_WHAT = frozenset({"dataloader_workers"})


class ResolvedTraining(BaseModel):
    """The effective settings of one training (see TrainConfig.resolved); not a config section."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    training: str = Field(description="judge_sft | judge_dpo | policy_dpo | diffusion_dpo.")
    lr: float = Field(description="Learning rate.")
    epochs: float = Field(description="Passes over the data.")
    max_steps: int | None = Field(description="Optimizer steps; null trains for epochs.")
    batch_size: int = Field(description="Per-worker batch size.")
    grad_accum_steps: int = Field(description="Gradient accumulation.")
    micro_batches: int = Field(1, description="Length-sorted micro-batches per batch.")
    lr_scheduler: str = Field(description="Learning-rate schedule.")
    lora: LoraConfig = Field(description="LoRA settings.")
    warmup_ratio: float = Field(description="Warm-up share.")
    weight_decay: float = Field(description="AdamW weight decay.")
    max_grad_norm: float = Field(description="Clipping norm.")
    logging_steps: int = Field(description="Logging interval.")
    save_steps: int = Field(description="Checkpoint interval.")
    keep_checkpoints: int = Field(description="Checkpoints kept.")
    max_failures: int = Field(description="Worker-group restarts.")
    seed: int | None = Field(description="Seed; null means run.seed.")
    group_by_length: bool = Field(False, description="Batch rows of similar length.")
    freeze_vision: bool = Field(False, description="Keep the vision encoder and projector fixed (VLMs).")
    image_feature_cache_mb: int = Field(0, description="Per-image vision feature cache size (with freeze_vision).")
    dataloader_workers: int = Field(0, description="Batch-collating processes per training worker.")
    completion_only_loss: bool | None = Field(None, description="SFT only.")
    beta: float | None = Field(None, description="DPO / Diffusion-DPO beta.")
    loss_type: list[str] | None = Field(None, description="DPO only.")
    loss_weights: list[float] | None = Field(None, description="DPO only.")
    resolution: int | None = Field(None, description="Diffusion-DPO only.")
    timestep_max: int | None = Field(None, description="Diffusion-DPO only.")
    scale_lr: bool | None = Field(None, description="Diffusion-DPO only.")
    method: str | None = Field(None, description="Update method of this training (DPO trainings only).")
    sft_weight: float | None = Field(None, description="DPO only: weight of dpo_sft's SFT term.")
    reference: str | None = Field(None, description="DPO only: previous | original.")
    heldout: GeneratorHeldoutConfig | HeldoutConfig | None = Field(None, description="Held-out evaluation.")

    @model_validator(mode="after")
    def _micro_batches_divide_the_batch(self) -> ResolvedTraining:
        if self.training != "diffusion_dpo":
            self.micro_batch_size()
        return self

    def micro_batch_size(self) -> int:
        """Rows per micro-batch; checked here too, as settings changed by model_copy skip validation."""
        if self.batch_size % self.micro_batches:
            raise ValueError(f"train.{self.training}: batch_size {self.batch_size} does not divide into "
                             f"micro_batches {self.micro_batches}")
        return self.batch_size // self.micro_batches
