"""The Ray Serve judge application: one FastAPI ingress deployment with the judge model inside each replica.

Routes (JSON; full schema in README.md "Serving the judge"):
  GET  /healthz                 liveness + the served model version (never needs auth)
  GET  /v1/models               OpenAI-style model list
  GET  /stats                   this replica's batch-size histogram, items served, RSS (observability, bench)
  POST /v1/judge/pointwise      Minos pointwise: items of {prompt, candidate}
  POST /v1/judge/pairwise       pairwise, both orders by default: items of {prompt, candidate_a, candidate_b, aspect}
  POST /v1/judge/aspects        UFEval aspects: items of {prompt (with subtask), candidate}
  POST /v1/chat/completions     OpenAI-compatible (images only as data:image/png;base64 URLs)

Every response carries the served model version (`model_version` in the body, `X-Model-Version` header); the one
exception is Serve's own 503 for a full queue, which the proxy sends before any replica sees the request.

How it scales and stays bounded:
- every generation goes through one `@serve.batch` method: concurrent HTTP requests (and the several generations of
  one judging request) are grouped into one engine call of up to serve.max_batch_size, waiting at most
  serve.batch_wait_timeout_s to fill; the engine runs in a worker thread so the replica keeps accepting requests;
- `max_ongoing_requests` per replica and `max_queued_requests` per caller bound the work in flight: beyond them
  Serve answers 503 instead of queueing without bound;
- replicas (or autoscaling), CPUs and GPUs per replica come from resources.serve / serve.autoscaling; the backend
  (hf on CPU, vllm on GPU) from serve.engine / judge.engine.
Limits answer 413 (body bytes, image pixels, images and items per request) or 422 (malformed input, URLs, max_tokens
over the cap) with the reason; with serve.auth_token_env set, every route but /healthz needs the bearer token (401).
"""

# No `from __future__ import annotations` here: FastAPI must see the real `Request` annotation on the routes.
import asyncio
import hashlib
import hmac
import logging
import os
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from ray import serve
from starlette.exceptions import HTTPException as StarletteHTTPException

from flywheel.config import Config, GenerationConfig
from flywheel.engines.base import TextEngine, TextRequest, TextResult
from flywheel.engines.samples import SAMPLED_PROTOCOLS, bundle
from flywheel.serve.chat import chat_request, chat_response
from flywheel.serve.judging import Plan, plan_aspects, plan_pairwise, plan_pointwise
from flywheel.serve.model import ServedModel, local_weights, resolve_served_model
from flywheel.serve.schemas import (AspectsBody, ChatBody, PairwiseBody, PointwiseBody, RequestError, invalid,
                                    parse_body, too_large)

log = logging.getLogger(__name__)
DEPLOYMENT = "JudgeServer"

app = FastAPI(title="flywheel judge", description="The judge model of the flywheel, served by Ray Serve.",
              docs_url=None, redoc_url=None)
# Set by the replica's constructor (one replica per process): error handlers and the header middleware need it.
# The constructor reaches it through an import (see JudgeServer.__init__), because Serve ships the deployment class
# by value: its own references to module globals would point at copies.
_STATE: dict[str, Any] = {"model_version": None}


def _error(status: int, reason: str, kind: str, headers: dict[str, str] | None = None) -> JSONResponse:
    body = {"error": {"message": reason, "type": kind, "code": status}, "model_version": _STATE["model_version"]}
    return JSONResponse(body, status_code=status, headers=headers)


@app.exception_handler(RequestError)
async def _on_request_error(request: Request, exc: RequestError) -> JSONResponse:
    return _error(exc.status, exc.reason, exc.kind, exc.headers)


@app.exception_handler(StarletteHTTPException)
async def _on_http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
    return _error(exc.status_code, str(exc.detail), "not_found_error" if exc.status_code == 404 else "http_error")


@app.middleware("http")
async def _version_header(request: Request, call_next):
    response = await call_next(request)
    if _STATE["model_version"]:
        response.headers["X-Model-Version"] = _STATE["model_version"]
    return response


async def read_body(request: Request, limit: int) -> bytes:
    """The body, refused with 413 as soon as it is known to exceed `limit` (Content-Length first, then while
    streaming: a body without a length never grows past the limit in memory)."""
    declared = request.headers.get("content-length")
    if declared is not None:
        try:
            n = int(declared)
        except ValueError:
            raise invalid(f"bad Content-Length {declared!r}") from None
        if n > limit:
            raise too_large(f"body of {n} bytes; the limit is {limit}")
    buf = bytearray()
    async for chunk in request.stream():
        buf += chunk
        if len(buf) > limit:
            raise too_large(f"body over {limit} bytes; the limit is {limit}")
    return bytes(buf)


def serve_engine_name(cfg: Config) -> str:
    return cfg.serve.engine or (cfg.judge.engine if cfg.judge.engine in ("hf", "vllm") else "hf")


def make_served_engine(cfg: Config, path: str) -> TextEngine:
    dtype = cfg.models.judge.dtype
    if serve_engine_name(cfg) == "vllm":
        from flywheel.engines.vllm import VLLMTextEngine

        return VLLMTextEngine(path, cfg.judge.generation, cfg.judge.vllm, dtype=dtype, seed=cfg.run.seed,
                              max_images_per_prompt=cfg.serve.limits.max_images)
    from flywheel.engines.hf import HFTextEngine

    return HFTextEngine(path, cfg.judge.generation, dtype=dtype)


def token_digest(cfg: Config) -> str | None:
    """SHA-256 of the bearer token read from the environment variable serve.auth_token_env (in the deploying
    process). Replicas get only the digest, so the token itself is never stored in Ray's deployment config."""
    name = cfg.serve.auth_token_env
    if name is None:
        return None
    token = os.environ.get(name)
    if not token:
        raise RuntimeError(f"serve.auth_token_env={name}: that environment variable is not set here; refusing to "
                           "start an app that would be configured for auth without a token")
    return hashlib.sha256(token.encode()).hexdigest()


Job = tuple[tuple[TextRequest, ...], GenerationConfig, int]


@serve.deployment(name=DEPLOYMENT)
@serve.ingress(app)
class JudgeServer:
    def __init__(self, cfg: dict, served: dict, token_sha256: str | None):
        self.cfg = Config.model_validate(cfg)
        self.served = ServedModel(**served)
        from flywheel.serve import app as module

        module._STATE["model_version"] = self.served.version
        t0 = time.perf_counter()
        self.engine = make_served_engine(self.cfg, local_weights(self.cfg, self.served))
        from flywheel.aspects import AspectTree

        self.tree = AspectTree.load()
        self.token_sha256 = token_sha256
        s = self.cfg.serve
        self.limits = s.limits
        self.generation: GenerationConfig = self.cfg.judge.generation
        self.max_tokens_cap = s.limits.max_tokens or self.generation.max_new_tokens
        self._generate.set_max_batch_size(s.max_batch_size)
        self._generate.set_batch_wait_timeout_s(s.batch_wait_timeout_s)
        self.batch_sizes: Counter[int] = Counter()
        self.items = 0
        self.started = time.time()
        log.info("judge replica: %s (%s) loaded in %.1f s", self.served.version, self.engine.name,
                 time.perf_counter() - t0)

    # ------------------------------------------------------------------ batching
    # A job: requests answered together (a chat's n copies of one request, or a judging request's judge.samples
    # copies), their decoding and seed.
    @serve.batch(max_batch_size=16, batch_wait_timeout_s=0.01)  # replaced from config in __init__
    async def _generate(self, jobs: list[Job]) -> list[list[TextResult]]:
        self.batch_sizes[len(jobs)] += 1
        self.items += sum(len(j[0]) for j in jobs)
        return await asyncio.to_thread(self._run_jobs, jobs)

    def _run_jobs(self, jobs: list[Job]) -> list[list[TextResult]]:
        """One engine call per group of jobs, the group one engine batch: the Serve batch is the batch. Greedy jobs
        with the same decoding share a group (their answers do not depend on their batch-mates); a sampled job is a
        group of its own, because a sampled answer depends on the batch it is drawn in: so the same request and
        seed get the same samples whatever else arrived at the same time, or however a call's requests were split
        between Serve batches. Runs in one worker thread at a time."""
        groups: dict[tuple[str, int | str], list[int]] = {}
        for i, (_, gen, _) in enumerate(jobs):
            key = ("sampled", i) if gen.temperature > 0 else ("greedy", gen.model_dump_json())
            groups.setdefault(key, []).append(i)
        out: list[list[TextResult]] = [[] for _ in jobs]
        for idx in groups.values():
            _, gen, seed = jobs[idx[0]]  # a greedy group's seed changes nothing
            flat = [(i, r) for i in idx for r in jobs[i][0]]
            self.engine.generation = gen.model_copy(update={"batch_size": len(flat)})
            for (i, _), r in zip(flat, self.engine.generate([r for _, r in flat], seed=seed), strict=True):
                out[i].append(r)
        return out

    # ------------------------------------------------------------------ plumbing
    def _auth(self, request: Request) -> None:
        if self.token_sha256 is None:
            return
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        challenge = {"WWW-Authenticate": "Bearer"}
        if scheme.lower() != "bearer" or not token.strip():
            raise RequestError(401, "missing bearer token (send Authorization: Bearer <token>)", headers=challenge)
        if not hmac.compare_digest(hashlib.sha256(token.strip().encode()).hexdigest(), self.token_sha256):
            raise RequestError(401, "invalid bearer token", headers=challenge)

    async def _body(self, request: Request, model: type) -> Any:
        self._auth(request)
        return parse_body(await read_body(request, self.limits.max_body_bytes), model)

    def _meta(self) -> dict:
        return {"model": self.cfg.serve.model_name, "model_version": self.served.version}

    async def _judge(self, protocol: str, plan: Plan, seed: int) -> dict:
        # judge.samples answers per pointwise or pairwise request, as make_text_engine's judge gives the loop: a
        # request's k samples are one job, drawn together in one engine batch (as a chat's n choices)
        k = self.cfg.judge.samples if protocol in SAMPLED_PROTOCOLS else 1
        answers = await asyncio.gather(*(self._generate(((r,) * k, self.generation, seed)) for r in plan.requests))
        results = [a[0] if k == 1 else bundle(a) for a in answers]
        usage = {"prompt_tokens": sum(r.prompt_tokens for r in results),
                 "completion_tokens": sum(r.completion_tokens for r in results), "generations": k * len(results)}
        return {**self._meta(), "protocol": protocol, "results": plan.assemble(results), "usage": usage}

    # ------------------------------------------------------------------ routes
    @app.get("/healthz")
    async def healthz(self) -> dict:
        return {"status": "ok", **self._meta(), "engine": self.engine.name.split(":", 1)[0]}

    @app.get("/v1/models")
    async def models(self, request: Request) -> dict:
        self._auth(request)
        return {"object": "list", "model_version": self.served.version,
                "data": [{"id": self.cfg.serve.model_name, "object": "model", "created": int(self.started),
                          "owned_by": "flywheel", "model_version": self.served.version}]}

    @app.get("/stats")
    async def stats(self, request: Request) -> dict:
        self._auth(request)
        import psutil

        return {**self._meta(), "pid": os.getpid(), "rss_mb": psutil.Process().memory_info().rss / 2**20,
                "uptime_s": time.time() - self.started, "items": self.items,
                "batches": sum(self.batch_sizes.values()),
                "batch_sizes": {str(k): v for k, v in sorted(self.batch_sizes.items())},
                "max_batch_size": self.cfg.serve.max_batch_size}

    @app.post("/v1/judge/pointwise")
    async def pointwise(self, request: Request) -> dict:
        body = await self._body(request, PointwiseBody)
        plan = await asyncio.to_thread(plan_pointwise, body, self.limits, self.cfg.judge.prompt_style,
                                       self.cfg.judge.rating_readout)
        return await self._judge("pointwise", plan, body.seed)

    @app.post("/v1/judge/pairwise")
    async def pairwise(self, request: Request) -> dict:
        body = await self._body(request, PairwiseBody)
        plan = await asyncio.to_thread(plan_pairwise, body, self.limits, self.tree, self.cfg.judge.prompt_style,
                                       self.cfg.judge.rating_readout)
        return await self._judge("pairwise", plan, body.seed)

    @app.post("/v1/judge/aspects")
    async def aspects(self, request: Request) -> dict:
        body = await self._body(request, AspectsBody)
        plan = await asyncio.to_thread(plan_aspects, body, self.limits, self.tree)
        return await self._judge("aspects", plan, body.seed)

    @app.post("/v1/chat/completions")
    async def chat_completions(self, request: Request) -> dict:
        body: ChatBody = await self._body(request, ChatBody)
        names = {self.cfg.serve.model_name, self.served.version, self.served.ref, self.served.uri}
        if body.model is not None and body.model not in names:
            raise RequestError(404, f"model {body.model!r} is not served here; this server serves "
                                    f"{self.cfg.serve.model_name!r} ({self.served.version})")
        req, gen, seed = await asyncio.to_thread(chat_request, body, self.limits, self.generation,
                                                 self.max_tokens_cap)
        results = await self._generate(((req,) * body.n, gen, seed))
        if failed := next((r for r in results if not r.ok), None):
            raise RequestError(500, f"generation failed: {failed.error}", "server_error")
        return chat_response(results, self.cfg.serve.model_name, self.served.version, gen.max_new_tokens,
                             body.top_logprobs or 0)


# ---------------------------------------------------------------------------- building & deploying
def deployment_options(cfg: Config) -> dict:
    """Serve deployment options from config: replicas or autoscaling, CPUs/GPUs per replica, the bounded queue."""
    s, res = cfg.serve, cfg.resources.serve
    if s.max_ongoing_requests < s.max_batch_size:
        raise ValueError(f"serve.max_ongoing_requests={s.max_ongoing_requests} < serve.max_batch_size="
                         f"{s.max_batch_size}: batches could never fill")
    actor: dict[str, Any] = {"num_cpus": res.num_cpus, "num_gpus": res.num_gpus}
    if res.resources:
        actor["resources"] = dict(res.resources)
    opts: dict[str, Any] = {"name": DEPLOYMENT, "max_ongoing_requests": s.max_ongoing_requests,
                            "max_queued_requests": s.max_queued_requests, "ray_actor_options": actor}
    if s.retry_after_s is not None:
        opts["backpressure_config"] = {"status_code": 503, "retry_after_s": s.retry_after_s}
    if s.autoscaling is not None:
        a = s.autoscaling
        opts["autoscaling_config"] = {"min_replicas": a.min_replicas, "max_replicas": a.max_replicas,
                                      "initial_replicas": max(a.min_replicas, 1),
                                      "target_ongoing_requests": a.target_ongoing_requests}
    else:
        opts["num_replicas"] = res.actors
    tp = cfg.judge.vllm.tensor_parallel_size
    if serve_engine_name(cfg) == "vllm" and tp > 1:
        # vLLM's Ray executor places its tensor-parallel workers in the replica's placement group: the replica
        # itself holds only CPUs, one bundle per GPU follows (the pattern of Ray Serve LLM). Untested here (no GPU).
        actor["num_gpus"] = 0
        opts["placement_group_bundles"] = [{"CPU": res.num_cpus}] + [{"GPU": 1}] * tp
        opts["placement_group_strategy"] = "STRICT_PACK"
    return opts


def build_app(cfg: Config, served: ServedModel | None = None):
    """The bound application (for serve.run, `serve run`, or a RayService through app_builder)."""
    served = served or resolve_served_model(cfg)
    return JudgeServer.options(**deployment_options(cfg)).bind(cfg.model_dump(mode="json"), served.to_dict(),
                                                              token_digest(cfg))


def app_builder(args: dict):
    """Application builder for `serve run flywheel.serve.app:app_builder config=configs/gpu_7b.yaml` or a
    RayService's `import_path` (args: config = a YAML path, overrides = a list or a space-separated string).
    Note: the proxy's host/port then come from the Serve config, not serve.host/serve.port."""
    from flywheel.config import load_config

    overrides = args.get("overrides") or []
    if isinstance(overrides, str):
        overrides = overrides.split()
    return build_app(load_config(args.get("config"), overrides))


@dataclass
class Deployed:
    url: str  # http://host:port/prefix (no trailing slash)
    served: ServedModel
    app_name: str

    @property
    def openai_base_url(self) -> str:
        """What an `http` engine's base_url (or any OpenAI client's) should be."""
        return self.url + "/v1"


def deploy(cfg: Config) -> Deployed:
    """Start Serve's HTTP proxy on serve.host:serve.port (in the Ray of `ray.address`, embedded if null) and
    deploy the judge app; returns once every replica is up. Zoo models are built first when named."""
    import ray

    from flywheel.raycluster import init_ray, warn_if_no_node_fits
    from flywheel.serve.model import served_ref

    if served_ref(cfg).startswith("zoo:"):
        from flywheel.models.zoo import build_zoo

        build_zoo(cfg)
    init_ray(cfg)
    served = resolve_served_model(cfg)
    s = cfg.serve
    warn_if_no_node_fits("serve: each replica", cfg.resources.serve, "resources.serve")
    serve.start(http_options={"host": s.host, "port": s.port})
    port = _proxy_port(s.port)
    _run_app(cfg, build_app(cfg, served))
    prefix = "" if s.route_prefix == "/" else s.route_prefix.rstrip("/")
    # Bound to every interface: the URL names this node's address, not 127.0.0.1, because the URL is handed to
    # Ray actors (the preference labels' http engine) that may run on other nodes. This driver's node runs a
    # proxy: Serve always runs one beside its controller, which a job's driver shares the head node with.
    host = ray.util.get_node_ip_address() if s.host in ("0.0.0.0", "::") else s.host
    log.info("serve: %s at http://%s:%d%s", served.version, host, port, prefix)
    return Deployed(url=f"http://{host}:{port}{prefix}", served=served, app_name=s.app_name)


def _run_app(cfg: Config, app) -> None:
    """serve.run, which waits for every replica to be up for ever: on a fixed cluster with no node for one, a hang.
    With ray.wait_for_actors_s the app is deployed without that wait (`serve.run_many`, Serve's developer API,
    with wait_for_applications_running=False: serve.run has no such switch) and waited for here at most that long
    (a replica loading its model counts, as a Ray Data actor's does); past it the app is deleted and
    ActorsDidNotStart names the ask and what Serve said."""
    from flywheel.raycluster import ActorsDidNotStart, actor_ask, ask_text

    s, wait = cfg.serve, cfg.ray.wait_for_actors_s
    if wait is None:
        serve.run(app, name=s.app_name, route_prefix=s.route_prefix)
        return
    serve.run_many([serve.RunTarget(app, name=s.app_name, route_prefix=s.route_prefix)],
                   wait_for_applications_running=False)
    deadline = time.monotonic() + wait
    while (st := serve.status().applications.get(s.app_name)) is None or st.status != "RUNNING":
        said = "" if st is None else "; ".join(m for m in [st.message, *(d.message for d in st.deployments.values())]
                                               if m)
        if st is not None and st.status == "DEPLOY_FAILED":
            raise RuntimeError(f"serve: app {s.app_name} failed to deploy: {said}")
        if time.monotonic() > deadline:
            serve.delete(s.app_name)
            raise ActorsDidNotStart(f"serve: the replicas of {s.app_name}, each with "
                                    f"{ask_text(actor_ask(cfg.resources.serve))}, were not up within {wait:g} s "
                                    f"(ray.wait_for_actors_s){': ' + said if said else ''}")
        time.sleep(0.5)


def _proxy_port(asked: int) -> int:
    """The port Serve's HTTP proxy listens on. Serve keeps the options it started with: once it runs in this Ray
    (an earlier deployment, another app) serve.start ignores another port, and a URL naming `asked` would reach
    nothing, or another cluster's proxy."""
    try:
        from ray.serve.context import _get_global_client  # no public API tells the running proxy's port

        port = int(_get_global_client().http_config.port)
    except Exception as e:  # noqa: BLE001 - a private API: fall back to the configured port, saying so
        log.warning("serve: could not read the running proxy's port (%s); assuming serve.port %d", e, asked)
        return asked
    if port != asked:
        log.warning("serve: Serve already runs in this Ray with its proxy on port %d, not serve.port %d; the app "
                    "is reached there", port, asked)
    return port
