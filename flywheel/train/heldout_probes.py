"""What a held-out evaluation measures, on the model *being trained* (no checkpoint is written or loaded):

- `TextPolicyProbe` (LLaVA policy): greedy answers to seeded oracle-world questions (policy_eval's held-out
  stream, disjoint from the training prompts and from the gate's items) -> accuracy per type, caption recall
  and hallucination, format validity, repetition, answer length;
- `GeneratorProbe` (SDXL): images for seeded draw prompts at the flywheel's sampling guidance (`score10`, ...)
  and at a normal guidance as a generic-quality probe (`probe/score10`, ...);
- `JudgeProbe` (judge DPO): the judge rates seeded gold outputs (pointwise, labelled by the noiseless oracle) ->
  rating accuracy, Kendall tau-b, pairwise accuracy derived from the ratings, format validity; with claim checks
  in the judge's protocols, also their format validity and the share the oracle's verdict agrees with;
- optionally (`heldout.judge`) a judge also scores the policy's held-out outputs (`judge/<protocol>/score`),
  with its parse failures counted (`judge/<protocol>/parse_failure_rate`): a curve to watch, or the target where
  no oracle says what is right (`heldout.target: judge/pointwise/score`; docs/tuning.md "heldout").

Each probe is called with the live model and runs under `torch.random.fork_rng`, so evaluating never moves the
training's random stream (a resumed run stays identical to an uninterrupted one).
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from contextlib import contextmanager

import numpy as np
import torch

from flywheel.engines.diffusion import DiffusersImageEngine
from flywheel.engines.hf import HFTextEngine

log = logging.getLogger(__name__)


# ------------------------------------------------------------------------------------------- live engines
class LiveTextEngine(HFTextEngine):
    """HFTextEngine's batching and decoding over a model in memory (the one being trained)."""

    def __init__(self, model, processor, generation):  # noqa: D107 - deliberately skips loading
        self.model, self.processor, self.tokenizer = model, processor, processor.tokenizer
        self.generation = generation
        self.device = next(model.parameters()).device
        self.name, self.version = "live:training", "current"


class LiveImageEngine(DiffusersImageEngine):
    """DiffusersImageEngine over a pipeline in memory (its UNet is the one being trained)."""

    def __init__(self, pipe, generation):  # noqa: D107
        self.pipe, self.generation = pipe, generation
        self.device = pipe.unet.device
        self.name, self.version = "live:training", "current"


@contextmanager
def evaluating(module: torch.nn.Module):
    """eval() for the probe, train() again after; the training's RNG untouched."""
    was_training = module.training
    module.eval()
    try:
        with torch.random.fork_rng(devices=[]):
            yield
    finally:
        module.train(was_training)


# ------------------------------------------------------------------------------------------- judge scoring
def make_judge_engine(cfg, ref: str):
    """The engine that scores held-out outputs: `oracle` (the world's teacher) or a model reference."""
    if ref == "oracle":
        from flywheel.engines.oracle import OracleTextEngine

        return OracleTextEngine(cfg.teacher, cfg.world.shapes)
    from flywheel.train.registry import resolve_base

    return HFTextEngine(resolve_base(cfg, ref), cfg.judge.generation)


class JudgeScorer:
    """Scores candidates with a judge through the judgments stage's own core and protocols (the ones the
    preference data was labelled with: `preferences.protocols`), one sample each."""

    def __init__(self, cfg, engine):
        from flywheel.config import JudgmentsConfig

        self.cfg, self.engine = cfg, engine
        self.jcfg = JudgmentsConfig(protocols=dict(cfg.preferences.protocols), samples_per_item=1,
                                    max_pairs_per_prompt=1, claim_subtasks=cfg.judgments.claim_subtasks,
                                    claim_splitter=cfg.judgments.claim_splitter,
                                    claim_images=cfg.judgments.claim_images,
                                    claim_context=cfg.judgments.claim_context)

    def __call__(self, prompts: list[dict], outputs: list[dict]) -> dict[str, float]:
        """prompts: records without ids; outputs: per prompt {"output_text": ...} or {"output_images": [...]}.
        The judge curve is optional: a judge that fails outright is logged and skipped, never the training."""
        try:
            return self.score_items(prompts, outputs)[0]
        except Exception as e:  # noqa: BLE001 - an optional measure must not end a training
            log.warning("held-out judge scoring failed (%s: %s); no judge point at this step", type(e).__name__, e)
            return {}

    def score_items(self, prompts: list[dict], outputs: list[dict]) -> tuple[dict[str, float], dict[str, list[float]]]:
        """(per protocol `judge/<protocol>/score`, the mean rating of the outputs the judge rated, and
        `judge/<protocol>/parse_failure_rate`; per protocol the rating of each output in prompt order, NaN where
        the judge's output did not parse or was quarantined - a failure is never a score). Raises what the
        judge raises (__call__ is the forgiving form)."""
        from flywheel.records import with_ids
        from flywheel.stages.judgments import JudgmentsCore

        prompts = with_ids("prompt", prompts)
        # stripped as the candidates stage stores a policy's text: a decoded answer starts with a space (" Yes."),
        # which the judge never saw in training and rated as if it were right (runs/t13, docs/results.md)
        cands = with_ids("candidate", [{"prompt_id": p["prompt_id"], "producer": "heldout", "sample_index": 0,
                                        "output_text": None if o.get("output_text") is None
                                        else o["output_text"].strip(),
                                        "output_images": o.get("output_images", []), "meta": None}
                                       for p, o in zip(prompts, outputs, strict=True)])
        position = {c["candidate_id"]: i for i, c in enumerate(cands)}
        core = JudgmentsCore(self.cfg, cands, engine=self.engine, role="judge", judgments=self.jcfg)
        res = core(prompts)
        rated: dict[str, list[list[float]]] = {}  # protocol -> per output, its ratings (one per judgment)
        asked, failed = Counter(), Counter()
        for r in res.rows:
            rows = rated.setdefault(r["protocol"], [[] for _ in cands])
            asked[r["protocol"]] += 1
            if r.get("parse_error") or r.get("score") is None:
                failed[r["protocol"]] += 1
            else:
                rows[position[r["candidate_ids"][0]]].append(float(r["score"]))
        for q in res.quarantined:
            if isinstance(q.get("raw"), dict) and (proto := q["raw"].get("protocol")) is not None:
                rated.setdefault(proto, [[] for _ in cands])
                asked[proto] += 1
                failed[proto] += 1
        out: dict[str, float] = {}
        per_item: dict[str, list[float]] = {}
        for proto, rows in rated.items():
            scores = [float(np.mean(r)) if r else float("nan") for r in rows]
            kept = [s for s in scores if s == s]
            out[f"judge/{proto}/score"] = float(np.mean(kept)) if kept else float("nan")
            out[f"judge/{proto}/parse_failure_rate"] = failed[proto] / asked[proto]
            per_item[f"judge/{proto}/score"] = scores
        return out, per_item


# ------------------------------------------------------------------------------------------- probes
class TextPolicyProbe:
    """Greedy answers to seeded oracle-world questions, or, with `prompts` (heldout.prompts_file's records, read
    by the driver), to the user's held-out prompts, which only the judge scores."""

    def __init__(self, cfg, heldout, seed: int, judge=None, prompts: list[dict] | None = None):
        from flywheel.stages.candidates import policy_request
        from flywheel.worlds.shapes.policy_eval import HELDOUT_STREAM, text_items, text_requests

        self.world, self.prompts = cfg.world.shapes, prompts
        if prompts is None:
            self.items = text_items(self.world, heldout.items, seed, stream=HELDOUT_STREAM)
            self.requests = text_requests(self.items, self.world)
        else:
            self.requests = [policy_request(p) for p in prompts]
        gen = cfg.policy.generation
        self.generation = gen.model_copy(update={"temperature": 0.0,  # greedy: the policy's own answer
                                                 "max_new_tokens": heldout.max_new_tokens or gen.max_new_tokens})
        self.judge = judge
        self.seed = seed

    def __call__(self, model, processor) -> dict[str, float]:
        from flywheel.worlds.shapes.policy_eval import score_text_answers, text_measures, text_prompt_records

        with evaluating(model):  # the judge samples too: inside, so the training's RNG stays untouched
            results = LiveTextEngine(model, processor, self.generation).generate(self.requests, seed=self.seed)
            if self.prompts is None:
                out = score_text_answers(self.items, results)
            else:  # no ground truth: what any answer shows (a collapse into repetition), and the judge's ratings
                out = text_measures(results) | {"items": float(len(results))}
            if self.judge is not None:
                records = self.prompts or text_prompt_records(self.items, self.world)
                out |= self.judge(records, [{"output_text": r.text if r.ok else ""} for r in results])
        return out


class GeneratorProbe:
    KINDS = ("single", "binding", "relation")

    def __init__(self, cfg, heldout, seed: int, judge=None, prompts: list[dict] | None = None):
        from flywheel.stages.candidates import generator_request
        from flywheel.worlds.shapes.policy_eval import HELDOUT_IMAGE_STREAM, generator_items, image_requests

        self.world, self.prompts = cfg.world.shapes, prompts
        if prompts is None:
            self.specs = generator_items(self.world, heldout.items, seed, self.KINDS, stream=HELDOUT_IMAGE_STREAM)
            self.requests = image_requests(self.specs, seed)
        else:  # the user's held-out drawing prompts, which only the judge scores (seeded as the gate seeds them)
            self.requests = [generator_request(p, seed * 100_003 + i) for i, p in enumerate(prompts)]
        gen = cfg.generator.generation
        steps = heldout.inference_steps or gen.num_inference_steps
        self.target_gen = gen.model_copy(update={"num_inference_steps": steps, "guidance_scale":
                                                 gen.guidance_scale if heldout.guidance_scale is None
                                                 else heldout.guidance_scale})
        self.probe_gen = None if heldout.probe_guidance_scale is None else gen.model_copy(
            update={"num_inference_steps": steps, "guidance_scale": heldout.probe_guidance_scale})
        self.judge, self.seed = judge, seed

    def __call__(self, pipe) -> dict[str, float]:
        from flywheel.images import to_png_bytes
        from flywheel.worlds.shapes.policy_eval import image_prompt_records, score_images

        with evaluating(pipe.unet):  # the judge samples too: inside, so the training's RNG stays untouched
            results = LiveImageEngine(pipe, self.target_gen).generate(self.requests, seed=self.seed)
            if self.prompts is not None:
                out = {"items": float(len(results))}
                if self.judge is not None:
                    out |= self.judge(self.prompts, [{"output_images": [to_png_bytes(r.image)] if r.ok else []}
                                                     for r in results])
                return out
            out = score_images(self.specs, self.KINDS, results, self.world)
            if self.probe_gen is not None:
                probe = LiveImageEngine(pipe, self.probe_gen).generate(self.requests, seed=self.seed)
                out |= {f"probe/{k}": v for k, v in score_images(self.specs, self.KINDS, probe, self.world).items()}
            if self.judge is not None:
                out |= self.judge(image_prompt_records(self.specs, self.KINDS, self.world, self.seed),
                                  [{"output_images": [to_png_bytes(r.image)] if r.ok else []} for r in results])
        return out


class JudgeProbe:
    """The judge being trained rates seeded gold outputs (pointwise) of fresh oracle prompts, or, with
    `heldout.gold_file`, the outputs of a labeled set (human labels held out from the gate's gold)."""

    def __init__(self, cfg, heldout, seed: int, gold_text: str | None = None):
        from flywheel.records import with_ids

        if heldout.gold_file:  # its text read by the driver (TrainJob.heldout_gold): no worker needs the path
            if gold_text is None:
                raise ValueError(f"train.judge_dpo.heldout.gold_file {heldout.gold_file}: the job carries no text")
            self.protocols = {t: ["pointwise"] for t in ("iu", "ig")}  # labels carry no claim checks
            self.prompts, self.candidates, judgments = labeled_heldout(gold_text, heldout.gold_file)
        else:
            # Claim checks where the judge is taught them: descriptions are rated by their claims, as the gate
            # rates them, and each check is scored against the oracle's (gold claim checks, as meta-eval scores
            # them); the checks' format is guarded: a judge never taught claims answered 204 of 219 of them in the
            # pairwise format ("Verdict: A") while every pointwise rating parsed (docs/tuning.md, runs/flip).
            self.protocols = {t: ["pointwise", *(["claims"] if "claims" in cfg.judgments.protocols.get(t, []) else [])]
                              for t in ("iu", "ig")}
            self.prompts, self.candidates, judgments = self._oracle_gold(cfg, heldout, seed)
        self.prompt_by_id = {p["prompt_id"]: p for p in self.prompts}
        self.gold = {j["candidate_ids"][0]: j["score"] for j in judgments
                     if j["protocol"] == "pointwise" and j["score"] is not None}
        # labelled pairs, ordered by the judge's ratings of their two outputs as meta-eval orders them
        self.gold_pairs = [(*j["candidate_ids"], j["verdict"]) for j in judgments if j["protocol"] == "pairwise"]
        self.gold_claims = with_ids("judgment", [j for j in judgments if j["protocol"] == "claims"])
        # Ratings are read as the flywheel reads them (judge.rating_readout), so the held-out target tracks the
        # gate's metric. Measured on the three kept judge DPO updates of a 3-iteration local run: read from the
        # written ratings (12 prompts, ~107 pairs) the probe rose in each (+0.03, +0.04, +0.01) while the gate's
        # id-test ranking by expected ratings fell (-0.039, -0.005, -0.005); read as expected ratings over 40
        # prompts (~360 pairs) it fell where the gate fell most (0.664 -> 0.634), stayed flat once (0.740 ->
        # 0.742) and rose once (0.721 -> 0.761).
        self.cfg = cfg
        self.generation = cfg.judge.generation.model_copy(update={
            "temperature": 0.0, "max_new_tokens": heldout.max_new_tokens or cfg.judge.generation.max_new_tokens,
            "top_logprobs": cfg.judge.generation.top_logprobs if cfg.judge.rating_readout == "expected" else 0})

    def _oracle_gold(self, cfg, heldout, seed: int) -> tuple[list[dict], list[dict], list[dict]]:
        """Gold of fresh oracle prompts, disjoint from the suites' and the gate's (the world's noiseless labels), in
        the probe's protocols."""
        from flywheel.stages.gold import build_gold
        from flywheel.worlds.shapes.suites import make_prompt

        subtasks = [s for s in cfg.world.suites.subtasks if s.startswith(("iu_", "ig_"))]
        rng = np.random.default_rng([seed, 7933])  # neither the suites' streams nor the gate's gold
        prompts: list[dict] = []
        for _ in range(50 * heldout.items):  # a draw that cannot pose its question is drawn again
            if len(prompts) == heldout.items:
                break
            row = make_prompt(subtasks[len(prompts) % len(subtasks)], rng, cfg.world.shapes)
            if row is not None:
                prompts.append({**row, "split": "id-test", "aspects": [], "meta": json.dumps(row["meta"],
                                                                                             sort_keys=True)})
        gcfg = cfg.model_copy(deep=True)
        gcfg.meta_eval.gold_files = {}  # fresh oracle prompts' gold, never the gate's human labels
        gcfg.world.gold.splits = ["id-test"]
        gcfg.world.gold.prompts_per_subtask = heldout.items
        gcfg.world.gold.protocols = self.protocols
        gold = build_gold(gcfg, prompts)["id-test"]
        return gold.prompts, gold.candidates, gold.judgments

    def __call__(self, model, processor) -> dict[str, float]:
        engine = LiveTextEngine(model, processor, self.generation)
        with evaluating(model):
            return self.score(engine)

    def score(self, engine) -> dict[str, float]:
        """The probe's measures of the judge behind `engine`."""
        from flywheel.config import JudgmentsConfig
        from flywheel.evaluate.meta import claim_metrics
        from flywheel.evaluate.metrics import PointItem, pairs_from_points, pairwise_metrics, pointwise_metrics
        from flywheel.judge import claims
        from flywheel.stages.judgments import JudgmentsCore

        # claims split by the world's parser whatever judgments.claim_splitter says: the gold claims are its
        core = JudgmentsCore(self.cfg, self.candidates, engine=engine, role="judge",
                             judgments=JudgmentsConfig(protocols=self.protocols, samples_per_item=1,
                                                       claim_subtasks=self.cfg.judgments.claim_subtasks,
                                                       claim_images=self.cfg.judgments.claim_images,
                                                       claim_context=self.cfg.judgments.claim_context))
        res = core(self.prompts)
        pointwise_rows = [r for r in res.rows if r["protocol"] == "pointwise"]
        judged = {r["candidate_ids"][0]: (None if r.get("parse_error") else r["score"]) for r in pointwise_rows}
        judged |= {cid: s for (_, cid), s in claims.candidate_scores(res.rows).items()}
        points = [PointItem(c, g, judged.get(c)) for c, g in self.gold.items()]
        by_prompt: dict[str, list[PointItem]] = {}
        prompt_of = {c["candidate_id"]: c["prompt_id"] for c in self.candidates}
        for p in points:
            by_prompt.setdefault(prompt_of[p.key], []).append(p)
        pairs = pairs_from_points((f"{a.key}|{b.key}", pid, a.gold, a.judged, b.gold, b.judged)
                                  for pid, ps in by_prompt.items() for i, a in enumerate(ps) for b in ps[i + 1:])
        pairs += pairs_from_points((f"{a}|{b}", None, float(w == "A"), judged.get(a), float(w == "B"), judged.get(b))
                                   for a, b, w in self.gold_pairs)
        point = pointwise_metrics(points)
        parsed = sum(1 for r in pointwise_rows if not r.get("parse_error"))
        out = {"pointwise/accuracy": point["exact"], "pointwise/kendall_tau_b": point["kendall_tau_b"],
               "pointwise/mae": point["mae"], "pairwise/accuracy": pairwise_metrics(pairs)["accuracy"],
               "pairwise/n": float(len(pairs)),  # the pairs the accuracy stands on
               # the pointwise answers' (every output is rated once); a missing one failed
               "format_valid": parsed / len(self.candidates)}
        # always reported, undefined (NaN) for a judge not taught claims: a config may then guard them in any run
        # (a guard whose start is undefined guards nothing), and a misspelt measure is still refused
        checked = claim_metrics(self.gold_claims, res.rows, self.prompt_by_id, set(), set())
        out |= {"claims/format_valid": 1.0 - checked.get("all/claims/parse_failure_rate", float("nan")),
                "claims/accuracy": checked.get("all/claims/exact", float("nan")),
                "claims/n": checked.get("all/claims/n", 0.0)}
        if bad := [r for r in res.rows if r["protocol"] == claims.NAME and r.get("parse_error")]:
            log.info("held-out: %d claim checks did not parse, e.g. %s: %r", len(bad), bad[0]["parse_error"],
                     bad[0]["raw_output"][:160])
        return out


def labeled_heldout(text: str, where: str) -> tuple[list[dict], list[dict], list[dict]]:
    """A labeled set's text (`flywheel eval --data`'s format) as the probe's prompts, outputs and gold judgments;
    `where` names the file in errors and logs."""
    from flywheel.evaluate.labeled import gold_rows, parse_labeled, require_items

    items = require_items(*parse_labeled(text), f"train.judge_dpo.heldout.gold_file: {where}")
    return gold_rows(items, "labeled:heldout")


def make_probe(ctx, judge=None):
    """The probe of the job's training (None when held-out evaluation is off)."""
    h = ctx.settings.heldout
    if h is None:
        return None
    seed = ctx.cfg.run.seed
    if ctx.job.training == "diffusion_dpo":
        return GeneratorProbe(ctx.cfg, h, seed, judge, ctx.job.heldout_prompts)
    if ctx.job.training == "judge_dpo":
        return JudgeProbe(ctx.cfg, h, seed, ctx.job.heldout_gold)
    return TextPolicyProbe(ctx.cfg, h, seed, judge, ctx.job.heldout_prompts)


def make_judge_scorer(ctx):
    """The judge that also scores held-out outputs, if the job names one (resolved by the driver)."""
    ref = ctx.job.heldout_judge
    if ref is None or ctx.job.training == "judge_dpo":
        return None
    log.info("held-out: outputs are also scored by the judge %s", ref)
    return JudgeScorer(ctx.cfg, make_judge_engine(ctx.cfg, ref))
