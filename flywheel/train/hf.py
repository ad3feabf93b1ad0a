"""What the TRL trainings (judge SFT, judge DPO, policy DPO) share: model loading, TRL arguments, the trainer
mixin (sample-id log + NaN guard), the callbacks, resume from Ray Train's checkpoint, and the export.

Settings that matter on every machine, and why:
- `max_length=None`: TRL truncates by token count, which can cut image placeholder tokens (TRL #5285) and then
  the model fails with "Image features and image tokens do not match" - or, worse, trains on a broken sample.
- `activation_checkpointing=False`: TRL turns it on by default (as `gradient_checkpointing`, the name
  transformers 5.23 deprecates); on tiny models it only costs time. (GPU configs with long sequences may want it;
  it is not a knob yet.)
- `bf16` only on a GPU with a bfloat16 checkpoint; TRL's default bf16=True raises on a CPU box.
- `remove_unused_columns=False`: keeps the `sample_id` column for the step log (the collator strips it).
- `train_sampling_strategy="group_by_length"` (train.group_by_length): batches of rows of similar length pad less.
  `length_grouped_trainer` draws them from (seed, epoch), so a resumed run replays the same batches (transformers'
  own sampler draws from the global RNG, which resume does not restore at the epoch's start), and shuffles them.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path

import torch
from transformers import TrainerCallback

from flywheel.train.data import LENGTH, SAMPLE_IDS, SampleIdCollator
from flywheel.train.guards import NonFiniteGuard

log = logging.getLogger(__name__)
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def on_gpu() -> bool:
    return torch.cuda.is_available()


def load_vlm(path: str, dtype: str = "float32"):
    """(model, processor) of an image-text-to-text checkpoint, in float32 on CPU."""
    import flywheel.models.processors  # noqa: F401  (registers the image-only Qwen2-VL processor)
    from transformers import AutoModelForImageTextToText, AutoProcessor

    torch_dtype = DTYPES[dtype] if on_gpu() else torch.float32
    processor = AutoProcessor.from_pretrained(path)
    # AutoProcessor falls back to the bare tokenizer when the checkpoint's processor class cannot load; TRL would
    # then train on the text alone, silently dropping every image.
    if getattr(processor, "image_processor", None) is None:
        raise RuntimeError(f"{path}: AutoProcessor gave {type(processor).__name__}, which takes no images "
                           "(is the checkpoint's processor class importable here?)")
    model = AutoModelForImageTextToText.from_pretrained(path, dtype=torch_dtype)
    return model, processor


def peft_config(settings) -> "object | None":
    """PEFT LoraConfig from a training's LoRA settings (no adapter in the vision side when `freeze_vision`), or
    None for a full fine-tune."""
    lora = settings.lora
    if not lora.enabled:
        return None
    from peft import LoraConfig

    from flywheel.models.vision import LORA_EXCLUDE

    return LoraConfig(r=lora.r, lora_alpha=lora.alpha, lora_dropout=lora.dropout,
                      target_modules=lora.target_modules, task_type="CAUSAL_LM",
                      exclude_modules=LORA_EXCLUDE if settings.freeze_vision else None)


def keep_vision(model, settings, peft_config) -> None:
    """A training without a new LoRA (a full fine-tune, or a loaded adapter trained further) freezes the vision
    side itself when `freeze_vision`; with a new LoRA, peft_config's exclude_modules does it. A frozen side's
    features are then computed once per image (flywheel/models/vision_cache.py)."""
    if settings.freeze_vision and peft_config is None:
        from flywheel.models.vision import freeze_vision

        log.info("vision encoder and projector frozen (%d parameters)", freeze_vision(model))
    if settings.freeze_vision and settings.image_feature_cache_mb:
        from flywheel.models.vision_cache import cache_image_features

        cache_image_features(model, settings.image_feature_cache_mb << 20)


def trl_args(settings, output_dir: str, seed: int, dtype: str = "float32", **extra) -> dict:
    """Keyword arguments shared by SFTConfig and DPOConfig."""
    return dict(
        output_dir=output_dir, seed=seed, data_seed=seed,
        learning_rate=settings.lr, num_train_epochs=settings.epochs,
        max_steps=settings.max_steps if settings.max_steps is not None else -1,
        per_device_train_batch_size=settings.micro_batch_size(),
        gradient_accumulation_steps=settings.grad_accum_steps * settings.micro_batches,
        lr_scheduler_type=settings.lr_scheduler, warmup_steps=settings.warmup_ratio,
        weight_decay=settings.weight_decay, max_grad_norm=settings.max_grad_norm,
        logging_steps=settings.logging_steps, save_strategy="steps", save_steps=settings.save_steps,
        save_total_limit=1, report_to=[], disable_tqdm=True, remove_unused_columns=False,
        dataloader_num_workers=settings.dataloader_workers,
        dataloader_persistent_workers=settings.dataloader_workers > 0,  # not forked again every epoch
        max_length=None, activation_checkpointing=False,
        train_sampling_strategy="group_by_length" if settings.group_by_length else "random",
        length_column_name=LENGTH,
        use_cpu=not on_gpu(), bf16=on_gpu() and dtype == "bfloat16", fp16=False,
        **extra,
    )


def length_grouped_sampler(batch_size: int, lengths: list[int], seed: int):
    """transformers' length grouping (rows sorted by length within random mega-batches of 50 batches), then the
    batches shuffled, all drawn from (seed, epoch). Why shuffle: transformers yields each mega-batch's batches
    longest first, so consecutive steps share a sub-task and a protocol (here length tracks both); a judge
    trained in that order lost its ranking (0.62 -> 0.46) and 37% of its pairwise verdicts stopped parsing."""
    from transformers.trainer_pt_utils import LengthGroupedSampler, get_length_grouped_indices

    class SeededLengthGroupedSampler(LengthGroupedSampler):
        epoch = 0

        def set_epoch(self, epoch: int) -> None:  # the trainer calls it at every epoch's start, resumed or not
            self.epoch = epoch

        def __iter__(self):
            g = torch.Generator().manual_seed(seed + 1_000_003 * self.epoch)
            order = get_length_grouped_indices(self.lengths, self.batch_size, generator=g)
            batches = [order[i:i + self.batch_size] for i in range(0, len(order), self.batch_size)]
            last = [batches.pop()] if len(batches[-1]) < self.batch_size else []  # a short batch stays last
            shuffled = [batches[i] for i in torch.randperm(len(batches), generator=g).tolist()] + last
            return iter([i for batch in shuffled for i in batch])

    return SeededLengthGroupedSampler(batch_size, lengths=lengths)


def sorted_micro_batch_sampler(batch_size: int, lengths: list[int], seed: int):
    """Random batches of `batch_size` rows (one optimizer step's, across its micro-batches and workers), each
    sorted longest first, drawn from (seed, epoch): consecutive micro-batches then hold rows of similar length
    and pad less, while every optimizer step still sees a random mix of rows (train.micro_batches)."""

    class SortedMicroBatchSampler(torch.utils.data.Sampler):
        epoch = 0

        def set_epoch(self, epoch: int) -> None:  # the trainer calls it at every epoch's start, resumed or not
            self.epoch = epoch

        def __len__(self) -> int:
            return len(lengths)

        def __iter__(self):
            g = torch.Generator().manual_seed(seed + 1_000_003 * self.epoch)
            order = torch.randperm(len(lengths), generator=g).tolist()
            return iter([i for start in range(0, len(order), batch_size)
                         for i in sorted(order[start:start + batch_size], key=lambda j: -lengths[j])])

    return SortedMicroBatchSampler()


def length_grouped_trainer(base_cls):
    """A TRL trainer whose batches come from length_grouped_sampler (train.group_by_length), or, when an
    optimizer step accumulates micro-batches, from sorted_micro_batch_sampler."""

    class LengthGroupedTrainer(base_cls):
        def _get_train_sampler(self, train_dataset=None):
            dataset = train_dataset if train_dataset is not None else self.train_dataset
            grouped = self.args.train_sampling_strategy == "group_by_length"
            if LENGTH not in dataset.column_names or not (grouped or self.args.gradient_accumulation_steps > 1):
                return super()._get_train_sampler(train_dataset)
            seed = self.args.data_seed if self.args.data_seed is not None else self.args.seed
            batch = self.args.train_batch_size * self.args.gradient_accumulation_steps
            if grouped:
                return length_grouped_sampler(batch, dataset[LENGTH], seed)
            return sorted_micro_batch_sampler(batch * self.args.world_size, dataset[LENGTH], seed)

    LengthGroupedTrainer.__name__ = base_cls.__name__
    return LengthGroupedTrainer


class FullWeightsResume:
    """Put before a transformers Trainer class in the bases: a resumed full fine-tune gets all its checkpointed
    weights back (see load_checkpoint_weights)."""

    def _load_from_checkpoint(self, resume_from_checkpoint, model=None):
        model = model if model is not None else self.model
        # PEFT adapters load by name, and a checkpoint without a model config (FSDP, DeepSpeed shards) is not
        # save_pretrained's: the Trainer's own path is right for both
        if _unwrap_peft(model) is not None or not os.path.isfile(os.path.join(resume_from_checkpoint,
                                                                              "config.json")):
            return super()._load_from_checkpoint(resume_from_checkpoint, model)
        load_checkpoint_weights(model, resume_from_checkpoint)


def flywheel_trainer(base_cls):
    """A subclass of a TRL trainer that logs each step's sample ids and feeds the NaN guard (and draws its
    batches as length_grouped_trainer does)."""

    class FlywheelTrainer(FullWeightsResume, length_grouped_trainer(base_cls)):
        _fw_steps = None
        _fw_guard: NonFiniteGuard | None = None

        def training_step(self, model, inputs, num_items_in_batch=None):
            ids = inputs.pop(SAMPLE_IDS, None)
            if ids is not None and self._fw_steps is not None:
                self._fw_steps.record(self.state.global_step + 1, ids)
            loss = super().training_step(model, inputs, num_items_in_batch)
            if self._fw_guard is not None:
                self._fw_guard.observe(loss)
            return loss

    FlywheelTrainer.__name__ = f"Flywheel{base_cls.__name__}"
    return FlywheelTrainer


def load_checkpoint_weights(model, checkpoint: str) -> None:
    """Put a full fine-tune's checkpointed weights back into `model`, every one of them.

    transformers 5 saves Qwen2-VL/LLaVA in the hub's key layout (`model.embed_tokens...`) while the live module
    says `model.language_model.embed_tokens...`; the Trainer's resume loads the file with load_state_dict(strict=
    False), which matched none of the keys and only warned. A resumed full judge SFT then went on from its start
    weights with the restored optimizer (runs/t13 iteration 1: loss at step 701 0.221, uninterrupted 0.181; its
    judge ranked 0.812 where the uninterrupted one ranked 0.752). from_pretrained applies the key mapping."""
    loaded = type(model).from_pretrained(checkpoint, dtype=next(model.parameters()).dtype)
    model.load_state_dict(loaded.state_dict(), strict=True)
    del loaded


class MetricsCallback(TrainerCallback):
    """Step time, and every logged value (loss, lr, grad norm, DPO reward margins/accuracies) to MLflow."""

    def __init__(self, ctx):
        self.ctx = ctx
        self._since_log: list[float] = []

    def on_step_end(self, args, state, control, **kwargs):
        dt = self.ctx.timer.tick()
        if dt is not None:
            self._since_log.append(dt)

    def on_log(self, args, state, control, logs=None, **kwargs):
        logs = dict(logs or {})
        if self._since_log:
            logs["step_time_s"] = sum(self._since_log) / len(self._since_log)
            self._since_log = []
        self.ctx.metrics.log(logs, state.global_step)


def ray_checkpoint_callback(ctx):
    """Ray Train's RayTrainReportCallback (copy the HF checkpoint just saved into a Ray checkpoint and report it
    with the logged metrics), extended: the worker's step log goes into the checkpoint, the metrics carry the
    step and the worker's pid."""
    from ray.train.huggingface.transformers import RayTrainReportCallback
    from transformers.trainer_utils import get_last_checkpoint

    class FlywheelReportCallback(RayTrainReportCallback):
        def on_save(self, args, state, control, **kwargs):
            import tempfile

            last = get_last_checkpoint(args.output_dir)
            metrics = {k: v for entry in state.log_history for k, v in entry.items()}
            with tempfile.TemporaryDirectory() as tmp:
                target = os.path.join(tmp, self.CHECKPOINT_NAME)
                if last is not None:
                    shutil.copytree(last, target)
                else:
                    os.makedirs(target)
                ctx.report_checkpoint(tmp, state.global_step, metrics, steps_dir=target)

    return FlywheelReportCallback()


def attach(trainer, ctx=None, guard: NonFiniteGuard | None = None):
    """Wire the sample-id collator, step log and guard into a trainer built by flywheel_trainer()."""
    from transformers.trainer_callback import PrinterCallback, ProgressCallback

    for cb in (PrinterCallback, ProgressCallback):  # logs go to MLflow; the console stays readable
        trainer.remove_callback(cb)
    trainer.data_collator = SampleIdCollator(trainer.data_collator)
    trainer._fw_steps = ctx.steps if ctx is not None else None
    trainer._fw_guard = guard
    return trainer


def callbacks(ctx, guard: NonFiniteGuard, extra=()) -> list:
    """The flywheel's callbacks; `extra` (e.g. the held-out evaluation) runs before the Ray checkpoint callback,
    so what it writes into a checkpoint folder is copied with it."""
    return [guard, MetricsCallback(ctx), *extra, ray_checkpoint_callback(ctx)]


def heldout_run(ctx):
    """The training's held-out evaluation (None when `heldout` is off); rank 0 alone builds the probe and loads
    the scoring judge, every rank takes part in the stop decision."""
    if ctx.settings.heldout is None:
        return None
    from flywheel.train.heldout_probes import make_judge_scorer, make_probe
    from flywheel.train.heldout_run import HeldoutRun

    probe = make_probe(ctx, make_judge_scorer(ctx)) if ctx.is_main else None
    return HeldoutRun(ctx, probe, model=None)  # the model is set once the trainer has wrapped it


def _unwrap_peft(model):
    from peft import PeftModel

    return model if isinstance(model, PeftModel) else None


def export(model, processor, out: str, save_merged: bool) -> str:
    """Write the trained weights as safetensors: `adapter/` (LoRA) and/or `model/` (full or merged weights,
    with the processor, loadable by AutoModelForImageTextToText). Returns the format: lora | full."""
    peft_model = _unwrap_peft(model)
    Path(out).mkdir(parents=True, exist_ok=True)
    if peft_model is None:
        model.save_pretrained(os.path.join(out, "model"))
        processor.save_pretrained(os.path.join(out, "model"))
        return "full"
    for name in list(peft_model.peft_config):
        if name != "default":  # TRL's frozen "ref" copy of a pretrained adapter
            peft_model.delete_adapter(name)
    peft_model.save_pretrained(os.path.join(out, "adapter"))
    processor.save_pretrained(os.path.join(out, "adapter"))
    if save_merged:
        merged = peft_model.merge_and_unload()
        merged.save_pretrained(os.path.join(out, "model"))
        processor.save_pretrained(os.path.join(out, "model"))
    return "lora"


def run(ctx, trainer, processor, guard: NonFiniteGuard, lineage: dict, heldout=None) -> None:
    """Train (resuming from Ray Train's latest checkpoint if there is one), then report the export: with a
    held-out evaluation, the best state it saw (not the last), and its decision in the final metrics."""
    from ray.train.huggingface.transformers import prepare_trainer

    from flywheel.train.guards import NonFiniteLossError

    trainer = prepare_trainer(trainer)
    restore = ctx.restore_dir()
    resume_from = None
    if restore is not None:
        resume_from = os.path.join(restore, "checkpoint")
        step = json.loads(Path(resume_from, "trainer_state.json").read_text())["global_step"]
        ctx.steps.load(resume_from, upto=step)
        ctx.resumed_from = step
        if heldout is not None:
            heldout.load_from(resume_from)
        log.info("resuming %s from step %d", ctx.job.training, step)
    try:
        trainer.train(resume_from_checkpoint=resume_from)
    except NonFiniteLossError as e:
        ctx.report_error(e, e.step)
        return
    step = trainer.state.global_step
    final = {k: v for entry in trainer.state.log_history for k, v in entry.items()}
    if heldout is not None:
        final |= heldout.finish(step, trainer.model, processor, planned=trainer.state.max_steps)  # best state back
    export_dir = None
    if ctx.is_main:
        export_dir = os.path.join(ctx.local_dir, "export-build")
        shutil.rmtree(export_dir, ignore_errors=True)
        fmt = export(trainer.model, processor, export_dir, ctx.cfg.train.registry.save_merged)
        meta = {**lineage, "format": fmt, "training": ctx.job.training, "final_step": step,
                "settings": ctx.settings.model_dump(mode="json")}
        Path(export_dir, "flywheel.json").write_text(json.dumps(meta, indent=1, default=str))
    ctx.report_final(export_dir, final, step)
