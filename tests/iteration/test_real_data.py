"""An iteration on prompts without ground truth, as a user with real data runs it: no oracle-world prompt
(`prompts.oracle_world: false`), the user's prompt file for the judge's data and the policies' preference data
(`preferences.sources`: train prompts drawn each iteration, id-test prompts held out), a teacher behind an
OpenAI-compatible endpoint, human-labelled gold (`meta_eval.gold_files`), a judge that learns the teacher's format
and ranks the policy's samples into DPO pairs, a LLaVA update probed during training on held-out prompts of the
user's (`heldout.prompts_file`, rated by the champion judge) and gated by the judge's ratings of its answers to the
file's id-test prompts. Every stage runs and nothing is taken from the oracle world.

No remote API is reachable from these machines: a local chat-completions server stands in for the teacher (it
rates a response by its length, so ratings differ; tests/chat_server.py). The models are the tiny random zoo."""

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
from chat_server import ChatServer, completion
from labeled_sets import pair, png_b64, point, write_jsonl
from mlflow import MlflowClient

from flywheel.config import REPO_ROOT, load_config
from flywheel.datasets import read_dataset
from flywheel.evaluate.downstream import evaluate_generator_ref, evaluate_policy_ref
from flywheel.iteration import paths
from tiny_iteration import TINY

pytestmark = pytest.mark.slow


class Teacher(ChatServer):
    """Rates a response 1-5 by its length and prefers the longer of two: a teacher whose labels differ."""

    def __init__(self):
        super().__init__()
        self.asked = 0

    async def handle(self, request):
        from aiohttp import web

        body = await request.json()
        self.asked += 1
        text = "".join(p.get("text", "") for p in body["messages"][-1]["content"]) if isinstance(
            body["messages"][-1]["content"], list) else body["messages"][-1]["content"]
        if "###Response A###" in text:
            a = text.split("###Response A###", 1)[1].split("###Response B###", 1)[0]
            b = text.split("###Response B###", 1)[1].split("###Your Evaluation###", 1)[0]
            answer = f"Analysis: compared.\nVerdict: {'A' if len(a) >= len(b) else 'B'}"
        else:
            instance = text.rsplit("###Task Instance###", 1)[-1]
            answer = f"Analysis: rated.\nRating: {1 + len(instance) % 5}"
        return web.json_response(completion(body["model"], answer))


def _write_data(root: Path) -> tuple[Path, Path]:
    colours = ["red", "blue", "green", "yellow", "white", "black", "orange", "purple"]
    rows = [{"task": "iu", "subtask": "vqa", "query": f"What colour is picture {i}?", "images": [png_b64(c)],
             "split": "id-test" if i >= 6 else "train"} for i, c in enumerate(colours)]
    rows += [{"task": "ig", "subtask": "text_to_image", "query": f"Draw a {c} square.", "images": [],
              "split": "id-test" if i >= 4 else "train"} for i, c in enumerate(colours[:6])]
    rows.append({"task": "speech", "subtask": "vqa", "query": "Say it.", "images": []})  # refused: no such task
    q = {"task": "iu", "subtask": "vqa", "query": "What colour is this?", "images": [png_b64("red")]}
    held = [{"task": "iu", "subtask": "vqa", "query": f"Which colour is shape {i}?", "images": [png_b64(c)]}
            for i, c in enumerate(colours[:3])]
    write_jsonl(root / "heldout-prompts.jsonl", held)  # the LLaVA's probe: in no preference file
    return write_jsonl(root / "prompts.jsonl", rows), write_jsonl(
        root / "gold.jsonl", [point(q, "Red.", 5), point(q, "Blue.", 1), pair(q, "It is red.", "Green.", "A")])


def test_an_iteration_on_user_prompts_takes_nothing_from_the_oracle_world(tmp_path):
    prompts_file, gold_file = _write_data(tmp_path)
    work = tmp_path / "work"
    source = f"[{{type: jsonl, path: {prompts_file}}}]"
    with Teacher() as teacher:
        run = [*TINY, f"run.workdir={work}", "prompts.oracle_world=false", f"prompts.sources={source}",
               f"preferences.sources={source}", "preferences.subtasks=[vqa, text_to_image]",
               "preferences.prompts_per_subtask=2", "gate.eval_items=10",
               "teacher.engine=http", f"teacher.http.base_url=http://127.0.0.1:{teacher.port}/v1",
               "teacher.http.model=teacher", "judge.prompt_style=minos", "world.gold.splits=[id-test]",
               f"meta_eval.gold_files={{id-test: {gold_file}}}",
               "gate.policy_metric=judge/pointwise/score", "gate.generator_metric=judge/pointwise/score",
               "train.diffusion_dpo.heldout=null", "train.judge_dpo.heldout=null",
               # the LLaVA's probe: its answers to held-out prompts of the user's, rated by the champion judge
               "train.policy_dpo.heldout={every_steps: 1, items: 2, target: judge/pointwise/score, judge: champion, "
               f"prompts_file: {tmp_path / 'heldout-prompts.jsonl'}, max_drop: {{}}, max_rise: {{}}, min_steps: 0}}",
               # enough SFT for the tiny judge to answer in the teacher's format (40 steps did not; 150 left a
               # probe's ratings unparsed in one run of three), so that its ratings parse and rank the policy's
               # samples; it ranks no gold pair: promote it anyway
               "train.judge_sft.max_steps=300", "train.judge_sft.lr=3e-3", "train.judge_sft.batch_size=8",
               "curate.policy_pairs.min_margin=0",  # the random policy's samples are rated alike: any gap pairs
               "gate.judge_test=none", "gate.judge_margin=-1"]
        log = tmp_path / "run.log"
        with open(log, "w") as out:
            proc = subprocess.run([sys.executable, str(REPO_ROOT / "jobs" / "iteration.py"), *run], stdout=out,
                                  stderr=subprocess.STDOUT, timeout=1500)
        assert proc.returncode == 0, log.read_text()[-4000:]
        assert teacher.asked > 0

    cfg = load_config(REPO_ROOT / "configs" / "local.yaml", run)
    p = paths(cfg, 0)
    rows = read_dataset(p["prompts"], "prompt")[0].to_pylist()
    assert len(rows) == 14 and {r["source"] for r in rows} == {"prompts.jsonl"}  # the file's, no oracle prompt
    labels = read_dataset(p["labels"], "judgment")[0].to_pylist()
    assert labels and {r["judge"] for r in labels} == {f"http:http://127.0.0.1:{teacher.port}/v1#teacher@teacher"}
    gold = read_dataset(str(Path(p["gold"]) / "id-test" / "judgments"), "judgment")[0].to_pylist()
    assert {g["judge"] for g in gold} == {"labeled:gold.jsonl"}
    # the preference prompts are the file's train prompts, two per sub-task
    pref = read_dataset(p["pref-prompts"], "prompt")[0].to_pylist()
    assert sorted(r["subtask"] for r in pref) == ["text_to_image"] * 2 + ["vqa"] * 2
    assert {r["split"] for r in pref} == {"train"}

    summary = _summary(cfg)
    assert summary["quarantined"]["prompts"] == 1  # the unknown task, named in the summary
    assert summary["meta_eval"]["challenger"]["id-test"]["all/pointwise/n"] == 2  # the labels, not the oracle's

    # the served judge ranked the LLaVA's samples of the file's prompts into pairs, and the LLaVA trained on them
    pairs = read_dataset(f"{p['pref-curated']}/pairs", "pair")[0].to_pylist()
    prompt_ids = {r["prompt_id"] for r in pref}
    assert pairs and {r["prompt_id"] for r in pairs} <= prompt_ids
    assert {r["judge"] for r in pairs} == {"http#judge@models:/judge/1"}  # the served champion
    client = MlflowClient(tracking_uri=cfg.tracking.uri)
    exp = client.get_experiment_by_name(cfg.experiment).experiment_id
    (trained,) = client.search_runs([exp], "metrics.`heldout.items` > 0")
    assert trained.data.tags["flywheel.model_version"] == "models:/policy-llava/1"
    # probed at every step on the held-out prompts: the judge's ratings (the target), nothing the oracle scores
    history = client.get_metric_history(trained.info.run_id, "heldout.judge/pointwise/score")
    failed = {m.step: m.value for m in client.get_metric_history(trained.info.run_id,
                                                                 "heldout.judge/pointwise/parse_failure_rate")}
    assert [m.step for m in history] == [0, 1, 2] and any(1 <= m.value <= 5 for m in history)
    assert all(1 <= m.value <= 5 or math.isnan(m.value) and failed[m.step] == 1.0 for m in history)  # never imputed
    assert trained.data.metrics["heldout.items"] == 2 and "heldout.accuracy" not in trained.data.metrics
    # the update is judged by the judge alone: refused by its probe (two steps rarely move the rating), or gated
    # on the judge's ratings of its answers to the file's id-test prompts
    (llava,) = [d for d in summary["decisions"] if d["model"] == "policy-llava"]
    assert llava["metric"] == "judge/pointwise/score"
    assert llava["reason"].startswith("refused by its training: no_gain: no held-out evaluation beat the starting "
                                      "model on judge/pointwise/score") or 1 <= llava["challenger_value"] <= 5

    # The generator's samples were not paired (the judge rates drawings alike): its held-out evaluation, which
    # the gate would run, is run here on the file's id-test prompts, with the random zoo judge
    import ray

    try:
        for evaluate, ref in ((evaluate_policy_ref, "zoo:policy"), (evaluate_generator_ref, "zoo:generator")):
            down = evaluate(cfg, ref, judge="zoo:judge")
            assert down.metrics["items"] == 2  # the file's two id-test prompts of the role
            assert down.metrics["judge/pointwise/parse_failure_rate"] == 1.0  # counted as failures, not scores
            assert len(down.per_item["judge/pointwise/score"]) == 2
            assert not {"accuracy", "score10"} & set(down.metrics)  # nothing the oracle scored
            with pytest.raises(ValueError, match="no ground truth: only the judge can score them"):
                evaluate(cfg, ref)
    finally:
        ray.shutdown()


def _summary(cfg) -> dict:
    client = MlflowClient(tracking_uri=cfg.tracking.uri)
    exp = client.get_experiment_by_name(cfg.experiment)
    parent = [r for r in client.search_runs([exp.experiment_id]) if "mlflow.parentRunId" not in r.data.tags][0]
    path = client.download_artifacts(parent.info.run_id, "summary/summary.json")
    return json.loads(Path(path).read_text())
