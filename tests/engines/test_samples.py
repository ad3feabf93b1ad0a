"""judge.samples (flywheel/engines/samples.py): each rating request answered k times from seeds of its own, the
rest once; the k answers read as one rating (their mean) or one verdict (their vote), wherever the judge rates."""
from __future__ import annotations

import pytest

from flywheel.config import Config, load_config
from flywheel.engines import make_text_engine
from flywheel.engines.base import SEED_STRIDE, TextEngine, TextRequest, TextResult
from flywheel.engines.samples import SampledTextEngine, bundle
from flywheel.judge import pairwise as pw
from flywheel.judge import pointwise as pt
from flywheel.stages.judgments import JudgmentsCore
from flywheel.worlds.shapes.teacher import make_context
from chat_server import ChatServer, completion


class RatesBySeed(TextEngine):
    """A stand-in judge (no model needed to test how its answers are drawn and read): rates every request
    `ratings[seed // SEED_STRIDE]`, garbage where that is None; records each call's request ids and seed."""

    name, version = "scripted", "1"

    def __init__(self, ratings):
        self.ratings, self.calls = ratings, []

    def generate(self, requests, seed=0):
        self.calls.append(([r.id for r in requests], seed))
        r = self.ratings[seed // SEED_STRIDE]
        text = "I am not sure" if r is None else f"Analysis: seed {seed}.\nRating: {r}"
        return [TextResult(text=text, completion_tokens=3) for _ in requests]


def _req(rid: str, protocol: str | None = None, step: str | None = None) -> TextRequest:
    ctx = None if protocol is None else make_context(protocol, {"prompt_id": "p"}, step=step)
    return TextRequest(messages=[{"role": "user", "content": "rate"}], id=rid, context=ctx)


def test_rating_requests_are_drawn_k_times_with_seeds_of_their_own_and_the_rest_once():
    inner = RatesBySeed([2, 4, 3])
    reqs = [_req("plain"), _req("point", "pointwise"), _req("rubric", "rubric", step="generate"),
            _req("claim", "claims"), _req("split", "claims", step="split")]
    out = SampledTextEngine(inner, 3).generate(reqs, seed=7)
    # requests read once, once; rating requests k times, the first with the caller's seed (so sample 0 is what
    # one sample gives), the others with seeds of their own
    assert inner.calls == [(["rubric", "split"], 7), (["plain", "point", "claim"], 7),
                           (["plain", "point", "claim"], 7 + SEED_STRIDE),
                           (["plain", "point", "claim"], 7 + 2 * SEED_STRIDE)]
    assert [len(r.samples or []) for r in out] == [3, 3, 0, 3, 0]
    assert out[1].text == "Analysis: seed 7.\nRating: 2" and out[1].completion_tokens == 9
    assert pt.result_fields(out[1])["score"] == pytest.approx(3.0)
    assert pt.result_fields(out[2])["score"] == 2  # read once


def test_the_wrapper_names_the_backend_as_it_is_now():
    inner = RatesBySeed([3])
    eng = SampledTextEngine(inner, 2)
    inner.version = "served-v7"  # as an HTTP engine learns its version from the server's answer
    assert (eng.name, eng.version) == ("scripted", "served-v7")


def test_a_rating_is_the_mean_of_the_samples_that_parsed_and_no_parse_is_never_a_score():
    out = SampledTextEngine(RatesBySeed([None, 5, 2, None]), 4).generate([_req("a")])[0]
    f = pt.result_fields(out)
    assert f["score"] == pytest.approx(3.5) and f["parse_error"] is None
    assert f["parsed"] == {"rating": 5, "sample_scores": [None, 5, 2, None]}
    assert f["analysis"] == f"seed {SEED_STRIDE}."  # the first sample that parsed
    none = pt.result_fields(SampledTextEngine(RatesBySeed([None, None]), 2).generate([_req("a")])[0])
    assert none["score"] is None and none["parse_error"] == "no 'Rating:' line"


def test_an_engine_error_in_one_sample_keeps_the_others():
    ok = TextResult(text="Analysis: fine.\nRating: 4")
    got = bundle([TextResult(error="timeout"), ok, TextResult(text="Analysis: meh.\nRating: 2")])
    assert got.ok and got.text == ok.text  # the row's raw output is the first answered sample's
    assert pt.result_fields(got)["score"] == pytest.approx(3.0)
    assert not bundle([TextResult(error="timeout"), TextResult(error="refused")]).ok
    with pytest.raises(ValueError, match="no samples"):
        bundle([])


def _verdict(v: str) -> TextResult:
    return TextResult(text=f"Analysis: {v} wins.\nVerdict: {v}")


@pytest.mark.parametrize("emitted, order, verdict", [
    (["A", "A", "B"], "AB", "A"),     # the majority
    (["A", "B"], "AB", "tie"),        # a draw is a tie, not the first sample's verdict
    (["A", "A", "tie"], "BA", "B"),   # read in the AB frame: shown BA, "A" is candidate B
    (["B", "junk", "junk"], "AB", "B"),  # unparsed samples do not vote
])
def test_a_pairwise_verdict_is_the_vote_of_the_samples(emitted, order, verdict):
    res = bundle([TextResult(text="???") if v == "junk" else _verdict(v) for v in emitted])
    f = pw.result_fields(res, order)
    assert f["verdict"] == verdict and f["parse_error"] is None
    assert f["parsed"]["verdict"] == pw.to_ab(verdict, order)  # as emitted in the request's order
    assert len(f["parsed"]["sample_verdicts"]) == len(emitted)
    if verdict != "tie":
        assert f["analysis"] == f"{pw.to_ab(verdict, order)} wins."  # an analysis that argues the verdict


def test_the_verdict_probabilities_of_the_samples_are_averaged():
    each = [pw.base.fields(parsed={"verdict": "A", "order": "AB", "verdict_probs": {"A": 0.8, "B": 0.2, "tie": 0.0}},
                           verdict="A", analysis="x"),
            pw.base.fields(parsed={"verdict": "B", "order": "AB", "verdict_probs": {"A": 0.4, "B": 0.6, "tie": 0.0}},
                           verdict="B", analysis="y")]
    assert pw.voted(each, "AB")["parsed"]["verdict_probs"] == pytest.approx({"A": 0.6, "B": 0.4, "tie": 0.0})


def test_the_judgments_stage_writes_the_mean_rating(cfg):
    prompt = {"prompt_id": "pr_1", "task": "iu", "subtask": "iu_color", "query": "What colour is it?", "images": [],
              "reference": None, "meta": None}
    cand = {"candidate_id": "ca_1", "prompt_id": "pr_1", "producer": "p", "sample_index": 0, "output_text": "Red.",
            "output_images": [], "meta": None}
    c = cfg.model_copy(deep=True)
    c.judgments.protocols = {"iu": ["pointwise"]}
    c.judgments.samples_per_item = 1
    core = JudgmentsCore(c, [cand], engine=SampledTextEngine(RatesBySeed([1, 5, 4]), 3), role="judge")
    row, = core([prompt]).rows
    assert row["score"] == pytest.approx(10 / 3) and row["parsed"]["sample_scores"] == [1, 5, 4]


def test_the_config_wraps_the_judge_only_and_refuses_greedy_samples(cfg):
    with pytest.raises(ValueError, match="set judge.generation.temperature > 0"):
        load_config(None, ["judge.samples=5"])
    c = load_config(None, [f"run.workdir={cfg.run.workdir}", "judge.samples=5", "judge.generation.temperature=0.7",
                           "judge.engine=oracle", "teacher.engine=oracle"])
    judge, teacher = make_text_engine(c, "judge"), make_text_engine(c, "teacher")
    assert isinstance(judge, SampledTextEngine) and judge.k == 5 and judge.name == teacher.name
    assert not isinstance(teacher, SampledTextEngine)


def test_more_samples_redo_only_the_judges_stages():
    # (one sample hashes as before the setting existed: tests/test_config.py, fields added later)
    import flywheel.config as config

    more = Config.model_validate({"judge": {"samples": 4, "generation": {"temperature": 0.7}}})
    # (temperature alone would change the same stages: compare with a one-sample config at that temperature)
    one = Config.model_validate({"judge": {"generation": {"temperature": 0.7}}})
    changed = {s for s in config.STAGE_SECTIONS if more.stage_hash(s) != one.stage_hash(s)}
    assert changed == {"judgments-judge", "meta-eval-judge", "downstream-judge"}


class RatesEachChoice(ChatServer):
    """An OpenAI-style server (what Serve or an API is to the HTTP engine) rating choice i of a request i + 1."""

    def __init__(self):
        super().__init__()
        self.bodies = []

    async def handle(self, request):
        from aiohttp import web

        body = await request.json()
        self.bodies.append(body)
        answer = completion(body["model"], "")
        answer["choices"] = [{**answer["choices"][0], "index": i,
                              "message": {"role": "assistant", "content": f"Analysis: choice {i}.\nRating: {i + 1}"}}
                             for i in range(body.get("n", 1))]
        return web.json_response(answer)


def test_a_judge_behind_http_is_asked_each_items_samples_in_one_request(cfg):
    """The loop's preference labels reach the served judge over HTTP: with judge.samples each candidate is one
    request asking for n choices (Serve draws them in one batch), and its row is rated by their mean."""
    prompt = {"prompt_id": "pr_1", "task": "iu", "subtask": "iu_color", "query": "What colour is it?", "images": [],
              "reference": None, "meta": None}
    cands = [{"candidate_id": f"ca_{i}", "prompt_id": "pr_1", "producer": "p", "sample_index": i,
              "output_text": text, "output_images": [], "meta": None} for i, text in enumerate(["Red.", "Blue."])]
    with RatesEachChoice() as server:
        c = load_config(None, [f"run.workdir={cfg.run.workdir}", "judge.engine=http",
                               f"judge.http.base_url=http://127.0.0.1:{server.port}/v1", "judge.samples=4",
                               "judge.generation.temperature=0.7", "judgments.samples_per_item=1",
                               "judgments.protocols={iu: [pointwise]}"])
        rows = JudgmentsCore(c, cands, role="judge")([prompt]).rows
    assert [b["n"] for b in server.bodies] == [4, 4]  # one request per candidate, not four
    assert [r["score"] for r in rows] == [pytest.approx(2.5)] * 2  # the mean of ratings 1-4
    assert rows[0]["parsed"]["sample_scores"] == [1, 2, 3, 4] and rows[0]["raw_output"].endswith("Rating: 1")
