"""Request bodies of the Serve app's routes, their limits, and the one error type every route answers with.

Kept free of Ray and FastAPI so the whole request -> TextRequest path is testable as plain functions
(flywheel/serve/judging.py, flywheel/serve/chat.py). Images are inline base64 PNG only: a URL is refused, never
fetched. Limits (ServeLimitsConfig) answer 413; malformed input answers 422; both name the reason.
"""

from __future__ import annotations

import base64
import binascii
import io
import json
import warnings
from typing import Any, Literal

from PIL import Image
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from flywheel.config import ServeLimitsConfig
from flywheel.images import PNG_MAGIC, ImageError, as_png

PNG_DATA_URL = "data:image/png;base64,"


class RequestError(Exception):
    """A request the app refuses: HTTP status + a reason meant for the client."""

    def __init__(self, status: int, reason: str, kind: str | None = None, headers: dict[str, str] | None = None):
        super().__init__(reason)
        self.status, self.reason, self.headers = status, reason, headers or {}
        self.kind = kind or {401: "authentication_error", 404: "not_found_error", 413: "request_too_large",
                             422: "invalid_request_error", 503: "overloaded_error"}.get(status, "server_error")


def too_large(reason: str) -> RequestError:
    return RequestError(413, reason)


def invalid(reason: str) -> RequestError:
    return RequestError(422, reason)


# ---------------------------------------------------------------- judging bodies
class _In(BaseModel):
    model_config = ConfigDict(extra="forbid")


class PromptIn(_In):
    """A prompt record (flywheel.records 'prompt'), with images as base64 PNG strings."""

    task: str = Field(description="nlg | iu | ig | itig.")
    subtask: str | None = Field(None, description="Sub-task name of configs/aspects.yaml (required by aspects).")
    query: str | None = Field(None, description="The query text.")
    images: list[str] = Field([], description="Input images, base64 PNG.")
    reference_text: str | None = Field(None, description="Reference answer (pointwise uses it).")
    reference_images: list[str] = Field([], description="Reference images, base64 PNG.")
    prompt_id: str | None = None


class CandidateIn(_In):
    """A candidate record: output text and/or output images (base64 PNG)."""

    candidate_id: str | None = None
    output_text: str | None = None
    output_images: list[str] = Field([], description="Output images, base64 PNG.")


class PointwiseItem(_In):
    prompt: PromptIn
    candidate: CandidateIn
    use_reference: bool = Field(True, description="Show the prompt's reference to the judge.")


class PairwiseItem(_In):
    prompt: PromptIn
    candidate_a: CandidateIn
    candidate_b: CandidateIn
    aspect: str | None = Field(None, description="An aspect name of the tree; null judges overall quality.")
    use_reference: bool = Field(True, description="Show the prompt's reference to the judge (a universal aspect "
                                "is judged without the query and its reference either way).")
    orders: list[Literal["AB", "BA"]] = Field(["AB", "BA"], min_length=1, max_length=2,
                                              description="Orders shown to the judge (both: position swap).")

    @field_validator("orders")
    @classmethod
    def _distinct(cls, v: list[str]) -> list[str]:
        if len(set(v)) != len(v):
            raise ValueError("orders must be distinct")
        return v


class AspectsItem(_In):
    prompt: PromptIn
    candidate: CandidateIn


class _JudgeBody(_In):
    seed: int = Field(0, description="Seed of sampled decoding (judge.generation.temperature > 0).")


class PointwiseBody(_JudgeBody):
    items: list[PointwiseItem] = Field(min_length=1)


class PairwiseBody(_JudgeBody):
    items: list[PairwiseItem] = Field(min_length=1)


class AspectsBody(_JudgeBody):
    items: list[AspectsItem] = Field(min_length=1)


# ---------------------------------------------------------------- OpenAI chat body
class ImageUrl(_In):
    url: str
    detail: str | None = None  # accepted and ignored (OpenAI clients may send it)


class ContentPart(_In):
    type: Literal["text", "image_url"]
    text: str | None = None
    image_url: ImageUrl | None = None


class ChatMessage(_In):
    role: Literal["system", "user", "assistant"]
    content: str | list[ContentPart]
    name: str | None = None


class ChatBody(_In):
    """The subset of OpenAI's chat-completions request this server honours; anything else is a 422 naming it."""

    model: str | None = None
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    top_k: int | None = Field(None, ge=0, description="Extension (vLLM's): 0 disables.")
    seed: int | None = None
    logprobs: bool | None = Field(None, description="Return each output token's log-probability.")
    top_logprobs: int | None = Field(None, ge=0, le=20, description="Only with logprobs: how many most likely "
                                     "tokens to return per position, with their log-probabilities (0-20).")
    n: int = Field(1, ge=1, le=64, description="Choices to draw (OpenAI's n): sampled together, in one batch of "
                   "their own, from the request's seed, so the same body gives the same choices.")
    stream: Literal[False] = Field(False, description="Streaming is not supported.")
    user: str | None = None


# ---------------------------------------------------------------- parsing & images
def parse_body(raw: bytes, model: type[BaseModel]) -> Any:
    """JSON bytes -> a validated body, or 422 naming every problem (field path + message)."""
    try:
        data = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as e:
        raise invalid(f"body is not valid JSON: {e}") from None
    try:
        return model.model_validate(data)
    except ValidationError as e:
        problems = []
        for err in e.errors()[:10]:
            where = ".".join(str(p) for p in err["loc"]) or "body"
            msg = "unsupported field" if err["type"] == "extra_forbidden" else err["msg"]
            problems.append(f"{where}: {msg}")
        raise invalid("; ".join(problems)) from None


def count_items(n: int, limits: ServeLimitsConfig) -> None:
    if n > limits.max_items:
        raise too_large(f"{n} items in one request; the limit is {limits.max_items}")


def count_images(n: int, limits: ServeLimitsConfig) -> None:
    if n > limits.max_images:
        raise too_large(f"{n} images in one request; the limit is {limits.max_images}")


def decode_png(text: str, where: str, limits: ServeLimitsConfig) -> bytes:
    """Base64 PNG (bare, or a `data:image/png;base64,` URL) -> verified PNG bytes. The pixel count is read from
    the header before any pixel is decoded; a URL of any other kind is refused and never fetched."""
    if not isinstance(text, str):
        raise invalid(f"{where}: expected a base64 PNG string")
    s = text.strip()
    if s.startswith("data:"):
        if not s.startswith(PNG_DATA_URL):
            raise invalid(f"{where}: only data:image/png;base64 URLs are accepted, got {s[:40]!r}")
        s = s[len(PNG_DATA_URL):]
    elif "://" in s[:16]:
        raise invalid(f"{where}: image URLs are not fetched; send the image inline as base64 PNG "
                      f"(data:image/png;base64,...)")
    try:
        raw = base64.b64decode(s, validate=True)
    except (binascii.Error, ValueError):
        raise invalid(f"{where}: not valid base64") from None
    if raw[:8] != PNG_MAGIC:
        raise invalid(f"{where}: not a PNG (only PNG images are accepted)")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            with Image.open(io.BytesIO(raw)) as im:  # header only
                w, h = im.size
    except Exception as e:
        raise invalid(f"{where}: undecodable PNG ({type(e).__name__})") from None
    if w * h > limits.max_image_pixels:
        raise too_large(f"{where}: {w}x{h} = {w * h} pixels; the limit is {limits.max_image_pixels} per image")
    try:
        return as_png(raw, max_pixels=limits.max_image_pixels, max_bytes=limits.max_body_bytes)
    except ImageError as e:
        raise invalid(f"{where}: {e}") from None
