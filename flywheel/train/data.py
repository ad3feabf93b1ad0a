"""Training datasets on storage (record kinds sft / dpo / image_pref) -> rows the trainers consume.

TRL's row formats: SFT `{"images": [PIL], "prompt": [...], "completion": [...]}` (or `"messages"` when the loss
covers the whole conversation) and DPO `{"images": [PIL], "prompt": [...], "chosen": [...], "rejected": [...]}`.
Every row also carries `sample_id` (the record's content-hash id) so the trainers can log exactly which samples
each optimizer step saw; `SampleIdCollator` strips it before TRL's collator runs.

Rows are held as a map-style `datasets.Dataset` on purpose (not a streaming Ray Data iterator): the trainer's
seeded sampler gives a deterministic order, and resume skips exactly the batches a checkpoint had consumed.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from flywheel.datasets import Manifest, read_dataset

SAMPLE_ID = "sample_id"
SAMPLE_IDS = "sample_ids"  # the batch key the collator adds
LENGTH = "length"  # transformers' length_column_name: what the length-grouped sampler sorts by
# Every image is many tokens on any VLM (16 on the tiny judge, hundreds on a 7B one), so rows sort by their image
# count first and their text length second: a sort key, not a token count.
_IMAGE_WEIGHT = 10_000


def _parts(content: Any) -> list[dict]:
    """Message content as a list of {type, text} parts (one Arrow type for every row; text is null on images)."""
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    return [{"type": p["type"], "text": p.get("text") if p["type"] == "text" else None} for p in content]


def _messages(text: str) -> list[dict]:
    return [{"role": m["role"], "content": _parts(m["content"])} for m in json.loads(text)]


def _image_cells(pngs: list[bytes]) -> list[dict]:
    return [{"bytes": b, "path": None} for b in pngs]


def _features(columns: list[str]):
    from datasets import Features, Image, List, Value

    part = {"type": Value("string"), "text": Value("string")}
    chat = List({"role": Value("string"), "content": List(part)})
    return Features({SAMPLE_ID: Value("string"), LENGTH: Value("int64"), "images": List(Image()),
                     **{c: chat for c in columns}})


def _length(row: dict, columns: list[str]) -> int:
    """The row's sort key for length-grouped batches: image count, then characters of text."""
    chars = sum(len(part["text"] or "") for c in columns for m in row[c] for part in m["content"])
    return _IMAGE_WEIGHT * len(row["images"]) + chars


@dataclass
class TrainingData:
    """A training dataset read from storage, with the manifest that names it in lineage."""

    rows: list[dict]
    manifest: Manifest
    uri: str

    @property
    def lineage(self) -> dict[str, str]:
        return {"path": self.uri, "content_hash": self.manifest.content_hash, "kind": self.manifest.kind,
                "rows": str(self.manifest.row_count)}


def read_training_data(uri: str, kind: str) -> TrainingData:
    """Read and verify (manifest, schema, content hash) a training dataset of the given record kind."""
    table, manifest = read_dataset(uri, kind)
    if table.num_rows == 0:
        raise ValueError(f"training dataset at {uri} has no rows")
    return TrainingData(rows=table.to_pylist(), manifest=manifest, uri=uri)


def sft_rows(rows: list[dict], completion_only_loss: bool = True) -> list[dict]:
    """TRL SFT rows. With completion_only_loss the final assistant message becomes the completion, so the loss
    covers the judge's answer (analysis + rating), not the prompt."""
    out = []
    for r in rows:
        msgs = _messages(r["messages"])
        row = {SAMPLE_ID: r["sft_id"], "images": _image_cells(r["images"])}
        if completion_only_loss:
            row.update(prompt=msgs[:-1], completion=msgs[-1:])
        else:
            row["messages"] = msgs
        out.append(row)
    return out


def dpo_rows(rows: list[dict]) -> list[dict]:
    """TRL DPO rows (prompt / chosen / rejected chat messages, images in the prompt)."""
    return [{SAMPLE_ID: r["dpo_id"], "images": _image_cells(r["images"]), "prompt": _messages(r["prompt"]),
             "chosen": _messages(r["chosen"]), "rejected": _messages(r["rejected"])} for r in rows]


def chosen_rows(rows: list[dict]) -> list[dict]:
    """TRL SFT rows of the chosen answers of preference pairs (best-of-N SFT): the loss covers the answer."""
    return [{SAMPLE_ID: r["dpo_id"], "images": _image_cells(r["images"]), "prompt": _messages(r["prompt"]),
             "completion": _messages(r["chosen"])} for r in rows]


def to_hf_dataset(rows: list[dict]):
    """A map-style `datasets.Dataset` whose images decode to PIL on access."""
    from datasets import Dataset

    columns = [c for c in ("messages", "prompt", "completion", "chosen", "rejected") if c in rows[0]]
    return Dataset.from_list([r | {LENGTH: _length(r, columns)} for r in rows], features=_features(columns))


class SampleIdCollator:
    """Wraps a TRL collator: removes `sample_id` (and the length sort key) from each example and returns the ids
    as `sample_ids`."""

    def __init__(self, inner):
        self.inner = inner

    def __call__(self, examples: list[dict]) -> dict:
        ids = [e.pop(SAMPLE_ID) for e in examples]
        for e in examples:
            e.pop(LENGTH, None)
        batch = self.inner(examples)
        batch[SAMPLE_IDS] = ids
        return batch
