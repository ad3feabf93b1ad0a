"""What collating judge SFT batches costs over a training's epochs: TRL's collator on every batch against RowCache
(flywheel/train/collate.py, train.judge_sft.cache_collated_rows), which collates each row once, measured in one run
on the same seeded batch order. Target: ratio <= 0.6 over the local judge SFT's 2.4 epochs, with every batch equal.

The batches are those of a seeded random order over `--epochs` passes (batch size from the config); both sides
build each batch, which is compared tensor for tensor, and each side's wall time over all batches is summed. The
memory RowCache holds at the end (token and image tensors) is printed too.

    .venv/bin/python bench/sft_collate_cache.py [--data <curated sft dir>] [--model <checkpoint>] [--epochs 2.4]

Measured on a local run's iteration-0 curated set (7,789 rows, 5,845 distinct) and the world judge base, 1,169
batches: TRL's collator 28.6 ms/batch (33.4 s), RowCache 19.9 ms/batch (23.2 s), ratio 0.69, 1,537 MiB held.
A row's first collation costs 2.2 ms alone against 1.3 ms inside a batch of 16; a cached batch costs 1.4 ms.
"""
from __future__ import annotations

import argparse
import random
import tempfile
import time

import torch

from flywheel.config import REPO_ROOT, load_config


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", default=None, help="a curated SFT dataset (default: synthetic rows)")
    p.add_argument("--model", default=None, help="judge checkpoint (default: the zoo judge)")
    p.add_argument("--epochs", type=float, default=2.4)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args()

    from flywheel.models.zoo import build_zoo
    from flywheel.train import hf, sft
    from flywheel.train.collate import RowCache
    from flywheel.train.data import read_training_data, sft_rows, to_hf_dataset
    from flywheel.train.registry import resolve_base
    from flywheel.train.synthetic import write_synthetic

    workdir = tempfile.mkdtemp(prefix="flywheel-bench-collate-")
    cfg = load_config(REPO_ROOT / "configs" / "local.yaml", [f"run.workdir={workdir}", "models.judge.path=zoo:judge"])
    torch.set_num_threads(args.threads)
    if args.model is None:
        build_zoo(cfg)
    model_path = args.model or resolve_base(cfg, cfg.models.judge.path)
    data = args.data or write_synthetic(f"{cfg.storage.uri}/bench/sft", "sft", 400).path
    s = cfg.train.resolved("judge_sft")
    dataset = to_hf_dataset(sft_rows(read_training_data(data, "sft").rows, completion_only_loss=True))
    model, processor = hf.load_vlm(model_path)
    trl = sft.build_trainer(model, processor, dataset, s.model_copy(update={"cache_collated_rows": False}), workdir,
                            cfg.run.seed, bare=True).data_collator
    cache = RowCache(trl)

    rng = random.Random(cfg.run.seed)
    order: list[int] = []
    while len(order) < args.epochs * len(dataset):
        order += rng.sample(range(len(dataset)), len(dataset))
    order = order[:int(args.epochs * len(dataset))]
    batches = [order[i:i + s.batch_size] for i in range(0, len(order), s.batch_size)]
    print(f"{len(dataset)} rows from {data}; {len(batches)} batches of {s.batch_size} ({args.epochs} epochs)")

    spent = {"trl": 0.0, "cache": 0.0}
    for index in batches:
        t = time.perf_counter()
        theirs = trl([dataset[i] for i in index])
        spent["trl"] += time.perf_counter() - t
        t = time.perf_counter()
        ours = cache([dataset[i] for i in index])
        spent["cache"] += time.perf_counter() - t
        if sorted(ours) != sorted(theirs) or not all(torch.equal(ours[k], theirs[k]) for k in theirs):
            raise SystemExit(f"batch {index} differs from TRL's")
    held = sum(v.numel() * v.element_size() for tokens, _ in cache.rows.values() for v in tokens.values())
    held += sum(v.numel() * v.element_size() for images in cache.images.values() for v in images.values())
    n = len(batches)
    print(f"TRL's collator  {spent['trl'] / n * 1000:.1f} ms/batch ({spent['trl']:.1f} s)")
    print(f"RowCache        {spent['cache'] / n * 1000:.1f} ms/batch ({spent['cache']:.1f} s); {len(cache.rows)} rows,"
          f" {len(cache.images)} distinct images, {held / 2**20:.0f} MiB held")
    print(f"ratio           {spent['cache'] / spent['trl']:.2f}; all {n} batches equal")


if __name__ == "__main__":
    main()
