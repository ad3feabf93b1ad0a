"""The OpenAI-compatible route as plain functions: a chat-completions body -> one TextRequest + the decoding
settings it asks for, and a TextResult -> the chat.completion response object.

Log-probabilities follow OpenAI: `logprobs: true` returns each output token's log-probability, `top_logprobs`
(0-20, only with logprobs) as many alternatives per position; they are the model's raw distribution (engines
report it before temperature and top-p)."""

from __future__ import annotations

import time
import uuid

from flywheel.config import GenerationConfig, ServeLimitsConfig
from flywheel.engines.base import TextRequest, TextResult, TokenLogprobs
from flywheel.serve.schemas import ChatBody, count_images, decode_png, invalid


def chat_request(body: ChatBody, limits: ServeLimitsConfig, default: GenerationConfig,
                 max_tokens_cap: int) -> tuple[TextRequest, GenerationConfig, int]:
    """(request, generation settings, seed). image_url parts must be data:image/png;base64 URLs (422 otherwise:
    nothing is ever fetched); max_tokens may not exceed the server's cap (422)."""
    n = sum(1 for m in body.messages if isinstance(m.content, list) for p in m.content if p.type == "image_url")
    count_images(n, limits)
    messages, images = [], []
    for i, m in enumerate(body.messages):
        if isinstance(m.content, str):
            messages.append({"role": m.role, "content": m.content})
            continue
        parts = []
        for j, p in enumerate(m.content):
            where = f"messages[{i}].content[{j}]"
            if p.type == "text":
                if p.text is None or p.image_url is not None:
                    raise invalid(f"{where}: a text part needs `text` (and no `image_url`)")
                parts.append({"type": "text", "text": p.text})
            else:
                if p.image_url is None or p.text is not None:
                    raise invalid(f"{where}: an image_url part needs `image_url` (and no `text`)")
                images.append(decode_png(p.image_url.url, f"{where}.image_url.url", limits))
                parts.append({"type": "image"})
        messages.append({"role": m.role, "content": parts})
    if body.max_tokens is not None and body.max_completion_tokens is not None \
            and body.max_tokens != body.max_completion_tokens:
        raise invalid("max_tokens and max_completion_tokens disagree; send one")
    asked = body.max_completion_tokens or body.max_tokens or min(default.max_new_tokens, max_tokens_cap)
    if asked > max_tokens_cap:
        raise invalid(f"max_tokens {asked} exceeds this server's limit of {max_tokens_cap}")
    updates: dict = {"max_new_tokens": asked}
    if body.temperature is not None:
        updates["temperature"] = body.temperature
    if body.top_p is not None:
        updates["top_p"] = body.top_p
    if body.top_k is not None:
        updates["top_k"] = body.top_k
    updates["top_logprobs"] = _engine_top_logprobs(body)
    gen = default.model_copy(update=updates)
    return TextRequest(messages=messages, images=images), gen, body.seed or 0


def _engine_top_logprobs(body: ChatBody) -> int:
    """The engine's top_logprobs for this body. Always set, so the judge's own setting (rating_readout=expected
    asks for logprobs) never leaks into a chat that did not ask. Engines give the chosen token's logprob only with
    k >= 1, so logprobs without top_logprobs asks for 1 (the response then shows none, see chat_response)."""
    if body.top_logprobs is not None and not body.logprobs:
        raise invalid("top_logprobs needs logprobs: true")
    return max(1, body.top_logprobs or 0) if body.logprobs else 0


def chat_logprobs(logprobs: list[TokenLogprobs] | None, top_logprobs: int | None = None) -> dict | None:
    """OpenAI's `choices[0].logprobs`: {"content": [{token, logprob, bytes, top_logprobs: [{token, logprob,
    bytes}]}]}, alternatives most likely first, at most `top_logprobs` of them (None: all the engine gave).
    `bytes` is null: engines give a token's decoded text, not its raw bytes (a token holding part of a UTF-8
    character decodes to U+FFFD, so encoding the text back would be wrong)."""
    if logprobs is None:
        return None
    content = []
    for t in logprobs:
        top = sorted(t.top.items(), key=lambda kv: -kv[1])[:top_logprobs]
        content.append({"token": t.token, "logprob": t.logprob, "bytes": None,
                        "top_logprobs": [{"token": a, "logprob": lp, "bytes": None} for a, lp in top]})
    return {"content": content}


def chat_response(result: TextResult | list[TextResult], model_name: str, model_version: str, max_tokens: int,
                  top_logprobs: int | None = None) -> dict:
    """One choice per result (a body's `n`). `top_logprobs`: the body's (0 for logprobs without it); None shows
    every alternative the engine returned. Logprobs appear only if the engine returned them, i.e. only if the body
    asked (chat_request)."""
    results = [result] if isinstance(result, TextResult) else result
    prompt_tokens = results[0].prompt_tokens  # one prompt, read once for all its choices
    completion_tokens = sum(r.completion_tokens for r in results)
    return {
        "id": f"chatcmpl-{uuid.uuid4().hex[:24]}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model_name,
        "model_version": model_version,
        "system_fingerprint": model_version,
        "choices": [{"index": i, "message": {"role": "assistant", "content": r.text},
                     "finish_reason": "length" if r.completion_tokens >= max_tokens else "stop",
                     "logprobs": chat_logprobs(r.logprobs, top_logprobs)} for i, r in enumerate(results)],
        "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                  "total_tokens": prompt_tokens + completion_tokens},
    }
