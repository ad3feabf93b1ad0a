import json

import pytest
from labeled_sets import png_b64
from PIL import Image

from flywheel.aspects import AspectTree
from flywheel.records import validate
from flywheel.sources import read_source, read_text_list


@pytest.fixture(scope="module")
def tree():
    return AspectTree.load()


@pytest.mark.parametrize("as_uri", [False, True], ids=["path", "file-uri"])
def test_jsonl_rows_become_valid_prompts_and_bad_lines_are_quarantined(tmp_path, tree, as_uri):
    """A local path or a storage URI (s3://, gs://: no object store is reachable here, so file:// takes the same
    pyarrow-filesystem branch), images named relative to the file either way."""
    Image.new("RGB", (28, 28), "blue").save(tmp_path / "blue.png")
    lines = [
        json.dumps({"task": "iu", "subtask": "iu_color", "query": "What colour?", "images": [png_b64()]}),
        json.dumps({"task": "iu", "subtask": "iu_count", "query": "How many?", "image_paths": ["blue.png"]}),
        "{not json",
        json.dumps({"task": "iu", "subtask": "iu_color", "query": "x", "images": ["%%%"]}),
        json.dumps({"task": "iu", "subtask": "iu_color", "query": "y", "image_paths": ["missing.png"]}),
        json.dumps({"task": "nlg", "subtask": "no_such_subtask", "query": "z"}),
        json.dumps([1, 2]),
        "",
    ]
    (tmp_path / "p.jsonl").write_text("\n".join(lines))
    path = f"file://{tmp_path}/p.jsonl" if as_uri else str(tmp_path / "p.jsonl")
    rows, bad = read_source({"type": "jsonl", "path": path}, tree)
    assert [r["query"] for r in rows] == ["What colour?", "How many?"]
    assert rows[1]["images"] == [(tmp_path / "blue.png").read_bytes()] and rows[0]["source"] == "p.jsonl"
    assert "color_accuracy" in rows[0]["aspects"] and "count_accuracy" in rows[1]["aspects"]
    valid, invalid = validate("prompt", rows)
    assert len(valid) == 2 and not invalid
    reasons = " | ".join(b["reason"] for b in bad)
    assert len(bad) == 5
    for expected in ("line 3: not valid UTF-8 JSON", "line 4: images[0]: not base64", "missing.png not found",
                     "no_such_subtask", "line 7: expected a JSON object"):
        assert expected in reasons


def test_text_list(tmp_path, tree):
    (tmp_path / "t.txt").write_bytes(b"a red circle\n\na blue square\n\xff\xfe bad\n")
    rows, bad = read_text_list(tmp_path / "t.txt", task="ig", subtask="ig_single_object")
    assert [r["query"] for r in rows] == ["a red circle", "a blue square"]
    assert len(bad) == 1 and "line 4: invalid UTF-8" in bad[0]["reason"]


def test_unknown_source_type(tree):
    with pytest.raises(ValueError, match="expected one of jsonl, parquet, text"):
        read_source({"type": "csv", "path": "x"}, tree)


def test_parquet_labels_and_digests_read_storage_uris(tmp_path, tree):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from flywheel.evaluate.labeled import load_labeled
    from flywheel.sources import files_digest
    from labeled_sets import pair, write_jsonl

    pq.write_table(pa.Table.from_pylist([{"task": "ig", "subtask": "ig_single_object", "query": "a red circle",
                                          "images": []}]), tmp_path / "p.parquet")
    rows, bad = read_source({"type": "parquet", "path": f"file://{tmp_path}/p.parquet"}, tree)
    assert [r["query"] for r in rows] == ["a red circle"] and not bad and rows[0]["source"] == "p.parquet"
    prompt = {"task": "nlg", "subtask": "nlg_describe_scene", "query": "Describe a red circle."}
    one = pair(prompt, "A red circle.", "A blue square.", "A")
    write_jsonl(tmp_path / "labels.jsonl", [one])
    items, refused = load_labeled(f"file://{tmp_path}/labels.jsonl")
    assert len(items) == 1 and not refused
    before = files_digest([f"file://{tmp_path}/labels.jsonl"])
    write_jsonl(tmp_path / "labels.jsonl", [one, one])
    assert files_digest([f"file://{tmp_path}/labels.jsonl"]) != before  # an edited file is read again
    assert files_digest([f"file://{tmp_path}/gone.jsonl"]) != files_digest([f"file://{tmp_path}/gone2.jsonl"])
