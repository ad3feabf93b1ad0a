"""Minos' perturbation checks on the gold pointwise items (seed 003, Appendix L): does the judge look at the image,
and does it notice a degraded response?

image_swap: the images of a gold item are replaced by the images of another gold item drawn at random - the input
  images when the prompt has them (Minos' check, IU here), else the output images (IG, ITIG). Everything else of
  the request stays the same, the reference answer included, so a judge that grades from text cues alone keeps its
  correlation with the gold while one that looks at the image collapses toward 0 (Minos: overall Pearson r to 0.085).
  The perturbed item is correlated with the *original* gold score. Where the oracle world knows what the donor
  image shows (a shapes scene), the perturbed prompt's meta carries that truth - the donor's scene, the original
  question answered on it - so the oracle teacher, judging from `meta`, judges the perturbed content; a donor on
  which the question cannot be posed (no single circle to ask the colour of) is not drawn.
span_swap: 25% of the word spans of a text output are replaced by words drawn at random from the vocabulary of
  other prompts' gold text outputs (each distinct word equally likely); the judge's score of the perturbed
  response is compared with its own score of the original (Minos: 71% scored lower). A judgment that fails
  (unparsed or missing) is counted as such, never imputed a score.

Everything is deterministic for (seed, gold set): each draw comes from a stream seeded by the seed, the check and
the id of what is perturbed. Perturbed records are copies with new content-hash ids; candidates' `producer` gets
a "+<check>" suffix and `meta.perturbation` names the original and the donor.
"""
from __future__ import annotations

import hashlib
import json
import re
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from flywheel.evaluate.metrics import PointItem, pointwise_metrics
from flywheel.judge.pointwise import RATING_MIN
from flywheel.records import with_ids
from flywheel.worlds.shapes.scene import Scene, relation_between

IMAGE_SWAP, SPAN_SWAP = "image_swap", "span_swap"
CHECKS = (IMAGE_SWAP, SPAN_SWAP)
WORD = re.compile(r"[A-Za-z0-9]+(?:'[A-Za-z]+)?")  # a word span; punctuation and spacing around it are kept
CORRELATIONS = ("pearson", "spearman", "kendall_tau_b")


@dataclass(frozen=True)
class PerturbedItem:
    check: str
    slot: str  # what was replaced: "input" or "output" images, or "text"
    original: dict  # the gold judgment row perturbed
    gold: dict  # its perturbed copy: new ids, the original's gold score (what the judge is compared with)


@dataclass
class PerturbedSet:
    prompts: list[dict] = field(default_factory=list)  # every prompt the perturbed gold rows name
    candidates: list[dict] = field(default_factory=list)  # the perturbed candidates
    items: list[PerturbedItem] = field(default_factory=list)
    skipped: Counter = field(default_factory=Counter)  # "<check>/<reason>" -> sampled items not perturbed

    @property
    def gold(self) -> list[dict]:
        return [i.gold for i in self.items]

    def extend(self, other: PerturbedSet) -> PerturbedSet:
        seen = {p["prompt_id"] for p in self.prompts}
        self.prompts += [p for p in other.prompts if p["prompt_id"] not in seen]
        self.candidates += other.candidates
        self.items += other.items
        self.skipped.update(other.skipped)
        return self


# ---------------------------------------------------------------- helpers
def _rng(seed: int, *key: Any) -> np.random.Generator:
    h = hashlib.sha256(json.dumps(["perturbation", seed, *key]).encode()).digest()
    return np.random.default_rng(int.from_bytes(h[:8], "big"))


def meta_of(rec: dict) -> dict:
    """A record's `meta` as a dict (datasets store it as JSON text)."""
    m = rec.get("meta")
    if isinstance(m, (bytes, bytearray)):
        m = m.decode()
    if isinstance(m, str):
        m = json.loads(m)
    return dict(m) if isinstance(m, dict) else {}


def _images(rec: dict, key: str) -> list[bytes]:
    return [bytes(x) for x in (rec.get(key) or [])]


def sample(gold: Sequence[dict], n: int, seed: int, check: str, eligible: Callable[[dict], bool]) -> list[dict]:
    """A seeded choice of up to n scored pointwise gold rows that `eligible` accepts (independent of row order)."""
    pool = sorted((g for g in gold if g["protocol"] == "pointwise" and g.get("score") is not None and eligible(g)),
                  key=lambda g: g["judgment_id"])
    take = sorted(_rng(seed, check, "sample").permutation(len(pool))[:n])
    return [pool[i] for i in take]


def _derived_candidate(c: dict, check: str, prompt_id: str, donor: str | None, **changes: Any) -> dict:
    # The producer suffix keeps the copy's id apart from the original's and from other checks' copies.
    meta = {**meta_of(c), "perturbation": {"check": check, "of": c["candidate_id"], "donor": donor}}
    return {**c, **changes, "candidate_id": None, "prompt_id": prompt_id, "producer": f"{c['producer']}+{check}",
            "meta": meta}


def _derived_gold(g: dict, check: str, prompt_id: str, candidate_id: str) -> dict:
    # The judge field says whose gold this is: the original item's, carried over to the perturbed one.
    return {**g, "judgment_id": None, "prompt_id": prompt_id, "candidate_ids": [candidate_id],
            "judge": f"{g['judge']}+{check}"}


def _collect(check: str, made: list[tuple[dict, str, dict, dict]], skipped: Counter) -> PerturbedSet:
    """PerturbedSet from (original gold row, slot, prompt shown, perturbed candidate without its id)."""
    out = PerturbedSet(skipped=skipped)
    seen_prompts, seen_items = set(), set()
    for g, slot, p, c in made:
        (c,) = with_ids("candidate", [c])
        if c["candidate_id"] in seen_items:  # two originals perturbed into the same item: judged, counted once
            out.skipped[f"{check}/duplicate"] += 1
            continue
        seen_items.add(c["candidate_id"])
        if p["prompt_id"] not in seen_prompts:
            seen_prompts.add(p["prompt_id"])
            out.prompts.append(p)
        (pg,) = with_ids("judgment", [_derived_gold(g, check, p["prompt_id"], c["candidate_id"])])
        out.candidates.append(c)
        out.items.append(PerturbedItem(check, slot, g, pg))
    return out


# ---------------------------------------------------------------- image swap
def question_on(scene: Scene, original: Scene, q: dict) -> dict | None:
    """The oracle question meta `q` (posed on `original`) answered on `scene`; None when it cannot be posed there
    (a colour question about a shape the scene has none or several of; a relation between objects it lacks)."""
    kind = q.get("type")
    if kind == "caption":
        return dict(q)
    if kind == "colour":
        objs = [o for o in scene.objects if o.shape == q["shape"]]
        return {**q, "answer": objs[0].colour} if len(objs) == 1 else None
    if kind == "count":
        return {**q, "answer": scene.count(q.get("colour"), q["shape"])}
    if kind == "existence":
        return {**q, "answer": scene.count(q["colour"], q["shape"]) > 0}
    if kind == "relation":
        idx = []
        for k in (q["subject"], q["object"]):
            o = original.objects[k]
            hits = [i for i, d in enumerate(scene.objects) if (d.colour, d.shape) == (o.colour, o.shape)]
            if len(hits) != 1:
                return None
            idx.append(hits[0])
        a, b = scene.objects[idx[0]], scene.objects[idx[1]]
        return {**q, "subject": idx[0], "object": idx[1],
                "answer": q["relation"] in relation_between(a, b, scene.margin)}
    return None


def _truth_with_donor(prompt: dict, donor: dict) -> dict | None:
    """The perturbed prompt's oracle truth: the donor's scene with the prompt's question answered on it. {} when
    either has no scene (the perturbed prompt then carries no truth, so the oracle cannot judge from a stale
    one); None when the question cannot be posed on the donor's scene."""
    mine, theirs = meta_of(prompt), meta_of(donor)
    if "scene" not in mine or "scene" not in theirs:
        return {}
    scene = Scene.from_json(theirs["scene"])
    q = mine.get("question")
    if q is None:
        return {"scene": scene.to_dict()}
    q2 = question_on(scene, Scene.from_json(mine["scene"]), q)
    return None if q2 is None else {"scene": scene.to_dict(), "question": q2}


def _input_swapped(prompt: dict, donors: list[dict], seed: int) -> dict | None:
    """A copy of the prompt showing another gold prompt's input images (same number of them, so the request text
    is unchanged), drawn at random among donors whose scene can pose the prompt's question."""
    own = _images(prompt, "images")
    ok = []
    for d in donors:
        theirs = _images(d, "images")
        if d["prompt_id"] == prompt["prompt_id"] or len(theirs) != len(own) or theirs == own:
            continue
        truth = _truth_with_donor(prompt, d)
        if truth is not None:
            ok.append((d, theirs, truth))
    if not ok:
        return None
    d, images, truth = ok[int(_rng(seed, IMAGE_SWAP, prompt["prompt_id"]).integers(len(ok)))]
    meta = {**truth, "perturbation": {"check": IMAGE_SWAP, "of": prompt["prompt_id"], "donor": d["prompt_id"]}}
    (p,) = with_ids("prompt", [{**prompt, "prompt_id": None, "images": images, "meta": meta}])
    return p


def swap_images(gold: Sequence[dict], prompts: Mapping[str, dict], candidates: Mapping[str, dict], n: int,
                seed: int) -> PerturbedSet:
    """Up to n pointwise gold items per slot (input images, output images) with their images replaced by
    another gold item's (see the module doc)."""
    def slot(g: dict) -> str | None:
        if _images(prompts[g["prompt_id"]], "images"):
            return "input"
        return "output" if _images(candidates[g["candidate_ids"][0]], "output_images") else None

    # Up to n items per slot: input and output images are reported apart and each needs its own sample.
    chosen = [g for where in ("input", "output")
              for g in sample(gold, n, seed, f"{IMAGE_SWAP}/{where}", lambda g, w=where: slot(g) == w)]
    in_donors = sorted((p for p in prompts.values() if _images(p, "images")), key=lambda p: p["prompt_id"])
    out_donors = sorted((c for c in candidates.values() if _images(c, "output_images")),
                        key=lambda c: c["candidate_id"])
    swapped: dict[str, dict | None] = {}  # one donor per prompt: all its candidates see the same new image
    made, skipped = [], Counter()
    for g in chosen:
        p, c = prompts[g["prompt_id"]], candidates[g["candidate_ids"][0]]
        where = slot(g)
        if where == "input":
            if p["prompt_id"] not in swapped:
                swapped[p["prompt_id"]] = _input_swapped(p, in_donors, seed)
            p2 = swapped[p["prompt_id"]]
            if p2 is None:
                skipped[f"{IMAGE_SWAP}/no donor image"] += 1
                continue
            made.append((g, where, p2, _derived_candidate(c, IMAGE_SWAP, p2["prompt_id"],
                                                          meta_of(p2)["perturbation"]["donor"])))
            continue
        own = _images(c, "output_images")
        ok = [d for d in out_donors if d["prompt_id"] != c["prompt_id"]
              and len(_images(d, "output_images")) == len(own) and _images(d, "output_images") != own]
        if not ok:
            skipped[f"{IMAGE_SWAP}/no donor image"] += 1
            continue
        d = ok[int(_rng(seed, IMAGE_SWAP, c["candidate_id"]).integers(len(ok)))]
        made.append((g, where, p, _derived_candidate(c, IMAGE_SWAP, p["prompt_id"], d["candidate_id"],
                                                     output_images=_images(d, "output_images"))))
    return _collect(IMAGE_SWAP, made, skipped)


# ---------------------------------------------------------------- span swap
def replace_spans(text: str, fraction: float, pool: Sequence[str], rng: np.random.Generator) -> str | None:
    """`text` with round(fraction x its word spans) of them (at least one) replaced by words drawn from `pool`,
    each different from the word it replaces; None when the text has no word or the pool nothing different."""
    spans = list(WORD.finditer(text))
    if not spans:
        return None
    k = max(1, int(np.floor(fraction * len(spans) + 0.5)))
    at = set(rng.choice(len(spans), size=k, replace=False).tolist())
    out, last = [], 0
    for i, m in enumerate(spans):
        if i not in at:
            continue
        word = m.group()
        choices = [w for w in pool if w.lower() != word.lower()]
        if not choices:
            return None
        new = choices[int(rng.integers(len(choices)))].lower()
        if word[:1].isupper():  # keep sentence form, so what degrades is the content
            new = new[:1].upper() + new[1:]
        out += [text[last:m.start()], new]
        last = m.end()
    return "".join(out + [text[last:]])


def swap_spans(gold: Sequence[dict], prompts: Mapping[str, dict], candidates: Mapping[str, dict], n: int,
               fraction: float, seed: int) -> PerturbedSet:
    """Up to n pointwise gold items with a text output whose word spans are `fraction` replaced (module doc)."""
    def text(g: dict) -> str | None:
        t = candidates[g["candidate_ids"][0]].get("output_text")
        return t if isinstance(t, str) and WORD.search(t) else None

    chosen = sample(gold, n, seed, SPAN_SWAP, lambda g: text(g) is not None)
    words = {(c["prompt_id"], m.group().lower()) for c in candidates.values()
             if isinstance(c.get("output_text"), str) for m in WORD.finditer(c["output_text"])}
    made, skipped = [], Counter()
    for g in chosen:
        c = candidates[g["candidate_ids"][0]]
        # The vocabulary of other prompts' responses, each word once: a random word, not mostly "the".
        pool = sorted({w for pid, w in words if pid != c["prompt_id"]})
        new = replace_spans(text(g), fraction, pool, _rng(seed, SPAN_SWAP, c["candidate_id"]))
        if new is None:
            skipped[f"{SPAN_SWAP}/no replacement words"] += 1
            continue
        made.append((g, "text", prompts[g["prompt_id"]],
                     _derived_candidate(c, SPAN_SWAP, c["prompt_id"], None, output_text=new)))
    return _collect(SPAN_SWAP, made, skipped)


def perturb(gold: Sequence[dict], prompts: Mapping[str, dict], candidates: Mapping[str, dict], n: int,
            span_fraction: float, seed: int) -> PerturbedSet:
    """Both checks' perturbed items for one split's gold set (prompts and candidates by id)."""
    return swap_images(gold, prompts, candidates, n, seed).extend(
        swap_spans(gold, prompts, candidates, n, span_fraction, seed))


# ---------------------------------------------------------------- scoring
Scores = Mapping[str, float | None]  # gold judgment id -> the judge's score (None: unparsed or not judged)


def score_image_swap(items: Sequence[PerturbedItem], before: Scores, after: Scores) -> dict[str, float]:
    """The judge's agreement with the original gold on the sampled items, unperturbed and with swapped images,
    and the drop of each correlation; overall and per slot (input / output images)."""
    out: dict[str, float] = {}
    mine = [i for i in items if i.check == IMAGE_SWAP]
    for slot in ("", "input/", "output/"):
        group = [i for i in mine if not slot or i.slot == slot[:-1]]
        if slot and not group:
            continue
        un = pointwise_metrics([PointItem(i.original["judgment_id"], i.original["score"],
                                          before.get(i.original["judgment_id"])) for i in group])
        pe = pointwise_metrics([PointItem(i.original["judgment_id"], i.original["score"],
                                          after.get(i.gold["judgment_id"])) for i in group])
        out |= {f"{slot}unperturbed/pointwise/{k}": v for k, v in un.items()}
        out |= {f"{slot}pointwise/{k}": v for k, v in pe.items()}
        out |= {f"{slot}drop/{k}": un[k] - pe[k] for k in CORRELATIONS}
    return out


def score_span_swap(items: Sequence[PerturbedItem], before: Scores, after: Scores) -> dict[str, float]:
    """Shares of span-replaced responses the judge scored lower / equal / higher than the original, plus those
    it failed on: `parse_failure_rate` (the perturbed judgment failed) and `baseline_parse_failure_rate` (its
    judgment of the original failed, so there is nothing to compare). The five shares sum to 1.
    `lower_share_above_floor`: among comparable items whose original was scored above the lowest rating (so
    could be scored lower at all)."""
    mine = [i for i in items if i.check == SPAN_SWAP]
    c: Counter = Counter()
    for i in mine:
        b, a = before.get(i.original["judgment_id"]), after.get(i.gold["judgment_id"])
        if b is None:
            c["baseline_unparsed"] += 1
        elif a is None:
            c["unparsed"] += 1
        else:
            c["lower" if a < b else "equal" if a == b else "higher"] += 1
            if b > RATING_MIN:
                c["above_floor"] += 1
                c["lower_above_floor"] += a < b
    n = len(mine)
    share = (lambda k: c[k] / n) if n else (lambda k: float("nan"))
    return {"n": float(n), "lower_share": share("lower"), "equal_share": share("equal"),
            "higher_share": share("higher"), "parse_failure_rate": share("unparsed"),
            "baseline_parse_failure_rate": share("baseline_unparsed"),
            "lower_share_above_floor": c["lower_above_floor"] / c["above_floor"] if c["above_floor"]
            else float("nan")}


def score(ps: PerturbedSet, before: Scores, after: Scores) -> dict[str, float]:
    """Both checks' metrics, keyed "<check>/<metric>", with "<check>/skipped": sampled items it could not
    perturb (see PerturbedSet.skipped for why)."""
    out = {f"{IMAGE_SWAP}/{k}": v for k, v in score_image_swap(ps.items, before, after).items()}
    out |= {f"{SPAN_SWAP}/{k}": v for k, v in score_span_swap(ps.items, before, after).items()}
    for check in CHECKS:
        out[f"{check}/skipped"] = float(sum(v for k, v in ps.skipped.items() if k.startswith(f"{check}/")))
    return out
