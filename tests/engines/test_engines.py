"""Engines on the tiny checkpoints: batched, seeded, per-item results and per-item errors."""

import io

import pytest
from PIL import Image

from flywheel.engines import ImageRequest, TextRequest, make_image_engine, make_text_engine
from flywheel.engines.base import EngineFailure, TextResult, run_batched


def _png(color="red"):
    buf = io.BytesIO()
    Image.new("RGB", (56, 56), color).save(buf, format="PNG")
    return buf.getvalue()


def _ask(text, images=()):
    content = [{"type": "image"} for _ in images] + [{"type": "text", "text": text}]
    return TextRequest(messages=[{"role": "user", "content": content}], images=list(images))


@pytest.fixture(scope="module")
def policy(cfg, zoo):
    cfg = cfg.model_copy(deep=True)
    cfg.policy.generation.batch_size = 3
    cfg.policy.generation.max_new_tokens = 8
    return make_text_engine(cfg, "policy")


@pytest.fixture(scope="module")
def judge(cfg, zoo):
    return make_text_engine(cfg, "judge")


@pytest.mark.parametrize("engine_name", ["judge", "policy"])
def test_text_engines_answer_image_and_text_only_requests_in_order(engine_name, request, cfg):
    engine = request.getfixturevalue(engine_name)
    limit = getattr(cfg, engine_name).generation.max_new_tokens
    reqs = [_ask("What colour?", [_png("red")]), _ask("Describe a blue square."), _ask("Count.", [_png("blue")])]
    results = engine.generate(reqs)
    assert len(results) == 3
    assert all(r.ok and isinstance(r.text, str) for r in results), results
    assert results[0].prompt_tokens > results[1].prompt_tokens  # image tokens were counted
    assert all(0 < r.completion_tokens <= limit for r in results)
    assert engine.version and engine.name.startswith("hf:")


def test_bad_items_get_errors_and_never_sink_the_batch(policy):
    reqs = [
        _ask("fine", [_png()]),
        TextRequest(messages=[{"role": "user", "content": [{"type": "image"}]}], images=[b"not an image"]),
        _ask("placeholder but no image", []) if False else TextRequest(
            messages=[{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "x"}]}], images=[]),
        TextRequest(messages=[], images=[]),
        _ask("also fine", [_png("green")]),
    ]
    results = policy.generate(reqs)
    assert [r.ok for r in results] == [True, False, False, False, True]
    assert "undecodable image" in results[1].error
    assert "1 image placeholder(s) in messages but 0 image(s)" in results[2].error
    assert "non-empty" in results[3].error


def test_a_failing_item_inside_a_batch_is_isolated():
    calls = []

    def run(batch, seed):
        calls.append(list(batch))
        if "boom" in batch:
            raise RuntimeError("boom item")
        return [TextResult(text=x.upper()) for x in batch]

    out = run_batched(["a", "boom", "c", "d"], 3, run, lambda e: TextResult(error=e))
    assert [r.text for r in out] == ["A", None, "C", "D"]
    assert "boom item" in out[1].error
    assert calls[0] == ["a", "boom", "c"]  # the batch was tried whole first, then item by item


def test_a_batch_whose_every_item_fails_alone_too_is_the_engines_failure_not_the_items():
    def broken(batch, seed):
        raise RuntimeError("CUDA error: device lost")

    with pytest.raises(EngineFailure, match=r"all 2 items of a batch failed, each alone too \(first: RuntimeError: "
                                            r"CUDA error: device lost\)"):
        run_batched(["a", "b", "c"], 2, broken, lambda e: TextResult(error=e))
    # one item alone cannot tell the engine from the item: it gets its error, as an isolated bad item does
    assert run_batched(["a"], 2, broken, lambda e: TextResult(error=e))[0].error.endswith("device lost")


def test_sampling_is_seeded(cfg, zoo):
    cfg = cfg.model_copy(deep=True)
    cfg.policy.generation.temperature = 1.0
    cfg.policy.generation.max_new_tokens = 12
    engine = make_text_engine(cfg, "policy")
    reqs = [_ask("Describe.", [_png("red")]) for _ in range(4)]
    a, b = engine.generate(reqs, seed=7), engine.generate(reqs, seed=7)
    c = engine.generate(reqs, seed=8)
    assert [r.text for r in a] == [r.text for r in b]
    assert [r.text for r in a] != [r.text for r in c]
    assert len({r.text for r in a}) > 1  # temperature 1 on random weights: samples differ


@pytest.fixture(scope="module")
def generator(cfg, zoo):
    cfg = cfg.model_copy(deep=True)
    cfg.generator.generation.num_inference_steps = 2
    cfg.generator.generation.batch_size = 2
    return make_image_engine(cfg)


def test_image_engine_makes_one_image_per_prompt_and_flags_bad_ones(generator):
    results = generator.generate([ImageRequest("a red circle"), ImageRequest("   "), ImageRequest("a blue square")])
    assert [r.ok for r in results] == [True, False, True]
    assert results[0].image.size == (56, 56)
    assert "non-empty" in results[1].error


def test_image_seed_is_per_item_not_per_batch(generator):
    alone = generator.generate([ImageRequest("a red circle", seed=3)])[0].image
    mixed = generator.generate([ImageRequest("a green triangle", seed=9), ImageRequest("a red circle", seed=3)])
    import numpy as np

    def diff(a, b):
        return np.abs(np.asarray(a, dtype=int) - np.asarray(b, dtype=int))

    # Same noise, so the same image up to float rounding of a different batch shape (≤ a few levels of 255).
    assert diff(alone, mixed[1].image).max() <= 3
    other = generator.generate([ImageRequest("a red circle", seed=4)])[0].image
    assert diff(alone, other).mean() > 5


def test_unavailable_backends_are_clear_errors(cfg, zoo):
    c = cfg.model_copy(deep=True)
    c.policy.engine = "oracle"
    with pytest.raises(ValueError, match="policy.engine=oracle"):
        make_text_engine(c, "policy")
    with pytest.raises(ValueError, match="role must be"):
        make_text_engine(c, "critic")


def test_engines_run_on_the_gpu_they_were_given(monkeypatch, policy):
    """A GPU cluster must not run its engines on the CPU: "auto" takes CUDA when this process has it. This
    machine has no GPU, so CUDA's presence is faked - only for the device choice, nothing runs on it."""
    import torch

    from flywheel.engines.base import resolve_device

    assert policy.device == "cpu" and next(policy.model.parameters()).device.type == "cpu"
    assert resolve_device("cpu") == "cpu" and resolve_device("cuda:1") == "cuda:1"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert resolve_device() == "cuda" and resolve_device("auto") == "cuda"


def test_hf_engine_returns_the_models_top_logprobs_per_generated_token(cfg, zoo):
    cfg = cfg.model_copy(deep=True)
    cfg.judge.generation.max_new_tokens = 6
    cfg.judge.generation.top_logprobs = 0
    req = _ask("What colour?", [_png("red")])
    plain = make_text_engine(cfg, "judge").generate([req])[0]
    assert plain.logprobs is None  # not asked for: nothing extra computed or carried
    cfg.judge.generation.top_logprobs = 5
    (res,) = make_text_engine(cfg, "judge").generate([req])
    assert res.text == plain.text and res.logprobs is not None
    assert "".join(t.token for t in res.logprobs) == res.text  # tokens spell the output, in order
    for t in res.logprobs:
        assert len(t.top) == 5 and all(v <= 0 for v in t.top.values())
        assert max(t.top, key=t.top.get) == t.token  # greedy: the chosen token is the most likely
        assert t.logprob == pytest.approx(max(t.top.values()))
