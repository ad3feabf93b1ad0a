"""The HTTP engine against a local OpenAI-style server that fails on purpose (127.0.0.1 only): retries with
backoff on 429/5xx/timeouts/connection errors, no retry on other 4xx, the concurrency limit, the API key from
the environment, token/cost accounting logged to MLflow, images as PNG data URLs.
(Against our own Serve app: tests/serve/test_app.py.)"""

from __future__ import annotations

import asyncio
import base64
import io
import json
import time
from collections import Counter

import pytest
from chat_server import ChatServer, completion
from PIL import Image

from flywheel.config import GenerationConfig, HttpEngineConfig, load_config
from flywheel.engines.base import TextRequest
from flywheel.engines.http import (EndpointRefused, EndpointUnavailable, HTTPTextEngine, MissingApiKey,
                                  openai_messages)
from flywheel.images import PNG_MAGIC
from flywheel.raycluster import free_port


# OpenAI's choices[0].logprobs for a two-token answer, with top_logprobs=2 (bytes as OpenAI sends them)
LOGPROBS = {"content": [
    {"token": "4", "logprob": -0.25, "bytes": [52],
     "top_logprobs": [{"token": "4", "logprob": -0.25, "bytes": [52]}, {"token": "3", "logprob": -1.5, "bytes": [51]}]},
    {"token": ".", "logprob": -0.01, "bytes": [46],
     "top_logprobs": [{"token": ".", "logprob": -0.01, "bytes": [46]}, {"token": "!", "logprob": -5.0, "bytes": [33]}]},
]}


class FlakyServer(ChatServer):
    """An OpenAI-style /v1/chat/completions whose behaviour is chosen by the user message's text:
    'fail-<status>-<n>': the first n attempts answer <status>, then 200;  'always-<status>': never 200;
    'slow-<n>': the first n attempts take 1 s (longer than the timeout test's);  'sleep': 0.1 s, then 200;
    'imposter-<n>': the first n answers name model_version 'other', then 'ours' (others name none);
    anything else: 200 at once, with `n` choices when the body asks for n ('onechoice': one whatever it asks). A
    request with `logprobs: true` gets LOGPROBS as choices[0].logprobs, unless its
    text is 'nologprobs' (logprobs: null, as a server without support answers). Records attempts per text, peak
    concurrency, auth headers, request bodies and image parts."""

    def __init__(self):
        super().__init__()
        self.attempts: Counter[str] = Counter()
        self.auth: list[str | None] = []
        self.images: list[bytes] = []
        self.bodies: list[dict] = []
        self.in_flight = self.peak = 0

    async def handle(self, request):
        from aiohttp import web

        body = await request.json()
        self.bodies.append(body)
        self.auth.append(request.headers.get("Authorization"))
        text = ""
        for part in body["messages"][-1]["content"] if isinstance(body["messages"][-1]["content"], list) else [
                {"type": "text", "text": body["messages"][-1]["content"]}]:
            if part["type"] == "text":
                text += part["text"]
            else:
                url = part["image_url"]["url"]
                assert url.startswith("data:image/png;base64,")
                self.images.append(base64.b64decode(url.split(",", 1)[1]))
        self.attempts[text] += 1
        n = self.attempts[text]
        self.in_flight += 1
        self.peak = max(self.peak, self.in_flight)
        try:
            kind, _, arg = text.partition("-")
            if kind == "fail":
                status, times = arg.split("-")
                if n <= int(times):
                    return web.json_response({"error": {"message": f"planned {status}"}}, status=int(status))
            if kind == "always":
                return web.json_response({"error": {"message": f"always {arg}"}}, status=int(arg),
                                         headers={"Retry-After": "0"})
            if kind == "slow" and n <= int(arg):
                await asyncio.sleep(1.0)
            if kind == "sleep":
                await asyncio.sleep(0.1)
            logprobs = LOGPROBS if body.get("logprobs") and text != "nologprobs" else None
            named = {} if kind != "imposter" else {"model_version": "other" if n <= int(arg) else "ours"}
            answer = completion(body["model"], f"echo {text}", logprobs, **named)
            choices = 1 if kind == "onechoice" else body.get("n", 1)  # 'onechoice': a server that ignores n
            answer["choices"] = [{**answer["choices"][0], "index": i,
                                  "message": {"role": "assistant", "content": f"echo {text} #{i}"}}
                                 for i in range(choices)] if "n" in body else answer["choices"]
            return web.json_response(answer)
        finally:
            self.in_flight -= 1


@pytest.fixture
def server():
    with FlakyServer() as s:
        yield s


def _engine(port: int, top_logprobs: int = 0, **kw) -> HTTPTextEngine:
    # a generous timeout: the tests count retries exactly, and a busy box answered a local request in over 0.5 s
    # (CI, 2026-11-30: 3 retries where 1 was due); the timeout test sets its own
    kw = {"timeout_s": 10.0, **kw}
    http = HttpEngineConfig(base_url=f"http://127.0.0.1:{port}/v1", model="m", backoff_initial_s=0.01,
                            backoff_max_s=0.05, **kw)
    return HTTPTextEngine(http, GenerationConfig(max_new_tokens=8, top_logprobs=top_logprobs))


def _ask(text: str, images=()) -> TextRequest:
    return TextRequest(messages=[{"role": "user", "content": [{"type": "image"} for _ in images]
                                  + [{"type": "text", "text": text}]}], images=list(images))


def _png(colour="red") -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (28, 28), colour).save(buf, format="PNG")
    return buf.getvalue()


def test_retries_on_429_and_5xx_then_succeeds(server):
    eng = _engine(server.port, max_retries=3)
    out = eng.generate([_ask("fail-429-2"), _ask("fail-500-1"), _ask("fail-503-3"), _ask("fail-404-1"), _ask("ok")])
    assert [r.text for r in out] == ["echo fail-429-2", "echo fail-500-1", "echo fail-503-3", "echo fail-404-1",
                                     "echo ok"]
    assert server.attempts == Counter({"fail-429-2": 3, "fail-500-1": 2, "fail-503-3": 4, "fail-404-1": 2, "ok": 1})
    assert eng.usage.retries == 7 and eng.usage.attempts == 12 and eng.usage.failed == 0
    assert eng.usage.status_counts["429"] == 2 and eng.usage.status_counts["503"] == 3


def test_gives_up_after_max_retries_and_never_retries_other_4xx(server):
    eng = _engine(server.port, max_retries=2)
    out = eng.generate([_ask("fail-400-5"), _ask("fail-422-1"), _ask("ok")])
    assert out[0].error == "HTTP 400: planned 400" and out[1].error == "HTTP 422: planned 422"  # the request's fault
    assert out[2].ok
    assert server.attempts["fail-400-5"] == 1 and server.attempts["fail-422-1"] == 1
    # a request that fails every retry is the endpoint's fault, not its item's: the call raises, after the others
    with pytest.raises(EndpointUnavailable, match=r"1 of 2 requests failed after 3 attempts each \(first: HTTP 503: "
                                                  r"always 503 \(gave up after 3 attempts\)\)"):
        eng.generate([_ask("always-503"), _ask("ok-2")])
    assert server.attempts["always-503"] == 3 and server.attempts["ok-2"] == 1
    assert eng.usage.failed == 3 and eng.usage.succeeded == 2


@pytest.mark.parametrize("status", [401, 403, 404])
def test_a_refusal_of_the_caller_stops_the_call_unretried_instead_of_quarantining_every_item(server, status):
    """A wrong key (401), a key without access (403) or a wrong URL or model name (404) would meet every request:
    not an item's fault, so no item is quarantined for it (a stage stops, and its finished batches are kept)."""
    eng = _engine(server.port, max_retries=2)
    said = rf"1 of 2 requests refused \(first: HTTP {status}: always {status}\): the key \(api_key_env\), the URL"
    with pytest.raises(EndpointRefused, match=said) as refused:
        eng.generate([_ask(f"always-{status}"), _ask("ok")])
    # raised outside the probe for a running loop: no "RuntimeError: no running event loop" chained to it, which a
    # Ray Data stage's error text would show above (and once instead of) the refusal
    assert refused.value.__context__ is None
    # never retried, but a 404, which Ray Serve's proxies give until they hear of a route just deployed
    assert server.attempts[f"always-{status}"] == (3 if status == 404 else 1)
    assert eng.usage.status_counts["refused"] == 1 and eng.usage.succeeded == 1


def test_an_answer_from_another_model_is_retried_then_a_failure_never_a_label(server):
    """Two Serve proxies can share a port (SO_REUSEPORT): an answer naming another model version is not ours."""
    eng = _engine(server.port, max_retries=3, expect_model_version="ours")
    out = eng.generate([_ask("imposter-2")])
    assert out[0].text == "echo imposter-2" and server.attempts["imposter-2"] == 3
    with pytest.raises(EndpointUnavailable, match=r"2 of 2 requests .*(response from model version 'other', "
                                                  r"expected 'ours': another server answers here|model version None,"
                                                  r" expected 'ours')"):
        eng.generate([_ask("imposter-9"), _ask("anonymous")])
    assert eng.usage.status_counts["wrong_model"] == 2 + 4 + 4 and eng.usage.failed == 2
    anyone = _engine(server.port, max_retries=0)  # no expectation: any model's answer is taken
    assert anyone.generate([_ask("imposter-99")])[0].text == "echo imposter-99"


def test_timeouts_are_retried(server):
    eng = _engine(server.port, max_retries=2, timeout_s=0.5)  # the server takes 1 s on the first attempt
    t0 = time.perf_counter()
    out = eng.generate([_ask("slow-1")])
    assert out[0].text == "echo slow-1" and server.attempts["slow-1"] == 2
    assert eng.usage.status_counts["timeout"] == 1
    assert time.perf_counter() - t0 < 5


def test_connection_errors_are_retried_then_reported():
    eng = _engine(free_port(), max_retries=2)  # nothing listens there
    with pytest.raises(EndpointUnavailable, match=r"connection error: .*gave up after 3 attempts"):
        eng.generate([_ask("x")])
    assert eng.usage.status_counts["connect"] == 3


def test_concurrency_limit_holds(server):
    eng = _engine(server.port, max_concurrency=3)
    t0 = time.perf_counter()
    out = eng.generate([_ask("sleep") for _ in range(12)])
    assert all(r.ok for r in out)
    assert server.peak == 3  # used, never exceeded
    assert time.perf_counter() - t0 >= 0.35  # 12 requests of 0.1 s, 3 at a time: at least 4 rounds


def test_backoff_grows_with_jitter_and_honours_retry_after():
    eng = HTTPTextEngine(HttpEngineConfig(backoff_initial_s=1.0, backoff_max_s=8.0), GenerationConfig())
    for attempt, full in [(0, 1.0), (1, 2.0), (2, 4.0), (3, 8.0), (6, 8.0)]:
        delays = [eng._delay(attempt, None) for _ in range(50)]
        assert all(full / 2 <= d <= full for d in delays)
        assert len(set(delays)) > 1  # jitter
    assert eng._delay(0, "3") == 3.0 and eng._delay(0, "100") == 8.0  # Retry-After, capped


def test_api_key_only_from_the_environment(server, monkeypatch):
    monkeypatch.setenv("FLYWHEEL_TEST_KEY", "secret-123")
    eng = _engine(server.port, api_key_env="FLYWHEEL_TEST_KEY")
    assert eng.generate([_ask("ok")])[0].ok
    assert server.auth[-1] == "Bearer secret-123"
    assert "secret-123" not in eng.name and "secret-123" not in repr(eng.http)
    monkeypatch.delenv("FLYWHEEL_TEST_KEY")
    with pytest.raises(MissingApiKey, match="FLYWHEEL_TEST_KEY"):
        _engine(server.port, api_key_env="FLYWHEEL_TEST_KEY")
    with pytest.raises(ValueError):  # a key pasted where the variable's NAME belongs is refused by the config
        HttpEngineConfig(api_key_env="sk-abc123")
    assert _engine(server.port).generate([_ask("ok")])[0].ok and server.auth[-1] is None


def test_images_travel_as_png_data_urls(server):
    jpeg = io.BytesIO()
    Image.new("RGB", (28, 28), "blue").save(jpeg, format="JPEG")
    eng = _engine(server.port)
    out = eng.generate([_ask("two images", [_png(), jpeg.getvalue()])])
    assert out[0].ok and len(server.images) == 2
    assert server.images[0] == _png()  # PNG bytes are sent verbatim
    assert server.images[1][:8] == PNG_MAGIC  # anything else is re-encoded as PNG
    bad = eng.generate([_ask("x", [b"not an image"])])[0]
    assert bad.error.startswith("invalid request") and server.attempts["x"] == 0
    msgs = openai_messages(_ask("hi", [_png()]))
    assert msgs[0]["content"][0]["type"] == "image_url" and msgs[0]["content"][1] == {"type": "text", "text": "hi"}


def test_usage_and_cost_logged_to_mlflow(server, tmp_path):
    import mlflow
    from mlflow import MlflowClient

    eng = _engine(server.port, price_per_1m_prompt_tokens=2.5, price_per_1m_completion_tokens=10.0)
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    previous = mlflow.get_tracking_uri()
    mlflow.set_tracking_uri(uri)
    try:
        exp = MlflowClient(uri).create_experiment("http-engine", artifact_location=(tmp_path / "art").as_uri())
        with mlflow.start_run(experiment_id=exp) as run:
            eng.generate([_ask("ok"), _ask("fail-429-1")])
            eng.generate([_ask("ok")])
    finally:
        mlflow.set_tracking_uri(previous)
    assert eng.usage.prompt_tokens == 30 and eng.usage.completion_tokens == 15
    assert eng.usage.cost == pytest.approx((30 * 2.5 + 15 * 10.0) / 1e6)
    metrics = MlflowClient(uri).get_run(run.info.run_id).data.metrics
    assert metrics["http.prompt_tokens"] == 30 and metrics["http.completion_tokens"] == 15
    assert metrics["http.cost"] == pytest.approx(eng.usage.cost) and metrics["http.retries"] == 1
    history = MlflowClient(uri).get_metric_history(run.info.run_id, "http.prompt_tokens")
    assert [m.value for m in history] == [20, 30]  # cumulative, one step per generate call


def test_make_text_engine_builds_the_http_backend(tmp_path):
    from flywheel.engines import make_text_engine

    cfg = load_config(None, [f"run.workdir={tmp_path}", "judge.engine=http",
                             "judge.http.base_url=http://127.0.0.1:9/v1", "judge.http.max_concurrency=2"])
    eng = make_text_engine(cfg, "judge")
    assert isinstance(eng, HTTPTextEngine) and eng.http.max_concurrency == 2
    k = cfg.judge.generation.top_logprobs  # the judge's config may ask for them (judge.rating_readout=expected)
    assert eng.payload(_ask("hi"), 3) == {
        "model": "judge", "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}],
        "max_tokens": cfg.judge.generation.max_new_tokens, "temperature": 0.0, "seed": 3,
        **({"logprobs": True, "top_logprobs": k} if k else {})}
    json.dumps(eng.payload(_ask("hi", [_png()]), 0))  # serialisable as is


def test_a_server_pinned_to_a_version_is_named_by_it_not_by_its_address(tmp_path):
    """Labels carry `name@version`: a pinned Serve deployment on another port or node must label alike."""
    from flywheel.engines import make_text_engine

    def engine(url, version=None):
        cfg = load_config(None, [f"run.workdir={tmp_path}", "judge.engine=http", f"judge.http.base_url={url}"]
                          + ([f"judge.http.expect_model_version={version}"] if version else []))
        eng = make_text_engine(cfg, "judge")
        return f"{eng.name}@{eng.version}"

    a, b = engine("http://10.0.0.1:8000/a/v1", "judge/7"), engine("http://127.0.0.1:41234/b/v1", "judge/7")
    assert a == b == "http#judge@judge/7"
    assert engine("http://127.0.0.1:41234/b/v1", "judge/8") != a  # another version is another judge
    # unpinned (an outside API), the address is all that says which server judged
    assert engine("http://10.0.0.1:8000/v1") == "http:http://10.0.0.1:8000/v1#judge@judge"


def test_logprobs_are_asked_for_only_when_configured_and_mapped(server):
    from flywheel.engines.base import TokenLogprobs

    plain = _engine(server.port).generate([_ask("ok")])[0]
    assert plain.ok and plain.logprobs is None
    assert not {"logprobs", "top_logprobs"} & set(server.bodies[-1])  # k=0: the body is as before
    eng = _engine(server.port, top_logprobs=2)
    out = eng.generate([_ask("ok"), _ask("nologprobs")])
    assert all(b["logprobs"] is True and b["top_logprobs"] == 2 for b in server.bodies[-2:])
    assert out[0].logprobs == [TokenLogprobs("4", -0.25, {"4": -0.25, "3": -1.5}),
                               TokenLogprobs(".", -0.01, {".": -0.01, "!": -5.0})]
    # a server that answers without logprobs: the text still counts, logprobs stay None
    assert out[1].ok and out[1].text == "echo nologprobs" and out[1].logprobs is None
    assert eng.usage.failed == 0


def test_unreadable_logprobs_are_logged_and_dropped_not_a_failed_request(caplog):
    eng = _engine(1, top_logprobs=2)  # no request is sent: the response body is given directly
    bad = {"choices": [{"logprobs": {"content": [{"token": "4", "top_logprobs": []}]}}]}  # no "logprob"
    with caplog.at_level("WARNING"):
        assert eng._logprobs(bad) is None
    assert "unreadable logprobs" in caplog.text
    good = {"choices": [{"logprobs": {"content": [{"token": "4", "logprob": -0.5, "top_logprobs": []}]}}]}
    assert eng._logprobs(good)[0].logprob == -0.5


def test_k_samples_are_one_request_each_asking_for_n_choices(server):
    """TextEngine.sample over HTTP (judge.samples through Serve or an API): one request per item with OpenAI's n,
    so a server draws its samples together; a server that sends fewer choices fails those items, never pads."""
    eng = _engine(server.port)
    got = eng.sample([_ask("a"), _ask("b")], seed=5, k=3)
    assert [[r.text for r in x] for x in got] == [[f"echo {t} #{i}" for i in range(3)] for t in "ab"]
    assert [b["n"] for b in server.bodies] == [3, 3] and sorted(b["seed"] for b in server.bodies) == [5, 6]
    assert [r.completion_tokens for r in got[0]] == [5, 0, 0]  # the request's usage counted once
    short = eng.sample([_ask("onechoice")], seed=0, k=2)[0]
    assert len(short) == 2 and all(not r.ok and "1 choices, asked for 2" in r.error for r in short)
    eng.generate([_ask("c")])
    assert "n" not in server.bodies[-1]  # one answer: the body is as it was
