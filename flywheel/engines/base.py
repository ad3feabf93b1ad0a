"""The engine interfaces: "generate text for a batch of (messages, images)" and "generate images for prompts".

Backends (transformers and diffusers now; vLLM, OpenAI-compatible HTTP and the oracle later) implement these two
classes. Contract shared by all of them:
- one result per request, in order; a request that fails gets `error` set and never sinks the rest of its batch;
- batched internally (`batch_size` from config); seeded, so the same requests and seed give the same outputs.
"""

from __future__ import annotations

import io
import logging
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from PIL import Image

log = logging.getLogger(__name__)


@dataclass
class TextRequest:
    """Chat messages in the Hugging Face/OpenAI style; `{"type": "image"}` parts consume `images` in order."""

    messages: list[dict[str, Any]]
    images: list[Image.Image | bytes] = field(default_factory=list)
    id: str | None = None
    # Ground truth for backends that judge from it (the oracle teacher): the prompt and candidate records, the
    # protocol and its step. Model backends ignore it, so a request means the same to every engine.
    context: dict[str, Any] | None = None


@dataclass(frozen=True)
class TokenLogprobs:
    """One generated token: its text, its log-probability, and the `top_logprobs` most likely tokens at that
    position with theirs (the model's raw distribution, before temperature or top-p)."""

    token: str
    logprob: float
    top: dict[str, float]


@dataclass
class TextResult:
    text: str | None = None
    error: str | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    # Per generated token, when the engine was asked for `generation.top_logprobs` > 0 and can give them.
    logprobs: list[TokenLogprobs] | None = None
    # Every sampled answer to the request, this one first, when the judge draws several (judge.samples,
    # flywheel/engines/samples.py); the judge protocols' result_fields read a rating from all of them.
    samples: list[TextResult] | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


@dataclass
class ImageRequest:
    prompt: str
    negative_prompt: str | None = None
    seed: int | None = None  # per-item seed: the same prompt and seed give the same image in any batch
    id: str | None = None


@dataclass
class ImageResult:
    image: Image.Image | None = None
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


# Sample s of k draws with seed + s * SEED_STRIDE (TextEngine.sample): far apart, so no sample repeats another call's
# seeds (engines that seed each request from the call's seed add the request's index, e.g. the HTTP engine's seed + i).
SEED_STRIDE = 1_000_003


class TextEngine(ABC):
    """Generates text from multimodal chat requests."""

    name: str  # e.g. "hf:/path/to/judge"; recorded as the producer of every output
    version: str

    @abstractmethod
    def generate(self, requests: Sequence[TextRequest], seed: int = 0) -> list[TextResult]: ...

    def sample(self, requests: Sequence[TextRequest], seed: int, k: int) -> list[list[TextResult]]:
        """k sampled answers to each request ([request][sample]): here k calls, the first with `seed` (so the first
        answer is generate's) and each other with a seed of its own; an engine that can draw k at once overrides
        it (the HTTP engine asks for OpenAI's `n` choices)."""
        draws = [self.generate(requests, seed=seed + s * SEED_STRIDE) for s in range(k)]
        for d in draws:
            if len(d) != len(requests):
                raise RuntimeError(f"engine returned {len(d)} results for {len(requests)} requests")
        return [list(x) for x in zip(*draws, strict=True)]

    def counters(self) -> dict[str, float]:
        """Cumulative counters of this engine's work that add up across calls and processes (an HTTP engine's
        requests, tokens and estimated cost): a stage logs their growth over its batches. None here."""
        return {}

    def close(self) -> None:
        """Release the model (GPU memory, worker processes)."""


class ImageEngine(ABC):
    """Generates images from text prompts."""

    name: str
    version: str

    @abstractmethod
    def generate(self, requests: Sequence[ImageRequest], seed: int = 0) -> list[ImageResult]: ...

    def close(self) -> None:
        """Release the model."""


def count_image_parts(messages: list[dict[str, Any]]) -> int:
    n = 0
    for m in messages:
        content = m.get("content")
        if isinstance(content, list):
            n += sum(1 for part in content if isinstance(part, dict) and part.get("type") == "image")
    return n


def check_text_request(req: TextRequest) -> list[Image.Image]:
    """Validate one request and decode its images; raises ValueError naming what is wrong."""
    if not isinstance(req.messages, list) or not req.messages:
        raise ValueError("messages must be a non-empty list")
    for i, m in enumerate(req.messages):
        if not isinstance(m, dict) or "role" not in m or "content" not in m:
            raise ValueError(f"messages[{i}] must be a dict with 'role' and 'content'")
    n_parts = count_image_parts(req.messages)
    if n_parts != len(req.images):
        raise ValueError(f"{n_parts} image placeholder(s) in messages but {len(req.images)} image(s) given")
    images = []
    for i, img in enumerate(req.images):
        if isinstance(img, bytes | bytearray):
            try:
                img = Image.open(io.BytesIO(img))
                img.load()
            except Exception as e:  # PIL raises several types for bad bytes
                raise ValueError(f"images[{i}]: undecodable image bytes ({type(e).__name__})") from None
        if not isinstance(img, Image.Image):
            raise ValueError(f"images[{i}]: expected a PIL image or PNG bytes, got {type(img).__name__}")
        images.append(img.convert("RGB"))
    return images


def prepare_text_requests(requests: Sequence[TextRequest]):
    """(results, prepared): `prepared` holds (index, request, decoded images) of the valid requests; `results`
    has an error result at every invalid request's index (named by check_text_request) and None elsewhere."""
    results: list[TextResult | None] = [None] * len(requests)
    prepared = []
    for i, req in enumerate(requests):
        try:
            prepared.append((i, req, check_text_request(req)))
        except ValueError as e:
            results[i] = TextResult(error=f"invalid request: {e}")
    return results, prepared


T = TypeVar("T")
R = TypeVar("R")


def resolve_device(device: str = "auto") -> str:
    """"auto": the GPU this process was given, else the CPU. Ray sets CUDA_VISIBLE_DEVICES per actor from its
    num_gpus (empty for 0), so an actor without a GPU - or a node with logical GPUs but no CUDA - gets the CPU."""
    if device != "auto":
        return device
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


class EngineFailure(RuntimeError):
    """Every item of a batch failed, alone as well: the engine is broken (a model that cannot run, a device gone),
    not the items. Raised so the stage stops instead of quarantining good items; a resume keeps finished batches."""


def run_batched(
    items: Sequence[T],
    batch_size: int,
    run: Callable[[list[T], int], list[R]],
    on_error: Callable[[str], R],
    seed: int = 0,
) -> list[R]:
    """Run `run(batch, batch_seed)` over batches; if a batch raises, retry its items one at a time so that only
    the item that really fails gets an error result. A batch of several items that each fail alone too raises
    EngineFailure."""
    results: list[R] = []
    for b, start in enumerate(range(0, len(items), batch_size)):
        batch = list(items[start : start + batch_size])
        batch_seed = seed + b
        try:
            results.extend(run(batch, batch_seed))
            continue
        except Exception as e:
            if len(batch) == 1:
                log.warning("engine item failed: %s", e)
                results.append(on_error(f"{type(e).__name__}: {e}"))
                continue
            log.warning("engine batch of %d failed (%s); isolating the bad item(s)", len(batch), e)
        errors: list[Exception] = []
        for i, item in enumerate(batch):
            try:
                results.extend(run([item], batch_seed * 1000 + i))
            except Exception as e:
                errors.append(e)
                results.append(on_error(f"{type(e).__name__}: {e}"))
        if len(errors) == len(batch):
            raise EngineFailure(f"all {len(batch)} items of a batch failed, each alone too (first: "
                                f"{type(errors[0]).__name__}: {errors[0]}): the engine fails, not the items") \
                from errors[0]
    return results

