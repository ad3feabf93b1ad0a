"""Vision SFT rows collated once per training (flywheel/train/collation_cache.py): every batch put together from
cached rows equals TRL's own collation of it, on the zoo's judge (Qwen2-VL) and policy (LLaVA) processors; a
batch that cannot be put together so turns the cache off; the training steps on the same losses either way."""

import json
from types import SimpleNamespace

import pytest
import torch

from flywheel.images import to_png_bytes
from flywheel.records import validate
from flywheel.train import hf, sft
from flywheel.train.collation_cache import RowCollationCache
from flywheel.train.data import SampleIdCollator, sft_rows, to_hf_dataset
from flywheel.train.synthetic import shape_image

COLOURS = ("red", "blue", "green")


def _row(i: int, images: int = 1, background=(255, 255, 255)) -> dict:
    content = [{"type": "image"}] * images + [{"type": "text", "text": f"question {i} " + "words " * (i % 5)}]
    answer = f"Analysis: {'long ' * (i % 4)}Rating: {1 + i % 5}"
    return {"images": [to_png_bytes(shape_image(COLOURS[(i + k) % 3], "circle", background=background))
                       for k in range(images)],
            "messages": json.dumps([{"role": "user", "content": content}, {"role": "assistant", "content": answer}])}


def _dataset(rows: list[dict], completion_only: bool = True):
    return to_hf_dataset(sft_rows(validate("sft", rows)[0], completion_only_loss=completion_only))


def _collator(zoo, cfg, tmp_path, model: str, ds, **update):
    m, processor = hf.load_vlm(str(zoo[model]))
    settings = cfg.train.resolved("judge_sft").model_copy(update={"max_steps": 1, **update})
    return sft.build_trainer(m, processor, ds, settings, str(tmp_path), seed=3)


def _batches(ds, order: list[int], size: int):
    return [[ds[i] for i in order[k:k + size]] for k in range(0, len(order), size)]


@pytest.mark.parametrize("model", ["judge", "policy"])
@pytest.mark.parametrize("completion_only", [True, False])
def test_batches_from_cached_rows_equal_trl_collation(zoo, cfg, tmp_path, model, completion_only):
    ds = _dataset([_row(i, images=1 + (i % 3 == 0)) for i in range(12)], completion_only)
    trainer = _collator(zoo, cfg, tmp_path, model, ds)
    inner = trainer.data_collator
    cached = SampleIdCollator(inner, RowCollationCache(inner, trainer.processing_class.tokenizer.pad_token_id,
                                                       64 << 20))
    plain = SampleIdCollator(inner)
    for epoch, order in enumerate(([*range(12)], [11, 3, 7, 0, 5, 9, 1, 10, 2, 6, 4, 8])):
        for a, b in zip(_batches(ds, order, 4), _batches(ds, order, 4), strict=True):
            got, want = cached(a), plain(b)
            assert got.keys() == want.keys()
            for key in want:
                if key == "sample_ids":
                    assert got[key] == want[key]
                else:
                    assert got[key].dtype == want[key].dtype and torch.equal(got[key], want[key]), (epoch, key)
    cache = cached.by_id
    assert cache.on and cache.misses == 12 and cache.hits == 12  # the second epoch came from the cache
    assert "pixel_values" in want and (want["labels"] == -100).any()


def test_rows_without_images_beside_rows_with_them(zoo, cfg, tmp_path):
    """A judge SFT set mixes rows with images and rows without: each mix is checked against TRL once, then put
    together from the cache (a text-only row's collation has no image tensors)."""
    ds = _dataset([_row(i, images=(0, 1, 2)[i % 3]) for i in range(9)])
    trainer = _collator(zoo, cfg, tmp_path, "judge", ds)
    inner = trainer.data_collator
    cached = SampleIdCollator(inner, RowCollationCache(inner, inner.processor.tokenizer.pad_token_id, 64 << 20))
    for order in ([0, 3, 6, 1, 4, 7, 2, 5, 8], [0, 1, 2, 3, 4, 5, 6, 7, 8], [8, 6, 3, 0, 7, 5, 4, 2, 1]):
        for a, b in zip(_batches(ds, order, 3), _batches(ds, order, 3), strict=True):
            got, want = cached(a), SampleIdCollator(inner)(b)
            assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want if k != "sample_ids")
    cache = cached.by_id
    assert cache.on and cache.misses == 9 and cache.hits == 18
    assert len(cache.checked) == 3  # text only; text and images; images only


def test_an_image_many_rows_show_is_kept_once(zoo, cfg, tmp_path):
    ds = _dataset([_row(3 * i) for i in range(6)])  # all red circles: one processed image
    trainer = _collator(zoo, cfg, tmp_path, "judge", ds)
    inner = trainer.data_collator
    cache = RowCollationCache(inner, inner.processor.tokenizer.pad_token_id, 64 << 20)
    SampleIdCollator(inner, cache)([ds[i] for i in range(6)])
    assert sorted(count for _, count in cache.shared.values()) == [6, 6]  # its pixel values and its grid, once
    assert len({id(r["pixel_values"]) for r in cache.rows.values()}) == 1


def test_a_first_batch_unlike_trl_s_turns_it_off(zoo, cfg, tmp_path, caplog):
    """Put together wrongly (here: padded with another token than TRL pads with), the first batch differs from
    TRL's and the cache turns itself off before any batch of its own is used."""
    ds = _dataset([_row(i) for i in range(4)])
    trainer = _collator(zoo, cfg, tmp_path, "judge", ds)
    inner = trainer.data_collator
    cached = SampleIdCollator(inner, RowCollationCache(inner, inner.processor.tokenizer.pad_token_id + 1, 64 << 20))
    for a, b in zip(_batches(ds, [0, 1, 2, 3], 4), _batches(ds, [0, 1, 2, 3], 4), strict=True):
        got, want = cached(a), SampleIdCollator(inner)(b)
        assert all(torch.equal(got[k], want[k]) for k in want if k != "sample_ids")
    assert not cached.by_id.on and "input_ids" in caplog.text


def test_the_cache_keeps_to_its_size(zoo, cfg, tmp_path):
    ds = _dataset([_row(i, background=(255, 255, 20 * i)) for i in range(8)])  # eight different images
    trainer = _collator(zoo, cfg, tmp_path, "judge", ds)
    one = trainer.data_collator([{k: v for k, v in ds[0].items() if k in ("images", "prompt", "completion")}])
    row_bytes = sum(v.numel() * v.element_size() for v in one.values())
    cache = RowCollationCache(trainer.data_collator, trainer.processing_class.tokenizer.pad_token_id,
                              int(row_bytes * 3.5))
    collate = SampleIdCollator(trainer.data_collator, cache)
    for batch in _batches(ds, [*range(8)], 2):
        collate(batch)
    assert len(cache.rows) <= 3 and cache.bytes <= cache.max_bytes and cache.on
    assert list(cache.rows) == [ds[i]["sample_id"] for i in range(8)][-len(cache.rows):]  # the newest kept
    held = {id(v): v for r in cache.rows.values() for v in r.values()}  # each shared tensor once
    assert cache.bytes == sum(v.numel() * v.element_size() for v in held.values())
    assert sum(count for _, count in cache.shared.values()) == 2 * len(cache.rows)  # none left of dropped rows


def test_training_steps_on_the_same_losses_with_the_cache(zoo, cfg, tmp_path):
    """hf.attach puts the cache in (train.collation_cache_mb); two epochs, the second from the cache."""
    ds = _dataset([_row(i) for i in range(8)])
    losses = {}
    for mb in (0, 64):
        trainer = _collator(zoo, cfg, tmp_path / str(mb), "judge", ds, max_steps=None, epochs=2, batch_size=2,
                            micro_batches=1, grad_accum_steps=1, logging_steps=1, collation_cache_mb=mb)
        settings = cfg.train.resolved("judge_sft").model_copy(update={"collation_cache_mb": mb})
        hf.attach(trainer, SimpleNamespace(settings=settings, steps=None))  # as the Ray Train worker does
        trainer.train()
        losses[mb] = [e["loss"] for e in trainer.state.log_history if "loss" in e]
        if mb:
            assert trainer.data_collator.by_id.hits == 8
        else:
            assert trainer.data_collator.by_id is None
    assert len(losses[0]) == 8 and losses[64] == losses[0]
