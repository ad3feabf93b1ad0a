"""Decomposed T2I: the six sub-task sample kinds (requests without the prompt where the paper says so, exact
targets and strict target parsers), assembly from sub-task outputs. The protocol itself: test_decomposed.py."""
from __future__ import annotations

from collections import Counter

import pytest
from judge_helpers import candidate, checked, prompt
from test_decomposed import ANS, EX, J, PROMPT, SC

from flywheel.judge import decomposed as dc
from flywheel.judge import decomposed_samples as dcs
from flywheel.records import validate


@pytest.fixture
def t2i(imgs):
    return prompt("ig", "text_to_image", PROMPT), candidate(None, [imgs[5]])


def test_six_sample_kinds(t2i, imgs):
    p, c = t2i
    samples = dcs.build_samples(p, c, J)
    n_q, n_dim = len(EX.ids), len(EX.dimensions)
    assert Counter(s.kind for s in samples) == {"content_extraction": 1, "answer_generation": n_q, "explanation": n_q,
                                                "scoring": n_q, "summarization": n_dim + 1,
                                                "summary_scoring": n_dim + 1}
    assert [k for k in dict.fromkeys(s.kind for s in samples)] == list(dcs.SAMPLE_KINDS)
    for s in samples:
        checked(s.request)
        assert s.images == [imgs[5]] and [m["role"] for m in s.messages] == ["user", "assistant"]
        parsed = dcs.parse_target(s.kind, s.target)
        assert parsed is not None and not isinstance(parsed, dc.ParseError)
    by = {(s.kind, s.key): s for s in samples}
    assert by[("content_extraction", None)].target == dc.format_content_extraction(EX, ANS.caption)
    ans = by[("answer_generation", "I1")]
    assert ans.target == "Answer: Black." and PROMPT not in dc.base.render(ans.request)  # individual QA, no prompt
    assert by[("explanation", "R1")].target == "Explanation: Roof, not hood."
    assert by[("scoring", "R1")].target == "Score: 4"
    assert "Explanation: Roof, not hood.\n###Your Score###" in dc.base.render(by[("scoring", "R1")].request)
    assert by[("summarization", "relationship")].target == "Explanation: Wrong place."
    assert by[("summary_scoring", "overall")].target == "Score: 7"
    overall = dc.base.render(by[("summarization", "overall")].request)
    assert "###Dimension Evaluations###\nAppearance: Mostly good.\nScore: 7\nIntrinsic:" in overall


def test_assemble_from_sub_task_outputs():
    sc = SC.by_key
    j = dcs.assemble(EX, ANS.caption, ANS.by_id, {k: v.explanation for k, v in sc.items()},
                     {k: v.score for k, v in sc.items()})
    assert j.to_dict() == J.to_dict() and j.score == 7
    with pytest.raises(ValueError, match="no answer, explanation or score for"):
        dcs.assemble(EX, ANS.caption, ANS.by_id, {}, {})


@pytest.mark.parametrize("kind, raw, reason", [
    ("answer_generation", "Black.", "no 'Answer:' line"),
    ("answer_generation", "Answer: Black.\nAnswer: White.", "text after the 'Answer:' line"),
    ("scoring", "Score: 12", "score 12 outside 0–10"),
    ("scoring", "Score: high", "score 'high' is not an integer 0–10"),
    ("explanation", "Explanation: fine. Score: 8", "explanation contains 'Score:' (scores are a separate sub-task)"),
    ("summarization", "Explanation:", "empty explanation"),
    ("content_extraction", dc.format_extraction(EX), "no 'Caption:' line"),
    ("content_extraction", dc.format_content_extraction(EX, "x") + "\nA3: more?", "text after the 'Caption:' line"),
])
def test_sample_target_strict_failures(kind, raw, reason):
    err = dcs.parse_target(kind, raw)
    assert isinstance(err, dc.ParseError) and err.reason == reason


def test_sample_targets_round_trip():
    assert dcs.parse_target("scoring", dcs.format_target("scoring", 0)) == 0
    assert dcs.parse_target("answer_generation", dcs.format_target("answer_generation", "Two red circles.")) == \
        "Two red circles."
    assert dcs.parse_target("content_extraction", dcs.format_target("content_extraction", (EX, "cap"))) == (EX, "cap")
    with pytest.raises(ValueError, match="unknown sample kind"):
        dcs.format_target("ranking", 1)


def test_samples_are_valid_sft_rows(t2i):
    p, c = t2i
    rows = [{"images": s.images, "messages": s.messages, "task": "ig", "protocol": "decomposed",
             "subtask": s.kind, "source_ids": []} for s in dcs.build_samples(p, c, J)]
    valid, quarantined = validate("sft", rows)
    assert not quarantined and len(valid) == len(rows)
