"""Candidates: N samples per prompt from the policies — the text policy (LLaVA) for NLG and IU, the generator
(SDXL) for IG, both for ITIG (the generator draws, then the text policy describes its own drawing).

`CandidatesCore` is the pure core (engines in, rows out; testable without Ray); `run` places it as a Ray Data
actor pool with the `candidates` resources from config.
"""

from __future__ import annotations

import hashlib
import io
import json
from typing import Any

import numpy as np

from flywheel.config import Config
from flywheel.engines import ImageRequest, TextRequest, make_image_engine, make_text_engine
from flywheel.stages.runner import CoreOutput, StageResult, run_stage
from flywheel.worlds.shapes.assessment import NoGroundTruth
from flywheel.worlds.shapes.gold import gold_candidates

TEXT_TASKS, IMAGE_TASKS = ("nlg", "iu"), ("ig",)


def _seed(prompt_id: str, k: int, base: int) -> int:
    """Per-sample seed from the prompt's id: the same sample comes out however prompts are batched."""
    return int.from_bytes(hashlib.sha256(f"{base}:{prompt_id}:{k}".encode()).digest()[:4], "big")


def _png(image) -> bytes:
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    return buf.getvalue()


def _user(text: str, n_images: int) -> list[dict[str, Any]]:
    return [{"role": "user", "content": [{"type": "image"}] * n_images + [{"type": "text", "text": text}]}]


def policy_request(prompt: dict) -> TextRequest:
    """What the text policy is asked for a text-task prompt: its images, then its query."""
    return TextRequest(_user(prompt["query"], len(prompt["images"])), list(prompt["images"]))


def generator_request(prompt: dict, seed: int) -> ImageRequest:
    """What the generator is asked for a drawing prompt: the oracle world's generator prompt, else the query."""
    meta = json.loads(prompt["meta"]) if prompt.get("meta") else {}
    return ImageRequest(meta.get("generator_prompt") or prompt["query"], seed=seed)


class CandidatesCore:
    def __init__(self, cfg: Config, text_engine=None, image_engine=None):
        self.cfg = cfg
        self._text, self._image = text_engine, image_engine  # loaded on first use: a batch may need only one

    @property
    def text(self):
        if self._text is None:
            self._text = make_text_engine(self.cfg, "policy")
        return self._text

    @property
    def image(self):
        if self._image is None:
            self._image = make_image_engine(self.cfg)
        return self._image

    def __call__(self, prompts: list[dict]) -> CoreOutput:
        n, seed = self.cfg.candidates.samples_per_prompt, self.cfg.run.seed
        out = CoreOutput()
        slots = [(i, p, k) for i, p in enumerate(prompts) for k in range(n)]
        meta = [json.loads(p["meta"]) if p.get("meta") else {} for p in prompts]

        images: dict[int, bytes] = {}  # slot index -> PNG
        draw = [j for j, (_, p, _) in enumerate(slots) if p["task"] in ("ig", "itig")]
        if draw:
            reqs = [generator_request(slots[j][1], _seed(slots[j][1]["prompt_id"], slots[j][2], seed)) for j in draw]
            for j, res in zip(draw, self.image.generate(reqs, seed=seed), strict=True):
                if res.ok:
                    images[j] = _png(res.image)
                else:
                    self._reject(out, slots[j], f"generator: {res.error}")

        texts: dict[int, str] = {}  # slot index -> answer
        speak = [j for j, (_, p, _) in enumerate(slots) if p["task"] in TEXT_TASKS or j in images]
        speak = [j for j in speak if slots[j][1]["task"] != "ig"]
        if speak:
            reqs = []
            for j in speak:
                i, p, _ = slots[j]
                if p["task"] == "itig":
                    describe = meta[i].get("describe_prompt") or self.cfg.candidates.itig_describe_prompt
                    reqs.append(TextRequest(_user(describe, 1), [images[j]]))
                else:
                    reqs.append(policy_request(p))
            for j, res in zip(speak, self.text.generate(reqs, seed=seed), strict=True):
                if res.ok:
                    texts[j] = res.text.strip()
                else:
                    self._reject(out, slots[j], f"policy: {res.error}")

        for j, (i, p, k) in enumerate(slots):
            task = p["task"]
            text, image = texts.get(j), images.get(j)
            if (task in TEXT_TASKS and text is None) or (task in IMAGE_TASKS and image is None) or (
                    task == "itig" and (text is None or image is None)):
                continue  # already quarantined with the engine's reason
            producers = []
            if image is not None:
                producers.append(f"{self.image.name}@{self.image.version}")
            if text is not None:
                producers.append(f"{self.text.name}@{self.text.version}")
            out.rows.append({"prompt_id": p["prompt_id"], "producer": "+".join(producers), "output_text": text,
                             "output_images": [image] if image is not None else [], "sample_index": k,
                             "meta": None})
        out.rows += self._seeded_variants(prompts)
        return out

    def _seeded_variants(self, prompts: list[dict]) -> list[dict]:
        """candidates.seeded_variants outputs per prompt from the world's variant maker, drawn per prompt id (the
        same however prompts are batched), numbered after the policy samples."""
        want, n, seed = self.cfg.candidates.seeded_variants, self.cfg.candidates.samples_per_prompt, self.cfg.run.seed
        rows: list[dict] = []
        if not want:
            return rows
        for p in prompts:
            try:
                made = gold_candidates(p, self.cfg.world.gold, self.cfg.world.shapes, seed)
            except NoGroundTruth:
                continue  # a prompt from outside the oracle world: its candidates are the policy's alone
            rng = np.random.default_rng(_seed(p["prompt_id"], -1, seed))
            for k, j in enumerate(sorted(rng.choice(len(made), size=min(want, len(made)), replace=False))):
                rows.append({**made[j], "sample_index": n + k})
        return rows

    @staticmethod
    def _reject(out: CoreOutput, slot, reason: str) -> None:
        i, p, k = slot
        out.quarantined.append({"kind": "candidate", "index": i, "reason": f"sample {k}: {reason}",
                                "field": "output", "raw": {"prompt_id": p["prompt_id"], "sample_index": k}})


def run(cfg: Config, prompts_uri: str, output_uri: str, tracker=None) -> StageResult:
    return run_stage(
        "candidates", inputs=[prompts_uri], output=output_uri, kind="candidate",
        core_factory=lambda: CandidatesCore(cfg), resources=cfg.resources.candidates,
        batch_size=cfg.candidates.batch_size, stage_hash=cfg.stage_hash("candidates"), limits=cfg.limits,
        tracker=tracker,
    )
