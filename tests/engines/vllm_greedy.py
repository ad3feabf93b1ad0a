"""Helper run by tests/engines/test_vllm.py under .venv-vllm (never under the main venv): generate with
VLLMTextEngine from a JSON spec and write the results as JSON.

    .venv-vllm/bin/python tests/engines/vllm_greedy.py spec.json out.json

spec: {"models": {name: path}, "generation": {...}, "vllm": {...}, "requests": [{"messages": [...],
"images": [<png file>, ...]}]}; out: {name: [{"text", "error", "prompt_tokens", "completion_tokens",
"logprobs": null or [{"token", "logprob", "top": {token: logprob}}]}]}. With spec "resample": {<generation
updates>}, each engine then generates the same requests again with those settings, as the Serve app switches an
engine's settings per batch; out names those results "<name>:resampled". With spec "samples": {"k", "temperature"},
each engine then draws k samples of every request (VLLMTextEngine.sample, SamplingParams n=k) twice with seed 0
and once with seed 1: "<name>:sampled", "<name>:sampled-again", "<name>:sampled-seed1", each [request][sample].
"""
import json
import sys
import time
from dataclasses import asdict
from pathlib import Path

from flywheel.config import GenerationConfig, VLLMConfig
from flywheel.engines.base import TextRequest
from flywheel.engines.vllm import VLLMTextEngine


def _as_json(r) -> dict:
    return {"text": r.text, "error": r.error, "prompt_tokens": r.prompt_tokens,
            "completion_tokens": r.completion_tokens,
            "logprobs": None if r.logprobs is None else [asdict(t) for t in r.logprobs]}


def main(spec_path: str, out_path: str) -> None:
    spec = json.loads(Path(spec_path).read_text())
    requests = [TextRequest(messages=r["messages"], images=[Path(p).read_bytes() for p in r["images"]])
                for r in spec["requests"]]
    out = {}
    for name, path in spec["models"].items():
        t0 = time.perf_counter()
        engine = VLLMTextEngine(path, GenerationConfig(**spec["generation"]), VLLMConfig(**spec["vllm"]))
        results = engine.generate(requests, seed=0)
        out[name] = [_as_json(r) for r in results]
        if spec.get("resample"):
            engine.generation = engine.generation.model_copy(update=spec["resample"])
            out[f"{name}:resampled"] = [_as_json(r) for r in engine.generate(requests, seed=0)]
        if spec.get("samples"):
            k = spec["samples"]["k"]
            engine.generation = engine.generation.model_copy(update={"temperature": spec["samples"]["temperature"]})
            for key, seed in (("sampled", 0), ("sampled-again", 0), ("sampled-seed1", 1)):
                out[f"{name}:{key}"] = [[_as_json(r) for r in x] for x in engine.sample(requests, seed, k)]
        print(f"[vllm] {name}: {len(results)} results in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
        engine.close()
    Path(out_path).write_text(json.dumps(out))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
