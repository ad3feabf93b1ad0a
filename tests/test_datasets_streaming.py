"""Datasets in bounded memory: the incremental content hash, datasets written in parts, streamed verification and
row ranges (what the stage runner uses so the driver never holds a stage's rows)."""

import os

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from flywheel import datasets, records
from flywheel.images import to_png_bytes
from flywheel.records import ContentHasher, content_hash, hash_lines, to_table, validate


def _png(i: int) -> bytes:
    from PIL import Image

    return to_png_bytes(Image.new("RGB", (4, 4), (i % 256, 0, 0)))


def _rows(n: int, start: int = 0) -> list[dict]:
    rows = [{"task": "iu", "subtask": "iu_count", "query": f"q{i}\nline two é", "images": [_png(i)],
             "reference_images": [], "aspects": ["a"], "source": "test", "split": "train",
             "meta": None if i % 2 else {"i": i}} for i in range(start, start + n)]
    valid, bad = validate("prompt", rows)
    assert not bad
    return valid


def _write_parts(uri, sizes: list[int], **kw) -> tuple[datasets.Manifest, list[dict]]:
    """A dataset of parts with these row counts (0: a batch with no valid rows, so no file)."""
    writer = datasets.PartsWriter(str(uri), "prompt", config_hash="c", producer="test", **kw)
    rows, start = [], 0
    for i, n in enumerate(sizes):
        part = _rows(n, start)
        start += n
        rows += part
        meta = datasets.write_part(str(uri), i, "prompt", to_table("prompt", part))
        writer.add_part(**meta)
    return writer.finish(), rows


def test_incremental_hash_equals_the_whole_table_hash():
    rows = _rows(23)
    table = to_table("prompt", rows)
    whole = content_hash("prompt", table)
    assert whole == content_hash("prompt", rows)
    for chunk in (1, 5, 23, 100):
        h = ContentHasher("prompt")
        for i in range(0, table.num_rows, chunk):
            h.update(table.slice(i, chunk))
        assert h.hexdigest() == whole and h.rows == 23
        lines = ContentHasher("prompt")
        for i in range(0, len(rows), chunk):  # lines made elsewhere (an actor), fed in order
            assert lines.update_lines(hash_lines("prompt", rows[i:i + chunk])) == len(rows[i:i + chunk])
        assert lines.hexdigest() == whole
    assert ContentHasher("prompt").update(table.to_batches()[0]).hexdigest() == content_hash("prompt", table)
    assert ContentHasher("prompt").hexdigest() == content_hash("prompt", [])


def test_parts_round_trip_streamed_and_whole(tmp_path):
    uri = tmp_path / "ds"
    m, rows = _write_parts(uri, [3, 0, 5, 1, 4])
    assert m.files == ["part-00000.parquet", "part-00002.parquet", "part-00003.parquet", "part-00004.parquet"]
    assert m.row_count == 13 and m.content_hash == content_hash("prompt", rows)
    assert sorted(os.listdir(uri)) == ["manifest.json", *m.files]
    table, m2 = datasets.read_dataset(str(uri), "prompt")
    assert m2 == m and table.to_pylist() == rows
    for batch_rows in (1, 2, 7, 1000):
        got = list(datasets.iter_dataset_batches(str(uri), "prompt", batch_rows=batch_rows))
        assert all(t.num_rows <= batch_rows for t in got)
        assert [r for t in got for r in t.to_pylist()] == rows
    assert list(datasets.iter_dataset_rows(str(uri))) == rows
    assert datasets.verify_dataset(str(uri)) == m
    # the same rows written whole give the same content hash
    assert datasets.write_dataset(str(tmp_path / "whole"), "prompt", rows, config_hash="c",
                                  producer="t").content_hash == m.content_hash


def test_tampered_or_missing_part_refused(tmp_path):
    uri = tmp_path / "ds"
    m, _ = _write_parts(uri, [3, 3, 3])
    part = uri / m.files[1]
    good = part.read_bytes()
    t = pq.read_table(part)
    pq.write_table(t.set_column(t.schema.get_field_index("split"), t.schema.field("split"),
                                pa.array(["ood-test"] * t.num_rows)), part)
    with pytest.raises(datasets.ManifestMismatch, match="data changed after the manifest was written"):
        datasets.read_dataset(str(uri))
    with pytest.raises(datasets.ManifestMismatch, match="data changed after the manifest was written"):
        datasets.verify_dataset(str(uri))
    it = datasets.iter_dataset_batches(str(uri), batch_rows=3)
    assert len([next(it), next(it), next(it)]) == 3  # rows come first; the refusal at the end of the iteration
    with pytest.raises(datasets.ManifestMismatch, match="data changed"):
        next(it)
    pq.write_table(t.slice(1), part)  # a dropped row
    with pytest.raises(datasets.ManifestMismatch, match="8 rows in data but manifest row_count is 9"):
        datasets.verify_dataset(str(uri))
    part.write_bytes(good)
    assert datasets.verify_dataset(str(uri)) == m
    part.unlink()
    with pytest.raises(datasets.ManifestMismatch, match="part-00001.parquet is missing"):
        datasets.verify_dataset(str(uri))
    part.write_bytes(b"garbage")
    with pytest.raises(datasets.ManifestMismatch, match="part-00001.parquet is not readable Parquet"):
        list(datasets.iter_dataset_batches(str(uri)))


def test_row_ranges_forward_backward_and_across_files(tmp_path):
    m, rows = _write_parts(tmp_path / "ds", [3, 0, 5, 1, 4])
    whole = datasets.write_dataset(str(tmp_path / "whole"), "prompt", rows, config_hash="c", producer="t")
    m2, file_rows = datasets.verify_dataset_files(str(tmp_path / "ds"))
    assert m2 == m and file_rows == [3, 5, 1, 4]
    for uri, manifest, rows_per_file in ((tmp_path / "ds", m, None), (tmp_path / "ds", m, file_rows),
                                         (tmp_path / "whole", whole, None)):
        reader = datasets.RowRangeReader(str(uri), manifest, read_rows=2, file_rows=rows_per_file)
        for start, stop in [(0, 2), (2, 4), (4, 9), (9, 13), (1, 12), (0, 13), (5, 5), (7, 8), (3, 4), (0, 1),
                            (12, 13), (8, 11)]:
            assert reader.read(start, stop).to_pylist() == rows[start:stop], (uri, start, stop)
        with pytest.raises(IndexError):
            reader.read(10, 14)
        reader.close()
    with pytest.raises(ValueError, match="do not fit"):
        datasets.RowRangeReader(str(tmp_path / "ds"), m, file_rows=[3, 5, 1])


def test_parts_writer_streams_quarantine_and_drops_stale_files(tmp_path):
    uri = tmp_path / "ds"
    _write_parts(uri, [2, 2, 2, 2])  # an earlier, longer write of the same dataset
    (uri / "quarantine.parquet").write_bytes(b"stale")
    writer = datasets.PartsWriter(str(uri), "prompt", config_hash="c2", producer="test", quarantine_rows=2)
    assert not (uri / "manifest.json").exists()  # incomplete from the start of the rewrite
    items = [{"kind": "prompt", "index": i, "reason": f"r{i}", "field": "query", "raw": {"q": i, "img": b"\x00\xff"}}
             for i in range(5)]
    writer.add_quarantined(items[:3])
    writer.add_quarantined(items[3:])
    rows = _rows(3)
    meta = datasets.write_part(str(uri), 0, "prompt", to_table("prompt", rows))
    writer.add_part(**{**meta, "size": None})  # size unknown: not checked
    m = writer.finish()
    assert m.files == ["part-00000.parquet"] and m.quarantined == 5 and m.row_count == 3
    assert sorted(os.listdir(uri)) == ["manifest.json", "part-00000.parquet", "quarantine.parquet"]
    assert datasets.read_rows(str(uri)) == rows
    got = records.read_quarantine(str(uri))
    assert [(q["index"], q["reason"]) for q in got] == [(i, f"r{i}") for i in range(5)]
    assert got[4]["raw"] == {"q": 4, "img": b"\x00\xff"}

    writer = datasets.PartsWriter(str(uri), "prompt", config_hash="c3", producer="test")
    writer.add_quarantined(items[:1])
    writer.abort()  # a failed stage: no manifest, no temporary file left
    assert sorted(os.listdir(uri)) == ["part-00000.parquet", "quarantine.parquet"]
    with pytest.raises(datasets.MissingManifest):
        datasets.read_dataset(str(uri))


def test_parts_writer_refuses_inconsistent_parts(tmp_path):
    writer = datasets.PartsWriter(str(tmp_path / "ds"), "prompt", config_hash="c", producer="test")
    meta = datasets.write_part(str(tmp_path / "ds"), 0, "prompt", to_table("prompt", _rows(2)))
    with pytest.raises(ValueError, match="hash lines for another count"):
        writer.add_part(meta["part"], 3, meta["lines"], meta["size"])
    with pytest.raises(ValueError, match="bad part"):
        writer.add_part("../x.parquet", 2, meta["lines"])
    writer.add_part(meta["part"], 2, meta["lines"], meta["size"] + 1)  # not the file on storage
    with pytest.raises(datasets.ManifestMismatch, match="part-00000.parquet is missing or not the file written"):
        writer.finish()
    assert datasets.write_part(str(tmp_path / "ds"), 1, "prompt", to_table("prompt", []))["part"] == ""
