"""Gold meta-eval sets: varied outputs per split, labelled by the noiseless oracle, written with manifests."""

from collections import Counter, defaultdict

import pytest

from flywheel.aspects import AspectTree
from flywheel.datasets import read_manifest, read_rows, write_dataset
from flywheel.records import validate, with_ids
from flywheel.stages import gold as gold_stage
from flywheel.stages.gold import build_gold
from flywheel.worlds.shapes.gold import variant_of
from flywheel.worlds.shapes.suites import generate
from flywheel.worlds.shapes.teacher import TEACHER_VERSION


@pytest.fixture(scope="module")
def gcfg(cfg):
    c = cfg.model_copy(deep=True)
    c.world.suites.prompts_per_subtask = 8
    c.world.gold.prompts_per_subtask = 2
    return c


@pytest.fixture(scope="module")
def prompts(gcfg):
    return with_ids("prompt", generate(gcfg.world.suites, gcfg.world.shapes, AspectTree.load(), gcfg.run.seed))


@pytest.fixture(scope="module")
def sets(gcfg, prompts):
    return build_gold(gcfg, prompts)


def test_every_split_has_pointwise_and_pairwise_gold(sets, gcfg):
    assert set(sets) == {"train", "id-test", "ood-test"}
    for split, gs in sets.items():
        assert gs.prompts and all(p["split"] == split for p in gs.prompts)
        assert not gs.quarantined
        valid, bad = validate("judgment", gs.judgments)
        assert not bad
        by = Counter(r["protocol"] for r in gs.judgments)
        assert by["pointwise"] == len(gs.candidates), split  # every output has its gold score
        assert by["pairwise"] > 0 and by["decomposed"] > 0
        assert all(r["parse_error"] is None and r["sample_k"] == 0
                   and r["judge"].startswith(f"oracle:shapes@v{TEACHER_VERSION}-e0-")
                   for r in gs.judgments)
        pairs = [r for r in gs.judgments if r["protocol"] == "pairwise"]
        assert all(r["verdict"] in ("A", "B") for r in pairs)  # ties excluded
        assert len({(r["prompt_id"], tuple(r["candidate_ids"])) for r in pairs}) == len(pairs)  # one order each
        first_wins = sum((r["order"] == "AB") == (r["verdict"] == "A") for r in pairs)
        assert abs(2 * first_wins - len(pairs)) <= 1  # no position bias to reward
    assert {p["subtask"] for p in sets["ood-test"].prompts} == set(gcfg.world.suites.split.ood_subtasks)


def test_outputs_are_deliberately_varied_and_scored_accordingly(sets):
    gs = sets["train"]
    cands = {c["candidate_id"]: c for c in gs.candidates}
    score = {r["candidate_ids"][0]: r["score"] for r in gs.judgments if r["protocol"] == "pointwise"}
    by_prompt = defaultdict(dict)
    for cid, c in cands.items():
        by_prompt[c["prompt_id"]][variant_of(c)] = score[cid]
    task = {p["prompt_id"]: p["task"] for p in gs.prompts}
    variants = Counter(v for vs in by_prompt.values() for v in vs)
    assert {"correct", "verbose", "wrong", "unreadable", "wrong_colour", "wrong_shape", "missing", "noise",
            "extra", "other_scene", "wrong_text"} <= set(variants)
    for pid, vs in by_prompt.items():
        assert vs["correct"] == 5, (task[pid], vs)
        assert min(vs.values()) <= 2, (task[pid], vs)  # something clearly wrong in every prompt's set
        if "verbose" in vs:
            assert vs["verbose"] == 4 and vs["wrong"] == 1  # partly wrong sits between right and wrong
    pw = [r for r in gs.judgments if r["protocol"] == "pairwise"]
    for r in pw[:50]:
        a, b = (score[c] for c in r["candidate_ids"])
        assert a != b and r["verdict"] == ("A" if a > b else "B")


def test_gold_is_deterministic_and_written_with_manifests(gcfg, prompts, sets, tmp_path):
    again = build_gold(gcfg, prompts)
    for split in sets:
        assert [r["raw_output"] for r in again[split].judgments] == [r["raw_output"] for r in sets[split].judgments]
    src = write_dataset(str(tmp_path / "prompts"), "prompt", prompts, config_hash="p", producer="test")
    out = str(tmp_path / "gold")
    ms = gold_stage.run(gcfg, src.path, out)
    for split, parts in ms.items():
        rows = read_rows(f"{out}/{split}/judgments", "judgment")
        assert len(rows) == len(sets[split].judgments) == parts["judgments"].row_count
        assert len(read_rows(f"{out}/{split}/candidates", "candidate")) == len(sets[split].candidates)
        m = read_manifest(f"{out}/{split}/judgments")
        assert m.producer == "gold" and m.upstream[0].content_hash == src.content_hash
    again = gold_stage.run(gcfg, src.path, out)  # up to date: skipped, same manifests
    assert {s: p["judgments"].created_at for s, p in again.items()} == \
        {s: p["judgments"].created_at for s, p in ms.items()}
