"""Training record kinds (sft / dpo / image_pref) and their conversion to TRL rows."""

import json

import pytest

from flywheel import records
from flywheel.datasets import read_quarantine, write_dataset
from flywheel.train.data import SAMPLE_ID, SAMPLE_IDS, SampleIdCollator, dpo_rows, read_training_data, sft_rows, \
    to_hf_dataset
from flywheel.train.synthetic import dpo_records, image_pref_records, sft_records


def test_training_kinds_have_content_hash_ids_and_round_trip(tmp_path):
    for kind, rows in (("sft", sft_records(6)), ("dpo", dpo_records(4)), ("image_pref", image_pref_records(3))):
        m = write_dataset(str(tmp_path / kind), kind, rows, config_hash="c", producer="test")
        assert m.row_count == len(rows) and m.quarantined == 0
        data = read_training_data(str(tmp_path / kind), kind)
        key = records.id_field(kind)
        assert all(r[key] == records.make_id(kind, r) for r in data.rows)
        # annotations are not content: relabelling keeps the id
        relabelled = {**data.rows[0], "meta": {"note": "x"}}
        assert records.make_id(kind, relabelled) == data.rows[0][key]


def test_bad_training_rows_are_quarantined_with_reasons(tmp_path):
    sft = sft_records(1)[0]
    dpo = dpo_records(1)[0]
    pref = image_pref_records(1)[0]
    bad = [
        ("sft", {**sft, "messages": json.dumps([{"role": "user", "content": "hi"}])}, "last message"),
        ("sft", {**sft, "images": []}, "placeholder"),
        ("sft", {**sft, "messages": "{}"}, "non-empty JSON list"),
        ("dpo", {**dpo, "rejected": dpo["chosen"]}, "equals chosen"),
        ("dpo", {**dpo, "chosen": json.dumps([{"role": "user", "content": "x"}])}, "role"),
        ("image_pref", {**pref, "rejected": pref["chosen"]}, "same image"),
        ("image_pref", {**pref, "chosen": pref["chosen"] * 2}, "exactly one image"),
    ]
    for i, (kind, row, reason) in enumerate(bad):
        uri = str(tmp_path / f"{kind}-{i}")
        m = write_dataset(uri, kind, [row], config_hash="c", producer="test")
        assert m.row_count == 0 and m.quarantined == 1, (kind, reason)
        assert reason in read_quarantine(uri)[0]["reason"], read_quarantine(uri)[0]["reason"]


def test_sft_rows_split_the_answer_off_and_keep_decomposed_subtasks(tmp_path):
    rows = sft_records(40, decomposed_share=0.5)
    write_dataset(str(tmp_path / "sft"), "sft", rows, config_hash="c", producer="test")
    data = read_training_data(str(tmp_path / "sft"), "sft")
    assert {r["protocol"] for r in data.rows} == {"pointwise", "decomposed"}
    trl = sft_rows(data.rows, completion_only_loss=True)
    assert len(trl) == len(data.rows)  # every protocol's samples, decomposed sub-tasks included
    r = trl[0]
    assert r["completion"][0]["role"] == "assistant" and r["prompt"][-1]["role"] == "user"
    assert [p["type"] for p in r["prompt"][0]["content"]] == ["image", "text"]
    full = sft_rows(data.rows, completion_only_loss=False)[0]
    assert full["messages"][-1]["role"] == "assistant" and "prompt" not in full
    ds = to_hf_dataset(trl)
    assert ds[0]["images"][0].size == (56, 56) and ds[0][SAMPLE_ID] == data.rows[0]["sft_id"]


def test_dpo_rows_and_sample_id_collator(tmp_path):
    write_dataset(str(tmp_path / "dpo"), "dpo", dpo_records(3), config_hash="c", producer="test")
    data = read_training_data(str(tmp_path / "dpo"), "dpo")
    ds = to_hf_dataset(dpo_rows(data.rows))
    seen = []

    def inner(examples):
        seen.extend(examples)
        return {"n": len(examples)}

    batch = SampleIdCollator(inner)([ds[0], ds[1]])
    assert batch[SAMPLE_IDS] == [data.rows[0]["dpo_id"], data.rows[1]["dpo_id"]]
    assert all(SAMPLE_ID not in e for e in seen) and set(seen[0]) == {"images", "prompt", "chosen", "rejected"}


def test_wrong_kind_is_refused(tmp_path):
    write_dataset(str(tmp_path / "d"), "dpo", dpo_records(2), config_hash="c", producer="test")
    with pytest.raises(Exception, match="kind"):
        read_training_data(str(tmp_path / "d"), "sft")


def test_a_judge_loads_with_its_image_processor_in_a_fresh_process(zoo):
    """Training processes import little: load_vlm alone must register the zoo's processor. (It once imported the
    wrong module; AutoProcessor then handed back the bare tokenizer, and TRL would have dropped every image.)"""
    import subprocess
    import sys

    code = ("import sys; from flywheel.train import hf; m, p = hf.load_vlm(sys.argv[1]); "
            "print(type(p).__name__, type(p.image_processor).__name__)")
    out = subprocess.run([sys.executable, "-c", code, str(zoo["judge"])], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split()[:1] == ["ImageOnlyQwen2VLProcessor"], out.stdout
