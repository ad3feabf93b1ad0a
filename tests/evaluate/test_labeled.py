"""`flywheel eval` on a user's labeled JSONL: formats, refusals with line numbers, metrics from a judge."""

import json

from labeled_sets import pair, png_b64, point, write_jsonl
from typer.testing import CliRunner

from flywheel.cli import app
from flywheel.engines.base import TextEngine, TextResult
from flywheel.evaluate.labeled import evaluate_labeled, load_labeled


PROMPT = {"task": "iu", "subtask": "iu_color", "query": "What colour is the circle?", "images": [png_b64()]}


def _write(tmp_path):
    lines = [point(PROMPT, "Red.", 5), point(PROMPT, "Blue.", 1), pair(PROMPT, "Red.", "Blue.", "A"),
             pair(PROMPT, "x", "y", "tie"), point(PROMPT, "Red.", 9), {"type": "ranking"}]
    return write_jsonl(tmp_path / "labels.jsonl", lines, "not json\n")


class SaysRedIsRight(TextEngine):
    """A stand-in judge (no model needed to test the evaluation): rates answers naming red 5, others 1, and in
    pairwise prefers the response that says red — except that it emits garbage for one request."""

    name, version = "scripted", "1"

    def generate(self, requests, seed=0):
        out = []
        for r in requests:
            text = r.messages[-1]["content"] if isinstance(r.messages[-1]["content"], str) else " ".join(
                p.get("text", "") for p in r.messages[-1]["content"] if p.get("type") == "text")
            if "Response A" in text or "response A" in text.lower():
                a_red = text.find("Red.") < text.find("Blue.")
                out.append(TextResult(text=f"Analysis: one says red.\\nVerdict: {'A' if a_red else 'B'}"
                                      .replace("\\n", "\n")))
            elif "Blue." in text:
                out.append(TextResult(text="I think maybe"))  # unparseable: must not become a score
            else:
                out.append(TextResult(text="Analysis: correct colour.\nRating: 5"))
        return out


def test_load_refuses_bad_lines_with_line_numbers(tmp_path):
    items, refused = load_labeled(_write(tmp_path))
    assert [i["type"] for i in items] == ["pointwise", "pointwise", "pairwise"]
    text = " | ".join(refused)
    for expected in ("line 4: winner must be 'A' or 'B'", "line 5: score must be", "line 6: type must be",
                     "line 7: not JSON (Expecting value"):
        assert expected in text


def test_metrics_count_unparsed_outputs_as_failures(tmp_path):
    items, _ = load_labeled(_write(tmp_path))
    m = evaluate_labeled(SaysRedIsRight(), items)
    assert m["pointwise/parse_failure_rate"] == 0.5  # the "Blue." answer got garbage
    assert m["pointwise/exact"] == 0.5
    assert m["pairwise/accuracy"] == 1.0 and m["pairwise/position_bias_rate"] == 0.0


def test_cli_eval_runs_a_judge_and_refuses_empty_sets(tmp_path, cfg, zoo):
    runner = CliRunner()
    empty = tmp_path / "empty.jsonl"
    empty.write_text("{}\n")
    r = runner.invoke(app, ["eval", "--data", str(empty), "--judge", "zoo:judge", f"run.workdir={cfg.run.workdir}"])
    assert r.exit_code == 2 and "no valid items" in r.output
    r = runner.invoke(app, ["eval", "--data", str(_write(tmp_path)), "--judge", "zoo:judge",
                            f"run.workdir={cfg.run.workdir}", "judge.generation.max_new_tokens=4"])
    assert r.exit_code == 0, r.output
    assert "pointwise/parse_failure_rate" in r.output and "3 items (4 refused)" in r.output


def test_cli_eval_asks_the_judge_with_the_runs_seed(tmp_path, monkeypatch):
    # a sampling judge (judge.samples) draws with run.seed, so two seeds are two draws; a scripted judge stands in
    # for the model (what is checked is the seed `flywheel eval` hands it)
    import flywheel.engines

    seeds = []

    class Spy(SaysRedIsRight):
        def generate(self, requests, seed=0):
            seeds.append(seed)
            return super().generate(requests, seed)

    monkeypatch.setattr(flywheel.engines, "make_text_engine", lambda cfg, role: Spy())
    r = CliRunner().invoke(app, ["eval", "--data", str(_write(tmp_path)), "--judge", "zoo:judge",
                                 f"run.workdir={tmp_path}", "run.seed=5"])
    assert r.exit_code == 0, r.output
    assert seeds == [5]
    r = CliRunner().invoke(app, ["eval", "--data", str(_write(tmp_path)), "--judge", "zoo:judge",
                                 f"run.workdir={tmp_path}", "judge.samples=3", "judge.generation.temperature=0.7"])
    assert r.exit_code == 0, r.output
    assert "judged by zoo:judge, each rated by 3 sampled answers at temperature 0.7" in " ".join(r.output.split())


class WritesThreeButLeans(TextEngine):
    """A stand-in judge that writes "Rating: 3" for every answer but, at the rating token, leans towards 5 for
    "Red." and towards 1 for "Blue." / "Green." by different amounts (its log-probabilities are scripted)."""

    name, version = "scripted-logprobs", "1"
    LEAN = {"Red.": 0.5, "Green.": 0.3, "Blue.": 0.1}  # P(" 5"); P(" 1") = 0.6 - P(" 5"); P(" 3") = 0.4

    def generate(self, requests, seed=0):
        import math

        from flywheel.engines.base import TokenLogprobs
        out = []
        for r in requests:
            text = " ".join(p.get("text", "") for p in r.messages[-1]["content"] if p.get("type") == "text")
            p5 = next(v for k, v in self.LEAN.items() if k in text)
            top = {" 3": math.log(0.4), " 5": math.log(p5), " 1": math.log(0.6 - p5)}
            out.append(TextResult(text="Analysis: a colour.\nRating: 3", logprobs=[
                TokenLogprobs("Analysis: a colour.\nRating:", 0.0, {"Analysis: a colour.\nRating:": 0.0}),
                TokenLogprobs(" 3", math.log(0.4), top)]))
        return out


def test_expected_readout_orders_what_the_written_ratings_tie(tmp_path):
    lines = [{"type": "pointwise", "prompt": PROMPT, "response": {"text": t}, "score": s}
             for t, s in (("Red.", 5), ("Green.", 3), ("Blue.", 1))]
    path = tmp_path / "l.jsonl"
    path.write_text("\n".join(json.dumps(x) for x in lines))
    items, _ = load_labeled(path)
    written = evaluate_labeled(WritesThreeButLeans(), items, readout="text")
    assert written["pointwise/spearman"] != written["pointwise/spearman"]  # all 3s: no order (NaN)
    expected = evaluate_labeled(WritesThreeButLeans(), items, readout="expected")
    assert expected["pointwise/spearman"] == 1.0 and expected["pointwise/parse_failure_rate"] == 0.0
    assert expected["pointwise/exact"] == 1 / 3  # 3.8, 3.0, 2.2: only the middle one rounds to its gold


class AlwaysSaysA(TextEngine):
    """A stand-in pairwise judge with total position bias: it writes "Verdict: A" whatever the order, but is surer
    of it when "Red." is Response A (its log-probabilities are scripted)."""

    name, version = "scripted-verdicts", "1"

    def generate(self, requests, seed=0):
        import math

        from flywheel.engines.base import TokenLogprobs
        out = []
        for r in requests:
            text = " ".join(p.get("text", "") for p in r.messages[-1]["content"] if p.get("type") == "text")
            p_a = 0.9 if text.find("Red.") < text.find("Blue.") else 0.7
            out.append(TextResult(text="Analysis: a colour.\nVerdict: A", logprobs=[
                TokenLogprobs(" A", math.log(p_a), {" A": math.log(p_a), " B": math.log(1 - p_a)})]))
        return out


def test_expected_readout_balances_a_position_biased_verdict(tmp_path):
    lines = [{"type": "pairwise", "prompt": PROMPT, "response_a": {"text": a}, "response_b": {"text": b},
              "winner": "A" if a == "Red." else "B"} for a, b in (("Red.", "Blue."), ("Blue.", "Red."))]
    path = tmp_path / "l.jsonl"
    path.write_text("\n".join(json.dumps(x) for x in lines))
    items, _ = load_labeled(path)
    written = evaluate_labeled(AlwaysSaysA(), items, readout="text")
    assert written["pairwise/accuracy"] == 0.0 and written["pairwise/position_bias_rate"] == 1.0
    assert not any(k.startswith("pairwise_balanced/") for k in written)  # no probabilities read
    balanced = evaluate_labeled(AlwaysSaysA(), items, readout="expected")
    assert balanced["pairwise_balanced/accuracy"] == 1.0 and balanced["pairwise_balanced/n"] == 2
