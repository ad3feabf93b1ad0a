"""Records: ids, validation/quarantine, datasets with manifests, storage URIs."""
from __future__ import annotations

import base64
import io
import json
import os
import struct
import subprocess
import sys
import zlib

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from PIL import Image
from pydantic import ValidationError

from flywheel import datasets, records, storage
from flywheel.records import RecordLimits, make_id, validate, with_ids


def png(w=8, h=8, color=(255, 0, 0)) -> bytes:
    return records.to_png_bytes(Image.new("RGB", (w, h), color))


def jpeg(w=8, h=8) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (w, h), (0, 0, 255)).save(buf, format="JPEG")
    return buf.getvalue()


def noise_png(w=10, h=10) -> bytes:
    pixels = np.random.default_rng(0).integers(0, 255, (h, w, 3), dtype=np.uint8)
    return records.to_png_bytes(Image.fromarray(pixels))


def flipped(data: bytes, at: int) -> bytes:
    out = bytearray(data)
    out[at] ^= 0xFF
    return bytes(out)


def png_claiming(w: int, h: int) -> bytes:
    """A tiny PNG whose header claims w x h pixels: a decompression bomb's shape, without the bomb."""
    data = bytearray(png(1, 1))
    ihdr = struct.pack(">II", w, h) + bytes(data[24:29])
    data[16:29] = ihdr
    data[29:33] = struct.pack(">I", zlib.crc32(b"IHDR" + ihdr))
    return bytes(data)


def prompt(**kw) -> dict:
    row = {"task": "iu", "subtask": "count", "query": "How many circles?", "images": [png()],
           "reference_text": "2", "reference_images": [], "aspects": ["correctness"], "source": "shapes",
           "split": "train", "meta": json.dumps({"scene": [1, 2]})}
    row.update(kw)
    return row


def candidate(**kw) -> dict:
    row = {"prompt_id": "pr_x", "producer": "llava-tiny@1", "output_text": "two", "output_images": [],
           "sample_index": 0, "meta": None}
    row.update(kw)
    return row


def judgment(**kw) -> dict:
    row = {"prompt_id": "pr_x", "candidate_ids": ["ca_a"], "judge": "qwen2vl-tiny@3", "protocol": "pointwise",
           "aspect": "correctness", "order": None, "sample_k": 0, "raw_output": "Rating: 4",
           "parsed": None, "score": 4.0, "verdict": None, "parse_error": None, "analysis": "ok."}
    row.update(kw)
    return row


def pair(**kw) -> dict:
    row = {"kind": "policy", "prompt_id": "pr_x", "chosen_id": "ca_a", "rejected_id": "ca_b", "chosen_score": 5.0,
           "rejected_score": 2.0, "margin": 3.0, "judge": "qwen2vl-tiny@3", "meta": None}
    row.update(kw)
    return row


# ---------------------------------------------------------------- ids
def test_ids_deterministic_and_content_sensitive():
    base = make_id("prompt", prompt())
    assert base == make_id("prompt", prompt()) and base.startswith("pr_") and len(base) == 23
    assert make_id("prompt", prompt(split="ood-test")) == base  # a label, not content
    assert make_id("prompt", prompt(aspects=["style"], meta=None)) == base
    assert make_id("prompt", prompt(query="How many squares?")) != base
    assert make_id("prompt", prompt(images=[png(color=(0, 255, 0))])) != base
    assert make_id("prompt", prompt(task="nlg")) != base
    assert make_id("prompt", prompt(query=b"How many circles?")) == base  # bytes are decoded, same text
    j = make_id("judgment", judgment())
    assert make_id("judgment", judgment(score=2.0, analysis="re-parsed")) == j  # derived from raw_output
    assert make_id("judgment", judgment(raw_output="Rating: 2")) != j
    assert make_id("candidate", candidate(sample_index=1)) != make_id("candidate", candidate())


def test_ids_stable_across_processes():
    code = ("from flywheel.records import make_id; from PIL import Image; import io;"
            "b=io.BytesIO(); Image.new('RGB',(8,8),(255,0,0)).save(b,format='PNG');"
            "print(make_id('prompt', dict(task='iu', subtask='count', query='How many circles?', images=[b.getvalue()],"
            "reference_text='2', reference_images=[], source='shapes')))")
    env = {**os.environ, "PYTHONHASHSEED": "123"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    assert out.stdout.strip() == make_id("prompt", prompt())


def test_with_ids_fills_missing_keeps_present_and_skips_bad():
    rows = with_ids("prompt", [prompt(), prompt(prompt_id="pr_given"), {"query": 3}])
    assert rows[0]["prompt_id"] == make_id("prompt", prompt())
    assert rows[1]["prompt_id"] == "pr_given"
    assert "prompt_id" not in rows[2]
    with pytest.raises(ValueError, match="make_id\\(prompt\\): task: missing required field"):
        make_id("prompt", {"query": "q"})


def test_config_hash_canonical():
    assert records.config_hash({"a": 1, "b": [1, 2]}) == records.config_hash({"b": [1, 2], "a": 1})
    assert records.config_hash({"a": 1}) != records.config_hash({"a": 2})
    assert records.config_hash(RecordLimits()) == records.config_hash(RecordLimits().model_dump())


def test_record_limits_forbid_unknown_keys():
    with pytest.raises(ValidationError):
        RecordLimits(max_text=3)
    assert all(f.description for f in RecordLimits.model_fields.values())


# ---------------------------------------------------------------- validation
SMALL = RecordLimits(max_text_chars=20, max_image_pixels=100, max_image_bytes=10_000, max_images=2)
BAD_CASES = [
    ("prompt", prompt(images=[png(), b"not an image"]), "images[1]",
     "images[1]: undecodable image bytes (cannot identify image file)"),
    ("prompt", prompt(images=[noise_png()[:189]]), "images[0]", "images[0]: undecodable image bytes (Truncated"),
    ("prompt", prompt(images=[noise_png()[:-12]]), "images[0]", "images[0]: undecodable image bytes (truncated PNG"),
    ("prompt", prompt(images=[flipped(noise_png(), 60)]), "images[0]", "bad header checksum in b'IDAT'"),
    ("prompt", prompt(images=[png()], reference_images=[png(), jpeg()[:100]]), "reference_images[1]",
     "reference_images[1]: undecodable image bytes"),
    ("prompt", prompt(images=[noise_png(100, 100)]), "images[0]", "bytes exceeds max_image_bytes=10000"),
    ("prompt", {k: v for k, v in prompt().items() if k != "task"}, "task", "task: missing required field"),
    ("candidate", candidate(sample_index="3"), "sample_index", "sample_index: expected int, got str"),
    ("prompt", prompt(query="x" * 25), "query", "query: 25 chars exceeds max_text_chars=20"),
    ("prompt", prompt(images=[png(16, 16)]), "images[0]", "images[0]: 16x16 = 256 pixels exceeds max_image_pixels=100"),
    ("prompt", prompt(images=[png_claiming(5000, 5000)]), "images[0]", "5000x5000 = 25000000 pixels exceeds max_"),
    ("prompt", prompt(images=[png_claiming(10**5, 10**5)]), "images[0]", "decompression bomb refused before decoding"),
    ("prompt", prompt(images=[png()] * 3), "images", "images: 3 images exceeds max_images=2"),
    ("prompt", prompt(query=b"ab\xffc"), "query", "query: invalid UTF-8 (byte 0xff at 2)"),
    ("prompt", prompt(query="ab\ud800c"), "query", "query: invalid UTF-8 (lone surrogate U+D800 at 2)"),
    ("prompt", prompt(task="video"), "task", "task: 'video' is not one of nlg|iu|ig|itig"),
    ("prompt", prompt(split="dev"), "split", "split: 'dev' is not one of train|id-test|ood-test"),
    ("prompt", prompt(colour="red"), "colour", "colour: unknown field"),
    ("prompt", prompt(meta="{not json"), "meta", "meta: invalid JSON"),
    ("prompt", prompt(prompt_id="pr_made_up"), "prompt_id", "does not match the content hash"),
    ("prompt", "not a row", "row", "row: expected dict, got str"),
    ("judgment", judgment(parse_error="no rating found"), "parse_error",
     "both a parse_error and a parsed value (score)"),
    ("judgment", judgment(score=None), "parse_error", "neither a parsed value"),
    ("judgment", judgment(protocol="pairwise"), "candidate_ids", "pairwise needs 2 distinct ids, got 1"),
    ("judgment", judgment(score=float("inf")), "score", "score: non-finite value inf"),
    ("candidate", candidate(output_text=None), "output_text", "neither output_text nor output_images"),
    ("pair", pair(rejected_id="ca_a"), "rejected_id", "rejected_id: equals chosen_id"),
    ("pair", pair(margin="3"), "margin", "margin: expected float, got str"),
]


@pytest.mark.parametrize("kind,row,field,reason", BAD_CASES, ids=[c[3][:40] for c in BAD_CASES])
def test_each_quarantine_reason_and_valid_neighbours_survive(kind, row, field, reason):
    good = {"prompt": [prompt(query="q1"), prompt(query="q2")], "candidate": [candidate(), candidate(sample_index=1)],
            "judgment": [judgment(), judgment(sample_k=1)], "pair": [pair(), pair(chosen_id="ca_c")]}[kind]
    valid, bad = validate(kind, [good[0], row, good[1]], SMALL)
    assert len(bad) == 1, bad
    assert bad[0]["index"] == 1 and bad[0]["kind"] == kind and bad[0]["field"] == field
    assert reason in bad[0]["reason"], bad[0]["reason"]
    assert "object at 0x" not in bad[0]["reason"]  # reasons are deterministic: no memory addresses
    assert json.loads(json.dumps(bad[0]["raw"])) == bad[0]["raw"]  # JSON-safe
    assert [v[records.id_field(kind)] for v in valid] == [make_id(kind, g) for g in good]
    assert [v["query"] for v in valid] == ["q1", "q2"] if kind == "prompt" else True


def test_all_field_errors_reported_together():
    _, bad = validate("candidate", [candidate(sample_index="3", producer=7)])
    assert bad[0]["field"] == "producer"
    assert "producer: expected str, got int" in bad[0]["reason"]
    assert "sample_index: expected int, got str" in bad[0]["reason"]


def test_nothing_valid_lost_in_mixed_batch():
    rows = [prompt(query=f"q{i}") if i % 3 else prompt(query=f"q{i}", task=None) for i in range(12)]
    valid, bad = validate("prompt", rows)
    assert [v["query"] for v in valid] == [f"q{i}" for i in range(12) if i % 3]
    assert [b["index"] for b in bad] == [0, 3, 6, 9]
    assert all(b["reason"] == "task: null is not allowed" for b in bad)


def test_valid_rows_normalised_and_ids_filled():
    (row,), _ = validate("judgment", [judgment(score=np.int64(4), sample_k=np.int32(2), parsed={"b": 1, "a": 2})])
    assert row["judgment_id"] == make_id("judgment", row) and row["score"] == 4.0 and type(row["score"]) is float
    assert row["sample_k"] == 2 and type(row["sample_k"]) is int and row["parsed"] == '{"a":2,"b":1}'
    (p,), _ = validate("prompt", [{k: v for k, v in prompt().items() if k not in ("meta", "aspects")}])
    assert p["meta"] is None and p["aspects"] == []


def test_jpeg_reencoded_to_png():
    (row,), bad = validate("prompt", [prompt(images=[jpeg(8, 8)])])
    assert bad == []
    out = row["images"][0]
    assert out.startswith(records.PNG_MAGIC)
    im = records.load_image(out)
    assert im.format is None or im.format == "PNG"
    assert im.size == (8, 8)
    assert row["prompt_id"] == make_id("prompt", {**prompt(), "images": [out]})  # the id covers the stored PNG


def test_valid_png_bytes_kept_verbatim():
    data = png(5, 7)
    (row,), _ = validate("prompt", [prompt(images=[data], reference_images=[bytearray(data)])])
    assert row["images"] == [data] and row["reference_images"] == [data]


def test_validate_table_accepts_ray_numpy_batch():
    rows = [judgment(sample_k=0), judgment(sample_k=1, score=None, parse_error="no rating")]
    table = pa.Table.from_pylist(records.validate("judgment", rows)[0], schema=records.SCHEMAS["judgment"])
    batch = {name: table.column(name).to_numpy(zero_copy_only=False).copy() for name in table.column_names}
    assert np.isnan(batch["score"][1])  # what Ray hands over for a null float
    batch["sample_k"][0] = np.int32(7)  # this row's id no longer matches its content
    out, bad = records.validate_table("judgment", batch)
    assert out.schema == records.SCHEMAS["judgment"]
    assert out.num_rows == 1 and out.column("score").to_pylist() == [None]
    assert bad[0]["index"] == 0 and bad[0]["field"] == "judgment_id"
    with pytest.raises(ValueError, match="different lengths"):
        records.to_rows({"a": [1, 2], "b": [1]})


# ---------------------------------------------------------------- datasets
def write(uri, kind="prompt", rows=None, **kw):
    rows = [prompt(query=f"q{i}", images=[png(4, 4, (i, 0, 0))]) for i in range(5)] if rows is None else rows
    return datasets.write_dataset(str(uri), kind, rows, config_hash="cfg123", producer="sources", **kw)


def test_round_trip(tmp_path):
    rows = [prompt(query=f"q{i}", split="train" if i % 2 else "id-test") for i in range(4)]
    up = {"path": "s3://bucket/sources", "content_hash": "abc"}
    m = write(tmp_path / "ds", rows=rows, upstream=[up])
    assert sorted(os.listdir(tmp_path / "ds")) == ["data.parquet", "manifest.json"]
    table, m2 = records.read_dataset(str(tmp_path / "ds"), "prompt")
    assert m2 == m and m.row_count == 4 and m.kind == "prompt" and m.quarantined == 0
    assert m.config_hash == "cfg123" and m.producer == "sources" and m.upstream[0].path == "s3://bucket/sources"
    assert table.schema == records.SCHEMAS["prompt"] and m.arrow_schema == str(table.schema)
    assert table.to_pylist() == validate("prompt", rows)[0]
    assert m.content_hash == records.content_hash("prompt", table)


def test_write_is_deterministic(tmp_path):
    a, b = (write(tmp_path / "a", rows=[prompt(), prompt(query=1)]),
            write(tmp_path / "b", rows=[prompt(), prompt(query=1)]))
    for name in ("data.parquet", "quarantine.parquet"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
    assert a.model_dump(exclude={"path", "created_at"}) == b.model_dump(exclude={"path", "created_at"})


def test_upstream_manifest_reference(tmp_path):
    src = write(tmp_path / "src")
    m = write(tmp_path / "next", kind="candidate", rows=[candidate()], upstream=[src])
    assert m.upstream[0].content_hash == src.content_hash and m.upstream[0].path == str(tmp_path / "src")


def test_tampered_data_dropped_row_refused(tmp_path):
    uri = tmp_path / "ds"
    write(uri)
    table = pq.read_table(uri / "data.parquet")
    pq.write_table(table.slice(1), uri / "data.parquet")
    with pytest.raises(datasets.ManifestMismatch, match=r"dataset at .*ds: 4 rows in data but manifest row_count is 5"):
        records.read_dataset(str(uri))


def test_tampered_data_same_row_count_refused(tmp_path):
    uri = tmp_path / "ds"
    write(uri)
    table = pq.read_table(uri / "data.parquet")
    split = pa.array(["ood-test"] * table.num_rows)  # split is not in the id, but is in the content hash
    field = table.schema.field("split")
    pq.write_table(table.set_column(table.schema.get_field_index("split"), field, split), uri / "data.parquet")
    with pytest.raises(datasets.ManifestMismatch, match="data changed after the manifest was written"):
        records.read_dataset(str(uri))


def test_garbage_data_file_and_kind_mismatch_refused(tmp_path):
    uri = tmp_path / "ds"
    write(uri)
    with pytest.raises(datasets.ManifestMismatch, match="kind is 'prompt', expected 'judgment'"):
        records.read_dataset(str(uri), "judgment")
    (uri / "data.parquet").write_bytes(b"garbage")
    with pytest.raises(datasets.ManifestMismatch, match="data.parquet is not readable Parquet"):
        records.read_dataset(str(uri))
    pq.write_table(pa.table({"x": [1]}), uri / "data.parquet")
    with pytest.raises(datasets.ManifestMismatch, match="schema differs"):
        records.read_dataset(str(uri))


def test_missing_or_broken_manifest_refused(tmp_path):
    uri = tmp_path / "ds"
    write(uri)
    (uri / "manifest.json").write_text("{}")
    with pytest.raises(datasets.ManifestMismatch, match="manifest at .* is unreadable"):
        records.read_dataset(str(uri))
    (uri / "manifest.json").unlink()
    with pytest.raises(datasets.MissingManifest, match="no manifest at .*manifest.json: dataset incomplete"):
        records.read_dataset(str(uri))


def test_quarantine_file_written_and_raw_recoverable(tmp_path):
    uri = tmp_path / "ds"
    corrupt, img = b"\x89PNG\r\n\x1a\nbroken", png(3, 3)
    rows = [prompt(), prompt(query="q2", images=[img, corrupt]), prompt(query=b"\xff", images=[img])]
    upstream_bad = {"kind": "prompt", "index": 7, "reason": "source: unreadable line", "field": "source", "raw": "{"}
    m = write(uri, rows=rows, quarantined=[upstream_bad])
    assert m.row_count == 1 and m.quarantined == 3
    raw_json = pq.read_table(uri / "quarantine.parquet").column("raw_json").to_pylist()
    assert json.loads(raw_json[1])["images"][1] == {"$bytes": base64.b64encode(corrupt).decode()}
    items = records.read_quarantine(str(uri))
    assert [(q["index"], q["field"]) for q in items] == [(7, "source"), (1, "images[1]"), (2, "query")]
    assert items[1]["raw"]["images"] == [img, corrupt]  # byte-exact
    assert items[2]["raw"]["query"] == b"\xff" and items[0]["raw"] == "{"
    assert "undecodable image bytes" in items[1]["reason"]
    write(uri)  # rewriting without bad rows must not leave a stale quarantine behind
    assert not (uri / "quarantine.parquet").exists() and records.read_quarantine(str(uri)) == []


def test_manifest_written_last(tmp_path, monkeypatch):
    written = []
    real = storage.write_bytes
    monkeypatch.setattr(storage, "write_bytes",
                        lambda uri, data: (written.append(os.path.basename(uri)), real(uri, data)))
    write(tmp_path / "ds", rows=[prompt(), prompt(task="x")])
    assert written == ["data.parquet", "quarantine.parquet", "manifest.json"]


def test_crashed_rewrite_leaves_dataset_visibly_incomplete(tmp_path, monkeypatch):
    uri = tmp_path / "ds"
    write(uri)

    def die(uri, data):
        raise OSError("disk full")
    monkeypatch.setattr(storage, "write_bytes", die)
    with pytest.raises(OSError, match="disk full"):
        write(uri, rows=[prompt(query="new")])
    with pytest.raises(datasets.MissingManifest):  # not the old manifest over half-new data
        records.read_dataset(str(uri))


def test_dataset_through_file_uri(tmp_path):
    uri = "file://" + str(tmp_path / "ds")
    m = write(uri)
    assert m.path == uri and records.read_dataset(uri)[1] == m and (tmp_path / "ds" / "manifest.json").exists()


def test_all_rows_quarantined_still_writes_empty_dataset(tmp_path):
    m = write(tmp_path / "ds", rows=[prompt(task="x")])
    table, _ = records.read_dataset(str(tmp_path / "ds"))
    assert m.row_count == 0 and table.num_rows == 0 and m.quarantined == 1


# ---------------------------------------------------------------- storage
def test_storage_local_paths_and_uris(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    fs, path = storage.resolve("rel/dir")
    assert type(fs).__name__ == "LocalFileSystem" and path == str(tmp_path / "rel/dir")
    assert storage.join("s3://bucket/a/", "b", "/c.parquet") == "s3://bucket/a/b/c.parquet"
    uri = "file://" + str(tmp_path / "x" / "f.bin")
    storage.write_bytes(uri, b"one")
    storage.write_bytes(uri, b"two")
    assert storage.read_bytes(str(tmp_path / "x" / "f.bin")) == b"two" and storage.exists(uri)
    assert os.listdir(tmp_path / "x") == ["f.bin"]  # no temp files left behind
    storage.remove(uri)
    assert not storage.exists(uri)
    with pytest.raises(FileNotFoundError):
        storage.remove(uri, missing_ok=False)
