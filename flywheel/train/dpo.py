"""Preference updates with TRL, shared by the judge (judge-DPO pairs, starting from the SFT result) and the LLaVA
policy (policy preference pairs: images / prompt / chosen / rejected). The update method is a setting:

- `dpo`: TRL's DPOTrainer with the configured `loss_type` terms;
- `dpo_sft`: the same plus an SFT term on the chosen answer (TRL's loss_type list + loss_weights, RPO-style);
- `bon_sft`: best-of-N / rejection-sampling fine-tuning: TRL's SFTTrainer on the *chosen* answers only. Measured
  on the tiny LLaVA (../shared/notes/cpu-stack.md) it fixed the taught habit as well as DPO, and stably.

Where an update starts: from a registered version (the previous round's champion, or the judge's SFT result) or a
base model. If that version has a LoRA adapter and the update uses LoRA, the adapter itself is trained further;
otherwise the full or merged weights are loaded and, with LoRA, a new adapter is added.
The DPO reference (`reference`):
- `previous` (default; the notes: resetting the reference to the round-1 model made round 2 better): the model
  the update starts from. A continued adapter gets TRL's frozen copy of itself ("ref"); a new adapter is
  disabled to give the start back.
- `original`: the base the adapter sits on, kept across rounds: TRL's "ref" copy is dropped, so the reference is
  the model with adapters disabled.
"""

from __future__ import annotations

import logging
from contextlib import contextmanager

from flywheel.train import hf
from flywheel.train.data import chosen_rows, dpo_rows, read_training_data, to_hf_dataset
from flywheel.train.guards import NonFiniteGuard
from flywheel.train.registry import export_meta, is_registry_uri, materialize, resolve_base

log = logging.getLogger(__name__)
ROLES = {"judge_dpo": "judge", "policy_dpo": "policy"}


def loss_terms(settings) -> tuple[list[str], list[float] | None]:
    """TRL loss_type and loss_weights of the method: dpo_sft appends an SFT term (weight sft_weight)."""
    types, weights = list(settings.loss_type), settings.loss_weights
    if (settings.method or "dpo") == "dpo_sft" and "sft" not in types:
        weights = [*(weights or [1.0] * len(types)), settings.sft_weight]
        types.append("sft")
    return types, (list(weights) if weights is not None else None)


def build_trainer(model, processor, dataset, settings, output_dir: str, seed: int, dtype: str = "float32",
                  callbacks=(), peft_config="from-settings", bare: bool = False, compact_head: bool = True):
    """The DPOTrainer every path uses (Ray worker, benchmark, tests). `bare` gives plain TRL (with the
    same batches), for comparison; `compact_head=False` keeps TRL's head as it is off a Triton device
    (labelled_positions_only)."""
    from trl import DPOConfig, DPOTrainer

    if peft_config == "from-settings":
        peft_config = hf.peft_config(settings)
    hf.keep_vision(model, settings, peft_config)
    loss_type, loss_weights = loss_terms(settings)
    args = DPOConfig(**hf.trl_args(settings, output_dir, seed, dtype), beta=settings.beta,
                     loss_type=loss_type, loss_weights=loss_weights, precompute_ref_log_probs=False)
    base = compact_head_trainer(DPOTrainer) if compact_head else DPOTrainer
    cls = hf.length_grouped_trainer(base) if bare else hf.flywheel_trainer(base)
    return cls(model=model, args=args, train_dataset=dataset, processing_class=processor,
               peft_config=peft_config, callbacks=list(callbacks))


@contextmanager
def labelled_positions_only():
    """Make TRL's fused LM head project only the labelled (completion) positions on any device. TRL 1.16 does so
    on Triton devices only and projects every position elsewhere, to keep tile shapes fixed for Neuron's
    compiler; on CPU its torch tiles take any number of rows, and a judge DPO row is mostly prompt. Measured on
    the local judge DPO (bench/loss_paths.py): 0.51 instead of 0.71 s per step, the same losses. TRL decides this
    with one private function; if a TRL release drops it, the head runs as TRL ships it (slower, same result)."""
    import trl.trainer.utils as trl_utils

    original = getattr(trl_utils, "_use_triton", None)
    if original is None:
        yield
        return
    trl_utils._use_triton = lambda device: True  # only picks compaction there; the kernel module keeps its own
    try:
        yield
    finally:
        trl_utils._use_triton = original


def compact_head_trainer(base_cls):
    """A DPOTrainer whose loss runs under labelled_positions_only."""

    class CompactHeadTrainer(base_cls):
        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            with labelled_positions_only():
                return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)

    CompactHeadTrainer.__name__ = base_cls.__name__
    return CompactHeadTrainer


def load_start(ctx):
    """(model, processor, peft_config, adapter_base, continued) for the job's starting point (module doc);
    `continued`: a registered adapter is trained further."""
    s, ref = ctx.settings, ctx.job.base
    dtype = getattr(ctx.cfg.models, ROLES[ctx.job.training]).dtype
    if is_registry_uri(ref):
        export = materialize(ctx.cfg, ref)
        meta = export_meta(export)
        if (export / "adapter").is_dir() and s.lora.enabled:
            from peft import PeftModel

            model, processor = hf.load_vlm(resolve_base(ctx.cfg, meta["adapter_base"]), dtype)
            model = PeftModel.from_pretrained(model, str(export / "adapter"), is_trainable=True)
            return model, processor, None, meta["adapter_base"], True
        if s.reference == "original" and s.method != "bon_sft":
            raise ValueError(f"reference=original keeps the adapter's base as the DPO reference, but {ref} has no "
                             "LoRA adapter to continue (or LoRA is off): use reference=previous")
        model, processor = hf.load_vlm(resolve_base(ctx.cfg, ref), dtype)
        return model, processor, hf.peft_config(s), ref, False
    model, processor = hf.load_vlm(ctx.base_path(), dtype)
    return model, processor, hf.peft_config(s), ref, False


def use_original_reference(trainer) -> None:
    """Drop TRL's frozen copy of a continued adapter: the reference becomes the model with adapters disabled,
    i.e. the adapter's base (the first round's start)."""
    model = trainer.model
    if "ref" in getattr(model, "peft_config", {}):
        model.delete_adapter("ref")
        model.set_adapter("default")


def worker(ctx) -> None:
    from flywheel.train import sft
    from flywheel.train.heldout_run import HeldoutCallback

    s = ctx.settings
    data = read_training_data(ctx.job.data, "dpo")
    target = ROLES[ctx.job.training]
    wrong = sum(r["target"] != target for r in data.rows)
    if wrong:
        raise ValueError(f"{ctx.job.data}: {wrong} of {len(data.rows)} pairs are not {target} pairs")
    model, processor, peft_config, adapter_base, continued = load_start(ctx)
    guard = NonFiniteGuard()
    dtype = getattr(ctx.cfg.models, target).dtype
    run = hf.heldout_run(ctx)
    extra = [HeldoutCallback(run, processor)] if run is not None else []
    log.info("%s: method %s on %d pairs from %s (reference: %s)", ctx.job.training, s.method, len(data.rows),
             ctx.job.base, "-" if s.method == "bon_sft" else s.reference)
    if s.method == "bon_sft":
        dataset = to_hf_dataset(chosen_rows(data.rows))
        trainer = sft.build_trainer(model, processor, dataset, s, ctx.local_dir, ctx.seed, dtype,
                                    callbacks=hf.callbacks(ctx, guard, extra), peft_config=peft_config)
    else:
        dataset = to_hf_dataset(dpo_rows(data.rows))
        trainer = build_trainer(model, processor, dataset, s, ctx.local_dir, ctx.seed, dtype,
                                callbacks=hf.callbacks(ctx, guard, extra), peft_config=peft_config)
        if s.reference == "original" and continued:
            use_original_reference(trainer)
    hf.attach(trainer, ctx, guard)
    if run is not None:
        run.model = trainer.model  # TRL wrapped it (PEFT): the weights the update changes live here
    hf.run(ctx, trainer, processor, guard, lineage={**ctx.job.lineage, "adapter_base": adapter_base,
                                                    "method": s.method}, heldout=run)
