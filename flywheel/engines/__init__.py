"""Engines: one interface for text generation from (messages, images), one for image generation from prompts.

`make_text_engine(cfg, "judge" | "policy")` and `make_image_engine(cfg)` pick the backend named in the config.
"""

from __future__ import annotations

from flywheel.config import Config
from flywheel.engines.base import ImageEngine, ImageRequest, ImageResult, TextEngine, TextRequest, TextResult

__all__ = ["ImageEngine", "ImageRequest", "ImageResult", "TextEngine", "TextRequest", "TextResult",
           "make_image_engine", "make_text_engine"]


def make_text_engine(cfg: Config, role: str) -> TextEngine:
    """role: judge | policy | teacher. The `oracle` backend (the oracle world's teacher, configured by the
    `teacher` section) answers judge requests from their context, for the teacher or the judge role. The judge
    answers each rating request judge.samples times (flywheel/engines/samples.py)."""
    if role not in ("judge", "policy", "teacher"):
        raise ValueError(f"role must be 'judge', 'policy' or 'teacher', got {role!r}")
    engine = _backend(cfg, role)
    if role == "judge" and cfg.judge.samples > 1:
        from flywheel.engines.samples import SampledTextEngine

        return SampledTextEngine(engine, cfg.judge.samples)
    return engine


def _backend(cfg: Config, role: str) -> TextEngine:
    section = getattr(cfg, role)
    if section.engine == "oracle":
        if role == "policy":
            raise ValueError("policy.engine=oracle: the oracle answers judge requests only")
        from flywheel.engines.oracle import OracleTextEngine

        return OracleTextEngine(cfg.teacher, cfg.world.shapes)
    if section.engine == "http":  # an OpenAI-compatible endpoint (GPT-4o, a vLLM server, `flywheel serve`)
        from flywheel.engines.http import HTTPTextEngine

        return HTTPTextEngine(section.http, section.generation)
    if role == "teacher":  # a teacher has no checkpoint of its own in models: a served one is reached by http
        raise NotImplementedError(f"teacher.engine={section.engine}: use oracle, or http for a served model")
    from flywheel.models.zoo import resolve_model_path

    ref = getattr(cfg.models, role)
    if section.engine == "vllm":  # needs the vllm package (GPU install, or .venv-vllm on CPU)
        from flywheel.engines.vllm import VLLMTextEngine

        return VLLMTextEngine(resolve_model_path(ref, cfg), section.generation, section.vllm, dtype=ref.dtype,
                              seed=cfg.run.seed, max_images_per_prompt=cfg.serve.limits.max_images)
    if section.engine == "hf":
        from flywheel.engines.hf import HFTextEngine

        return _named(HFTextEngine(resolve_model_path(ref, cfg), section.generation, dtype=ref.dtype), ref.path)
    raise NotImplementedError(f"{role}.engine={section.engine}: this backend is not implemented yet; use 'hf'")


def make_image_engine(cfg: Config) -> ImageEngine:
    from flywheel.engines.diffusion import DiffusersImageEngine
    from flywheel.models.zoo import resolve_model_path

    ref = cfg.models.generator
    return _named(DiffusersImageEngine(resolve_model_path(ref, cfg), cfg.generator.generation, dtype=ref.dtype),
                  ref.path)


def _named(engine, ref: str):
    """A registered version is named by its registry URI (its local copy's folder name says nothing)."""
    if ref.startswith("models:/"):
        engine.name = f"{engine.name.split(':', 1)[0]}:{ref}"
    return engine
