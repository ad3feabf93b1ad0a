"""Judge SFT: TRL's SFTTrainer (+ PEFT LoRA, or a full fine-tune) on the curated SFT set, images included.

The set holds every protocol's samples, the decomposed T2I protocol's sub-task samples among them; they are
trained on together (the mix is the data plane's decision), and the per-protocol / per-sub-task counts go to
MLflow with the data lineage.
"""

from __future__ import annotations

from collections import Counter

import torch

from flywheel.train import hf
from flywheel.train.data import read_training_data, sft_rows, to_hf_dataset
from flywheel.train.guards import NonFiniteGuard


def build_trainer(model, processor, dataset, settings, output_dir: str, seed: int, dtype: str = "float32",
                  callbacks=(), bare: bool = False, peft_config="from-settings", fused_head: bool | None = None):
    """The SFTTrainer every path uses (Ray worker, benchmark, tests, best-of-N SFT of the policies). `bare` gives
    plain TRL (with the same batches), for comparison; `peft_config=None` trains the model as given (e.g. a loaded
    adapter); `fused_head` picks TRL's fused LM head or the model's own loss (model_loss_trainer), by default the
    first on a GPU only."""
    from trl import SFTConfig, SFTTrainer

    if peft_config == "from-settings":
        peft_config = hf.peft_config(settings)
    hf.keep_vision(model, settings, peft_config)

    completion_only = "completion" in dataset.column_names
    args = SFTConfig(**hf.trl_args(settings, output_dir, seed, dtype), completion_only_loss=completion_only,
                     packing=False)
    fused = hf.on_gpu() if fused_head is None else fused_head
    base = SFTTrainer if fused else model_loss_trainer(SFTTrainer)
    cls = hf.length_grouped_trainer(base) if bare else hf.flywheel_trainer(base)
    return cls(model=model, args=args, train_dataset=dataset, processing_class=processor,
               peft_config=peft_config, callbacks=list(callbacks))


def model_loss_trainer(base_cls):
    """An SFTTrainer whose loss is the one the model computes from its labels (transformers' causal-LM loss: the
    completion tokens' NLL summed and divided by their count across the accumulated batch, as TRL's is), with
    TRL's entropy and token-accuracy metrics taken from the logits. Used off a GPU: TRL's fused LM head projects
    only the labelled positions on a Triton device and every position elsewhere, which on the local judge SFT
    (16 rows of ~225 tokens, a fifth of them labelled; vocabulary 1,024) cost 0.28 s per step against 0.21 for
    the same losses (bench/loss_paths.py). A GPU keeps TRL's head, which never builds the full logits."""
    from transformers import Trainer

    class ModelLossTrainer(base_cls):
        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            inputs["use_cache"] = False
            loss, outputs = Trainer.compute_loss(self, model, inputs, return_outputs=True,
                                                 num_items_in_batch=num_items_in_batch)
            self._log_token_metrics(outputs.logits, inputs["labels"], inputs["attention_mask"])
            return (loss, outputs) if return_outputs else loss

        @torch.no_grad()
        def _log_token_metrics(self, logits, labels, attention_mask):
            labels = labels[:, 1:]
            mask = labels != -100
            logp = logits[:, :-1][mask].float().log_softmax(-1)
            gather = self.accelerator.gather_for_metrics
            valid = gather(mask.sum()).sum().clamp(min=1)
            entropy = gather(-(logp.exp() * logp).sum()).sum()
            correct = gather((logp.argmax(-1) == labels[mask]).sum()).sum()
            mode = "train" if self.model.training else "eval"
            self._metrics[mode]["entropy"].append((entropy / valid).item())
            self._metrics[mode]["mean_token_accuracy"].append((correct / valid).item())
            if mode == "train":
                self._total_train_tokens += gather(attention_mask.sum()).sum().item()
            self._metrics[mode]["num_tokens"] = [self._total_train_tokens]

    ModelLossTrainer.__name__ = base_cls.__name__
    return ModelLossTrainer


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
