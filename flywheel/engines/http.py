"""The OpenAI-compatible HTTP backend of the text engine: GPT-4o, a vLLM server, or our own Serve app
(`flywheel serve`, route /v1/chat/completions) as a teacher or judge.

What it promises beyond the engine contract (flywheel/engines/base.py):
- at most `max_concurrency` requests in flight per `generate` call (an asyncio semaphore + a bounded pool);
- a 429, any 5xx, a timeout or a connection error is retried up to `max_retries` times with exponential backoff
  and jitter (a `Retry-After` header is honoured up to `backoff_max_s`); other 4xx are final, with the server's
  reason in the result's `error` (that request is wrong: its item is quarantined with the reason), except those
  that refuse the caller (401, 403, 404, 405, 407: its key, URL or model; a 404 after its retries, as Ray Serve's
  proxies give one for a route just deployed): the call raises EndpointRefused;
- a request that still fails after every retry means the endpoint is down or overloaded, not that the item is bad:
  the call raises EndpointUnavailable once all its requests are done, so the stage stops instead of quarantining
  good items, and `--resume` asks again, keeping the batches that finished (flywheel/stages/finished_batches.py);
- usage (prompt/completion tokens) is summed, cost estimated from per-token prices in config, and both logged
  to the active MLflow run, if any (metrics `http.*`);
- the API key comes only from the environment variable named in config (`api_key_env`), never from config.

With `generation.top_logprobs` = k > 0 the body asks for `logprobs: true, top_logprobs: k` and the result's
`logprobs` is read from `choices[0].logprobs.content`; a server that answers without them (null or missing) gives
`logprobs=None`, not an error: the text is still good, and readers fall back to it (the judge's written rating).

Images travel as `data:image/png;base64,...` URLs inside `image_url` parts (the only image form our Serve app
accepts; OpenAI and vLLM accept it too). The HTTP client is aiohttp (a dependency of ray[serve] and mlflow).
"""

from __future__ import annotations

import asyncio
import base64
import concurrent.futures
import json
import logging
import random
import threading
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from flywheel.config import GenerationConfig, HttpEngineConfig
from flywheel.engines.base import TextEngine, TextRequest, TextResult, TokenLogprobs, check_text_request
from flywheel.images import PNG_MAGIC, to_png_bytes

log = logging.getLogger(__name__)

RETRY_STATUS = frozenset({429}) | frozenset(range(500, 600))
# Refusals of the caller, not of a request: a wrong or missing key (401, 407), a key without access (403), a wrong
# URL or model name (404: OpenAI's and vLLM's answer to an unknown model; 405: a path that takes no POST). Every
# request would meet them, so they stop the call (EndpointRefused) instead of quarantining every item.
REFUSED_STATUS = frozenset({401, 403, 404, 405, 407})
# ... of which a 404 is retried first: Ray Serve's proxies answer 404 until a route they have not yet heard of is
# added (an app just deployed or redeployed), so our own judge app may give one briefly.
RETRIED_REFUSALS = frozenset({404})


class MissingApiKey(RuntimeError):
    """The config names an API-key environment variable that is not set."""


class EndpointUnavailable(RuntimeError):
    """Requests that failed after every retry (429, 5xx, timeouts, connection errors): the endpoint, not the item."""


class EndpointRefused(RuntimeError):
    """The endpoint refused the caller (REFUSED_STATUS: its key, URL or model), not a request: fix the config."""


@dataclass
class HttpUsage:
    """Counters of one engine instance, summed over all its `generate` calls."""

    requests: int = 0  # items asked for
    succeeded: int = 0
    failed: int = 0
    attempts: int = 0  # HTTP attempts, retries included
    retries: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost: float = 0.0
    seconds: float = 0.0  # wall time inside generate
    status_counts: dict[str, int] = field(default_factory=dict)  # "200", "429", "timeout", "connect", ...

    def metrics(self) -> dict[str, float]:
        out = {k: float(v) for k, v in asdict(self).items() if k != "status_counts"}
        out.update({f"status_{k}": float(v) for k, v in self.status_counts.items()})
        return out


def openai_messages(req: TextRequest) -> list[dict[str, Any]]:
    """The request's messages in OpenAI form: each `{"type": "image"}` part becomes an `image_url` part holding the
    next image as a base64 PNG data URL. Raises ValueError (from check_text_request) for a malformed request."""
    decoded = check_text_request(req)
    urls = []
    for raw, img in zip(req.images, decoded, strict=True):
        png = bytes(raw) if isinstance(raw, bytes | bytearray) and bytes(raw[:8]) == PNG_MAGIC else to_png_bytes(img)
        urls.append("data:image/png;base64," + base64.b64encode(png).decode("ascii"))
    out, k = [], 0
    for m in req.messages:
        content = m["content"]
        if isinstance(content, list):
            parts = []
            for p in content:
                if p.get("type") == "image":
                    parts.append({"type": "image_url", "image_url": {"url": urls[k]}})
                    k += 1
                elif p.get("type") == "text":
                    parts.append({"type": "text", "text": p.get("text", "")})
                else:
                    raise ValueError(f"unsupported content part type {p.get('type')!r}")
            content = parts
        out.append({"role": m["role"], "content": content})
    return out


class HTTPTextEngine(TextEngine):
    """A TextEngine over an OpenAI-compatible `/chat/completions` endpoint."""

    def __init__(self, http: HttpEngineConfig, generation: GenerationConfig):
        import os

        self.http = http
        self.generation = generation
        self._api_key: str | None = None
        if http.api_key_env:
            key = os.environ.get(http.api_key_env)
            if not key:
                raise MissingApiKey(f"the HTTP engine's API key is read from the environment variable "
                                    f"{http.api_key_env!r}, which is not set")
            self._api_key = key
        self.url = http.base_url.rstrip("/") + "/chat/completions"
        # A server pinned to one model version (our Serve deployment) is named by that version alone: its address
        # is only where it happens to be served (a node, a port), and labels must not change with it.
        pinned = http.expect_model_version
        self.name = f"http#{http.model}" if pinned else f"http:{http.base_url.rstrip('/')}#{http.model}"
        # replaced by the server's model_version when it reports one (our Serve app)
        self.version = pinned or http.model
        self.usage = HttpUsage()
        self._calls = 0
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ public API
    def generate(self, requests: Sequence[TextRequest], seed: int = 0) -> list[TextResult]:
        """Blocking; safe to call from a thread that runs an event loop (it then runs in a helper thread)."""
        return self._blocking(self.agenerate(requests, seed))

    @staticmethod
    def _blocking(coro):
        try:
            asyncio.get_running_loop()
        except RuntimeError:  # no loop here; run one outside this handler, or its error chains to "no running loop"
            in_loop = False
        else:
            in_loop = True
        if not in_loop:
            return asyncio.run(coro)
        with concurrent.futures.ThreadPoolExecutor(1) as ex:
            return ex.submit(asyncio.run, coro).result()

    def sample(self, requests: Sequence[TextRequest], seed: int, k: int) -> list[list[TextResult]]:
        """k answers to each request in one call each: OpenAI's `n` choices (a server draws them together, in one
        batch, from the request's seed)."""
        return self._blocking(self._agenerate(requests, seed, k))

    async def agenerate(self, requests: Sequence[TextRequest], seed: int = 0) -> list[TextResult]:
        return [r[0] for r in await self._agenerate(requests, seed, 1)]

    async def _agenerate(self, requests: Sequence[TextRequest], seed: int, n: int) -> list[list[TextResult]]:
        import aiohttp

        t0 = time.perf_counter()
        sem = asyncio.Semaphore(self.http.max_concurrency)
        timeout = aiohttp.ClientTimeout(total=self.http.timeout_s)
        connector = aiohttp.TCPConnector(limit=self.http.max_concurrency)
        async with aiohttp.ClientSession(timeout=timeout, connector=connector, headers=self._headers()) as session:
            gave_up: list[str] = []  # errors of requests that failed after every retry
            refused: list[str] = []  # refusals of the caller (REFUSED_STATUS)
            results = await asyncio.gather(*(self._one(session, sem, req, seed + i, gave_up, refused, n)
                                             for i, req in enumerate(requests)))
        with self._lock:
            self.usage.seconds += time.perf_counter() - t0
            self._calls += 1
        self._log_usage()
        if refused:
            raise EndpointRefused(f"{self.url}: {len(refused)} of {len(results)} requests refused (first: "
                                  f"{refused[0]}): the key (api_key_env), the URL or the model name is wrong for "
                                  "this endpoint. Fix the config and run again: finished batches are kept.")
        if gave_up:
            raise EndpointUnavailable(f"{self.url}: {len(gave_up)} of {len(results)} requests failed after "
                                      f"{self.http.max_retries + 1} attempts each (first: {gave_up[0]}); the "
                                      "endpoint is down or overloaded. Run again with --resume when it answers: "
                                      "finished batches are kept.")
        return list(results)

    # ------------------------------------------------------------------ internals
    def _headers(self) -> dict[str, str]:
        h = {"Content-Type": "application/json"}
        if self._api_key:
            h["Authorization"] = f"Bearer {self._api_key}"
        return h

    def payload(self, req: TextRequest, seed: int, n: int = 1) -> dict[str, Any]:
        g = self.generation
        body: dict[str, Any] = {"model": self.http.model, "messages": openai_messages(req),
                                "max_tokens": g.max_new_tokens, "temperature": g.temperature, "seed": seed}
        if n > 1:  # only when asked: every OpenAI-compatible server takes it, but n=1 requests stay as they were
            body["n"] = n
        if g.temperature > 0:
            body["top_p"] = g.top_p
            if g.top_k > 0:  # not an OpenAI parameter (vLLM and our Serve app take it): sent only when set
                body["top_k"] = g.top_k
        if g.top_logprobs > 0:  # only when asked: a server without logprobs support never sees the keys
            body["logprobs"] = True
            body["top_logprobs"] = g.top_logprobs
        return body

    def _count(self, key: str, **add: float) -> None:
        with self._lock:
            self.usage.status_counts[key] = self.usage.status_counts.get(key, 0) + 1
            for k, v in add.items():
                setattr(self.usage, k, getattr(self.usage, k) + v)

    def _delay(self, attempt: int, retry_after: str | None) -> float:
        cap = self.http.backoff_max_s
        if retry_after:
            try:
                return min(cap, max(0.0, float(retry_after)))
            except ValueError:
                pass  # an HTTP date: fall back to our own backoff
        d = min(cap, self.http.backoff_initial_s * 2**attempt)
        return d / 2 + random.uniform(0, d / 2)  # "equal jitter": never zero, never in lock-step

    async def _one(self, session, sem: asyncio.Semaphore, req: TextRequest, seed: int,
                   gave_up: list[str], refused: list[str], n: int = 1) -> list[TextResult]:
        """The request's n answers (choices), or n copies of its error."""
        import aiohttp

        def failed(error: str) -> list[TextResult]:
            return [TextResult(error=error)] * n

        with self._lock:
            self.usage.requests += 1
        try:
            body = json.dumps(self.payload(req, seed, n))
        except (ValueError, TypeError) as e:
            self._count("invalid", failed=1)
            return failed(f"invalid request: {e}")
        last = "no attempt"
        for attempt in range(self.http.max_retries + 1):
            retry_after = None
            async with sem:
                self._count_attempt(attempt)
                try:
                    async with session.post(self.url, data=body) as resp:
                        text = await resp.text()
                        status = resp.status
                        retry_after = resp.headers.get("Retry-After")
                except asyncio.TimeoutError:
                    self._count("timeout")
                    last = f"timeout after {self.http.timeout_s} s"
                    status = None
                except aiohttp.ClientError as e:
                    self._count("connect")
                    last = f"connection error: {type(e).__name__}: {e}"
                    status = None
            if status is not None:
                self._count(str(status))
                if status == 200:
                    data = _parsed(text)
                    if (other := self._other_model(data)) is None:
                        return self._ok(data, n)
                    self._count("wrong_model")  # retried: on a shared port (SO_REUSEPORT) the next connection
                    last = other                # may reach ours
                else:
                    last = f"HTTP {status}: {_reason(text)}"
                    if status in REFUSED_STATUS and (status not in RETRIED_REFUSALS
                                                     or attempt == self.http.max_retries):
                        self._count("refused", failed=1)
                        refused.append(last)
                        return failed(last)
                    if status not in RETRY_STATUS | RETRIED_REFUSALS:
                        self._count("final", failed=1)
                        return failed(last)
            if attempt < self.http.max_retries:
                await asyncio.sleep(self._delay(attempt, retry_after))
        self._count("exhausted", failed=1)
        gave_up.append(f"{last} (gave up after {self.http.max_retries + 1} attempts)")
        return failed(gave_up[-1])

    def _count_attempt(self, attempt: int) -> None:
        with self._lock:
            self.usage.attempts += 1
            self.usage.retries += attempt > 0

    def _other_model(self, data: Any) -> str | None:
        """Why a parsed 200 response is not from `expect_model_version`'s model, or None (it is, any model will
        do, or the body is malformed: _ok says so)."""
        expected = self.http.expect_model_version
        if expected is None or not isinstance(data, dict) or (named := data.get("model_version")) == expected:
            return None
        return f"response from model version {named!r}, expected {expected!r}: another server answers here"

    def _ok(self, data: Any, n: int = 1) -> list[TextResult]:
        """A 200 response's body, as _parsed gave it: its first n choices (the request's usage on the first)."""
        try:
            if isinstance(data, ValueError):
                raise data
            if len(data["choices"]) < n:
                raise IndexError(f"{len(data['choices'])} choices, asked for {n}")
            contents = [data["choices"][i]["message"]["content"] for i in range(n)]
            for content in contents:
                if not isinstance(content, str):
                    raise TypeError(f"message content is {type(content).__name__}")
        except (ValueError, KeyError, IndexError, TypeError) as e:
            self._count("bad_response", failed=1)
            return [TextResult(error=f"malformed response: {type(e).__name__}: {e}")] * n
        usage = data.get("usage") or {}
        pt, ct = int(usage.get("prompt_tokens") or 0), int(usage.get("completion_tokens") or 0)
        cost = (pt * self.http.price_per_1m_prompt_tokens + ct * self.http.price_per_1m_completion_tokens) / 1e6
        with self._lock:
            self.usage.succeeded += 1
            self.usage.prompt_tokens += pt
            self.usage.completion_tokens += ct
            self.usage.cost += cost
            if data.get("model_version"):  # our Serve app names the exact model version it served
                self.version = str(data["model_version"])
        return [TextResult(text=content, prompt_tokens=pt if i == 0 else 0, completion_tokens=ct if i == 0 else 0,
                           logprobs=self._logprobs(data, i) if self.generation.top_logprobs > 0 else None)
                for i, content in enumerate(contents)]

    def _logprobs(self, data: dict, i: int = 0) -> list[TokenLogprobs] | None:
        """`choices[i].logprobs.content` as TokenLogprobs; None when the server sent none, or a shape we cannot
        read (logged): the text is fine either way, so the request does not fail over its logprobs."""
        lp = data["choices"][i].get("logprobs")
        content = lp.get("content") if isinstance(lp, dict) else None
        if content is None:
            return None
        try:
            return [TokenLogprobs(str(t["token"]), float(t["logprob"]),
                                  {str(a["token"]): float(a["logprob"]) for a in t.get("top_logprobs") or []})
                    for t in content]
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            log.warning("http engine: unreadable logprobs in the response (%s: %s); returning none",
                        type(e).__name__, e)
            return None

    def counters(self) -> dict[str, float]:
        return {f"http.{k}": v for k, v in self.usage.metrics().items()}

    def _log_usage(self) -> None:
        """Cumulative counters to the active MLflow run (step = generate calls so far); silent without one."""
        try:
            import mlflow

            if mlflow.active_run() is None:
                return
            mlflow.log_metrics({f"http.{k}": v for k, v in self.usage.metrics().items()}, step=self._calls)
        except Exception as e:  # tracking must never fail a labeling run
            log.warning("http engine: could not log usage to MLflow: %s", e)


def _parsed(text: str) -> Any:
    """The JSON body, or the ValueError that parsing it raised (_ok reports it as a malformed response)."""
    try:
        return json.loads(text)
    except ValueError as e:
        return e


def _reason(text: str) -> str:
    """The error message of an OpenAI-style error body, else the body's start."""
    try:
        data = json.loads(text)
        err = data.get("error") if isinstance(data, dict) else None
        if isinstance(err, dict) and err.get("message"):
            return str(err["message"])
        if isinstance(data, dict) and data.get("detail"):
            return str(data["detail"])
    except ValueError:
        pass
    return text[:300]
