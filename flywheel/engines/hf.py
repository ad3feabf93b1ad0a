"""The transformers backend of the text engine: any `AutoModelForImageTextToText` checkpoint (Qwen2-VL, LLaVA, ...)."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from PIL import Image

import flywheel.models.processors  # noqa: F401  (registers the image-only Qwen2-VL processor)
from flywheel.config import GenerationConfig
from flywheel.engines.base import (TextEngine, TextRequest, TextResult, TokenLogprobs, prepare_text_requests,
                                   resolve_device, run_batched)
from flywheel.models.versions import checkpoint_name, checkpoint_version

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class HFTextEngine(TextEngine):
    def __init__(self, model_path: str, generation: GenerationConfig, dtype: str = "float32", device: str = "auto"):
        from transformers import AutoModelForImageTextToText, AutoProcessor

        self.generation = generation
        self.device = resolve_device(device)
        self.processor = AutoProcessor.from_pretrained(model_path)
        self.model = AutoModelForImageTextToText.from_pretrained(model_path, dtype=DTYPES[dtype]).to(self.device).eval()
        self.tokenizer = self.processor.tokenizer
        self.name = f"hf:{checkpoint_name(model_path)}"
        self.version = checkpoint_version(model_path)

    def generate(self, requests: Sequence[TextRequest], seed: int = 0) -> list[TextResult]:
        results, prepared = prepare_text_requests(requests)
        # Text-only and image requests are batched apart: a processor call takes images for all items or none.
        for with_images in (True, False):
            group = [p for p in prepared if bool(p[2]) == with_images]
            outs = run_batched(
                group, self.generation.batch_size, self._generate_batch, lambda err: TextResult(error=err), seed
            )
            for (i, _, _), out in zip(group, outs, strict=True):
                results[i] = out
        return results  # type: ignore[return-value]

    @torch.inference_mode()
    def _generate_batch(self, batch: list[tuple[int, TextRequest, list[Image.Image]]], seed: int) -> list[TextResult]:
        texts = [self.processor.apply_chat_template(req.messages, add_generation_prompt=True) for _, req, _ in batch]
        images = [imgs for _, _, imgs in batch]
        inputs = self.processor(
            text=texts, images=images if any(images) else None, return_tensors="pt", padding=True
        ).to(self.device)
        g = self.generation
        sample = g.temperature > 0
        torch.manual_seed(seed)
        want_logprobs = g.top_logprobs > 0
        out = self.model.generate(
            **inputs,
            max_new_tokens=g.max_new_tokens,
            do_sample=sample,
            temperature=g.temperature if sample else None,
            top_p=g.top_p if sample else None,
            top_k=g.top_k if sample else None,
            pad_token_id=self.tokenizer.pad_token_id,
            # raw logits (not the temperature/top-p processed scores): the model's own distribution
            output_logits=want_logprobs,
            return_dict_in_generate=True,
        )
        new = out.sequences[:, inputs["input_ids"].shape[1] :]
        prompt_lens = inputs["attention_mask"].sum(dim=1).tolist()
        logprobs = self._logprobs(out.logits, new, g.top_logprobs) if want_logprobs else [None] * len(new)
        results = []
        for row, n_prompt, lp in zip(new, prompt_lens, logprobs, strict=True):
            n_out = int((row != self.tokenizer.pad_token_id).sum())
            text = self.tokenizer.decode(row, skip_special_tokens=True)
            results.append(TextResult(text=text, prompt_tokens=int(n_prompt), completion_tokens=n_out, logprobs=lp))
        return results

    def _logprobs(self, logits: tuple, new: torch.Tensor, k: int) -> list[list[TokenLogprobs]]:
        """Per row, its generated tokens up to the first special token, each with the k most likely tokens. Each
        step is normalised for the whole batch at once (one (batch, vocab) slice in memory at a time), and every
        token id involved is decoded once."""
        values, indices, chosen = [], [], []
        for step, step_logits in enumerate(logits):
            lp = step_logits.float().log_softmax(dim=-1)
            top = lp.topk(k, dim=-1)
            values.append(top.values.tolist())
            indices.append(top.indices.tolist())
            chosen.append(lp.gather(-1, new[:, step : step + 1])[:, 0].tolist())
        ids = sorted(set(new.flatten().tolist()) | {i for step in indices for row in step for i in row})
        text = dict(zip(ids, self.tokenizer.batch_decode([[i] for i in ids]), strict=True))
        special = set(self.tokenizer.all_special_ids)
        out = []
        for r, row in enumerate(new.tolist()):
            tokens = []
            for step, tok in enumerate(row):
                if tok in special:
                    break
                alternatives: dict[str, float] = {}
                for v, i in zip(values[step][r], indices[step][r], strict=True):
                    alternatives.setdefault(text[i], v)  # two ids spelling one text: keep the likelier
                tokens.append(TokenLogprobs(text[tok], chosen[step][r], alternatives))
            out.append(tokens)
        return out

    def close(self) -> None:
        del self.model
