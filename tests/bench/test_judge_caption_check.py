"""The judge caption-check bench's rows: its numbers say whether the judge base can look a caption's mention up,
so a row whose answer is not what the reference (or the response) holds would make a look-up look unlearnable."""

import re

import numpy as np
from bench_scripts import load_bench

from flywheel.config import REPO_ROOT, load_config

bench = load_bench("judge_caption_check")
WORLD = load_config(str(REPO_ROOT / "configs" / "local.yaml")).world.shapes


def _text(row: dict) -> str:
    return "".join(part.get("text", "") for part in row["prompt"][0]["content"])


def _quoted(text: str, name: str) -> set[tuple[str, str]]:
    said = re.search(rf'the {name} is "([^"]*)"', text).group(1).split(".")[0].lower()
    return set(re.findall(r"(?:a|an) (\w+) (\w+)", said))


def test_a_colour_row_answers_what_the_reference_holds_of_the_mentioned_colour():
    rng, copied = np.random.default_rng(0), 0
    for _ in range(40):
        row, value = bench.check_row(rng, WORLD, "colour")
        text, target = _text(row), row["completion"][0]["content"][0]["text"]
        colour, shape = re.search(r"It mentions an? (\w+) (\w+)\.$", text).groups()
        reference = {c: s for c, s in _quoted(text, "reference answer")}
        assert value == reference.get(colour, "missing")
        mention = f"It mentions {'an' if colour[0] in 'aeiou' else 'a'} {colour} {shape}: "
        assert target == mention + (f"nothing in the image is {colour}." if value == "missing" else
                                    f"the {colour} shape is {'an' if value[0] in 'aeiou' else 'a'} {value}.")
        assert len(row["images"]) == 1 and text.startswith(bench.HEADER)
        copied += value == shape
    assert copied < 35  # the mention's own shape is often not the answer


def test_a_shape_row_answers_what_the_response_calls_the_reference_object():
    rng = np.random.default_rng(1)
    for _ in range(40):
        row, value = bench.check_row(rng, WORLD, "shape")
        text, target = _text(row), row["completion"][0]["content"][0]["text"]
        colour, shape = re.search(r"The (\w+) (\w+)\.$", text).groups()
        response = {s: c for c, s in _quoted(text, "response")}
        assert value == response[shape] and target == f"It calls it {value}."


def test_the_answer_words_give_the_same_value_alone():
    teacher = bench.check_row(np.random.default_rng(2), WORLD, "colour", "teacher")
    answer = bench.check_row(np.random.default_rng(2), WORLD, "colour", "answer")
    assert teacher[1] == answer[1] and _text(teacher[0]) == _text(answer[0])
    said = answer[0]["completion"][0]["content"][0]["text"]
    assert said.startswith("The ") and said.endswith(("missing.", f"{answer[1]}."))
