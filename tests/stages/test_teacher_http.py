"""A teacher behind an OpenAI-compatible endpoint (`teacher.engine: http`: GPT-4o, a vLLM server): the judgments
stage labels through it as through the oracle, every answer parsed strictly and each row named by the endpoint.
No remote API is reachable from these machines, so a local aiohttp server stands in for one: it answers every
request with the same text, a judgment or prose."""

from collections import Counter

import pytest
from chat_server import ChatServer, completion

from flywheel.aspects import AspectTree
from flywheel.config import JudgmentsConfig, load_config
from flywheel.engines import make_text_engine
from flywheel.engines.http import HTTPTextEngine
from flywheel.engines.oracle import OracleTextEngine
from flywheel.failures import summary
from flywheel.records import with_ids
from flywheel.stages.judgments import JudgmentsCore
from flywheel.worlds.shapes.gold import gold_candidates
from flywheel.worlds.shapes.oracle_config import TeacherConfig as OracleTeacherConfig
from flywheel.worlds.shapes.suites import SuitesConfig, generate


class Endpoint(ChatServer):
    """Answers `answer` to every request, recording the bodies."""

    def __init__(self, answer: str):
        super().__init__()
        self.answer, self.bodies = answer, []

    async def handle(self, request):
        from aiohttp import web

        body = await request.json()
        self.bodies.append(body)
        return web.json_response(completion(body["model"], self.answer))


def _labelled(tmp_path, answer: str):
    with Endpoint(answer) as api:
        cfg = load_config(None, [f"run.workdir={tmp_path}", "teacher.engine=http", "judge.prompt_style=minos",
                                 f"teacher.http.base_url=http://127.0.0.1:{api.port}/v1", "teacher.http.model=gpt-x",
                                 "teacher.generation.max_new_tokens=512"])
        cfg.judgments = JudgmentsConfig(protocols={"iu": ["pointwise"]}, samples_per_item=1)
        suites = SuitesConfig(prompts_per_subtask=2, subtasks=["iu_color"],
                              split={"ood_subtasks": [], "ood_aspects": []})
        prompts = with_ids("prompt", generate(suites, cfg.world.shapes, AspectTree.load(), seed=3))
        cands = with_ids("candidate", [c for p in prompts
                                       for c in gold_candidates(p, cfg.world.gold, cfg.world.shapes, seed=3)[:2]])
        out = JudgmentsCore(cfg, cands, role="teacher")(prompts)
    return cfg, cands, out, api


def test_an_http_teacher_labels_every_item_and_names_the_endpoint(tmp_path):
    cfg, cands, out, api = _labelled(tmp_path, "Analysis: The answer names the right colour.\nRating: 4")
    assert isinstance(make_text_engine(cfg, "teacher"), HTTPTextEngine)
    assert not out.quarantined and len(out.rows) == len(cands)
    assert all(r["score"] == 4 and r["parse_error"] is None for r in out.rows)
    assert {r["judge"] for r in out.rows} == {f"http:http://127.0.0.1:{api.port}/v1#gpt-x@gpt-x"}
    # the teacher is asked what the judge will be taught: the minos request, with the teacher's own decoding
    assert len(api.bodies) == len(cands) and all(b["model"] == "gpt-x" and b["max_tokens"] == 512
                                                 for b in api.bodies)
    text = "".join(p.get("text", "") for p in api.bodies[0]["messages"][-1]["content"])
    assert text.startswith("Please act as an impartial and helpful evaluator")


def test_an_answer_that_does_not_parse_is_a_parse_failure_never_a_score(tmp_path):
    _, cands, out, _ = _labelled(tmp_path, "I think this answer is quite good.")
    assert len(out.rows) == len(cands)
    assert all(r["score"] is None and r["parse_error"] for r in out.rows)


def test_the_oracles_version_is_its_own_fields_not_the_http_settings_beside_them(tmp_path):
    # judgment ids carry the teacher's version: settings of another backend must not rename the oracle's labels
    a = load_config(None, [f"run.workdir={tmp_path}"]).teacher
    b = load_config(None, [f"run.workdir={tmp_path}", "teacher.http.model=gpt-x"]).teacher
    bare = OracleTeacherConfig(**{k: getattr(a, k) for k in OracleTeacherConfig.model_fields})
    assert OracleTextEngine(a).version == OracleTextEngine(b).version == OracleTextEngine(bare).version
    assert OracleTextEngine(a).version != OracleTextEngine(a.model_copy(update={"error_rate": 0.2})).version


def test_a_teacher_engine_without_a_served_model_is_refused_by_name(tmp_path):
    with pytest.raises(ValueError, match="teacher.engine"):
        load_config(None, [f"run.workdir={tmp_path}", "teacher.engine=hf"])


def _stage_inputs(cfg, tmp_path, prompts_per_subtask: int) -> tuple[str, str, list[dict]]:
    """The labels stage's inputs on storage: colour questions, two gold candidates each."""
    from flywheel.datasets import write_dataset

    suites = SuitesConfig(prompts_per_subtask=prompts_per_subtask, subtasks=["iu_color"],
                          split={"ood_subtasks": [], "ood_aspects": []})
    prompts = with_ids("prompt", generate(suites, cfg.world.shapes, AspectTree.load(), seed=3))
    cands = with_ids("candidate", [c for p in prompts
                                   for c in gold_candidates(p, cfg.world.gold, cfg.world.shapes, seed=3)[:2]])
    pu = write_dataset(str(tmp_path / "prompts"), "prompt", prompts, config_hash="p", producer="test").path
    cu = write_dataset(str(tmp_path / "candidates"), "candidate", cands, config_hash="c", producer="test").path
    return pu, cu, cands


@pytest.fixture(scope="module")
def ray_local():
    import ray

    ray.init(address="local", num_cpus=2, include_dashboard=False)
    yield
    ray.shutdown()


def test_the_teachers_requests_tokens_and_cost_reach_the_stages_run(ray_local, tmp_path):
    # the labelling runs in Ray Data actors, which have no MLflow run of their own: each batch's usage comes back
    # to the stage and is summed there (a paid teacher's bill, per stage)
    from mlflow import MlflowClient

    from flywheel.stages import judgments
    from flywheel.track import Tracker

    with Endpoint("Analysis: The answer names the right colour.\nRating: 4") as api:
        cfg = load_config(None, [f"run.workdir={tmp_path}", "teacher.engine=http",
                                 f"teacher.http.base_url=http://127.0.0.1:{api.port}/v1", "teacher.http.model=gpt-x",
                                 "teacher.http.price_per_1m_prompt_tokens=2.5",
                                 "teacher.http.price_per_1m_completion_tokens=10", "judgments.batch_size=2",
                                 "judgments.samples_per_item=1", "judgments.protocols={iu: [pointwise]}"])
        pu, cu, cands = _stage_inputs(cfg, tmp_path, prompts_per_subtask=3)
        tracker = Tracker(cfg)
        with tracker.iteration(0), tracker.stage("labels") as run:
            res = judgments.run(cfg, pu, cu, str(tmp_path / "labels"), role="teacher", tracker=tracker)
    n = len(cands)
    assert len(api.bodies) == n and res.counters["http.succeeded"] == n  # two batches, summed
    assert res.counters["http.prompt_tokens"] == 10 * n and res.counters["http.completion_tokens"] == 5 * n
    metrics = MlflowClient(tracker.uri).get_run(run.info.run_id).data.metrics
    assert metrics["http.succeeded"] == n
    assert metrics["http.cost"] == pytest.approx(n * (10 * 2.5 + 5 * 10) / 1e6)


def _text(body: dict) -> str:
    return "".join(p.get("text", "") for m in body["messages"] for p in m["content"])


class FailingEndpoint(Endpoint):
    """Answers 503 (an outage) to every request whose text holds `down_for` until it is set to None."""

    def __init__(self, answer: str):
        super().__init__(answer)
        self.down_for: str | None = None

    async def handle(self, request):
        from aiohttp import web

        body = await request.json()
        if self.down_for and self.down_for in _text(body):
            return web.json_response({"error": {"message": "overloaded"}}, status=503)
        self.bodies.append(body)
        return web.json_response(completion(body["model"], self.answer))


def test_a_teacher_outage_stops_the_stage_and_a_resume_asks_only_the_unfinished_batches(ray_local, tmp_path):
    """An endpoint that fails every retry is not a bad item: the stage stops rather than quarantine good items, and
    the next attempt asks only the items of the batches that had not finished (a paid teacher is not asked twice)."""
    from flywheel.datasets import read_quarantine, read_rows
    from flywheel.stages import judgments

    with FailingEndpoint("Analysis: The answer names the right colour.\nRating: 4") as api:
        cfg = load_config(None, [f"run.workdir={tmp_path}", "teacher.engine=http", "judgments.batch_size=2",
                                 f"teacher.http.base_url=http://127.0.0.1:{api.port}/v1", "teacher.http.model=gpt-x",
                                 "teacher.http.max_retries=1", "teacher.http.backoff_initial_s=0.01",
                                 "resources.labeling.actors=1", "judgments.samples_per_item=1",
                                 "judgments.protocols={iu: [pointwise]}"])
        pu, cu, cands = _stage_inputs(cfg, tmp_path, prompts_per_subtask=3)
        out = str(tmp_path / "labels")
        # batches of 2 prompts x 2 candidates: the second (the third prompt's 2 requests) meets the outage. Ray Data
        # may run it first, and the first batch before the stop or not at all: what is kept depends on that order.
        # (the third prompt's reference answer is its own; its query is the first's too)
        api.down_for = f'the reference answer is "{read_rows(pu)[2]["reference_text"]}"'
        with pytest.raises(Exception, match="requests failed after 2 attempts each .*HTTP 503: overloaded.* down or "
                                            "overloaded") as stopped:
            judgments.run(cfg, pu, cu, out, role="teacher")
        # under Ray Data's wrappers, the line the log, the CLI and the stage's MLflow run give
        assert summary(stopped.value).startswith(f"EndpointUnavailable: http://127.0.0.1:{api.port}/v1/chat/")
        answered, down_for = len(api.bodies), api.down_for
        api.down_for = None  # the endpoint is back
        res = judgments.run(cfg, pu, cu, out, role="teacher")
        assert res.batches_kept <= (answered == 4)  # a batch is kept only if all its items were answered
        # Each item's answered requests over both attempts (the outage's 503s are not counted). The stopped attempt's
        # actor may start its queued first batch after the second failed and before Ray Data kills it, so some of
        # that batch's requests can arrive after the stop was seen: counted per item, not per attempt.
        asked = Counter(_text(b) for b in api.bodies)
        second = [k for k in asked if down_for in k]
        first = [k for k in asked if down_for not in k]
        assert len(second) == 2 and all(asked[k] == 1 for k in second)  # asked again once it was back
        assert len(first) == 4
        if res.batches_kept:  # the finished first batch is not asked again
            assert all(asked[k] == 1 for k in first) and len(api.bodies) - answered == 2
        else:  # an unfinished one is asked again, once
            assert all(1 <= asked[k] <= 2 for k in first) and len(api.bodies) - answered >= 6
        clean = judgments.run(cfg, pu, cu, str(tmp_path / "clean"), role="teacher")  # uninterrupted
    assert res.manifest.content_hash == clean.manifest.content_hash and res.manifest.row_count == len(cands)
    assert read_rows(out) == read_rows(str(tmp_path / "clean")) and not read_quarantine(out)


def test_a_cost_cap_stops_the_stage_and_raising_it_goes_on_without_asking_again(ray_local, tmp_path):
    from flywheel.datasets import read_rows
    from flywheel.stages import judgments
    from flywheel.stages.runner import CapReached

    with Endpoint("Analysis: The answer names the right colour.\nRating: 4") as api:
        # 10 prompt tokens a request at 100,000 per million: 1.0 a request, 4.0 a batch of 2 prompts x 2 candidates
        base = [f"run.workdir={tmp_path}", "teacher.engine=http", "judgments.batch_size=2",
                f"teacher.http.base_url=http://127.0.0.1:{api.port}/v1", "teacher.http.model=gpt-x",
                "teacher.http.price_per_1m_prompt_tokens=100000", "resources.labeling.actors=1",
                "judgments.samples_per_item=1", "judgments.protocols={iu: [pointwise]}"]
        cfg = load_config(None, [*base, "teacher.http.max_cost_per_stage=5"])
        pu, cu, cands = _stage_inputs(cfg, tmp_path, prompts_per_subtask=5)
        out = str(tmp_path / "labels")
        with pytest.raises(CapReached, match=r"http.cost 8 passed its cap 5 after 2 of 3 batches"):
            judgments.run(cfg, pu, cu, out, role="teacher")
        asked = len(api.bodies)
        assert asked == 8  # the actor did not start the third batch once the second had passed the cap
        res = judgments.run(load_config(None, [*base, "teacher.http.max_cost_per_stage=20"]), pu, cu, out,
                            role="teacher")
        # the first two batches are kept, the third is asked now: no finished batch's item is asked twice
        assert res.batches_kept == 2 and len(api.bodies) - asked == 2
        assert res.counters["http.cost"] == pytest.approx(10.0)  # the stage's bill: kept batches' and the rest
        clean = judgments.run(load_config(None, base), pu, cu, str(tmp_path / "clean"), role="teacher")
        # passed only at the last batch: nothing is left to save, so the stage finishes
        last = judgments.run(load_config(None, [*base, "teacher.http.max_cost_per_stage=9"]), pu, cu,
                             str(tmp_path / "last"), role="teacher")
    assert read_rows(out) == read_rows(clean.manifest.path) == read_rows(last.manifest.path)
