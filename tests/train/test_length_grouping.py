"""Length-grouped batches (train.group_by_length): rows sort by image count then text, the order is drawn from
(seed, epoch) so a resumed run replays it, batches pad less than random ones, and the trainers use it only
when asked."""

import json

import numpy as np
import torch

from flywheel.images import to_png_bytes
from flywheel.records import validate
from flywheel.train import hf, sft
from flywheel.train.data import LENGTH, SampleIdCollator, sft_rows, to_hf_dataset
from flywheel.train.synthetic import shape_image


def _row(text: str, images: int, answer: str = "Rating: 3") -> dict:
    content = [{"type": "image"}] * images + [{"type": "text", "text": text}]
    return {"images": [to_png_bytes(shape_image("red", "circle"))] * images,
            "messages": json.dumps([{"role": "user", "content": content},
                                    {"role": "assistant", "content": answer}])}


def _dataset(rows: list[dict]):
    return to_hf_dataset(sft_rows(validate("sft", rows)[0]))


def test_rows_sort_by_image_count_then_text_length():
    ds = _dataset([_row("short", 1), _row("a much longer question " * 20, 1), _row("short", 2)])
    one_short, one_long, two_short = ds[LENGTH]
    assert one_short < one_long < two_short  # a second image outweighs any text
    assert one_long - one_short == len("a much longer question " * 20) - len("short")


def test_collator_strips_the_length_key():
    ds = _dataset([_row("q", 1)])
    seen = []
    SampleIdCollator(lambda ex: seen.extend(ex) or {})([ds[0]])
    assert LENGTH not in seen[0]


def _padding(order: list[int], lengths: list[int], batch: int) -> float:
    """Share of padded positions when each batch pads to its longest row."""
    batches = [[lengths[i] for i in order[k:k + batch]] for k in range(0, len(order), batch)]
    return 1 - sum(map(sum, batches)) / sum(max(b) * len(b) for b in batches)


def test_order_is_seeded_per_epoch_and_pads_less_than_random():
    lengths = np.random.default_rng(0).integers(40, 200, size=960).tolist()
    sampler = hf.length_grouped_sampler(16, lengths, seed=7)
    first = list(sampler)
    assert sorted(first) == list(range(960))  # every row once
    assert list(hf.length_grouped_sampler(16, lengths, seed=7)) == first  # a fresh (resumed) trainer: same order
    sampler.set_epoch(1)
    second = list(sampler)
    assert second != first and sorted(second) == list(range(960))
    sampler.set_epoch(0)
    assert list(sampler) == first
    assert list(hf.length_grouped_sampler(16, lengths, seed=8)) != first
    random_order = torch.randperm(960, generator=torch.Generator().manual_seed(0)).tolist()
    assert _padding(first, lengths, 16) < 0.25 * _padding(random_order, lengths, 16)
    # consecutive batches are not sorted by length (transformers' order runs longest to shortest within each
    # mega-batch of 50 batches: a judge trained so drifted with each run of similar rows)
    longest = [max(lengths[i] for i in first[k:k + 16]) for k in range(0, 960, 16)]
    falls = sum(a > b for a, b in zip(longest, longest[1:]))
    assert 0.3 < falls / (len(longest) - 1) < 0.7


def _trainer(zoo, cfg, tmp_path, group: bool):
    model, processor = hf.load_vlm(str(zoo["judge"]))
    settings = cfg.train.resolved("judge_sft").model_copy(update={"group_by_length": group, "batch_size": 2,
                                                                  "micro_batches": 1, "max_steps": 1})
    ds = _dataset([_row("q" * (i * 7), 1 + i % 2) for i in range(8)])
    return sft.build_trainer(model, processor, ds, settings, str(tmp_path), seed=3)


def test_trainer_draws_length_grouped_batches_only_when_asked(zoo, cfg, tmp_path):
    grouped = _trainer(zoo, cfg, tmp_path, group=True)
    sampler = grouped._get_train_sampler()
    assert list(sampler) == list(hf.length_grouped_sampler(2, grouped.train_dataset[LENGTH], seed=3))
    hf.attach(grouped)
    grouped.train()  # the length column never reaches TRL's collator or the model
    assert grouped.state.global_step == 1
    plain = _trainer(zoo, cfg, tmp_path / "plain", group=False)
    assert isinstance(plain._get_train_sampler(), torch.utils.data.RandomSampler)
