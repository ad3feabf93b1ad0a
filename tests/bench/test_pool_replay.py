"""bench/pool_replay.py imports the loop's own training and evaluation entry points: a rename there must fail here,
not the first time someone replays a pool (a replay trains for about a minute, too long for this suite)."""

import pytest
from bench_scripts import load_bench


def _exit_code(argv: list[str]) -> str:
    """The script's main, in this process (a subprocess would spend ~14 s importing torch for one argument)."""
    with pytest.raises(SystemExit) as e:
        load_bench("pool_replay").main(argv)
    return str(e.value.code)


def test_the_replay_bench_loads_and_documents_its_options(capsys):
    assert _exit_code(["--help"]) == "0"
    out = capsys.readouterr().out
    assert all(opt in out for opt in ("--pool", "--seeds", "--min-margin", "--oracle", "--base", "--models-from",
                                      "--set", "--subtask", "--perfect", "--sampled", "--eval"))


def test_oracle_ordering_reverses_wrong_pairs_and_drops_ties_and_pairs_it_cannot_decide():
    from flywheel.worlds.shapes.assessment import NoGroundTruth

    bench = load_bench("pool_replay")
    values = {"a": 5.0, "b": 2.0, "c": 3.0, "d": 3.0}

    def value(_row, cid):
        if cid == "x":
            raise NoGroundTruth("no scene")
        return values[cid]

    def pair(chosen, rejected):
        return {"source_ids": [chosen, rejected], "chosen": f"img {chosen}", "rejected": f"img {rejected}",
                "chosen_score": 4.0, "rejected_score": 1.0}

    out, swapped = bench.order_by([pair("a", "b"), pair("b", "a"), pair("c", "d"), pair("a", "x")], value)
    assert swapped == 1
    assert [(r["source_ids"], r["chosen"], r["chosen_score"]) for r in out] == [
        (["a", "b"], "img a", 4.0), (["a", "b"], "img a", 1.0)]  # the reversed pair keeps its judge's scores


def test_perfect_pairs_are_valid_pool_rows_with_the_right_answer_chosen(tmp_path):
    import json

    from flywheel.config import load_config
    from flywheel.datasets import read_rows, write_dataset
    from flywheel.worlds.shapes.policy_eval import check_answer

    bench = load_bench("pool_replay")
    world = load_config().world.shapes
    rows = [*bench.perfect_pairs(world, "iu_existence", 40), *bench.perfect_pairs(world, "iu_count", 10)]
    manifest = write_dataset(str(tmp_path / "pool"), "dpo", rows, config_hash="t", producer="test")
    assert manifest.row_count == 50 and not manifest.quarantined
    said = lambda m: json.loads(m)[0]["content"][0]["text"]  # noqa: E731
    answers = set()
    for r in read_rows(str(tmp_path / "pool")):
        q = json.loads(r["meta"])["question"]
        assert check_answer(q, said(r["chosen"]), None).correct
        assert not check_answer(q, said(r["rejected"]), None).correct
        answers.add(said(r["chosen"]))
    assert {"Yes.", "No."} <= answers  # both existence answers are taught


def test_a_perfect_spec_without_one_right_answer_is_refused_by_name(tmp_path):
    assert "--perfect 'iu_caption:10': expected SUBTASK:N" in _exit_code(["--perfect", "iu_caption:10",
                                                                           "--workdir", str(tmp_path)])


def test_oracle_ranking_finds_a_text_pairs_prompt_through_its_candidates(tmp_path, monkeypatch):
    """A text (dpo) pool row names no prompt, only its two candidates: the oracle must find the prompt through
    them (a KeyError 'prompt_id' before). Datasets and the oracle are stood in for: this checks the look-up."""
    bench = load_bench("pool_replay")
    it = tmp_path / "data" / "iterations" / "000"
    (it / "pref-candidates").mkdir(parents=True)
    stored = {str(it / "pref-prompts"): [{"prompt_id": "p1", "query": "How many?"}],
              str(it / "pref-candidates"): [{"candidate_id": "c1", "prompt_id": "p1", "output_text": "Two."},
                                            {"candidate_id": "c2", "prompt_id": "p1", "output_text": "Three."}]}
    monkeypatch.setattr(bench, "iter_dataset_rows", lambda path: iter(stored[str(path)]))
    seen = []

    def oracle_value(prompt, cand, _world):
        seen.append(prompt["prompt_id"])
        return {"Two.": 0.0, "Three.": 1.0}[cand["output_text"]]

    monkeypatch.setattr(bench, "oracle_value", oracle_value)
    row = {"source_ids": ["c1", "c2"], "chosen": "Two.", "rejected": "Three.", "chosen_score": 4.0,
           "rejected_score": 2.0, "subtask": "iu_count"}
    out = bench.oracle_ranked([row], str(it / "pref-pool" / "dpo"), world=None)
    assert seen == ["p1", "p1"]
    assert [(r["chosen"], r["source_ids"]) for r in out] == [("Three.", ["c2", "c1"])]  # the oracle's order


def test_sampled_pairs_choose_a_right_sample_over_a_wrong_one_per_item(tmp_path, monkeypatch):
    """--sampled: the policy's draws are stood in for by a fake engine (odd draws give each item's reference
    answer, even draws an unreadable one), and the start model's path by a placeholder, so this checks the pairing
    and the rows without a model: one distinct right over one distinct wrong answer per item, valid pool rows."""
    import json

    from flywheel.config import load_config
    from flywheel.datasets import read_rows, write_dataset
    from flywheel.engines import TextResult
    from flywheel.worlds.shapes import policy_eval as pe

    bench = load_bench("pool_replay")
    cfg = load_config()
    items = pe.text_items(cfg.world.shapes, 8, 4242, bench.SAMPLED_STREAM)

    class Draws:
        def __init__(self, _path, generation):
            assert generation.temperature == cfg.policy.generation.temperature  # the preference stage's sampling

        def generate(self, requests, seed):
            draw = (seed - 4242) // 1000
            return [TextResult(text=(q["reference"] if draw % 2 else "Zzz.") + " ") for *_, q in items]

    monkeypatch.setattr("flywheel.engines.hf.HFTextEngine", Draws)
    monkeypatch.setattr(bench, "resolve_model_path", lambda ref, _cfg: "/no/model")
    rows = bench.sampled_pairs(cfg, "world:policy", k=3, per_item=2, n_items=8)
    assert len(rows) == 8  # each item: right (draws 1 and 3, one distinct answer) over wrong (draw 2)
    manifest = write_dataset(str(tmp_path / "pool"), "dpo", rows, config_hash="t", producer="test")
    assert manifest.row_count == 8 and not manifest.quarantined
    said = lambda m: json.loads(m)[0]["content"][0]["text"]  # noqa: E731
    for row, (_, scene, question, q) in zip(read_rows(str(tmp_path / "pool")), items, strict=True):
        assert said(row["chosen"]) == q["reference"] and said(row["rejected"]) == "Zzz."
        assert pe.check_answer(q, said(row["chosen"]), scene).correct == 1.0
        assert question in row["prompt"]


def test_a_sampled_spec_that_is_not_three_positive_integers_is_refused_by_name(tmp_path):
    assert "--sampled '16:0:480': expected K:P:N" in _exit_code(["--sampled", "16:0:480", "--workdir", str(tmp_path)])
