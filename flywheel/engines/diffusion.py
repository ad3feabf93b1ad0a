"""The diffusers backend of the image engine: any StableDiffusionXLPipeline checkpoint."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from flywheel.config import ImageGenerationConfig
from flywheel.engines.base import ImageEngine, ImageRequest, ImageResult, resolve_device, run_batched
from flywheel.models.versions import checkpoint_name, checkpoint_version

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class DiffusersImageEngine(ImageEngine):
    def __init__(self, model_path: str, generation: ImageGenerationConfig, dtype: str = "float32",
                 device: str = "auto"):
        from diffusers import StableDiffusionXLPipeline

        self.generation = generation
        self.device = resolve_device(device)
        self.pipe = StableDiffusionXLPipeline.from_pretrained(model_path, dtype=DTYPES[dtype]).to(self.device)
        self.pipe.set_progress_bar_config(disable=True)
        self.name = f"diffusers:{checkpoint_name(model_path)}"
        self.version = checkpoint_version(model_path)

    def generate(self, requests: Sequence[ImageRequest], seed: int = 0) -> list[ImageResult]:
        results: list[ImageResult | None] = [None] * len(requests)
        good = []
        for i, req in enumerate(requests):
            if not isinstance(req.prompt, str) or not req.prompt.strip():
                results[i] = ImageResult(error="invalid request: prompt must be a non-empty string")
            else:
                good.append((i, req))
        outs = run_batched(good, self.generation.batch_size, lambda b, s: self._generate_batch(b, s, seed),
                           lambda err: ImageResult(error=err), seed)
        for (i, _), out in zip(good, outs, strict=True):
            results[i] = out
        return results  # type: ignore[return-value]

    @torch.inference_mode()
    def _generate_batch(self, batch: list[tuple[int, ImageRequest]], _batch_seed: int, seed: int) -> list[ImageResult]:
        g = self.generation
        # One generator per item, seeded by the item (or by its position in the call), so an image does not
        # depend on which other prompts shared its batch.
        generators = [
            torch.Generator(self.device).manual_seed(req.seed if req.seed is not None else seed * 100_003 + i)
            for i, req in batch
        ]
        negatives = [req.negative_prompt or "" for _, req in batch]
        out = self.pipe(
            prompt=[req.prompt for _, req in batch],
            negative_prompt=negatives if any(negatives) else None,
            num_inference_steps=g.num_inference_steps,
            guidance_scale=g.guidance_scale,
            height=g.height,
            width=g.width,
            generator=generators,
            output_type="pil",
        )
        return [ImageResult(image=img) for img in out.images]

    def close(self) -> None:
        del self.pipe
