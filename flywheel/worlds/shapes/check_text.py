"""Score free-text answers and captions against a scene, per task aspect of configs/aspects.yaml.

Question answers (iu_color, iu_count, iu_existence, iu_relation; and nlg_scene_qa, which scores the same
answers as answer_correctness) get their content aspect, answer_correctness and answer_format. Captions and
scene descriptions (iu_caption, nlg_describe_scene, the text of itig_draw_and_describe) get object_presence,
count_accuracy, color_accuracy, shape_accuracy, attribute_binding, object_hallucination and, when the text
states relations, spatial_relation. Text that cannot be read at all comes back with `status="unparseable"`,
an `error` and no content scores (only answer_format = 0 for short-answer tasks): a caller decides what an
unreadable answer is worth, it is never a silent 0.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Iterable

import numpy as np
from scipy.optimize import linear_sum_assignment

from flywheel.worlds.shapes.scene import Scene, relation_between
from flywheel.worlds.shapes.text_parse import (Mention, find_mentions, find_relation_phrases, first_colour,
                                               first_number, sentences, tokens, yes_no)
from flywheel.worlds.shapes.vocab import INVERSE

MAX_ITEMS = 10  # a caption claiming "a hundred circles" is not expanded into a hundred objects


@dataclass(frozen=True)
class TextCheck:
    kind: str  # colour | count | existence | relation | caption
    status: str  # "ok" | "unparseable"
    parsed: Any  # what was read: a colour, a number, True/False, a set of relations, or caption details
    correct: float | None  # the content score (None when unparseable)
    aspects: dict[str, float]
    error: str | None = None
    detail: dict[str, Any] = field(default_factory=dict)

    @property
    def unparseable(self) -> bool:
        return self.status == "unparseable"


def _format(toks: list[str], value_len: int) -> float:
    """1: the requested short form ('Red.', 'The circle is red.', '3', 'There are none.', 'Yes.');
    0.5: a right-type answer buried in a longer text."""
    return 1.0 if sum(t != "," for t in toks) <= value_len + 4 else 0.5


def _qa(kind: str, aspect: str, parsed: Any, ok: bool, toks: list[str], value_len: int = 1,
        extra: dict[str, float] | None = None) -> TextCheck:
    score = float(ok)
    aspects = {aspect: score, "answer_correctness": score, "answer_format": _format(toks, value_len)}
    return TextCheck(kind, "ok", parsed, score, aspects | (extra or {}))


def _unparseable(kind: str, why: str) -> TextCheck:
    return TextCheck(kind, "unparseable", None, None, {"answer_format": 0.0}, f"unparseable: {why}")


def check_colour_answer(answer: str, truth: str) -> TextCheck:
    toks = tokens(answer)
    colour = first_colour(toks)
    if colour is None:
        return _unparseable("colour", "no colour word")
    return _qa("colour", "color_accuracy", colour, colour == truth, toks)


def check_count_answer(answer: str, truth: int) -> TextCheck:
    toks = tokens(answer)
    n = first_number(toks)
    if n is None:
        return _unparseable("count", "no number")
    return _qa("count", "count_accuracy", n, n == truth, toks)


def check_existence_answer(answer: str, truth: bool) -> TextCheck:
    """Saying yes to an absent object is also an object hallucination; saying no to a present one is not."""
    toks = tokens(answer)
    said = yes_no(toks)
    if said is None:
        return _unparseable("existence", "no yes/no")
    return _qa("existence", "existence_accuracy", said, said == truth, toks,
               extra={"object_hallucination": 0.0 if said and not truth else 1.0})


def check_relation_answer(answer: str, truth: Iterable[str], subject: tuple[str, str] | None = None,
                          obj: tuple[str, str] | None = None, asked: str | None = None) -> TextCheck:
    """`truth`: the relations that hold for "subject <rel> obj" (colour, shape pairs).

    Open questions ("where is A relative to B?"): the answer is right when it states at least one relation and
    every one it states holds. Yes/no questions ("is A <asked> B?"): yes states `asked`, no denies it. A sentence
    naming the two objects the other way round ("the blue square is right of the red circle") is read from the
    subject's side, and a negated phrase ("not left of") denies rather than states."""
    truth = set(truth)
    toks = tokens(answer)
    phrases = find_relation_phrases(toks)
    said = yes_no(toks) if asked is not None else None
    if not phrases and said is None:
        return _unparseable("relation", "no relation phrase" + ("" if asked is None else " and no yes/no"))
    mentions = find_mentions(toks)
    first = mentions[0] if mentions and phrases and mentions[0].end <= phrases[0].start else None
    flip = (first is not None and obj is not None and subject is not None and _fits(first, *obj)
            and not _fits(first, *subject))
    stated = {INVERSE[r] if flip else r for p in phrases for r in p.relations if not p.negated}
    denied = {INVERSE[r] if flip else r for p in phrases for r in p.relations if p.negated}
    if said is not None:
        (stated if said else denied).add(asked)
    ok = bool(stated or denied) and stated <= truth and not (denied & truth)
    value_len = max([p.end - p.start for p in phrases] + [1])
    return _qa("relation", "spatial_relation", stated if asked is None else said, ok, toks, value_len)


def _fits(m: Mention, colour: str | None, shape: str | None) -> bool:
    return (m.colour is None or m.colour == colour) and (m.shape is None or m.shape == shape)


# ---- captions ------------------------------------------------------------------------------------------
def caption_items(mentions: list[Mention]) -> list[Mention]:
    """Objects a caption introduces: indefinite mentions with a shape, expanded by count (plural without a
    number = 2); a definite one ('the red circle') only if nothing like it was introduced before."""
    out: list[Mention] = []
    for m in mentions:
        if m.shape is None or m.count == 0:
            continue
        if m.definite and any(_fits(o, m.colour, m.shape) for o in out):
            continue
        out.extend([m] * min(MAX_ITEMS, m.count if m.count is not None else 2))
    return out


def relation_statements(sent_toks: list[str], mentions: list[Mention]
                        ) -> list[tuple[Mention, str, Mention, bool]]:
    """(subject, relation, object, negated) from one sentence: 'A is left of B', 'left of B is A',
    'A is above and to the left of B' (both relations, same subject and object). A phrase followed by a comma
    ('a red circle on the left, a blue square ...') places its subject in the image, not relative to B."""
    out = []
    for p in find_relation_phrases(sent_toks):
        before = [m for m in mentions if m.end <= p.start]
        after = [m for m in mentions if m.start >= p.end]
        if before:
            if not after or "," in sent_toks[p.end:after[0].start]:
                continue
            subj, obj = before[-1], after[0]
            if out and out[-1][2] is subj:  # "A is left of B and above C": B is an object, not a subject
                subj = out[-1][0]
        elif len(after) >= 2:  # inverted: "to the left of the blue square is a red circle"
            obj, subj = after[0], after[1]
        else:
            continue
        out.extend((subj, r, obj, p.negated) for r in p.relations)
    return out


def check_caption(text: str, scene: Scene) -> TextCheck:
    sents = [tokens(s) for s in sentences(text)]
    per_sent = [find_mentions(t) for t in sents]
    mentions = [m for ms in per_sent for m in ms]
    items = caption_items(mentions)
    counted = [m for m in mentions if not m.definite and m.count is not None]
    if not items and not counted:
        return TextCheck("caption", "unparseable", None, None, {}, "unparseable: no shapes mentioned")
    objs = scene.objects

    # Items <-> scene objects: same colour and shape first, then the right shape, then the right colour.
    pairs: list[tuple[int, int]] = []
    if items and objs:
        cost = np.array([[0.0 if (m.colour == o.colour and m.shape == o.shape) else 1.0 if m.shape == o.shape
                          else 1.2 if m.colour == o.colour else 3.0 for o in objs] for m in items])
        rows, cols = linear_sum_assignment(cost)
        pairs = [(int(i), int(j)) for i, j in zip(rows, cols, strict=True) if cost[i, j] < 3.0]
    exact = [(i, j) for i, j in pairs if items[i].colour == objs[j].colour and items[i].shape == objs[j].shape]
    with_colour = [(i, j) for i, j in pairs if items[i].colour is not None]
    hallucinated = [items[i] for i in range(len(items)) if i not in {i for i, _ in pairs}]

    # Count statements: summed per colour+shape group that exists; counts of partial groups ('two red
    # shapes', 'four shapes') compared with the scene directly.
    truth = scene.counts()
    groups: Counter = Counter()
    checks: list[bool] = []
    for m in counted:
        if m.colour is not None and m.shape is not None:
            groups[(m.colour, m.shape)] += m.count
        elif m.count > 0:
            checks.append(m.count == scene.count(m.colour, m.shape))
    checks += [n == truth[g] for g, n in groups.items() if truth[g]]

    relations = []
    for toks, ms in zip(sents, per_sent, strict=True):
        for s, rel, o, neg in relation_statements(toks, ms):
            cands = [(a, b) for a in range(len(objs)) for b in range(len(objs)) if a != b
                     and _fits(s, objs[a].colour, objs[a].shape) and _fits(o, objs[b].colour, objs[b].shape)]
            if cands:  # statements about absent objects are hallucinations, not relation errors
                holds = any(rel in relation_between(objs[a], objs[b], scene.margin) for a, b in cands)
                relations.append(((s.colour, s.shape), rel, (o.colour, o.shape), neg, holds != neg))

    n_obj = max(len(objs), 1)
    aspects = {
        "object_presence": len(exact) / n_obj,
        "object_hallucination": 1 - len(hallucinated) / len(items) if items else 1.0,
        "color_accuracy": (sum(items[i].colour == objs[j].colour for i, j in with_colour) / len(with_colour)
                           if with_colour else 0.0),
        "shape_accuracy": sum(items[i].shape == objs[j].shape for i, j in pairs) / len(pairs) if pairs else 0.0,
        "attribute_binding": len(exact) / len(with_colour) if with_colour else 0.0,
    }
    if checks:
        aspects["count_accuracy"] = sum(checks) / len(checks)
    if relations:
        aspects["spatial_relation"] = sum(r[-1] for r in relations) / len(relations)
    detail = {
        "mentioned": [[m.colour, m.shape] for m in items],
        "missed": [[o.colour, o.shape] for j, o in enumerate(objs) if j not in {j for _, j in exact}],
        "hallucinated": [[m.colour, m.shape] for m in hallucinated],
        "relations": [[list(s), r, list(o), neg, ok] for s, r, o, neg, ok in relations],
    }
    correct = float(np.mean(list(aspects.values())))
    return TextCheck("caption", "ok", detail, correct, aspects, None, detail)
