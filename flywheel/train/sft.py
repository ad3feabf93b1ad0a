"""Judge SFT: TRL's SFTTrainer (+ PEFT LoRA, or a full fine-tune) on the curated SFT set, images included.

The set holds every protocol's samples, the decomposed T2I protocol's sub-task samples among them; they are
trained on together (the mix is the data plane's decision), and the per-protocol / per-sub-task counts go to
MLflow with the data lineage.
"""

from __future__ import annotations

from collections import Counter

from flywheel.train import hf
from flywheel.train.data import read_training_data, sft_rows, to_hf_dataset
from flywheel.train.guards import NonFiniteGuard


def build_trainer(model, processor, dataset, settings, output_dir: str, seed: int, dtype: str = "float32",
                  callbacks=(), bare: bool = False, peft_config="from-settings"):
    """The SFTTrainer every path uses (Ray worker, benchmark, tests, best-of-N SFT of the policies). `bare` gives
    plain TRL (with the same batches), for comparison; `peft_config=None` trains the model as given (e.g. a loaded adapter)."""
    from trl import SFTConfig, SFTTrainer

    if peft_config == "from-settings":
        peft_config = hf.peft_config(settings)
    hf.keep_vision(model, settings, peft_config)

    completion_only = "completion" in dataset.column_names
    args = SFTConfig(**hf.trl_args(settings, output_dir, seed, dtype), completion_only_loss=completion_only,
                     packing=False)
    cls = hf.length_grouped_trainer(SFTTrainer) if bare else hf.flywheel_trainer(SFTTrainer)
    return cls(model=model, args=args, train_dataset=dataset, processing_class=processor,
               peft_config=peft_config, callbacks=list(callbacks))


def data_summary(rows: list[dict]) -> dict[str, float]:
    """Counts per protocol and per sub-task (decomposed sub-task samples included)."""
    out: dict[str, float] = {"rows": float(len(rows))}
    for key in ("protocol", "subtask"):
        for value, n in Counter(r.get(key) or "none" for r in rows).items():
            out[f"data.{key}.{value}"] = float(n)
    return out


def worker(ctx) -> None:
    s = ctx.settings
    data = read_training_data(ctx.job.data, "sft")
    dataset = to_hf_dataset(sft_rows(data.rows, completion_only_loss=bool(s.completion_only_loss)))
    ctx.metrics.log(data_summary(data.rows), 0)
    model, processor = hf.load_vlm(ctx.base_path(), ctx.cfg.models.judge.dtype)
    guard = NonFiniteGuard()
    trainer = build_trainer(model, processor, dataset, s, ctx.local_dir, ctx.seed, ctx.cfg.models.judge.dtype,
                            callbacks=hf.callbacks(ctx, guard))
    hf.attach(trainer, ctx, guard)
    hf.run(ctx, trainer, processor, guard, lineage={**ctx.job.lineage, "adapter_base": ctx.job.base})
