"""Self-consistency: a judge engine that answers each rating request several times, each with a sampling seed of
its own (judge.samples, at judge.generation.temperature > 0), so the rating read from them is their mean
(flywheel/judge/pointwise.result_fields) and a pairwise verdict their vote (pairwise.result_fields).

Wang et al. 2022 sample several reasoning paths and keep the majority answer; G-Eval averages 20 sampled ratings.
The tiny judge half sees blur and noise: its greedy analysis may call both candidates sharp though "blurred" is
likelier for one of them; averaged over sampled analyses, that likelihood reaches the rating (bench/judge_samples.py
measured the lift: docs/results.md, "Self-consistency").

Requests that read one answer (a rubric, a decomposed step, a claim split, an aspects group) are sent once. The
samples are drawn by the engine (TextEngine.sample): by default k calls, the first with the caller's seed (so it is
the one-sample answer); vLLM draws them in one request (n=k); over HTTP one request asks for OpenAI's n
choices, which Serve draws in one batch.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from flywheel.engines.base import TextEngine, TextRequest, TextResult

# The protocols whose rating or verdict result_fields reads from all samples.
SAMPLED_PROTOCOLS = ("pointwise", "pairwise", "claims")


def is_sampled(req: TextRequest) -> bool:
    """Whether a request's answer is read as a rating or verdict: a pointwise, pairwise or claim-check request
    (its context's protocol with no step), or one without context (Serve's and `flywheel eval`'s pointwise and
    pairwise requests)."""
    ctx = req.context
    return ctx is None or (ctx.get("protocol") in SAMPLED_PROTOCOLS and ctx.get("step") is None)


def bundle(samples: Sequence[TextResult]) -> TextResult:
    """k sampled answers to one request -> one result carrying all k in `samples`. Its own text (its row's
    raw_output) is its first answered sample's; it fails only when every sample failed, so one engine error does
    not lose the answers of the other samples."""
    if not samples:
        raise ValueError("no samples to bundle")
    lead = next((s for s in samples if s.ok), samples[0])
    return TextResult(text=lead.text, error=lead.error, prompt_tokens=sum(s.prompt_tokens for s in samples),
                      completion_tokens=sum(s.completion_tokens for s in samples), logprobs=lead.logprobs,
                      samples=list(samples))


class SampledTextEngine(TextEngine):
    """Wraps a judge engine: each sampled request (is_sampled) is generated `k` times, the rest once."""

    def __init__(self, inner: TextEngine, k: int):
        if k < 2:
            raise ValueError(f"k must be at least 2 (one sample needs no wrapper), got {k}")
        self.inner, self.k = inner, k  # name and version are the backend's, read live (__getattr__): an HTTP
        # engine learns its version from the server's first answer

    def generate(self, requests: Sequence[TextRequest], seed: int = 0) -> list[TextResult]:
        sampled = [i for i, r in enumerate(requests) if is_sampled(r)]
        once = [i for i, r in enumerate(requests) if not is_sampled(r)]
        results: list[TextResult | None] = [None] * len(requests)
        if once:
            got = self.inner.generate([requests[i] for i in once], seed=seed)
            if len(got) != len(once):
                raise RuntimeError(f"engine returned {len(got)} results for {len(once)} requests")
            for i, r in zip(once, got, strict=True):
                results[i] = r
        if sampled:
            got = self.inner.sample([requests[i] for i in sampled], seed, self.k)
            if len(got) != len(sampled) or any(len(x) != self.k for x in got):
                raise RuntimeError(f"engine returned {[len(x) for x in got]} samples for {len(sampled)} requests "
                                   f"x {self.k}")
            for i, x in zip(sampled, got, strict=True):
                results[i] = bundle(x)
        return results  # type: ignore[return-value]

    def counters(self) -> dict[str, float]:
        return self.inner.counters()

    def close(self) -> None:
        self.inner.close()

    def __getattr__(self, name: str) -> Any:  # the backend's own attributes (generation, model, ...) stay readable
        if name == "inner":  # not set yet (a copy being built): no recursion
            raise AttributeError(name)
        return getattr(self.inner, name)
