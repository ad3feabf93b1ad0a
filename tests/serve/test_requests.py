"""The Serve app's request handling as plain functions (no Ray): image decoding and limits, body parsing, the
judging plans built with the protocols' builders and their strict parsing, the OpenAI body, deployment options.
The routes themselves, on a real Serve app: tests/serve/test_app.py."""

from __future__ import annotations

import base64
import io
import json
import math

import pytest
from PIL import Image

from flywheel.aspects import AspectTree
from flywheel.config import GenerationConfig, ServeLimitsConfig, load_config
from flywheel.engines.base import TextResult, TokenLogprobs
from flywheel.judge import aspects as ap
from flywheel.judge import pairwise as pw
from flywheel.judge import pointwise as pt
from flywheel.serve.chat import chat_request, chat_response
from flywheel.serve.judging import plan_aspects, plan_pairwise, plan_pointwise
from flywheel.serve.schemas import (AspectsBody, ChatBody, PairwiseBody, PointwiseBody, RequestError, decode_png,
                                    parse_body)

LIMITS = ServeLimitsConfig(max_image_pixels=64 * 64, max_images=4, max_items=3, max_body_bytes=100_000)


def b64png(size=(56, 56), colour="red", fmt="PNG") -> str:
    buf = io.BytesIO()
    Image.new("RGB", size, colour).save(buf, format=fmt)
    return base64.b64encode(buf.getvalue()).decode()


def status_of(fn, *args) -> tuple[int, str]:
    with pytest.raises(RequestError) as e:
        fn(*args)
    return e.value.status, e.value.reason


@pytest.fixture(scope="module")
def tree():
    return AspectTree.load()


# ---------------------------------------------------------------- images
def test_decode_png_accepts_inline_png_only():
    raw = decode_png(b64png(), "img", LIMITS)
    assert raw[:4] == b"\x89PNG"
    assert decode_png("data:image/png;base64," + b64png(), "img", LIMITS) == raw
    for bad, why in [("https://example.com/a.png", "not fetched"), ("file:///etc/passwd", "not fetched"),
                     ("data:image/jpeg;base64," + b64png(fmt="JPEG"), "only data:image/png"),
                     (b64png(fmt="JPEG"), "not a PNG"), ("%%%not base64%%%", "not valid base64"),
                     (base64.b64encode(base64.b64decode(b64png())[:60]).decode(), "img")]:
        status, reason = status_of(decode_png, bad, "img", LIMITS)
        assert status == 422 and why in reason, (bad[:30], reason)
    status, reason = status_of(decode_png, b64png(size=(112, 112)), "items[0].prompt.images[0]", LIMITS)
    assert status == 413 and reason == "items[0].prompt.images[0]: 112x112 = 12544 pixels; the limit is 4096 per image"


# ---------------------------------------------------------------- bodies
def test_parse_body_names_every_problem():
    assert status_of(parse_body, b"{not json", PointwiseBody)[0] == 422
    status, reason = status_of(parse_body, json.dumps({"items": [{"prompt": {"task": "iu"}, "candidate": {},
                                                                  "colour": 1}]}).encode(), PointwiseBody)
    assert status == 422 and "items.0.colour: unsupported field" in reason
    assert "items: List should have at least 1 item" in status_of(parse_body, b'{"items": []}', PointwiseBody)[1]
    status, reason = status_of(parse_body, json.dumps({"messages": [{"role": "user", "content": "hi"}],
                                                       "stream": True}).encode(), ChatBody)
    assert status == 422 and reason.startswith("stream:")


def _pointwise(n=1, images=1, **prompt):
    item = {"prompt": {"task": "iu", "subtask": "iu_color", "query": "What colour?",
                       "images": [b64png() for _ in range(images)], **prompt},
            "candidate": {"candidate_id": "c", "output_text": "Red."}}
    return PointwiseBody.model_validate({"items": [item] * n})


def test_plans_refuse_too_many_items_or_images_and_bad_records():
    assert status_of(plan_pointwise, _pointwise(n=4), LIMITS) == (413, "4 items in one request; the limit is 3")
    assert status_of(plan_pointwise, _pointwise(n=1, images=5), LIMITS) == (413, "5 images in one request; the "
                                                                                  "limit is 4")
    status, reason = status_of(plan_pointwise, _pointwise(task="cooking"), LIMITS)
    assert status == 422 and reason.startswith("items[0]: ") and "cooking" in reason
    body = PointwiseBody.model_validate({"items": [{"prompt": {"task": "iu"}, "candidate": {}}]})
    status, reason = status_of(plan_pointwise, body, LIMITS)
    assert status == 422 and "neither output_text nor output_images" in reason


def test_pointwise_plan_uses_the_protocol_builder_and_parses_strictly():
    plan = plan_pointwise(_pointwise(n=3), LIMITS)
    assert len(plan.requests) == 3 and len(plan.requests[0].images) == 1
    assert "###Task Instance###" in plan.requests[0].messages[0]["content"][0]["text"]
    good = pt.format(pt.PointwiseJudgment("The shape is red.", 4))
    out = plan.assemble([TextResult(text=good), TextResult(text="Rating: 9"), TextResult(error="boom")])
    assert out[0]["score"] == 4.0 and out[0]["parse_error"] is None and out[0]["analysis"] == "The shape is red."
    assert out[1]["score"] is None and out[1]["parse_error"] == "no 'Analysis:' line" and out[1]["raw"] == "Rating: 9"
    assert out[2] == {"candidate_id": "c", "raw": None, "error": "boom", "parsed": None, "score": None,
                      "verdict": None, "parse_error": None, "analysis": None}


def test_pairwise_plan_judges_both_orders_and_flags_position_inconsistency(tree):
    item = {"prompt": {"task": "iu", "query": "What colour?", "images": [b64png()]},
            "candidate_a": {"candidate_id": "a", "output_text": "Red."},
            "candidate_b": {"candidate_id": "b", "output_text": "Blue."}}
    body = PairwiseBody.model_validate({"items": [item, item, {**item, "orders": ["BA"]}]})
    plan = plan_pairwise(body, LIMITS, tree)
    assert len(plan.requests) == 5
    assert "Red." in plan.requests[0].messages[0]["content"][-1]["text"].split("###Response B###")[0]
    assert "Blue." in plan.requests[1].messages[0]["content"][-1]["text"].split("###Response B###")[0]

    def v(x):
        return TextResult(text=pw.format(pw.PairwiseJudgment("Because.", x)))

    out = plan.assemble([v("A"), v("B"), v("A"), v("A"), v("A")])
    assert out[0]["verdict"] == "A" and out[0]["position_consistent"] is True
    assert out[0]["orders"]["BA"]["parsed"] == {"verdict": "B", "order": "BA"}
    assert out[1]["verdict"] is None and out[1]["position_consistent"] is False
    assert out[2]["verdict"] == "B" and out[2]["position_consistent"] is None  # BA only, mapped to the AB frame
    assert [o["verdict_balanced"] for o in out] == [None] * 3  # read as text: no probabilities to balance
    bad = PairwiseBody.model_validate({"items": [{**item, "aspect": "no_such_aspect"}]})
    assert status_of(plan_pairwise, bad, LIMITS, tree)[0] == 422
    with_ref = {**item, "prompt": {**item["prompt"], "reference_text": "Red."}}
    shown = plan_pairwise(PairwiseBody.model_validate({"items": [with_ref]}), LIMITS, tree).requests[0]
    hidden = plan_pairwise(PairwiseBody.model_validate({"items": [{**with_ref, "use_reference": False}]}),
                           LIMITS, tree).requests[0]
    assert "###Reference Answer###\nRed.\n" in shown.messages[0]["content"][-1]["text"]
    assert "Reference" not in hidden.messages[0]["content"][-1]["text"]


def test_pairwise_plan_read_with_probabilities_gives_a_balanced_verdict(tree):
    """judge.rating_readout=expected: each order's verdict probabilities are returned, and one verdict from both
    (pairwise.balanced_verdict) even where the written verdicts are position-inconsistent."""
    item = {"prompt": {"task": "iu", "query": "What colour?"},
            "candidate_a": {"candidate_id": "a", "output_text": "Red."},
            "candidate_b": {"candidate_id": "b", "output_text": "Blue."}}
    body = PairwiseBody.model_validate({"items": [item, {**item, "orders": ["AB"]}]})
    plan = plan_pairwise(body, LIMITS, tree, readout="expected")

    def said_a(p_a):  # "Verdict: A" with P(A) = p_a at its token
        tok = lambda t, p: TokenLogprobs(t, math.log(p), {" A": math.log(p_a), " B": math.log(1 - p_a)})  # noqa: E731
        return TextResult(text=pw.format(pw.PairwiseJudgment("Because.", "A")), logprobs=[tok(" A", p_a)])

    out = plan.assemble([said_a(0.6), said_a(0.9), said_a(0.9)])
    assert out[0]["verdict"] is None and out[0]["position_consistent"] is False  # "A" both times
    assert out[0]["orders"]["BA"]["parsed"]["verdict_probs"] == pytest.approx({"A": 0.9, "B": 0.1, "tie": 0.0})
    assert out[0]["verdict_balanced"] == "B"  # surer of "A" when B sat there
    assert out[1]["verdict"] == "A" and out[1]["verdict_balanced"] is None  # one order only


def test_aspects_plan_selects_from_the_tree_and_merges_group_scores(tree):
    item = {"prompt": {"task": "iu", "subtask": "iu_color", "query": "What colour?", "images": [b64png()]},
            "candidate": {"candidate_id": "c", "output_text": "Red."}}
    plan = plan_aspects(AspectsBody.model_validate({"items": [item]}), LIMITS, tree)
    assert len(plan.requests) == 2  # universal (no query, no input image) + task
    assert plan.requests[0].images == [] and len(plan.requests[1].images) == 1
    sel = ap.select(tree, {"task": "iu", "subtask": "iu_color"}, {"output_text": "Red."})
    text = [ap.format([ap.AspectJudgment(a, "Fine.", 4) for a in ap.expected(sel, g)]) for g in ("universal", "task")]
    out = plan.assemble([TextResult(text=text[0]), TextResult(text=text[1])])[0]
    assert out["score"] == 4.0 and set(out["scores"]) == set(sel.names)
    out = plan.assemble([TextResult(text=text[0]), TextResult(text="color_accuracy: ok Score: 5")])[0]
    assert out["groups"]["task"]["parse_error"].startswith("aspect") and out["score"] is None
    no_sub = AspectsBody.model_validate({"items": [{**item, "prompt": {"task": "iu"}}]})
    assert status_of(plan_aspects, no_sub, LIMITS, tree)[0] == 422


# ---------------------------------------------------------------- OpenAI body
def test_chat_request_maps_image_parts_and_enforces_caps():
    body = ChatBody.model_validate({"model": "judge", "temperature": 0.5, "max_tokens": 8, "seed": 7, "messages": [
        {"role": "system", "content": "Be strict."},
        {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:image/png;base64," + b64png()}},
                                     {"type": "text", "text": "Rate it."}]}]})
    req, gen, seed = chat_request(body, LIMITS, GenerationConfig(max_new_tokens=16), 16)
    assert req.messages[1]["content"] == [{"type": "image"}, {"type": "text", "text": "Rate it."}]
    assert len(req.images) == 1 and gen.max_new_tokens == 8 and gen.temperature == 0.5 and seed == 7
    too_many = body.model_copy(update={"max_tokens": 17})
    assert status_of(chat_request, too_many, LIMITS, GenerationConfig(), 16) == (
        422, "max_tokens 17 exceeds this server's limit of 16")
    url = ChatBody.model_validate({"messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "http://127.0.0.1/x.png"}}]}]})
    assert status_of(chat_request, url, LIMITS, GenerationConfig(), 16)[0] == 422
    resp = chat_response(TextResult(text="hi", prompt_tokens=5, completion_tokens=8), "judge", "v1", 8)
    assert resp["choices"][0]["finish_reason"] == "length" and resp["usage"]["total_tokens"] == 13
    assert resp["model_version"] == "v1" and resp["object"] == "chat.completion"
    # n choices: one per result, the prompt's tokens counted once
    many = chat_response([TextResult(text="a", prompt_tokens=5, completion_tokens=2),
                          TextResult(text="b", prompt_tokens=5, completion_tokens=3)], "judge", "v1", 8)
    assert [(c["index"], c["message"]["content"]) for c in many["choices"]] == [(0, "a"), (1, "b")]
    assert many["usage"] == {"prompt_tokens": 5, "completion_tokens": 5, "total_tokens": 10}
    assert status_of(parse_body, json.dumps({**body.model_dump(exclude_none=True), "n": 65}).encode(),
                     ChatBody)[0] == 422



def test_chat_logprobs_follow_openai():
    base = {"messages": [{"role": "user", "content": "Rate it."}]}
    judge = GenerationConfig(max_new_tokens=16, top_logprobs=5)  # a judge that reads its ratings' probabilities

    def engine_k(**kw) -> int:
        return chat_request(ChatBody.model_validate({**base, **kw}), LIMITS, judge, 16)[1].top_logprobs

    # not asked: none (the judge's own setting does not leak into a chat); logprobs alone: the chosen token's,
    # which engines give with one alternative
    assert engine_k() == 0 and engine_k(logprobs=False) == 0
    assert engine_k(logprobs=True) == 1 and engine_k(logprobs=True, top_logprobs=0) == 1
    assert engine_k(logprobs=True, top_logprobs=3) == 3 and engine_k(logprobs=True, top_logprobs=20) == 20
    for kw in ({"top_logprobs": 2}, {"logprobs": False, "top_logprobs": 0}):
        assert status_of(chat_request, ChatBody.model_validate({**base, **kw}), LIMITS, judge, 16) == (
            422, "top_logprobs needs logprobs: true")
    for bad, reason in [(21, "less than or equal to 20"), (-1, "greater than or equal to 0")]:
        raw = json.dumps({**base, "logprobs": True, "top_logprobs": bad}).encode()
        assert status_of(parse_body, raw, ChatBody) == (422, f"top_logprobs: Input should be {reason}")

    result = TextResult(text="4.", prompt_tokens=3, completion_tokens=2, logprobs=[
        TokenLogprobs("4", -0.2, {"3": -1.9, "4": -0.2, "5": -2.5}), TokenLogprobs(".", -0.01, {".": -0.01})])
    resp = chat_response(result, "judge", "v1", 8, top_logprobs=2)
    assert resp["choices"][0]["logprobs"] == {"content": [  # most likely first, at most top_logprobs
        {"token": "4", "logprob": -0.2, "bytes": None, "top_logprobs": [
            {"token": "4", "logprob": -0.2, "bytes": None}, {"token": "3", "logprob": -1.9, "bytes": None}]},
        {"token": ".", "logprob": -0.01, "bytes": None, "top_logprobs": [
            {"token": ".", "logprob": -0.01, "bytes": None}]}]}
    json.dumps(resp)
    zero = chat_response(result, "judge", "v1", 8, top_logprobs=0)["choices"][0]["logprobs"]["content"]
    assert [(t["token"], t["logprob"], t["top_logprobs"]) for t in zero] == [("4", -0.2, []), (".", -0.01, [])]
    assert len(chat_response(result, "judge", "v1", 8)["choices"][0]["logprobs"]["content"][0]["top_logprobs"]) == 3
    assert chat_response(TextResult(text="4."), "judge", "v1", 8, top_logprobs=2)["choices"][0]["logprobs"] is None

# ---------------------------------------------------------------- deployment options & auth
def test_deployment_options_follow_config(tmp_path, monkeypatch):
    from flywheel.serve.app import deployment_options, token_digest

    base = [f"run.workdir={tmp_path}"]
    cfg = load_config(None, base + ["resources.serve.actors=3", "resources.serve.num_gpus=1",
                                    "serve.max_queued_requests=5", "serve.max_ongoing_requests=20"])
    o = deployment_options(cfg)
    assert o["num_replicas"] == 3 and o["ray_actor_options"] == {"num_cpus": 1, "num_gpus": 1}
    assert o["max_queued_requests"] == 5 and o["max_ongoing_requests"] == 20 and "autoscaling_config" not in o
    cfg = load_config(None, base + ["serve.autoscaling={min_replicas: 1, max_replicas: 4}"])
    o = deployment_options(cfg)
    assert "num_replicas" not in o and o["autoscaling_config"]["max_replicas"] == 4
    cfg = load_config(None, base + ["judge.engine=vllm", "judge.vllm.tensor_parallel_size=2",
                                    "resources.serve.num_gpus=1"])
    o = deployment_options(cfg)
    assert o["placement_group_bundles"] == [{"CPU": 1}, {"GPU": 1}, {"GPU": 1}]
    assert o["ray_actor_options"]["num_gpus"] == 0
    with pytest.raises(ValueError, match="batches could never fill"):
        deployment_options(load_config(None, base + ["serve.max_batch_size=32", "serve.max_ongoing_requests=8"]))
    cfg = load_config(None, base + ["serve.auth_token_env=FLYWHEEL_TEST_SERVE_TOKEN"])
    monkeypatch.delenv("FLYWHEEL_TEST_SERVE_TOKEN", raising=False)
    with pytest.raises(RuntimeError, match="FLYWHEEL_TEST_SERVE_TOKEN"):
        token_digest(cfg)
    monkeypatch.setenv("FLYWHEEL_TEST_SERVE_TOKEN", "t0k")
    assert len(token_digest(cfg)) == 64 and "t0k" not in token_digest(cfg)
