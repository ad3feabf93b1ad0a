"""The per-image vision feature cache of trainings that keep the vision side frozen: the model computes the same
logits and gradients with it, each distinct image goes through the tower once, and it steps aside while the
vision side can learn."""

import pytest
import torch
from PIL import Image

from flywheel.models.vision import freeze_vision, image_features, vision_parameters
from flywheel.models.vision_cache import ImageFeatureCache, cache_image_features
from flywheel.train.hf import load_vlm


def _images():
    return [Image.new("RGB", (56, 56), c) for c in ("white", "red", "white", "blue")]


def _batch(model, processor, images):
    """A chat per image, as a training batch holds them (Qwen2-VL wants each row's images as a list)."""
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What is it?"}]},
                {"role": "assistant", "content": "A shape."}]
    text = processor.apply_chat_template(messages)
    qwen = type(model).__name__.startswith("Qwen2VL")
    return processor(text=[text] * len(images), images=[[i] for i in images] if qwen else images,
                     return_tensors="pt", padding=True)


@pytest.mark.parametrize("name", ["judge", "policy"])
def test_cached_features_give_the_same_logits_and_gradients_and_each_image_is_computed_once(zoo, name):
    model, processor = load_vlm(str(zoo[name]))
    freeze_vision(model)
    inputs = _batch(model, processor, _images())
    out = model(**inputs)
    out.logits.sum().backward()
    want_logits = out.logits.detach()
    want_grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad()
    want_features = image_features(model, processor, _images())

    cache = cache_image_features(model, 1 << 20)
    assert cache_image_features(model, 1 << 20) is cache  # installed once
    for calls in (1, 2):
        got = model(**inputs)
        assert torch.equal(got.logits, want_logits)
        got.logits.sum().backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        assert grads.keys() == want_grads.keys() and all(torch.equal(grads[n], want_grads[n]) for n in grads)
        model.zero_grad()
        # 3 distinct images of 4: computed once each, the repeat and every later call served from the cache
        assert (cache.misses, cache.hits) == (3, 1 + 4 * (calls - 1))
    # image_features (the model's own get_image_features) now reads the cache: the same features as before
    assert torch.equal(image_features(model, processor, _images()), want_features)
    assert cache.misses == 3

@pytest.mark.parametrize("name", ["judge", "policy"])
def test_a_vision_side_that_can_learn_is_not_cached(zoo, name):
    model, processor = load_vlm(str(zoo[name]))
    freeze_vision(model)
    cache = cache_image_features(model, 1 << 20)
    vision_parameters(model)[0].requires_grad_(True)
    inputs = _batch(model, processor, _images()[:2])
    model(**inputs).logits.sum().backward()
    assert (cache.hits, cache.misses, len(cache.entries)) == (0, 0, 0)
    assert vision_parameters(model)[0].grad is not None  # its gradient still flows


def test_the_cache_stays_within_its_size_and_drops_the_least_recently_used():
    vision = list(torch.nn.Linear(1, 1).requires_grad_(False).parameters())
    cache = ImageFeatureCache(vision, max_bytes=2 * 4 * 4)  # two entries of 4 float32s
    calls = []

    def compute(positions):
        calls.append(positions)
        return [torch.full((4,), float(p)) for p in positions]

    assert [t[0].item() for t in cache.lookup([b"a", b"b"], compute)] == [0, 1]
    cache.lookup([b"a"], compute)  # a is now the most recently used
    cache.lookup([b"c"], compute)
    assert list(cache.entries) == [b"a", b"c"] and cache.bytes == 32
    # a batch larger than the cache still gets every image's features
    got = cache.lookup([b"x", b"y", b"z", b"x"], compute)
    assert [t[0].item() for t in got] == [0, 1, 2, 0] and cache.bytes <= 32
    assert calls[-1] == [0, 1, 2]  # the repeated x computed once


@pytest.mark.parametrize("mb", [0, 64])
def test_trainings_install_the_cache_as_configured(cfg, zoo, mb):
    from flywheel.train.hf import keep_vision

    model, _ = load_vlm(str(zoo["judge"]))
    settings = cfg.train.resolved("judge_sft").model_copy(update={"image_feature_cache_mb": mb})
    assert settings.freeze_vision
    keep_vision(model, settings, None)
    cache = getattr(model.model, "_image_feature_cache", None)
    assert (cache is not None) == bool(mb) and (cache is None or cache.max_bytes == mb << 20)
