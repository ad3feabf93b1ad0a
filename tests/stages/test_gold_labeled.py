"""Gold from human labels (`meta_eval.gold_files`): the gold stage writes a labelled file's items in the gold
layout beside the oracle world's splits, quarantines the file's bad lines with their line numbers, is redone
when the file changes, and meta-eval scores a judge against those labels (labelled pairs ordered by the judge's
own ratings of their outputs)."""

import json
import sys

import pytest
import ray
from labeled_sets import pair, png_b64, point, write_jsonl

from flywheel.config import load_config
from flywheel.datasets import read_dataset, read_manifest, read_quarantine
from flywheel.engines.base import TextEngine, TextResult
from flywheel.evaluate import meta
from flywheel.evaluate.labeled import UNLABELLED
from flywheel.stages import gold, prompts


PROMPT = {"task": "iu", "subtask": "iu_color", "query": "What colour is the circle?", "images": [png_b64()]}
LINES = [point(PROMPT, "Red.", 5), point(PROMPT, "Blue.", 1), point(PROMPT, "A red circle.", 2),
         pair(PROMPT, "A red one.", "Green.", "A"),  # outputs without pointwise labels: its ratings order them
         pair(PROMPT, "Blue.", "Red.", "A"),  # a labeller's choice the judge below disagrees with
         pair(PROMPT, "x", "y", "tie")]


def _write(path, lines) -> None:
    write_jsonl(path, lines, "not json\n")


class PrefersRed(TextEngine):
    """Stands in for a judge model so the metrics are known in advance (no model is needed to test the gold and
    its scoring): rates a response naming red 5 and any other 1, and in a pair prefers A when A names red."""

    name, version = "prefers-red", "1"

    def generate(self, requests, seed=0):
        out = []
        for r in requests:
            content = r.messages[-1]["content"]
            text = content if isinstance(content, str) else " ".join(
                p.get("text", "") for p in content if p.get("type") == "text")
            if text.startswith("Compare A and B"):  # the compact pairwise request: "...\nA: <a>\nB: <b>"
                a = text.split("\nA: ", 1)[1].split("\nB: ", 1)[0]
                out.append(TextResult(text=f"Analysis: compared.\nVerdict: {'A' if 'red' in a.lower() else 'B'}"))
            else:
                response = text.rsplit("What colour is the circle?", 1)[-1]
                out.append(TextResult(text=f"Analysis: rated.\nRating: {5 if 'red' in response.lower() else 1}"))
        return out


@pytest.fixture(scope="module")
def labeled(tmp_path_factory, cfg):
    root = tmp_path_factory.mktemp("labeled-gold")
    _write(root / "labels.jsonl", LINES)
    c = load_config(None, [f"run.workdir={cfg.run.workdir}", "world.suites.prompts_per_subtask=2",
                           "world.gold.prompts_per_subtask=1", "world.gold.max_pairs_per_prompt=1",
                           "world.gold.splits=[id-test, ood-test]", "meta_eval.perturbation.enabled=false",
                           f"meta_eval.gold_files={{id-test: {root / 'labels.jsonl'}}}"])
    prompts.run(c, str(root / "prompts"))
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    ray.init(address="local", num_cpus=2, include_dashboard=False)
    yield c, root
    ray.shutdown()


def _gold(root, split="id-test"):
    table, manifest = read_dataset(str(root / "gold" / split / "judgments"))
    return table.to_pylist(), manifest


def test_a_labelled_split_is_the_files_items_and_its_bad_lines_are_quarantined(labeled):
    c, root = labeled
    gold.run(c, str(root / "prompts"), str(root / "gold"))
    rows, _ = _gold(root)
    assert {r["judge"] for r in rows} == {"labeled:labels.jsonl"}
    by = lambda proto: [r for r in rows if r["protocol"] == proto]  # noqa: E731
    assert sorted(r["score"] for r in by("pointwise") if r["score"] is not None) == [1, 2, 5]
    assert [(r["verdict"], r["order"]) for r in by("pairwise")] == [("A", "AB"), ("A", "AB")]
    unlabelled = [r for r in by("pointwise") if r["score"] is None]
    assert len(unlabelled) == 2 and all(json.loads(r["parsed"]) == {UNLABELLED: True} for r in unlabelled)
    q = read_quarantine(str(root / "gold" / "id-test" / "judgments"))  # each refused line, raw, with its reason
    assert [(i["index"], i["reason"].split(":")[0]) for i in q] == [(6, "line 6"), (7, "line 7")]
    assert "ties are not gold" in q[0]["reason"] and q[1]["raw"] == "not json"
    prompts_rows = read_dataset(str(root / "gold" / "id-test" / "prompts"))[0].to_pylist()
    assert len(prompts_rows) == 1 and prompts_rows[0]["split"] == "id-test"
    assert len(read_dataset(str(root / "gold" / "id-test" / "candidates"))[0]) == 5  # repeated outputs kept once
    ood, _ = _gold(root, "ood-test")  # a split the file does not name keeps the oracle world's gold
    assert ood and all(r["judge"].startswith("oracle:") for r in ood)


def test_meta_eval_scores_the_judge_against_the_labels_and_a_changed_file_redoes_the_gold(labeled):
    c, root = labeled
    gold.run(c, str(root / "prompts"), str(root / "gold"))
    manifest = root / "gold" / "id-test" / "judgments" / "manifest.json"
    before, written = read_manifest(str(manifest.parent)), manifest.stat().st_mtime_ns
    gold.run(c, str(root / "prompts"), str(root / "gold"))  # unchanged: skipped, nothing written
    assert manifest.stat().st_mtime_ns == written

    m = meta.run(c, str(root / "gold"), str(root / "me"), engine_factory=PrefersRed)["id-test"]
    assert m["all/pointwise/n"] == 3  # the unlabelled outputs are rated, not scored
    assert m["all/pointwise/exact"] == pytest.approx(2 / 3)  # "A red circle." labelled 2, rated 5
    assert m["all/pairwise/accuracy"] == 0.5  # it disagrees with the labeller on Blue. vs Red.
    assert m["all/pointwise_ranking/accuracy"] == 0.5  # the first pair ordered by its ratings of unlabelled outputs
    outcomes = meta.stored_outcomes(c, str(root / "gold"), str(root / "me"), "id-test/all/pointwise_ranking/accuracy")
    assert sorted(outcomes.values()) == [False, True]  # the gate's paired test reads the same two pairs

    flipped = [*LINES[:4], {**LINES[4], "winner": "B"}, *LINES[5:]]
    _write(root / "labels.jsonl", flipped)  # edited in place: same path, new contents
    gold.run(c, str(root / "prompts"), str(root / "gold"))
    assert read_manifest(str(root / "gold" / "id-test" / "judgments")).content_hash != before.content_hash
    m = meta.run(c, str(root / "gold"), str(root / "me"), engine_factory=PrefersRed)["id-test"]
    assert m["all/pairwise/accuracy"] == 1.0 and m["all/pointwise_ranking/accuracy"] == 1.0


def test_a_missing_or_empty_gold_file_is_named(tmp_path, cfg):
    c = load_config(None, [f"run.workdir={cfg.run.workdir}", f"meta_eval.gold_files={{id-test: {tmp_path / 'no'}}}"])
    with pytest.raises(FileNotFoundError, match=r"meta_eval.gold_files.id-test: no file at"):
        gold.labeled_gold(c.meta_eval.gold_files["id-test"], "id-test")
    (tmp_path / "bad.jsonl").write_text('{"type": "ranking"}\n')
    with pytest.raises(ValueError, match=r"holds no valid item \(1 refused, e.g. line 1: type must be"):
        gold.labeled_gold(str(tmp_path / "bad.jsonl"), "id-test")
    with pytest.raises(Exception, match="gold_files"):
        load_config(None, ["meta_eval.gold_files={train: x.jsonl}"])  # the gold's train split is not scored


def test_a_split_without_oracle_prompts_or_a_file_is_refused_not_left_empty(tmp_path, cfg):
    c = load_config(None, [f"run.workdir={cfg.run.workdir}", "world.gold.splits=[id-test]"])
    with pytest.raises(ValueError, match=r"gold id-test: no oracle-world prompt .* meta_eval.gold_files.id-test"):
        gold.build_gold(c, [])  # user prompts only (prompts.oracle_world false): the world has no gold to give
