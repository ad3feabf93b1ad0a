"""Claims of a text about shapes, read from the text alone, and the oracle's verdict on one claim against a text.

RLAIF-V's divide-and-conquer (seed 005) splits a response into atomic claims and has the labeler check each one
on its own, because a weak labeler checks one short claim far better than a whole response. In this world the
splitter is the world's own parser (`text_parse`): it reads the text only, never a scene, so a judge that uses it
sees nothing a judge on a cluster would not (there an LLM splits the text). A claim is an object group ("two red
circles", "a triangle") or a stated relation ("the red circle is to the left of the blue square").

`verdict(claim, text)` is what the oracle teacher writes for a claim checked against another text (a caption
against the prompt's reference, and the reference's claims against the caption): the look-up, keyed by colour
as captions name objects (colour before shape), and a rating: 5 the text says it, 3 it says it with another
count, 2 another colour or shape, 1 nothing like it. `misread` is the wrong verdict a noisy labeler writes.
"""
from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

from flywheel.worlds.shapes.assessment import np_
from flywheel.worlds.shapes.check_text import caption_items, relation_statements
from flywheel.worlds.shapes.text_parse import find_mentions, sentences, tokens
from flywheel.worlds.shapes.vocab import INVERSE, RELATION_PHRASES

Group = tuple[str | None, str]  # (colour or None, shape)
EXACT, OTHER_COUNT, OTHER_ATTRIBUTE, ABSENT = 5, 3, 2, 1


@dataclass(frozen=True)
class Claim:
    """One atomic claim: an object group (count, colour, shape) or a relation (subject, relation, object)."""

    kind: str  # "object" | "relation"
    group: Group | None = None
    count: int = 1
    subject: Group | None = None
    relation: str | None = None
    object: Group | None = None

    @property
    def text(self) -> str:
        if self.kind == "object":
            return np_(*self.group, count=self.count)
        subject, obj = np_(*self.subject, article="the"), np_(*self.object, article="the")
        return f"{subject} is {RELATION_PHRASES[self.relation]} {obj}"


@dataclass(frozen=True)
class TextFacts:
    """What a text states: its object groups with counts and its (non-negated) relations."""

    groups: Counter
    relations: frozenset[tuple[Group, str, Group]]


def read(text: str) -> TextFacts:
    sents = [tokens(s) for s in sentences(text or "")]
    per_sentence = [find_mentions(t) for t in sents]
    items = caption_items([m for ms in per_sentence for m in ms])
    rels = set()
    for toks, ms in zip(sents, per_sentence, strict=True):
        for s, rel, o, negated in relation_statements(toks, ms):
            if not negated and s.shape and o.shape:
                rels.add(((s.colour, s.shape), rel, (o.colour, o.shape)))
    return TextFacts(Counter((m.colour, m.shape) for m in items), frozenset(rels))


def split_claims(text: str) -> list[Claim]:
    """The text's claims in reading order of their kind: object groups first, then relations."""
    facts = read(text)
    out = [Claim("object", group=g, count=n) for g, n in facts.groups.items()]
    out += [Claim("relation", subject=s, relation=r, object=o) for s, r, o in sorted(facts.relations, key=str)]
    return out


def _object_verdict(claim: Claim, facts: TextFacts) -> tuple[str, int]:
    colour, shape = claim.group
    n = (facts.groups.get(claim.group, 0) if colour is not None  # a colourless claim: any colour of its shape
         else sum(k for (_, s), k in facts.groups.items() if s == shape))
    if n == claim.count:
        return f"The text has {np_(colour, shape, count=n)}.", EXACT
    if n:
        return f"The text has {np_(colour, shape, count=n)}.", OTHER_COUNT
    if colour is not None:
        same_colour = [s for (c, s) in facts.groups if c == colour]
        if same_colour:
            return f"The {colour} shape in the text is {np_(None, same_colour[0])}.", OTHER_ATTRIBUTE
    same_shape = [c for (c, s) in facts.groups if s == shape and c is not None]
    if same_shape:
        return f"The text has no {colour} shape; its {shape} is {same_shape[0]}.", OTHER_ATTRIBUTE
    what = f"{colour} shape" if colour else shape
    return f"The text has no {what}.", ABSENT


def _relation_verdict(claim: Claim, facts: TextFacts) -> tuple[str, int]:
    s, r, o = claim.subject, claim.relation, claim.object
    if (s, r, o) in facts.relations or (o, INVERSE[r], s) in facts.relations:
        return "The text says so.", EXACT
    said = [r2 for s2, r2, o2 in facts.relations if (s2, o2) == (s, o)]
    said += [INVERSE[r2] for s2, r2, o2 in facts.relations if (s2, o2) == (o, s)]
    a, b = np_(*s, article="the"), np_(*o, article="the")
    if said:
        return f"The text says {a} is {RELATION_PHRASES[said[0]]} {b}.", ABSENT
    return f"The text does not place {a} against {b}.", ABSENT


def verdict(claim: Claim, text: str) -> tuple[str, int]:
    """(the analysis, the rating 1..5) of `claim` checked against `text`."""
    facts = read(text)
    return _object_verdict(claim, facts) if claim.kind == "object" else _relation_verdict(claim, facts)


def misread(claim: Claim, rating: int) -> tuple[str, int]:
    """The verdict of a labeler who misread the text (the teacher's verdict_flip): a claim the text states is
    reported absent, any other reported stated - each the verdict on a text that says nothing, or just the claim."""
    return verdict(claim, "" if rating == EXACT else claim.text)


def claim_texts(text: str) -> list[str]:
    """The words of the text's claims: the splitter the judge's claim checks use (flywheel/judge/claims.py)."""
    return [c.text for c in split_claims(text)]


def read_claim(words: str) -> Claim:
    """The claim these words state (as `Claim.text` writes it); ValueError when they state none exactly."""
    found = next((c for c in split_claims(words) if c.text == words), None)
    if found is None:
        raise ValueError(f"not a claim of this world: {words!r}")
    return found


def claim_kind(words: str) -> str | None:
    """The kind of claim these words state ("object" | "relation"), None when they state none of this world's:
    what curation balances claim verdicts within (curate.claim_balance)."""
    try:
        return read_claim(words).kind
    except ValueError:
        return None


def relation_sentences(words: str, text: str) -> str:
    """What a claim is checked against under `judgments.claim_context: sentences`: for a relation, only the text's
    sentences that name both its objects (each by its colour and shape words), so the judge reads a sentence or two,
    not the whole text, and the verdict is the same (a relation is stated within one sentence); "" when none does.
    Any other claim (an object group, words that are no claim of this world): the whole text."""
    try:
        claim = read_claim(words)
    except ValueError:
        return text
    if claim.kind != "relation":
        return text

    def names(sentence: str, group: Group) -> bool:
        colour, shape = group
        low = sentence.lower()
        return (colour is None or colour in low) and shape in low
    return " ".join(f"{s.strip()}." for s in sentences(text) if names(s, claim.subject) and names(s, claim.object))


def object_sentences(text: str) -> str:
    """The text's sentences that introduce objects (those a mention of which `read` counts), joined: an object
    claim's verdict reads only the text's object counts, and a sentence that introduces none (a relation between
    objects named before, "the red circle is left of the blue square") adds none, so the verdict is the same."""
    kept, mentions = [], []
    for s in sentences(text or ""):
        before = len(caption_items(mentions))
        mentions += find_mentions(tokens(s))
        if len(caption_items(mentions)) > before:  # caption_items reads mentions in order: a prefix's is a prefix
            kept.append(f"{s.strip()}.")
    return " ".join(kept)


def claim_sentences(words: str, text: str) -> str:
    """What a claim is checked against under `judgments.claim_context: all_sentences`: a relation its
    `relation_sentences`, an object group the `object_sentences`; words that are no claim of this world, the
    whole text."""
    try:
        claim = read_claim(words)
    except ValueError:
        return text
    return relation_sentences(words, text) if claim.kind == "relation" else object_sentences(text)


CONTEXTS: dict[str, Callable[[str, str], str] | None] = {
    "text": None, "sentences": relation_sentences, "all_sentences": claim_sentences}


def claim_context(setting: str) -> Callable[[str, str], str] | None:
    """judgments.claim_context -> what narrows the text a claim is checked against (None: the whole text)."""
    return CONTEXTS[setting]
