"""Decomposed text-to-image protocol (seed 001, "task-decomposed framework"): the teacher's three steps.

The teacher framework has three steps (Section 3.1):
1. Evaluation Content Extraction (ECE), from the text prompt only: entities, their intrinsic attributes, the
   relations between them, and questions in three dimensions: appearance (A1..), intrinsic (I1..) and
   relationship (R1..).
2. Caption and Answer Generation (CAG), from the image only, WITHOUT the prompt (the paper's fix for
   information leakage): a detailed caption, then an answer to every question.
3. Explanation and Scoring (E&S): per question a brief explanation and a 0..10 score, then per dimension that
   has questions, then overall.

Here: the constants, the step templates, the structures (Question, Extraction, Answers, Scored, Scores,
DecomposedJudgment), the step requests (build_*), the exact formats and strict parsers of each step, of the joined
transcript (format_full / parse_full) and of the extraction + caption (content extraction), and the judgment-record
fields. The six sub-task SFT samples made from a judgment (Section 3.2.1) are in flywheel.judge.decomposed_samples,
which imports this module.
"""
from __future__ import annotations

import itertools
import re
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass

from flywheel.engines.base import TextRequest
from flywheel.judge import base
from flywheel.judge.base import IMAGE, ParseError, fail, strict

NAME = "decomposed"
DIMENSIONS = ("appearance", "intrinsic", "relationship")
OVERALL = "overall"
PREFIX = {"appearance": "A", "intrinsic": "I", "relationship": "R"}
DIMENSION_OF = {v: k for k, v in PREFIX.items()}
SCORE_MIN, SCORE_MAX = 0, 10
STEPS = ("extraction", "answers", "scores")

# ---------------------------------------------------------------- templates
# Section headers of the extraction output, in order (key, header label).
EXTRACTION_SECTIONS = (("entities", "Entities"), ("attributes", "Attributes"), ("relations", "Relations"),
                       ("appearance", "Appearance questions"), ("intrinsic", "Intrinsic questions"),
                       ("relationship", "Relationship questions"))
NONE = "none"
BULLET = "- {text}"
ATTRIBUTE = "{entity}: {attribute}"
QUESTION_LINE = "{id}: {text}"
CAPTION = "Caption"
CAPTION_LINE = "Caption: {caption}"
ANSWER_LINE = "{id}: {answer}"
SCORE_LINE = "{key}: {explanation} Score: {score}"
DIMENSION_LABEL = {"appearance": "Appearance", "intrinsic": "Intrinsic", "relationship": "Relationship",
                   OVERALL: "Overall"}
EXTRACTION_SPEC = """Entities:
- <entity>
Attributes:
- <entity>: <attribute>
Relations:
- <relation>
Appearance questions:
A1: <question>
Intrinsic questions:
I1: <question>
Relationship questions:
R1: <question>"""
EXTRACT_INSTRUCTIONS = """List the entities (key nouns) of the text prompt, their intrinsic attributes (such as colour, count and shape) and the relations between them (such as spatial relations). Then write questions in three dimensions: appearance questions about the visual quality of each entity, intrinsic questions that check each intrinsic attribute, and relationship questions that check each relation. Ask questions that can be answered by looking at an image, without giving the answer away.

Use exactly this format, writing "none" after a header whose list is empty:
"""
STEP1_TEMPLATE = """You are evaluating a text-to-image generation, step 1 of 3: extract the evaluation content from the text prompt. {instructions}{spec}

###Text Prompt###
{prompt}
###Your Extraction###"""
STEP2_TEMPLATE = """You are describing a generated image, step 2 of 3. First write a detailed caption of the image, then answer each question from what the image shows. Answer only from the image.

Use exactly this format, one line each:
Caption: <detailed caption>
<id>: <answer>

###Image###
{image}
###Questions###
{questions}
###Your Answers###"""
STEP3_TEMPLATE = """You are evaluating a text-to-image generation, step 3 of 3. Below are the text prompt, the evaluation content extracted from it, and a caption of the generated image with answers to the questions, written from the image alone. For each question, briefly explain whether the answer shows that the image matches the prompt (for an appearance question: how good the entity looks), then give a score from 0 to 10 (higher means better). Then explain and score each dimension that has questions, and finally the overall quality of the image.

Use exactly this format, one line each:
<id>: <explanation> Score: <0-10>
Appearance: <explanation> Score: <0-10>
Intrinsic: <explanation> Score: <0-10>
Relationship: <explanation> Score: <0-10>
Overall: <explanation> Score: <0-10>

###Text Prompt###
{prompt}
###Extracted Content###
{extraction}
###Caption###
{caption}
###Answers###
{answers}
###Your Evaluation###"""
QA_ITEM = "{id}: {question}\nAnswer: {answer}"
# The three steps' outputs joined into one raw output (a teacher judgment row).
FULL_HEADERS = ("[Step 1: Extraction]", "[Step 2: Caption and answers]", "[Step 3: Explanation and scoring]")
SCORE = "Score"


# ---------------------------------------------------------------- structures
def _qid_dimension(qid: str) -> str:
    m = re.fullmatch(r"([AIR])([1-9]\d*)", qid) if isinstance(qid, str) else None
    if not m:
        raise ValueError(f"question id {qid!r} is not A<n>, I<n> or R<n>")
    return DIMENSION_OF[m.group(1)]


@dataclass(frozen=True)
class Question:
    id: str
    text: str

    @property
    def dimension(self) -> str:
        return _qid_dimension(self.id)


@dataclass(frozen=True)
class Extraction:
    """Step 1: entities, intrinsic attributes (entity, attribute), relations, and the questions of each
    dimension (ids A<n> / I<n> / R<n> by position)."""

    entities: tuple[str, ...]
    attributes: tuple[tuple[str, str], ...] = ()
    relations: tuple[str, ...] = ()
    appearance: tuple[str, ...] = ()
    intrinsic: tuple[str, ...] = ()
    relationship: tuple[str, ...] = ()

    def __post_init__(self):
        for f in ("entities", "relations", *DIMENSIONS):
            object.__setattr__(self, f, tuple(getattr(self, f)))
        object.__setattr__(self, "attributes", tuple(tuple(a) for a in self.attributes))
        if not self.entities:
            raise ValueError("no entities")
        for e in self.entities:
            base.check_text("entity", e)
            if ":" in e or e.lower() == NONE or e.startswith("-"):
                raise ValueError(f"entity {e!r} may not contain ':', start with '-' or be 'none'")
        dup = [e for e, n in Counter(e.lower() for e in self.entities).items() if n > 1]
        if dup:
            raise ValueError(f"duplicate entities {dup}")
        known = {e.lower() for e in self.entities}
        for a in self.attributes:
            if len(a) != 2:
                raise ValueError(f"attribute {a!r} is not (entity, attribute)")
            if a[0].lower() not in known:
                raise ValueError(f"attribute of {a[0]!r}, which is not among the entities")
            base.check_text(f"attribute of {a[0]!r}", a[1])
        for r in self.relations:
            base.check_text("relation", r)
            if r.lower() == NONE:
                raise ValueError("relation may not be 'none'")
        for d in DIMENSIONS:
            for i, q in enumerate(getattr(self, d), 1):
                base.check_text(f"{PREFIX[d]}{i}", q)
        if not self.questions:
            raise ValueError("no questions")

    @property
    def questions(self) -> list[Question]:
        return [Question(f"{PREFIX[d]}{i}", q) for d in DIMENSIONS for i, q in enumerate(getattr(self, d), 1)]

    @property
    def ids(self) -> list[str]:
        return [q.id for q in self.questions]

    @property
    def dimensions(self) -> list[str]:
        """The dimensions that have questions (only these are scored)."""
        return [d for d in DIMENSIONS if getattr(self, d)]

    def question(self, qid: str) -> Question:
        for q in self.questions:
            if q.id == qid:
                return q
        raise KeyError(f"no question {qid!r}; have {self.ids}")


@dataclass(frozen=True)
class Answers:
    """Step 2: a caption and one answer per question id, in the order written."""

    caption: str
    answers: tuple[tuple[str, str], ...]

    def __post_init__(self):
        object.__setattr__(self, "answers", tuple(tuple(a) for a in self.answers))
        base.check_text("caption", self.caption)
        for qid, a in self.answers:
            _qid_dimension(qid)
            base.check_text(f"answer {qid}", a)
        dup = [q for q, n in Counter(q for q, _ in self.answers).items() if n > 1]
        if dup:
            raise ValueError(f"questions {dup} answered more than once")

    @property
    def by_id(self) -> dict[str, str]:
        return dict(self.answers)


@dataclass(frozen=True)
class Scored:
    """An explanation and a 0..10 score for a question id, a dimension, or 'overall'."""

    key: str
    explanation: str
    score: int

    def __post_init__(self):
        if self.key not in (*DIMENSIONS, OVERALL):
            _qid_dimension(self.key)
        base.check_text(f"explanation of {self.key!r}", self.explanation, forbid_inline=(SCORE,))
        if isinstance(self.score, bool) or not isinstance(self.score, int):
            raise TypeError(f"score of {self.key!r}: expected int, got {type(self.score).__name__}")
        if not SCORE_MIN <= self.score <= SCORE_MAX:
            raise ValueError(f"score {self.score} for {self.key!r} outside {SCORE_MIN}–{SCORE_MAX}")


@dataclass(frozen=True)
class Scores:
    """Step 3: per question, per dimension (those with questions) and overall."""

    questions: tuple[Scored, ...]
    dimensions: tuple[Scored, ...]
    overall: Scored

    def __post_init__(self):
        object.__setattr__(self, "questions", tuple(self.questions))
        object.__setattr__(self, "dimensions", tuple(self.dimensions))
        for s in self.questions:
            _qid_dimension(s.key)
        if any(s.key not in DIMENSIONS for s in self.dimensions):
            raise ValueError(f"dimension keys must be in {DIMENSIONS}: {[s.key for s in self.dimensions]}")
        if self.overall.key != OVERALL:
            raise ValueError(f"overall key is {self.overall.key!r}")
        for group in (self.questions, self.dimensions):
            dup = [k for k, n in Counter(s.key for s in group).items() if n > 1]
            if dup:
                raise ValueError(f"{dup} scored more than once")

    @property
    def by_key(self) -> dict[str, Scored]:
        return {s.key: s for s in (*self.questions, *self.dimensions, self.overall)}


@dataclass(frozen=True)
class DecomposedJudgment:
    """The three steps' outputs for one (prompt, image): what a teacher produces and the trained judge rebuilds."""

    extraction: Extraction
    answers: Answers
    scores: Scores

    def __post_init__(self):
        ids = set(self.extraction.ids)
        if set(self.answers.by_id) != ids:
            raise ValueError(f"answers cover {sorted(self.answers.by_id)}, questions are {sorted(ids)}")
        if {s.key for s in self.scores.questions} != ids:
            raise ValueError(f"scores cover {sorted(s.key for s in self.scores.questions)}, "
                             f"questions are {sorted(ids)}")
        if {s.key for s in self.scores.dimensions} != set(self.extraction.dimensions):
            raise ValueError(f"dimension scores {[s.key for s in self.scores.dimensions]} != dimensions with "
                             f"questions {self.extraction.dimensions}")

    @property
    def score(self) -> int:
        return self.scores.overall.score

    def to_dict(self) -> dict:
        ex, ans, sc = self.extraction, self.answers.by_id, self.scores.by_key
        return {"entities": list(ex.entities), "attributes": [list(a) for a in ex.attributes],
                "relations": list(ex.relations),
                "questions": [{"id": q.id, "dimension": q.dimension, "text": q.text, "answer": ans[q.id],
                               "explanation": sc[q.id].explanation, "score": sc[q.id].score} for q in ex.questions],
                "caption": self.answers.caption,
                "answer_order": [q for q, _ in self.answers.answers],
                "question_score_order": [s.key for s in self.scores.questions],
                "dimensions": {s.key: {"explanation": s.explanation, "score": s.score} for s in self.scores.dimensions},
                "overall": {"explanation": self.scores.overall.explanation, "score": self.scores.overall.score}}

    @classmethod
    def from_dict(cls, d: Mapping) -> DecomposedJudgment:
        """Inverse of to_dict (e.g. from a judgment row's parsed JSON)."""
        qs = {q["id"]: q for q in d["questions"]}
        by_dim = {dim: tuple(q["text"] for q in d["questions"] if q["dimension"] == dim) for dim in DIMENSIONS}
        ex = Extraction(tuple(d["entities"]), tuple(tuple(a) for a in d["attributes"]), tuple(d["relations"]),
                        by_dim["appearance"], by_dim["intrinsic"], by_dim["relationship"])
        answers = Answers(d["caption"], tuple((q, qs[q]["answer"]) for q in d["answer_order"]))
        scores = Scores(tuple(Scored(q, qs[q]["explanation"], qs[q]["score"]) for q in d["question_score_order"]),
                        tuple(Scored(k, v["explanation"], v["score"]) for k, v in d["dimensions"].items()),
                        Scored(OVERALL, d["overall"]["explanation"], d["overall"]["score"]))
        return cls(ex, answers, scores)


# ---------------------------------------------------------------- record helpers
def prompt_text(prompt: dict) -> str:
    """The text prompt of a text-to-image prompt record (refuses input images and an empty query)."""
    if base.images_of(prompt, "images"):
        raise ValueError("the decomposed T2I protocol judges text-to-image prompts; this prompt has input images "
                     f"(task {prompt.get('task')!r}, sub-task {prompt.get('subtask')!r})")
    text = base.slot_text(prompt.get("query") or "", "query")
    if not text:
        raise ValueError("the decomposed T2I protocol needs a text prompt (query)")
    return text


def image_slots(candidate: dict) -> tuple[str, list]:
    """The candidate's output images and the image markers that place them in a request."""
    _, images = base.output_of(candidate)
    if not images:
        raise ValueError(f"candidate {candidate.get('candidate_id')!r} has no output image to judge")
    return IMAGE * len(images), images


# ---------------------------------------------------------------- the three framework steps
def build_extraction(prompt: dict) -> TextRequest:
    """Step 1 (ECE): from the text prompt only; no images."""
    text = STEP1_TEMPLATE.format(instructions=EXTRACT_INSTRUCTIONS, spec=EXTRACTION_SPEC, prompt=prompt_text(prompt))
    return base.request(text, [], rid=prompt.get("prompt_id"))


def build_answering(candidate: dict, extraction: Extraction) -> TextRequest:
    """Step 2 (CAG): the image and the questions, WITHOUT the prompt (no information leakage)."""
    slots, images = image_slots(candidate)
    questions = "\n".join(QUESTION_LINE.format(id=q.id, text=q.text) for q in extraction.questions)
    return base.request(STEP2_TEMPLATE.format(image=slots, questions=questions), images,
                        rid=candidate.get("candidate_id"))


def build_scoring(prompt: dict, extraction: Extraction, answers: Answers) -> TextRequest:
    """Step 3 (E&S): prompt, extraction, caption and answers; text only (it compares answers with the prompt)."""
    by_id = answers.by_id
    missing = [q for q in extraction.ids if q not in by_id]
    if missing:
        raise ValueError(f"no answers for {missing}")
    qa = "\n".join(QA_ITEM.format(id=q.id, question=q.text, answer=by_id[q.id]) for q in extraction.questions)
    text = STEP3_TEMPLATE.format(prompt=prompt_text(prompt), extraction=format_extraction(extraction),
                                 caption=answers.caption, answers=qa)
    return base.request(text, [], rid=prompt.get("prompt_id"))


# ---------------------------------------------------------------- format
def format_extraction(ex: Extraction) -> str:
    items = {"entities": [BULLET.format(text=e) for e in ex.entities],
             "attributes": [BULLET.format(text=ATTRIBUTE.format(entity=e, attribute=a)) for e, a in ex.attributes],
             "relations": [BULLET.format(text=r) for r in ex.relations]}
    for d in DIMENSIONS:
        items[d] = [QUESTION_LINE.format(id=f"{PREFIX[d]}{i}", text=q) for i, q in enumerate(getattr(ex, d), 1)]
    out = []
    for key, label in EXTRACTION_SECTIONS:
        out += [f"{label}:", *items[key]] if items[key] else [f"{label}: {NONE}"]
    return "\n".join(out)


def format_answers(a: Answers) -> str:
    return "\n".join([CAPTION_LINE.format(caption=a.caption),
                      *(ANSWER_LINE.format(id=q, answer=t) for q, t in a.answers)])


def format_scores(s: Scores) -> str:
    lines = [SCORE_LINE.format(key=x.key, explanation=x.explanation, score=x.score) for x in s.questions]
    lines += [SCORE_LINE.format(key=DIMENSION_LABEL[x.key], explanation=x.explanation, score=x.score)
              for x in (*s.dimensions, s.overall)]
    return "\n".join(lines)


def format_full(j: DecomposedJudgment) -> str:
    """The three steps' outputs in one text (one raw_output for a teacher judgment row)."""
    parts = (format_extraction(j.extraction), format_answers(j.answers), format_scores(j.scores))
    return "\n".join(f"{h}\n{p}" for h, p in zip(FULL_HEADERS, parts, strict=True))


def format_content_extraction(ex: Extraction, caption: str) -> str:
    """Sample (1)'s target: the extraction, then the caption."""
    base.check_text("caption", caption)
    return f"{format_extraction(ex)}\n{CAPTION_LINE.format(caption=caption)}"


# ---------------------------------------------------------------- parse
_SECTION_RE = [(key, label, base.label_re(label)) for key, label in EXTRACTION_SECTIONS]
_CAPTION_RE = base.label_re(CAPTION)
_BULLET_RE = re.compile(r"^-\s*(.*)$")
_ID_LINE_RE = re.compile(r"^([A-Za-z])(\d+)\s*:\s*(.*)$")


def _is_none(value: str) -> bool:
    v = value.strip().lower()
    return v in (NONE, NONE + ".")


def _parse_extraction(raw: str, with_caption: bool) -> tuple[Extraction, str | None]:
    found: dict[str, list] = {}
    order = [k for k, _, _ in _SECTION_RE]
    labels = {k: lab for k, lab, _ in _SECTION_RE}
    current, empty_declared, caption = None, set(), None
    for ln in base.nonblank(raw):
        if caption is not None:
            fail("text after the 'Caption:' line")
        hit = next(((k, m) for k, _, rx in _SECTION_RE if (m := rx.match(ln))), None)
        if hit:
            key, m = hit
            if key in found:
                fail(f"'{labels[key]}:' section appears twice")
            expected_key = order[len(found)]
            if key != expected_key:
                fail(f"no '{labels[expected_key]}:' section" if order.index(key) > len(found)
                     else f"'{labels[key]}:' section out of order")
            value = m.group(1)
            if value and not _is_none(value):
                fail(f"unexpected text after '{labels[key]}:': {value[:40]!r} (items go on their own lines)")
            found[key], current = [], key
            if value:
                if key == "entities":
                    fail("'Entities:' cannot be none")
                empty_declared.add(key)
            continue
        cm = _CAPTION_RE.match(ln)
        if cm and with_caption:
            if len(found) < len(order):
                fail(f"'Caption:' before the '{labels[order[len(found)]]}:' section")
            caption = base.one_line(cm.group(1))
            if not caption:
                fail("empty caption")
            continue
        if current is None:
            fail(f"text before 'Entities:': {ln[:60]!r}")
        if current in empty_declared:
            fail(f"item under '{labels[current]}: none'")
        label = labels[current]
        if current in ("entities", "attributes", "relations"):
            b = _BULLET_RE.match(ln)
            if not b:
                fail(f"line {ln[:60]!r} under '{label}:' is not a '- ' item")
            text = base.one_line(b.group(1))
            if not text:
                fail(f"empty item under '{label}:'")
            if current == "attributes":
                if ":" not in text:
                    fail(f"attribute {text[:60]!r} is not '<entity>: <attribute>'")
                ent, att = (base.one_line(x) for x in text.split(":", 1))
                if not ent or not att:
                    fail(f"attribute {text[:60]!r} is not '<entity>: <attribute>'")
                if ent.lower() not in {e.lower() for e in found["entities"]}:
                    fail(f"attribute of {ent!r}, which is not among the entities")
                found[current].append((ent, att))
            else:
                found[current].append(text)
        else:
            q = _ID_LINE_RE.match(ln)
            if not q:
                fail(f"line {ln[:60]!r} under '{label}:' is not '<id>: <question>'")
            prefix, num, text = q.group(1).upper(), int(q.group(2)), base.one_line(q.group(3))
            if prefix != PREFIX[current]:
                fail(f"question '{prefix}{num}' under '{label}:'")
            if num != len(found[current]) + 1:
                fail(f"question '{prefix}{num}' out of sequence: expected {PREFIX[current]}{len(found[current]) + 1}")
            if not text:
                fail(f"empty question '{prefix}{num}'")
            found[current].append(text)
    if len(found) < len(order):
        fail(f"no '{labels[order[len(found)]]}:' section")
    for key in order:
        if not found[key] and key not in empty_declared:
            fail(f"'{labels[key]}:' section has no items (write '{labels[key]}: none' for an empty list)")
    if not any(found[d] for d in DIMENSIONS):
        fail("no questions")
    if with_caption and caption is None:
        fail("no 'Caption:' line")
    ex = base.make(Extraction, tuple(found["entities"]), tuple(found["attributes"]), tuple(found["relations"]),
                   tuple(found["appearance"]), tuple(found["intrinsic"]), tuple(found["relationship"]))
    return ex, caption


@strict
def parse_extraction(raw: str) -> Extraction | ParseError:
    """Step 1's output: the six sections in order, each '<Header>:' then items, or '<Header>: none'."""
    return _parse_extraction(raw, with_caption=False)[0]


@strict
def parse_content_extraction(raw: str) -> tuple[Extraction, str] | ParseError:
    """Sample (1)'s output: the extraction, then a last line 'Caption: ...'."""
    return _parse_extraction(raw, with_caption=True)


def _missing(what: str, missing: list[str]) -> None:
    if missing:
        fail(f"{what} for {', '.join(map(repr, missing))} missing")


@strict
def parse_answers(raw: str, extraction: Extraction) -> Answers | ParseError:
    """Step 2's output: 'Caption: ...' first, then '<id>: <answer>' for every question exactly once."""
    lines = base.nonblank(raw)
    captions = [i for i, ln in enumerate(lines) if _CAPTION_RE.match(ln)]
    if not captions:
        fail("no 'Caption:' line")
    if len(captions) > 1:
        fail(f"{len(captions)} 'Caption:' lines, expected 1")
    if captions[0] != 0:
        fail("'Caption:' must come first")
    caption = base.one_line(_CAPTION_RE.match(lines[0]).group(1))
    if not caption:
        fail("empty caption")
    want, seen, answers = extraction.ids, Counter(), []
    for ln in lines[1:]:
        m = _ID_LINE_RE.match(ln)
        if not m:
            fail(f"line {ln[:60]!r} is not '<id>: <answer>'")
        qid, text = f"{m.group(1).upper()}{m.group(2)}", base.one_line(m.group(3))
        if qid not in want:
            fail(f"'{qid}' is not a question id")
        seen[qid] += 1
        if seen[qid] > 1:
            fail(f"answer for '{qid}' given {seen[qid]} times")
        if not text:
            fail(f"empty answer for '{qid}'")
        answers.append((qid, text))
    _missing("answer", [q for q in want if q not in seen])
    return base.make(Answers, caption, tuple(answers))


_SCORE_RE = re.compile(r"^([A-Za-z][A-Za-z0-9]*)\s*:\s*(.*?)\s*\bscore\s*:\s*(.*)$", re.IGNORECASE)
_KEY_RE = re.compile(r"^([A-Za-z][A-Za-z0-9]*)\s*:")


def _key(word: str) -> str | None:
    if re.fullmatch(r"[A-Za-z]\d+", word):
        return word.upper()
    w = word.lower()
    return w if w in (*DIMENSIONS, OVERALL) else None


@strict
def parse_scores(raw: str, extraction: Extraction) -> Scores | ParseError:
    """Step 3's output: '<key>: <explanation> Score: N' (N integer 0..10) for every question, every dimension
    that has questions, and 'Overall', each exactly once."""
    ids, dims = extraction.ids, extraction.dimensions
    seen, questions, dimensions, overall = Counter(), [], [], None
    for ln in base.nonblank(raw):
        m = _SCORE_RE.match(ln)
        if not m:
            k = _KEY_RE.match(ln)
            if k and _key(k.group(1)):
                fail(f"no 'Score:' for {_label(_key(k.group(1)))!r}")
            fail(f"line {ln[:60]!r} is not '<id or dimension>: <explanation> Score: N'")
        key = _key(m.group(1))
        if key is None:
            fail(f"{m.group(1)!r} is neither a question id, a dimension nor 'Overall'")
        label = _label(key)
        if key in DIMENSIONS and key not in dims:
            fail(f"'{label}' scored but there are no {key} questions")
        if key not in (*DIMENSIONS, OVERALL) and key not in ids:
            fail(f"'{key}' is not a question id")
        seen[key] += 1
        if seen[key] > 1:
            fail(f"'{label}' scored {seen[key]} times")
        explanation = base.one_line(m.group(2))
        if not explanation:
            fail(f"empty explanation for '{label}'")
        value = base.parse_int(m.group(3), SCORE_MIN, SCORE_MAX, "score", f" for '{label}'")
        s = base.make(Scored, key, explanation, value)
        if key == OVERALL:
            overall = s
        elif key in DIMENSIONS:
            dimensions.append(s)
        else:
            questions.append(s)
    _missing("score", [q for q in ids if q not in seen])
    missing_dims = [d for d in dims if d not in seen]
    if missing_dims:
        fail(f"dimension {', '.join(map(repr, missing_dims))} missing")
    if overall is None:
        fail("no 'Overall:' line")
    return base.make(Scores, tuple(questions), tuple(dimensions), overall)


def _label(key: str) -> str:
    return DIMENSION_LABEL.get(key, key)


@strict
def parse_full(raw: str) -> DecomposedJudgment | ParseError:
    """format_full's text: the three step headers in order, each followed by that step's output."""
    lines = base.lines_of(raw)
    marks = []
    for h in FULL_HEADERS:
        at = [i for i, ln in enumerate(lines) if ln.lower() == h.lower()]
        if len(at) != 1:
            fail(f"{len(at)} '{h}' lines, expected 1")
        marks.append(at[0])
    if marks != sorted(marks):
        fail(f"step headers out of order: expected {', '.join(FULL_HEADERS)}")
    if any(lines[:marks[0]]):
        fail(f"text before '{FULL_HEADERS[0]}'")
    chunks = ["\n".join(lines[a + 1:b]) for a, b in itertools.pairwise([*marks, len(lines)])]
    results = []
    for step, chunk in zip(STEPS, chunks, strict=True):
        if not chunk.strip():
            fail(f"{step}: empty")
        r = (parse_extraction(chunk) if step == "extraction" else
             parse_answers(chunk, results[0]) if step == "answers" else parse_scores(chunk, results[0]))
        if isinstance(r, ParseError):
            fail(f"{step}: {r.reason}")
        results.append(r)
    return base.make(DecomposedJudgment, *results)


# ---------------------------------------------------------------- judgment fields
def to_judgment_fields(x: DecomposedJudgment | ParseError) -> dict:
    """score = the overall score (0..10); parsed = DecomposedJudgment.to_dict(); analysis = the overall
    explanation."""
    if isinstance(x, ParseError):
        return base.error_fields(x)
    return base.fields(parsed=x.to_dict(), score=x.score, analysis=x.scores.overall.explanation)
