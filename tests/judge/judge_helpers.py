"""Shared helpers of the judge-protocol tests (imported by them; fixtures are in conftest.py): tiny distinct
PNGs, prompt/candidate records, random texts, generated tokens with their alternatives, and a full judgment row
for flywheel.records.validate."""
from __future__ import annotations

import math
import random

from PIL import Image

from flywheel.engines.base import TokenLogprobs, check_text_request
from flywheel.images import to_png_bytes
from flywheel.judge import base
from flywheel.records import make_id

COLORS = [(255, 0, 0), (0, 255, 0), (0, 0, 255), (255, 255, 0), (0, 255, 255), (255, 0, 255), (128, 128, 128)]


def png(i: int) -> bytes:
    return to_png_bytes(Image.new("RGB", (28, 28), COLORS[i % len(COLORS)]))


def prompt(task="iu", subtask="iu_count", query="How many red circles are there?", images=(), ref_text=None,
           ref_images=(), **kw) -> dict:
    row = {"task": task, "subtask": subtask, "query": query, "images": list(images), "reference_text": ref_text,
           "reference_images": list(ref_images), "aspects": [], "source": "test", "split": "train", **kw}
    try:
        row["prompt_id"] = make_id("prompt", row)
    except ValueError:  # a deliberately invalid prompt (e.g. an unknown task) keeps no id
        row["prompt_id"] = None
    return row


def candidate(text=None, images=(), prompt_id="pr_x", index=0) -> dict:
    row = {"prompt_id": prompt_id, "producer": "policy:test", "output_text": text, "output_images": list(images),
           "sample_index": index}
    row["candidate_id"] = make_id("candidate", row)
    return row


def image_parts(req) -> int:
    return sum(1 for m in req.messages if isinstance(m["content"], list)
               for p in m["content"] if p.get("type") == "image")


def checked(req) -> str:
    """Validate a request the way engines do (image count = placeholders, images decode); its readable text."""
    check_text_request(req)
    assert image_parts(req) == len(req.images)
    return base.render(req)


def judgment_row(protocol: str, fields: dict, candidate_ids=("ca_1",), order=None, aspect=None, raw="x") -> dict:
    return {"prompt_id": "pr_1", "candidate_ids": list(candidate_ids), "judge": "teacher:test", "protocol": protocol,
            "aspect": aspect, "order": order, "sample_k": 0, "raw_output": raw, **fields}


# ---- random texts for round trips: words chosen to look like labels without being them -------------------
WORDS = ["the", "image", "shows", "a", "red", "circle", "left", "of", "blue", "square", "score", "rating",
         "Rating", "A", "B", "tie", "Tie", "none", "met", "Met", "helmet:", "note:", "3", "10", "4/5", "-", "—",
         "é", "colour", "is", "correct.", "wrong,", "(mostly)", '"quoted"', "x:y", "Verdict", "Analysis", "I1",
         "T2", "A1", "Overall", "Score", "criteria", "Answer", "Caption", "ok",
         # reserved-looking: each structure refuses them where they would be ambiguous (build_valid redraws)
         "score:", "Rating:", "Met:", "verdict:", "Analysis:", "none."]


def words(rng: random.Random, lo=1, hi=14) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(lo, hi)))


def paragraph(rng: random.Random) -> str:
    """Multi-line text in clean_text form (possibly with a blank line inside)."""
    lines = [words(rng) for _ in range(rng.randint(1, 3))]
    if len(lines) > 1 and rng.random() < 0.3:
        lines.insert(1, "")
    return base.clean_text("\n".join(lines))


def build_valid(rng: random.Random, make, n: int, tries: int = 50):
    """n values from make(rng), retrying draws the structure refuses (e.g. a reserved label in a text)."""
    out = []
    for _ in range(n):
        for _ in range(tries):
            try:
                out.append(make(rng))
                break
            except ValueError:
                continue
        else:
            raise AssertionError("could not generate a valid value")
    return out


def tokens(*steps) -> list[TokenLogprobs]:
    """TokenLogprobs for (chosen token, {alternative: probability}) steps."""
    return [TokenLogprobs(tok, math.log(alts.get(tok, 0.01)), {t: math.log(p) for t, p in alts.items()})
            for tok, alts in steps]
