"""The look-up probe's rows: its numbers say whether the tiny language model can answer from its context, so a
row whose answer disagrees with its own description would make a learnable task look unlearnable."""

import random
import re

import pytest
from bench_scripts import load_bench

bench = load_bench("lookup_probe")


def _objects(desc: str) -> set[tuple[str, str]]:
    return set(re.findall(r"a (\w+) (\w+)", desc.lower()))


def test_every_answer_is_what_its_description_says():
    rng = random.Random(3)
    answers = {"Yes": 0, "No": 0}
    for _ in range(300):
        context, answer = bench.example(rng, "colour")
        desc, shape = context.split(". The ")[0], context.split(". The ")[1].removesuffix(" is")
        assert (answer.strip(" ."), shape) in _objects(desc)
        context, answer = bench.example(rng, "existence")
        desc, asked = context.split(". Is there a ")
        colour, shape = asked.removesuffix("?").split()
        present = (colour, shape) in _objects(desc)
        assert answer == (" Yes." if present else " No.")
        answers[answer.strip(" .")] += 1
    assert min(answers.values()) > 100  # both answers are common: "Yes" alone cannot score


def test_multi_asks_every_object_once_and_unknown_kinds_are_refused():
    desc, answer = bench.example(random.Random(0), "multi")
    asked = re.findall(r"The (\w+) is (\w+)\.", answer)
    assert sorted((c, s) for s, c in asked) == sorted(_objects(desc))
    with pytest.raises(ValueError, match="kind 'colours'"):
        bench.example(random.Random(0), "colours")


def test_only_the_answer_is_trained_on():
    tok = bench.PreTrainedTokenizerFast(tokenizer_object=bench.train_bpe(1024, ["<s>", "</s>", "<pad>"]),
                                        pad_token="<pad>")
    b = bench.batch(tok, [("A red circle. The circle is", " red."), ("A blue star and a red square.", " x")])
    labelled = b["labels"][0][b["labels"][0] != -100].tolist()
    assert tok.decode(labelled) == " red."
    assert b["attention_mask"][1].sum() == len(tok("A blue star and a red square. x")["input_ids"])


def test_a_direct_row_asks_the_shape_it_answers_and_a_repeat_row_copies_its_description():
    rng = random.Random(5)
    for _ in range(100):
        context, answer = bench.example(rng, "direct")
        desc, question = context.split(". What colour is the ")
        shape = question.split("?")[0]
        assert context.endswith(f"The {shape}:") and (answer.strip(" ."), shape) in _objects(desc)
        context, answer = bench.example(rng, "repeat")
        assert answer == " " + context


@pytest.mark.parametrize("kind", ["colourkey", "shapekey"])
def test_a_check_row_answers_from_the_reference_not_the_response(kind):
    """The answer is the looked-up key's value in the reference ("missing" when it has none), and often differs
    from the mention's own: copying the mention cannot score."""
    rng, copied, missing = random.Random(7), 0, 0
    for _ in range(300):
        context, answer = bench.example(rng, kind)
        reference = _objects(context.split("Reference: ")[1].split(" Response: ")[0])
        response = _objects(context.split("Response: ")[1].split(" It mentions")[0])
        c, s = re.search(r"It mentions a (\w+) (\w+): ", context).groups()
        assert (c, s) in response and len(response - reference) <= 1  # one object changed (maybe to another)
        found = {o[0] if kind == "colourkey" else o[1]: o for o in reference}.get(c if kind == "colourkey" else s)
        value = "missing" if found is None else found[1] if kind == "colourkey" else found[0]
        assert answer == f" {value}."
        assert len({o[0] if kind == "colourkey" else o[1] for o in reference}) == len(reference)  # keys unique
        copied += value == (s if kind == "colourkey" else c)
        missing += value == "missing"
    assert 0.5 < copied / 300 < 0.75 and missing > 10
