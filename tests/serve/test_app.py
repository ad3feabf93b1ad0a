"""The judge Serve app, for real: a private Ray, Serve's proxy on a free 127.0.0.1 port, the tiny judge registered
in MLflow and served by its alias (`models:/serve-test-judge@champion`), bearer-token auth on. Every route's happy
path and error codes, batches observed forming, 503 past saturation, and the HTTP engine as a client.

One module on purpose: the app is started once (about 30 s on 2 cores) and stopped at the end of the module, so
later test modules find no Serve replica holding a CPU."""

from __future__ import annotations

import base64
import io
import json
import os
import re
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace

import pytest
import requests
from PIL import Image

from flywheel.config import REPO_ROOT, load_config
from flywheel.raycluster import free_port
from registry_helpers import register_judge

TOKEN_ENV = "FLYWHEEL_SERVE_TEST_TOKEN"
TOKEN = "test-token-4f1c"
MODEL = "serve-test-judge"  # its own registered name: versions of other tests' `judge` never interfere


def png(size=(56, 56), colour="red") -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", size, colour).save(buf, format="PNG")
    return buf.getvalue()


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


@pytest.fixture(scope="module")
def app(cfg, zoo):
    import ray
    from ray import serve

    from flywheel.serve.app import deploy

    scfg = load_config(REPO_ROOT / "configs" / "local.yaml", [
        f"run.workdir={cfg.run.workdir}", f"train.registry.judge={MODEL}", f"serve.model=models:/{MODEL}@champion",
        f"serve.port={free_port()}", f"serve.auth_token_env={TOKEN_ENV}", "serve.app_name=judge-test",
        "serve.max_batch_size=8", "serve.batch_wait_timeout_s=0.05", "serve.max_ongoing_requests=8",
        "serve.max_queued_requests=8", "serve.limits.max_body_bytes=200000", "serve.limits.max_image_pixels=4096",
        "serve.limits.max_items=4", "serve.limits.max_images=6", "serve.limits.max_tokens=64",
        "judge.generation.max_new_tokens=16", "resources.serve.actors=1", "resources.serve.num_cpus=1"])
    version = register_judge(scfg, zoo["judge"], tag="serve-test")
    old_token = os.environ.get(TOKEN_ENV)
    os.environ[TOKEN_ENV] = TOKEN
    started_ray = not ray.is_initialized()
    try:
        d = deploy(scfg)
        yield SimpleNamespace(url=d.url, cfg=scfg, served=d.served, version=version,
                              auth={"Authorization": f"Bearer {TOKEN}"})
    finally:
        try:
            serve.shutdown()  # only the Serve instance this fixture started
        finally:
            if started_ray:
                ray.shutdown()
            if old_token is None:
                os.environ.pop(TOKEN_ENV, None)
            else:
                os.environ[TOKEN_ENV] = old_token


def post(app, route: str, body, auth=True, **kw) -> requests.Response:
    headers = dict(app.auth) if auth else {}
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    return requests.post(app.url + route, data=data, headers={**headers, "Content-Type": "application/json"},
                         timeout=120, **kw)


def error_of(resp: requests.Response) -> str:
    return resp.json()["error"]["message"]


def item(colour="red", answer="Red."):
    return {"prompt": {"task": "iu", "subtask": "iu_color", "query": "What colour is the shape?",
                       "images": [b64(png(colour=colour))]},
            "candidate": {"candidate_id": f"c-{colour}", "output_text": answer}}


def chat(text="Rate the image.", image=True, **kw):
    content = ([{"type": "image_url", "image_url": {"url": "data:image/png;base64," + b64(png())}}] if image else [])
    return {"model": "judge", "messages": [{"role": "user", "content": content + [{"type": "text", "text": text}]}],
            **kw}


# ---------------------------------------------------------------- health, version, auth
def test_healthz_needs_no_auth_and_names_the_registered_version(app):
    assert app.served.ref == f"models:/{MODEL}@champion" and app.served.version == app.version
    r = requests.get(app.url + "/healthz", timeout=30)
    assert r.status_code == 200 and r.json()["model_version"] == app.version and r.json()["status"] == "ok"
    assert r.headers["X-Model-Version"] == app.version


def test_auth_answers_401_without_or_with_a_wrong_token(app):
    for headers, reason in [({}, "missing bearer token"), ({"Authorization": "Bearer nope"}, "invalid bearer token"),
                            ({"Authorization": f"Basic {TOKEN}"}, "missing bearer token")]:
        r = requests.post(app.url + "/v1/judge/pointwise", json={"items": [item()]}, headers=headers, timeout=30)
        assert r.status_code == 401 and reason in error_of(r), r.text
        assert r.headers["WWW-Authenticate"] == "Bearer" and r.json()["model_version"] == app.version
    assert requests.get(app.url + "/v1/models", timeout=30).status_code == 401
    r = requests.get(app.url + "/v1/models", headers=app.auth, timeout=30)
    assert r.status_code == 200 and r.json()["data"][0]["id"] == "judge"


# ---------------------------------------------------------------- judging routes
def test_pointwise_route(app):
    r = post(app, "/v1/judge/pointwise", {"items": [item("red"), item("blue", "Blue.")]})
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["model_version"] == app.version and out["protocol"] == "pointwise" and len(out["results"]) == 2
    for res, cid in zip(out["results"], ["c-red", "c-blue"], strict=True):
        assert res["candidate_id"] == cid and isinstance(res["raw"], str) and res["error"] is None
        # the tiny judge is random: whatever it wrote is parsed strictly, and a failure is never a score
        assert (res["score"] is None) == (res["parse_error"] is not None)
    assert out["usage"]["generations"] == 2 and out["usage"]["prompt_tokens"] > 0


def test_pairwise_route_judges_both_orders(app):
    body = {"items": [{"prompt": item()["prompt"], "candidate_a": {"candidate_id": "a", "output_text": "Red."},
                       "candidate_b": {"candidate_id": "b", "output_text": "Blue."}, "aspect": "color_accuracy"}]}
    r = post(app, "/v1/judge/pairwise", body)
    assert r.status_code == 200, r.text
    res = r.json()["results"][0]
    assert set(res["orders"]) == {"AB", "BA"} and res["candidate_ids"] == ["a", "b"]
    assert "position_consistent" in res and "verdict" in res and "verdict_balanced" in res


def test_aspects_route_scores_both_groups(app):
    r = post(app, "/v1/judge/aspects", {"items": [item()]})
    assert r.status_code == 200, r.text
    res = r.json()["results"][0]
    assert set(res["groups"]) == {"universal", "task"} and "color_accuracy" in res["groups"]["task"]["aspects"]
    assert r.json()["usage"]["generations"] == 2


def test_chat_completions_is_openai_compatible(app):
    r = post(app, "/v1/chat/completions", chat(max_tokens=8))
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["object"] == "chat.completion" and out["model"] == "judge" and out["model_version"] == app.version
    assert out["choices"][0]["message"]["role"] == "assistant" and isinstance(out["choices"][0]["message"]["content"],
                                                                              str)
    assert 0 < out["usage"]["completion_tokens"] <= 8 and out["usage"]["prompt_tokens"] > 0
    r = post(app, "/v1/chat/completions", chat(model="gpt-4o"))
    assert r.status_code == 404 and "not served here" in error_of(r)



def test_chat_completions_draws_n_choices_reproducibly(app):
    """OpenAI's n (judge.samples through Serve: the HTTP engine asks each request's samples at once): n sampled
    choices drawn together from the body's seed, so the same body answers the same, whatever else is in flight."""
    body = chat(max_tokens=12, temperature=1.0, seed=3, n=4)
    first = post(app, "/v1/chat/completions", body)
    assert first.status_code == 200, first.text
    texts = [c["message"]["content"] for c in first.json()["choices"]]
    assert [c["index"] for c in first.json()["choices"]] == [0, 1, 2, 3] and len(set(texts)) > 1  # samples differ
    with ThreadPoolExecutor(3) as ex:  # again, beside other sampled calls with the same seed
        again, *_ = ex.map(lambda b: post(app, "/v1/chat/completions", b),
                           [body, chat(max_tokens=12, temperature=1.0, seed=3, text="Other."), body])
    assert [c["message"]["content"] for c in again.json()["choices"]] == texts


def test_chat_completions_returns_logprobs_when_asked(app):
    r = post(app, "/v1/chat/completions", chat(max_tokens=6, logprobs=True, top_logprobs=3))
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    content = choice["logprobs"]["content"]
    assert 0 < len(content) <= r.json()["usage"]["completion_tokens"]  # up to the first special token (EOS)
    for t in content:
        assert set(t) == {"token", "logprob", "bytes", "top_logprobs"} and t["logprob"] <= 0, t
        alts = t["top_logprobs"]
        assert len(alts) == 3 and [a["logprob"] for a in alts] == sorted((a["logprob"] for a in alts), reverse=True)
        # the judge decodes greedily: the chosen token is the most likely one
        assert alts[0]["token"] == t["token"] and alts[0]["logprob"] == pytest.approx(t["logprob"]), t
    # not asked: null, whatever the served judge's own generation.top_logprobs (local.yaml asks for 5)
    plain = post(app, "/v1/chat/completions", chat(max_tokens=6)).json()["choices"][0]
    assert plain["logprobs"] is None and plain["message"]["content"] == choice["message"]["content"]

# ---------------------------------------------------------------- limits: 413 and 422 with the reason
def test_limits_answer_413_with_the_reason(app):
    r = post(app, "/v1/judge/pointwise", {"items": [item()], "pad": "x" * 300_000})
    assert r.status_code == 413 and "the limit is 200000" in error_of(r)
    big = item()
    big["prompt"]["images"] = [b64(png(size=(112, 112)))]
    r = post(app, "/v1/judge/pointwise", {"items": [big]})
    assert r.status_code == 413 and error_of(r) == ("items[0].prompt.images[0]: 112x112 = 12544 pixels; the limit "
                                                    "is 4096 per image")
    r = post(app, "/v1/judge/pointwise", {"items": [item()] * 5})
    assert r.status_code == 413 and error_of(r) == "5 items in one request; the limit is 4"
    r = post(app, "/v1/chat/completions", {"messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "data:image/png;base64," + b64(png())}}] * 7}]})
    assert r.status_code == 413 and error_of(r) == "7 images in one request; the limit is 6"
    assert r.json()["model_version"] == app.version


def test_malformed_requests_answer_422_with_the_reason(app):
    cases = [
        ("/v1/judge/pointwise", b"{not json", "not valid JSON"),
        ("/v1/judge/pointwise", {"items": [{**item(), "extra": 1}]}, "items.0.extra: unsupported field"),
        ("/v1/judge/pointwise", {"items": [{**item(), "prompt": {"task": "cooking", "query": "?"}}]}, "cooking"),
        ("/v1/chat/completions", chat(stream=True), "stream"),
        ("/v1/chat/completions", chat(max_tokens=65), "max_tokens 65 exceeds this server's limit of 64"),
        ("/v1/chat/completions", chat(top_logprobs=2), "top_logprobs needs logprobs: true"),
        ("/v1/chat/completions", chat(logprobs=True, top_logprobs=21), "top_logprobs: Input should be less than or "
                                                                      "equal to 20"),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}}]}]}, "not fetched"),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": "data:image/jpeg;base64,AAAA"}}]}]}, "only data:image/png"),
    ]
    for route, body, reason in cases:
        r = post(app, route, body)
        assert r.status_code == 422 and reason in error_of(r), (route, r.status_code, r.text)


# ---------------------------------------------------------------- batching and overload
def _stats(app) -> dict:
    return requests.get(app.url + "/stats", headers=app.auth, timeout=30).json()


def _patiently(app, body) -> int:
    """A client that backs off on 503 (simultaneous arrivals may briefly exceed the small test queue)."""
    for _ in range(10):
        status = post(app, "/v1/chat/completions", body).status_code
        if status != 503:
            return status
        time.sleep(0.2)
    return status


def test_concurrent_requests_form_batches(app):
    before = Counter({int(k): v for k, v in _stats(app)["batch_sizes"].items()})
    with ThreadPoolExecutor(16) as pool:
        statuses = list(pool.map(lambda _: _patiently(app, chat(max_tokens=16)), range(16)))
    assert statuses == [200] * 16
    after = _stats(app)
    formed = Counter({int(k): v for k, v in after["batch_sizes"].items()}) - before
    assert sum(k * v for k, v in formed.items()) == 16, formed  # every request went through a batch
    assert max(formed) > 1 and max(formed) <= 8, formed  # batches formed, never above max_batch_size
    assert sum(formed.values()) < 16, formed


def test_past_saturation_it_answers_503_instead_of_queueing(app):
    # 8 in flight + 8 queued fit; the rest of 64 simultaneous requests must be refused at once
    with ThreadPoolExecutor(64) as pool:
        answers = list(pool.map(lambda _: post(app, "/v1/chat/completions", chat(max_tokens=64)), range(64)))
    statuses = Counter(r.status_code for r in answers)
    assert set(statuses) <= {200, 503}, statuses
    assert statuses[503] > 0 and statuses[200] >= 8, statuses
    refused = next(r for r in answers if r.status_code == 503)
    assert refused.headers.get("Retry-After") == "1"  # serve.retry_after_s, which the http engine honours
    assert requests.get(app.url + "/healthz", timeout=30).status_code == 200  # and it keeps serving


# ---------------------------------------------------------------- the HTTP engine as a client of the app
def test_http_engine_uses_the_app_like_a_stage_would(app):
    from flywheel.engines import make_text_engine
    from flywheel.engines.hf import HFTextEngine
    from flywheel.judge import pointwise as pt
    from flywheel.serve.model import local_weights

    cfg = load_config(REPO_ROOT / "configs" / "local.yaml", [
        f"run.workdir={app.cfg.run.workdir}", "judge.engine=http", f"judge.http.base_url={app.url}/v1",
        f"judge.http.api_key_env={TOKEN_ENV}", "judge.http.max_concurrency=4", "judge.generation.max_new_tokens=12",
        "judge.generation.top_logprobs=5"])
    engine = make_text_engine(cfg, "judge")
    records = [({"task": "iu", "subtask": "iu_color", "query": "What colour is the shape?", "images": [png(colour=c)]},
                {"candidate_id": f"c{i}", "output_text": f"It is {c}."})
               for i, c in enumerate(["red", "green", "blue", "yellow", "white", "black"])]
    reqs = [pt.build(p, c) for p, c in records]
    results = engine.generate(reqs)
    assert all(r.ok for r in results), [r.error for r in results]
    assert engine.version == app.version  # the served version, as reported by the app
    assert engine.usage.succeeded == 6 and engine.usage.prompt_tokens == sum(r.prompt_tokens for r in results) > 0
    parsed = [pt.to_judgment_fields(pt.parse(r.text)) for r in results]
    assert all((f["score"] is None) == (f["parse_error"] is not None) for f in parsed)
    # the same requests on the same weights, locally: same prompts (token counts) and same greedy outputs
    local = HFTextEngine(local_weights(app.cfg, app.served), cfg.judge.generation.model_copy(
        update={"batch_size": 1})).generate(reqs)
    assert [r.prompt_tokens for r in local] == [r.prompt_tokens for r in results]
    assert [r.text for r in local] == [r.text for r in results]
    # and the same log-probabilities: asked for by the engine, answered in OpenAI's form by the app, read back
    for lr, rr in zip(local, results, strict=True):
        assert rr.logprobs and [t.token for t in rr.logprobs] == [t.token for t in lr.logprobs]
        assert [t.logprob for t in rr.logprobs] == pytest.approx([t.logprob for t in lr.logprobs], abs=1e-4)
        assert [len(t.top) for t in rr.logprobs] == [len(t.top) for t in lr.logprobs]


def test_a_second_app_is_reached_on_the_port_serve_already_runs(app):
    """Serve keeps the proxy options it started with: a later deployment asking another port is reached on the
    running proxy's, and the URL it returns says so (not a port where nothing, or another cluster, listens)."""
    from ray import serve

    from flywheel.serve.app import deploy

    other = app.cfg.model_copy(update={"serve": app.cfg.serve.model_copy(update={
        "app_name": "judge-test-second", "route_prefix": "/second", "port": free_port(), "auth_token_env": None})})
    d = deploy(other)
    try:
        assert d.url == app.url + "/second"
        assert requests.get(d.url + "/healthz", timeout=30).json()["model_version"] == app.version
    finally:
        serve.delete(d.app_name)


def test_judge_samples_are_drawn_per_request_reproducibly(app):
    """An app with judge.samples=4 (a second app on the running proxy): each pointwise or pairwise request is
    answered 4 times, its samples drawn together in one job of their own, so the same body and seed answer the
    same beside other calls in flight, and another seed draws other samples. (The tiny judge is random: how the
    samples' ratings are averaged or voted is tested on scripted judges, tests/engines/test_samples.py.)"""
    from ray import serve

    from flywheel.config import Config
    from flywheel.serve.app import deploy

    d = app.cfg.model_dump(mode="json")
    d["serve"].update(app_name="judge-test-sampled", route_prefix="/sampled", auth_token_env=None)
    d["judge"]["samples"] = 4
    d["judge"]["generation"]["temperature"] = 1.0
    sampled = deploy(Config.model_validate(d))
    url = sampled.url + "/v1/judge/pointwise"
    try:
        body = {"items": [item("red"), item("blue", "Blue."), item("green", "Green.")], "seed": 3}
        first = requests.post(url, json=body, timeout=120)
        assert first.status_code == 200, first.text
        assert first.json()["usage"]["generations"] == 3 * 4  # every sample counted
        with ThreadPoolExecutor(3) as ex:  # again, beside a call with another seed and one with other items
            again, other_seed, _ = ex.map(lambda b: requests.post(url, json=b, timeout=120), [
                body, {**body, "seed": 4}, {"items": [item("white", "White.")] * 2, "seed": 3}])
        assert again.json()["results"] == first.json()["results"]
        assert [r["raw"] for r in other_seed.json()["results"]] != [r["raw"] for r in first.json()["results"]]
        pair = {"items": [{"prompt": item()["prompt"], "candidate_a": {"candidate_id": "a", "output_text": "Red."},
                           "candidate_b": {"candidate_id": "b", "output_text": "Blue."}}], "seed": 3}
        r = requests.post(sampled.url + "/v1/judge/pairwise", json=pair, timeout=120)
        assert r.status_code == 200 and r.json()["usage"]["generations"] == 2 * 4, r.text  # both orders, 4 each
        r = requests.post(sampled.url + "/v1/judge/aspects", json={"items": [item()], "seed": 3}, timeout=120)
        assert r.status_code == 200 and r.json()["usage"]["generations"] == 2, r.text  # aspects: answered once
    finally:
        serve.delete(sampled.app_name)


@pytest.mark.timeout(180)  # unbounded, serve.run waits for the replica for ever
def test_replicas_no_node_fits_fail_after_the_configured_wait_and_the_app_goes(app, caplog):
    """This box has no GPU: a replica asking one is never placed. The deploy warns at once, gives up after
    ray.wait_for_actors_s and deletes the app it started."""
    from ray import serve

    from flywheel.raycluster import ActorsDidNotStart
    from flywheel.serve.app import deploy

    other = app.cfg.model_copy(update={
        "serve": app.cfg.serve.model_copy(update={"app_name": "judge-test-gpu", "route_prefix": "/gpu"}),
        "resources": app.cfg.resources.model_copy(update={"serve": app.cfg.resources.serve.model_copy(update={
            "num_gpus": 1})}),
        "ray": app.cfg.ray.model_copy(update={"wait_for_actors_s": 4})})
    t0 = time.monotonic()
    with caplog.at_level("WARNING"), pytest.raises(
            ActorsDidNotStart, match=r"serve: the replicas of judge-test-gpu, each with CPU 1, GPU 1, were not up "
                                     r"within 4 s \(ray.wait_for_actors_s\)"):
        deploy(other)
    assert time.monotonic() - t0 < 60
    assert "serve: each replica asks CPU 1, GPU 1 and no live node has that" in caplog.text
    assert "judge-test-gpu" not in serve.status().applications
    assert requests.get(app.url + "/healthz", timeout=30).ok  # the app that fits is untouched


def test_apps_left_by_gone_drivers_are_deleted_and_live_ones_kept(app):
    """flywheel/serve/orphans.py: an app matching the pattern without a live owner is deleted; one whose owner
    lives (this driver's) and an app outside the pattern (a user's judge) are kept. An owner that died is started
    again. The owner of a driver that is killed goes with it: tests/cluster/test_serve_cluster.py."""
    import ray
    from ray import serve

    from flywheel.serve import orphans

    @serve.deployment(num_replicas=1, ray_actor_options={"num_cpus": 0})
    def hello(_request) -> str:
        return "hi"

    gone, live = "orph-preferences-0000dead", "orph-preferences-0000beef"
    orphans.hold_owner(live)
    orphans.hold_owner(live)  # held once per driver: a second deployment of the app reuses the owner
    for name in (gone, live):
        serve.run(hello.bind(), name=name, route_prefix=f"/{name}")
    held = dict(orphans._HELD)  # the handles keep the owners alive (Ray collects an unreferenced actor)
    try:
        assert orphans.owner_alive(live) and not orphans.owner_alive(gone)
        assert orphans.remove_orphans(re.compile(r"orph-preferences-[0-9a-f]{8}")) == [gone]
        apps = serve.status().applications
        assert live in apps and gone not in apps and app.cfg.serve.app_name in apps
        # another driver deploying the same app while its owner lives is refused, with the reason
        orphans._HELD.clear()
        with pytest.raises(RuntimeError, match="another live driver"):
            orphans.hold_owner(live, retry_s=1)
        orphans._HELD.update(held)
        # an owner lost (its node, here killed) is started again by the next deployment, not trusted as held
        (owner,) = [h for key, h in held.items() if key[2] == live]
        ray.kill(owner)
        deadline = time.time() + 30
        while orphans.owner_alive(live) and time.time() < deadline:
            time.sleep(0.2)
        assert not orphans.owner_alive(live)
        orphans.hold_owner(live)
        assert orphans.owner_alive(live)
    finally:
        for key, handle in held.items():  # after a failure above: never left cleared
            orphans._HELD.setdefault(key, handle)
        for name in (gone, live):
            serve.delete(name)
