"""`flywheel report`: the iterations of a real MLflow store, read back from their summaries - the judge beside
its teacher, the policies before and after, promotions and time; a killed iteration shows its status alone."""

import json
import logging
import math
import re

import mlflow
import pytest
from typer.testing import CliRunner

from flywheel.cli import app
from flywheel.config import load_config
from flywheel.gate import Decision
from flywheel.iteration import IterationResult, _summarize
from flywheel.iteration_summary import describe
from flywheel.report import iteration_rows, row_of
from flywheel.track import Tracker


def _decision(model: str, promoted: bool, reason: str = "r") -> dict:
    return Decision(model=model, challenger=f"models:/{model}/2", champion=None, metric="m", challenger_value=0.8,
                    champion_value=0.6, margin=0.0, promoted=promoted, reason=reason).to_dict()


def _meta(ranking: float) -> dict:
    return {"id-test": {"all/pointwise_ranking/accuracy": ranking, "all/pointwise_ranking/n": 100,
                        "all/pairwise/accuracy": 0.3, "all/pairwise/n": 0, "all/pointwise/pearson": 0.5,
                        "subtask/iu_caption/pointwise_ranking/accuracy": ranking - 0.2,
                        "subtask/iu_caption/pointwise_ranking/n": 30, "subtask/iu_caption/pairwise/accuracy": 0.1,
                        "subtask/iu_caption/pairwise/position_bias_rate": 0.85,
                        "subtask/iu_count/pointwise_ranking/accuracy": 1.0},
            "ood-test": {"all/pointwise_ranking/accuracy": ranking + 0.1,
                         "subtask/ig_relation/pointwise_ranking/accuracy": ranking - 0.1}}


VS = {"metric": "all/pointwise_ranking/accuracy"}


def _iteration(tracker: Tracker, n: int, ranking: float | None, promoted: bool = False) -> str:
    with tracker.iteration(n) as parent:
        with tracker.stage("prompts"):
            pass
        if ranking is not None:  # None: killed before its summary
            res = IterationResult(n, parent.info.run_id, seconds={"prompts": 1.5, "judge-sft": 300.0}, cpus=2,
                                  load={"prompts": 2.0, "judge-sft": 4.6 if n == 0 else 2.2})  # 0: a shared box
            res.meta_eval = {"challenger": _meta(ranking), "teacher": _meta(0.95)}
            if n == 1:  # iteration 0's summary is as one written before the judge was compared with its teacher
                res.vs_teacher = {"id-test": {**VS, "pairs": 202, "better": 15, "worse": 13, "p": 0.425},
                                  "ood-test": {**VS, "unavailable": "cannot read the meta-eval at x"}}
            res.downstream = {"policy": {"before": {"accuracy": 0.43}, "after": {"accuracy": 0.48}},
                              "generator": {"before": {"score10": 4.4}, "after": {"score10": 4.38}}}
            # two LLaVA methods: one refused by its training, the other gated (and kept out)
            res.decisions = [_decision("judge", promoted), _decision("policy-llava", False, "refused by its training"),
                             _decision("policy-llava", False),
                             _decision("policy-sdxl", False, "refused by its training")]
            if n == 0:  # only refused updates: nothing was evaluated downstream; the SDXL's waits for pairs
                res.downstream = {}
                res.decisions = res.decisions[:2]
                res.counts = {"generator_pool_pairs": 80, "generator_pool_needs": 300, "generator_waits": 1,
                              "policy_pool_pairs": 310, "policy_pool_needs": 300}
            _summarize(res)
    return parent.info.run_id


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    wd = tmp_path_factory.mktemp("report") / "wd"
    tracker = Tracker(load_config(None, [f"run.workdir={wd}", "run.name=report-test"]))
    _iteration(tracker, 0, 0.63, promoted=True)
    _iteration(tracker, 1, 0.70)  # an earlier run of iteration 1 ...
    _iteration(tracker, 1, 0.73, promoted=True)  # ... and the one that counts
    _iteration(tracker, 2, None)
    mlflow.set_tracking_uri(None)
    return wd


def test_rows_come_from_each_iterations_latest_run(workdir):
    rows = iteration_rows(load_config(None, [f"run.workdir={workdir}", "run.name=report-test"]))
    assert [r.iteration for r in rows] == [0, 1, 2]
    assert rows[1].judge == {"id/ranking": 0.73, "id/pairwise": 0.3, "id/pearson": 0.5,
                             "ood/ranking": pytest.approx(0.83)}
    assert rows[1].teacher["id/ranking"] == 0.95
    assert rows[1].vs_teacher["id-test"] == {**VS, "pairs": 202, "better": 15, "worse": 13, "p": 0.425}
    assert rows[0].vs_teacher == {}
    assert rows[1].subtasks == {"id/iu_caption": pytest.approx(0.53), "id/iu_count": 1.0,
                                "ood/ig_relation": pytest.approx(0.63)}
    assert rows[1].teacher_subtasks["id/iu_caption"] == pytest.approx(0.75)
    assert rows[1].subtask_pairwise == {"id/iu_caption": 0.1} and rows[1].teacher_subtask_pairwise == {
        "id/iu_caption": 0.1}
    assert rows[1].subtask_position_bias == {"id/iu_caption": 0.85}
    assert rows[1].downstream == {"policy": {"before": 0.43, "after": 0.48},
                                  "generator": {"before": 4.4, "after": 4.38}}
    assert rows[1].outcome == {"judge": "promoted", "policy-llava": "kept", "policy-sdxl": "refused"}
    assert rows[1].seconds == 301.5
    assert rows[0].outcome == {"judge": "promoted", "policy-llava": "refused"} and rows[0].downstream == {}
    assert rows[0].waiting == {"generator": [80, 300]} and rows[1].waiting == {}
    assert rows[2].status == "FINISHED" and rows[2].judge == {} and math.isnan(rows[2].seconds)
    assert rows[0].busy == "machine busy: load 4.6 on 2 CPUs during judge-sft" and rows[1].busy == rows[2].busy == ""


def test_cli_prints_a_table_and_json_lines(workdir):
    args = ["report", "-c", "configs/local.yaml", f"run.workdir={workdir}", "run.name=report-test"]
    out = CliRunner().invoke(app, args, terminal_width=250)
    assert out.exit_code == 0, out.output
    ranking, pairwise = out.output.split("pairwise accuracy per sub-task")
    # a measure per row, an iteration per column (0, 1, 2) and the teacher's last
    table = {line.split("│")[1].strip(): [c.strip() for c in line.split("│")[2:-1]]
             for line in ranking.splitlines() if line[:1] == "│"}
    # 73 of 100 gold pairs: Wilson's 95% interval is [0.636, 0.807], shown by its larger side
    assert table["id ranking"] == ["0.630±0.10", "0.730±0.09", "—", "0.950"]
    assert table["ood ranking"][1] == "0.830" and table["LLaVA accuracy"][1] == "0.430 → 0.480"
    assert table["status"] == ["FINISHED", "FINISHED", "FINISHED", "(noisy)"]
    assert "Wilson interval" in out.output
    assert table["SDXL score10"][1] == "4.400 → 4.380" and table["promoted"][:2] == ["judge", "judge"]
    assert "Downloading" not in out.output
    # the judge against its teacher pair by pair: iteration 1's counts, none recorded in iteration 0's summary
    assert table["id vs teacher"] == ["—", "15/13 p=0.42", "—", ""]
    assert table["ood vs teacher"][1] == "not compared"
    text = " ".join(out.output.split())
    assert "the judge against its noisy teacher gold pair by gold pair (all/pointwise_ranking/accuracy)" in text
    assert table["LLaVA accuracy"][0] == "refused"  # the LLaVA's training refused its update in iteration 0 ...
    assert table["SDXL score10"][0] == "pairs 80/300"  # ... the SDXL's waits for more pooled pairs
    assert table["seconds"] == ["302*", "302", "—", ""]  # iteration 0's times were taken on a busy machine
    assert "* iteration 0: machine busy: load 4.6 on 2 CPUs during judge-sft" in out.output
    assert "Earlier iterations" not in out.output
    # the sub-task table: a row per sub-task (id first), a column per iteration, the teacher's last
    assert "ranking accuracy per sub-task" in out.output
    assert table["id/iu_caption"] == ["0.430", "0.530", "—", "0.750"]
    assert table["ood/ig_relation"] == ["0.530", "0.630", "—", "0.850"]
    assert out.output.index("id/iu_count") < out.output.index("ood/ig_relation")
    # then the pairwise protocol's, with the share of verdicts that flip under the swap
    row = next(line for line in pairwise.splitlines() if "id/iu_caption" in line)
    assert [c for c in row.split() if c != "│"][1:] == ["0.100", "(0.85)", "0.100", "(0.85)", "—", "0.100"]
    assert "id/iu_count" not in pairwise  # no pairwise metrics for it
    lines = CliRunner().invoke(app, [*args, "--json", "--last", "1"]).output.splitlines()
    assert [json.loads(x)["iteration"] for x in lines] == [0, 1, 2]  # --json gives every iteration
    # no interval without the pairs' count (the pairwise n is 0, the ood split gives none)
    assert json.loads(lines[1])["judge_interval"] == {"id/ranking": pytest.approx([0.6357, 0.8073], abs=1e-4)}


def test_last_shows_the_latest_iterations_and_says_so(workdir):
    args = ["report", "-c", "configs/local.yaml", f"run.workdir={workdir}", "run.name=report-test", "--last", "2"]
    out = CliRunner().invoke(app, args)
    assert out.exit_code == 0, out.output
    header = next(line for line in out.output.splitlines() if "iteration" in line and line[:1] == "┃")
    assert [c.strip() for c in header.split("┃")[2:-1]] == ["1", "2", "teacher"]
    assert "the latest 2 of 3 iterations" in out.output and "Earlier iterations: --last 3" in out.output
    assert "* iteration 0" not in out.output  # iteration 0's notes go with its column
    assert CliRunner().invoke(app, [*args[:-1], "0"]).exit_code == 2


def test_a_running_iteration_names_its_latest_stage(tmp_path):
    cfg = load_config(None, [f"run.workdir={tmp_path}", "run.name=report-running"])
    tracker = Tracker(cfg)
    with tracker.iteration(0):
        with tracker.stage("prompts"):
            pass
        with tracker.stage("labels"):
            running = iteration_rows(cfg)[0]
            out = CliRunner().invoke(app, ["report", f"run.workdir={tmp_path}", "run.name=report-running"])
    mlflow.set_tracking_uri(None)
    assert running.status == "RUNNING" and re.fullmatch(r"labels since \d{4}-\d\d-\d\d \d\d:\d\d UTC", running.at_stage)
    assert f"iteration 0 is at stage {running.at_stage}" in out.output
    assert iteration_rows(cfg)[0].at_stage == ""  # finished


def test_an_empty_store_says_so_and_fails(tmp_path):
    out = CliRunner().invoke(app, ["report", f"run.workdir={tmp_path}", "run.name=nothing-here"])
    assert out.exit_code == 1 and "no iterations" in out.output
    out = CliRunner().invoke(app, ["report", "--json", f"run.workdir={tmp_path}", "run.name=nothing-here"])
    assert out.exit_code == 1 and "no iterations" in out.output
    assert not (tmp_path / "mlflow.db").exists()  # reading a workdir never run does not create its store


def test_a_tracking_server_that_does_not_answer_is_named_in_one_line(tmp_path, caplog):
    out = CliRunner().invoke(app, ["report", f"run.workdir={tmp_path}", "tracking.uri=http://127.0.0.1:1"])
    assert out.exit_code == 1
    assert "stopped: ConnectionError: the MLflow tracking server http://127.0.0.1:1 (tracking.uri) does not answer" \
        in out.output
    # a read-only command's environment failure: the one line, its traceback only at DEBUG
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR and r.exc_info]


def test_a_summary_without_downstream_or_teacher_gives_what_it_has():
    row = row_of(3, "r", "FINISHED", {"meta_eval": {"challenger": _meta(0.5)}, "seconds": {"a": 2.0},
                                      "decisions": [_decision("judge", False)]})
    assert row.judge["id/ranking"] == 0.5 and row.teacher == {} and row.downstream == {}
    assert row.outcome == {"judge": "kept"} and row.seconds == 2.0


def test_an_unreadable_summary_is_named_and_the_other_iterations_still_show(tmp_path):
    cfg = load_config(None, [f"run.workdir={tmp_path}", "run.name=report-broken"])
    tracker = Tracker(cfg)
    _iteration(tracker, 0, 0.63)
    with tracker.iteration(1):
        mlflow.log_text("{not json", "summary/summary.json")
    mlflow.set_tracking_uri(None)
    rows = iteration_rows(cfg)
    assert rows[0].judge["id/ranking"] == 0.63 and rows[0].problem == ""
    assert rows[1].judge == {} and rows[1].problem.startswith("summary/summary.json is not JSON")
    out = CliRunner().invoke(app, ["report", f"run.workdir={tmp_path}", "run.name=report-broken"],
                             terminal_width=250)
    assert out.exit_code == 0 and "iteration 1" in out.output and "not JSON" in out.output


def test_a_stopped_iteration_says_where_and_why(tmp_path):
    cfg = load_config(None, [f"run.workdir={tmp_path}", "run.name=report-stopped"])
    tracker = Tracker(cfg)
    _iteration(tracker, 0, 0.63)
    with pytest.raises(ConnectionError), tracker.iteration(1), tracker.stage("labels"):
        raise ConnectionError("teacher endpoint unreachable")
    mlflow.set_tracking_uri(None)
    rows = iteration_rows(cfg)
    assert rows[0].problem == "" and rows[1].status == "FAILED"
    assert rows[1].problem == ("stopped at stage labels: ConnectionError: teacher endpoint unreachable; the same "
                               "command again resumes it")


def test_the_iteration_description_names_the_sub_tasks_worst_first():
    summary = {"iteration": 3, "decisions": [], "downstream": {}, "seconds": {}, "counts": {},
               "meta_eval": {"challenger": _meta(0.73), "teacher": _meta(0.95)}}
    lines = [line for line in describe(summary).splitlines() if "per sub-task" in line]
    assert lines == ["*Ranking accuracy per sub-task, id-test:* iu_caption 0.530, iu_count 1.000",
                     "*Ranking accuracy per sub-task, ood-test:* ig_relation 0.630"]  # the challenger's only
    assert "noisy teacher*" not in describe(summary)  # a summary from before the comparison
    summary["vs_teacher"] = {"id-test": {**VS, "pairs": 202, "better": 15, "worse": 13, "p": 0.425}}
    assert ("*The judge vs its noisy teacher* (all/pointwise_ranking/accuracy, gold pair by gold pair): id-test: 15 "
            "pairs only the judge gets right, 13 only the teacher (of 202; one-sided McNemar p=0.42)"
            in describe(summary).splitlines())


def test_the_iteration_description_says_what_the_next_judge_trains_from():
    kept_out = {"model": "judge", "promoted": False, "reason": "0.80 ≤ champion 0.84: champion stays",
                "next_start": {"start": "models:/judge/20", "reason": "p=0.17 ≥ alpha 0.05: within noise"}}
    summary = {"iteration": 9, "decisions": [kept_out, {"model": "policy", "promoted": False, "reason": "refused"}],
               "downstream": {}, "seconds": {}, "counts": {}, "meta_eval": {}}
    lines = describe(summary).splitlines()
    assert lines[3:6] == ["- judge: kept champion — 0.80 ≤ champion 0.84: champion stays",
                          "- policy: kept champion — refused",
                          "- judge's next training starts from models:/judge/20 — p=0.17 ≥ alpha 0.05: within noise"]


def test_the_iteration_description_shows_each_stages_load_and_flags_a_busy_machine():
    summary = {"iteration": 3, "decisions": [], "downstream": {}, "counts": {}, "meta_eval": {},
               "seconds": {"labels": 40.0, "judge-sft": 846.0}, "load": {"labels": 2.1, "judge-sft": 4.3}, "cpus": 2}
    text = describe(summary)
    assert "| judge-sft | 846.0 | 4.3 |" in text and "| labels | 40.0 | 2.1 |" in text and "(2 CPUs)" in text
    assert "*Times inflated: machine busy: load 4.3 on 2 CPUs during judge-sft.*" in text
    summary["load"]["judge-sft"] = 2.4
    assert "inflated" not in describe(summary)
    del summary["load"], summary["cpus"]  # a summary written before the load was kept
    assert "| judge-sft | 846.0 | — |" in describe(summary)


def test_the_iteration_description_says_which_update_waits_for_pairs_and_what_a_pool_trained_on():
    summary = {"iteration": 7, "decisions": [], "downstream": {}, "seconds": {}, "meta_eval": {}, "counts": {},
               "pools": {"policy": {"pairs": 310, "needs": 300, "iterations": [4, 5, 6, 7]},
                         "generator": {"pairs": 234, "needs": 300, "iterations": [5, 6, 7]}}}
    lines = describe(summary).splitlines()
    assert lines[3:6] == ["- generator: not trained — its update waits for 300 pairs; 234 pooled from iterations 5-7",
                          "- policy's update trained on 310 pairs pooled from iterations 4-7", ""]
    summary["pools"] = {"policy": {"pairs": 70, "needs": 0, "iterations": [0]}}  # no pool: nothing to say
    assert describe(summary).splitlines()[3:5] == ["- none (no model reached a gate)", ""]


def test_the_iteration_description_shows_the_oracles_check_of_a_judge_gated_update():
    judged = {"before": {"accuracy": 0.55, "judge/pointwise/score": 3.1},
              "after": {"accuracy": 0.64, "judge/pointwise/score": 3.6},
              "oracle_check": {"metric": "accuracy", "before": 0.55, "after": 0.64, "test": "McNemar", "better": 14.0,
                               "worse": 3.0, "p": 0.0064, "auc": 0.71}}
    summary = {"iteration": 4, "decisions": [], "downstream": {"policy": judged, "generator": {
        "before": {"score10": 5.2}, "after": {"score10": 5.3}}}, "seconds": {}, "counts": {}, "meta_eval": {}}
    lines = describe(summary).splitlines()
    assert ("**policy** (judge/… by the serving judge, the rest by the oracle), before → after: accuracy 0.550 → "
            "0.640, judge/pointwise/score 3.100 → 3.600") in lines
    assert ("*The oracle's check of this judge-gated update:* accuracy 0.550 → 0.640; its McNemar: 14 better, "
            "3 worse, p=0.0064; the judge's ratings vs the oracle's per answer: ROC AUC 0.710") in lines
    assert "**generator** (oracle), before → after: score10 5.200 → 5.300" in lines


def test_claim_checks_scored_against_gold_show_in_the_row_and_the_description():
    meta = _meta(0.8)
    meta["id-test"] |= {"all/claims/exact": 0.74, "all/claims/n": 219, "all/claims/parse_failure_rate": 0.0}
    summary = {"iteration": 4, "decisions": [], "downstream": {}, "seconds": {}, "counts": {},
               "meta_eval": {"challenger": meta}}
    assert row_of(4, "r", "FINISHED", summary).judge["id/claims"] == 0.74
    assert "*Claim checks, id-test:* gold's verdict on 0.740 of 219 claims, unparsed 0.000" in describe(summary)
    # without gold claim checks: no claims column, no line
    plain = {**summary, "meta_eval": {"challenger": _meta(0.8)}}
    assert "id/claims" not in row_of(4, "r", "FINISHED", plain).judge and "Claim checks" not in describe(plain)


def test_the_iteration_description_names_the_datasets_with_quarantined_rows_and_where_to_see_why():
    summary = {"iteration": 2, "decisions": [], "downstream": {}, "seconds": {}, "meta_eval": {},
               "counts": {"labels": 40}, "quarantined": {"candidates": 1, "labels": 3}}
    assert describe(summary).splitlines()[-1] == (
        "**Quarantined rows** (why, grouped: the stage's `quarantine/<dataset>.json`, or `flywheel data --iteration 2 "
        "--dataset <name>`): candidates 1, labels 3")
    del summary["quarantined"]  # none (or a summary written before they were counted)
    assert "Quarantined" not in describe(summary)


def test_an_iteration_judged_on_other_gold_is_marked_and_its_own_teacher_printed():
    from rich.console import Console

    from flywheel.report_view import print_report

    def summary(ranking: float, teacher: float) -> dict:
        return {"meta_eval": {"challenger": _meta(ranking), "teacher": _meta(teacher)}}

    # the gold set grew before iteration 1: its teacher scores 0.836 where iteration 0's scored 0.816
    rows = [row_of(0, "r0", "FINISHED", summary(0.891, 0.816)), row_of(1, "r1", "FINISHED", summary(0.921, 0.836))]
    console = Console(record=True, width=250)
    print_report(console, rows, "x", {"policy": "p", "generator": "g"}, shown_of=2)
    text = console.export_text()
    line = next(x for x in text.splitlines() if x.startswith("│ id ranking"))
    assert [c.strip() for c in line.split("│")[2:-1]] == ["0.891±0.08†", "0.921±0.07", "0.836"]
    assert ("† iteration 0 was judged on other gold than the teacher column's (the gold set changed since); its "
            "teacher there: id ranking 0.816, id pairwise 0.300, id pearson 0.500, ood ranking 0.916") in text
    assert "† iteration 1" not in text
    line = next(x for x in text.splitlines() if x.startswith("│ id/iu_caption"))  # the sub-task tables too
    assert [c.strip() for c in line.split("│")[2:-1]] == ["0.691†", "0.721", "0.636"]
    # one gold set throughout: no mark, no note
    console = Console(record=True, width=250)
    print_report(console, [rows[1]], "x", {"policy": "p", "generator": "g"}, shown_of=1)
    assert "†" not in console.export_text()


def test_a_fresh_workdirs_base_build_is_timed_apart_from_its_iteration():
    from rich.console import Console

    from flywheel.report_view import print_report

    # iteration 0 built the bases (stage models, ~1 h here); iteration 1 found them built (a skip, 0.3 s)
    rows = [row_of(n, f"r{n}", "FINISHED", {"seconds": {"models": base, "judge-sft": 1434.4, "labels": 106.0}})
            for n, base in ((0, 4091.3), (1, 0.3))]
    assert rows[0].seconds == pytest.approx(1540.4) and rows[0].base_seconds == pytest.approx(4091.3)
    console = Console(record=True, width=250)
    print_report(console, rows, "x", {"policy": "p", "generator": "g"}, shown_of=2)
    table = {line.split("│")[1].strip(): [c.strip() for c in line.split("│")[2:-1]]
             for line in console.export_text().splitlines() if line[:1] == "│"}
    assert table["seconds"] == ["1540", "1540", ""] and table["+ base build s"] == ["4091", "", ""]
    # no iteration built its bases in the window shown: no such row
    console = Console(record=True, width=250)
    print_report(console, rows[1:], "x", {"policy": "p", "generator": "g"}, shown_of=2)
    assert "base build" not in console.export_text()
