"""Records: Arrow schemas, content-hash ids, image checks, and validation with quarantine (DESIGN.md "Records").

Rows are plain dicts; images are PNG bytes (flywheel.images). Writing and reading datasets is in flywheel.datasets.
"""
from __future__ import annotations

import base64
import hashlib
import json
import math
from dataclasses import dataclass
from typing import Any, Iterable

import numpy as np
import pyarrow as pa
from pydantic import BaseModel, ConfigDict, Field

from flywheel.images import PNG_MAGIC, ImageError, as_png, load_image, to_png_bytes  # noqa: F401 (re-exported)


class RecordLimits(BaseModel):
    """Size limits a record must respect; a row beyond any of them is quarantined, never truncated."""

    model_config = ConfigDict(extra="forbid")
    max_text_chars: int = Field(20000, gt=0, description="Longest allowed text field, in characters.")
    max_image_pixels: int = Field(4096 * 4096, gt=0, description="Largest width*height of one image; checked "
                                  "from the header before decoding, to stop decompression bombs.")
    max_image_bytes: int = Field(16 * 2**20, gt=0, description="Largest encoded size of one image, in bytes.")
    max_images: int = Field(8, ge=0, description="Most images in one image-list field of one record.")


@dataclass(frozen=True)
class _F:
    name: str
    type: str  # id | str | json (str holding JSON) | int32 | float64 | strs | images
    nullable: bool = False  # may be null, and so may be omitted
    content: bool = False  # part of the content-hash id
    choices: tuple[str, ...] = ()


# List children are named "element" as Parquet names them, so a written table reads back with an equal schema.
_ARROW = {"id": pa.string(), "str": pa.string(), "json": pa.string(), "int32": pa.int32(), "float64": pa.float64(),
          "strs": pa.list_(pa.field("element", pa.string())), "images": pa.list_(pa.field("element", pa.binary()))}
TASKS, SPLITS = ("nlg", "iu", "ig", "itig"), ("train", "id-test", "ood-test")
PROTOCOLS = ("pointwise", "pairwise", "aspects", "rubric", "decomposed", "claims")
# Content fields are what the record *is*; labels (split), annotations (aspects, meta) and values derived from
# a raw output (parsed, score, analysis) are not, so re-labelling or re-parsing keeps ids and lineage stable.
_SPECS: dict[str, tuple[_F, ...]] = {
    "prompt": (_F("prompt_id", "id"), _F("task", "str", content=True, choices=TASKS),
               _F("subtask", "str", content=True), _F("query", "str", content=True),
               _F("images", "images", content=True), _F("reference_text", "str", True, True),
               _F("reference_images", "images", content=True), _F("aspects", "strs"),
               _F("source", "str", content=True), _F("split", "str", choices=SPLITS), _F("meta", "json", True)),
    "candidate": (_F("candidate_id", "id"), _F("prompt_id", "str", content=True), _F("producer", "str", content=True),
                  _F("output_text", "str", True, True), _F("output_images", "images", content=True),
                  _F("sample_index", "int32", content=True), _F("meta", "json", True)),
    "judgment": (_F("judgment_id", "id"), _F("prompt_id", "str", content=True),
                 _F("candidate_ids", "strs", content=True),
                 _F("judge", "str", content=True), _F("protocol", "str", content=True, choices=PROTOCOLS),
                 _F("aspect", "str", True, True), _F("order", "str", True, True, ("AB", "BA")),
                 _F("sample_k", "int32", content=True), _F("raw_output", "str", content=True),
                 _F("parsed", "json", True), _F("score", "float64", True), _F("verdict", "str", True),
                 _F("parse_error", "str", True), _F("analysis", "str", True)),
    "pair": (_F("pair_id", "id"), _F("kind", "str", content=True, choices=("judge", "policy")),
             _F("prompt_id", "str", content=True), _F("chosen_id", "str", content=True),
             _F("rejected_id", "str", content=True), _F("chosen_score", "float64"), _F("rejected_score", "float64"),
             _F("margin", "float64"), _F("judge", "str", content=True), _F("meta", "json", True)),
    # Training rows (flywheel.train), in TRL's row formats. Messages are JSON lists of chat messages whose
    # {"type": "image"} parts consume `images` in order. The row *is* its images and text; where it came from
    # (protocol, subtask, upstream ids) is annotation, so relabelling keeps ids stable.
    "sft": (_F("sft_id", "id"), _F("images", "images", content=True), _F("messages", "json", content=True),
            _F("task", "str", True, choices=TASKS), _F("protocol", "str", True, choices=PROTOCOLS),
            _F("subtask", "str", True), _F("source_ids", "strs"), _F("meta", "json", True)),
    "dpo": (_F("dpo_id", "id"), _F("target", "str", content=True, choices=("judge", "policy")),
            _F("images", "images", content=True), _F("prompt", "json", content=True),
            _F("chosen", "json", content=True), _F("rejected", "json", content=True),
            _F("chosen_score", "float64", True), _F("rejected_score", "float64", True), _F("margin", "float64", True),
            _F("protocol", "str", True, choices=PROTOCOLS), _F("subtask", "str", True), _F("pair_id", "str", True),
            _F("source_ids", "strs"), _F("meta", "json", True)),
    # One prompt with a preferred and a dispreferred image (exactly one PNG each) for Diffusion-DPO.
    "image_pref": (_F("image_pref_id", "id"), _F("prompt", "str", content=True),
                   _F("chosen", "images", content=True), _F("rejected", "images", content=True),
                   _F("chosen_score", "float64", True), _F("rejected_score", "float64", True),
                   _F("margin", "float64", True), _F("judge", "str", True), _F("prompt_id", "str", True),
                   _F("pair_id", "str", True), _F("source_ids", "strs"), _F("meta", "json", True)),
}
KINDS = tuple(_SPECS)
_PREFIX = {"prompt": "pr", "candidate": "ca", "judgment": "ju", "pair": "pa", "sft": "sf", "dpo": "dp",
           "image_pref": "ip"}
SCHEMAS: dict[str, pa.Schema] = {
    k: pa.schema([pa.field(f.name, _ARROW[f.type], nullable=f.nullable) for f in s]) for k, s in _SPECS.items()}


def _spec(kind: str) -> tuple[_F, ...]:
    if kind not in _SPECS:
        raise ValueError(f"unknown record kind {kind!r}; expected one of {'|'.join(KINDS)}")
    return _SPECS[kind]


def id_field(kind: str) -> str:
    return _spec(kind)[0].name  # the id is always the first field


# ---------------------------------------------------------------- field checks
_MISSING = object()


class _Invalid(Exception):
    def __init__(self, field: str, msg: str):
        super().__init__(f"{field}: {msg}")
        self.field = field


def _text(name: str, v: Any, limits: RecordLimits | None) -> str:
    if isinstance(v, (bytes, bytearray, memoryview)):
        b = bytes(v)
        try:
            v = b.decode("utf-8")
        except UnicodeDecodeError as e:
            raise _Invalid(name, f"invalid UTF-8 (byte 0x{b[e.start]:02x} at {e.start})") from None
    elif not isinstance(v, str):
        raise _Invalid(name, f"expected str, got {type(v).__name__}")
    try:
        v.encode("utf-8")
    except UnicodeEncodeError as e:  # lone surrogates: a Python str that no UTF-8 file can hold
        raise _Invalid(name, f"invalid UTF-8 (lone surrogate U+{ord(v[e.start]):04X} at {e.start})") from None
    if limits is not None and len(v) > limits.max_text_chars:
        raise _Invalid(name, f"{len(v)} chars exceeds max_text_chars={limits.max_text_chars}")
    return str(v)


def _reject_constant(name: str):
    raise ValueError(f"{name} is not valid JSON")  # Python's json accepts NaN/Infinity; other readers do not


def _value(f: _F, v: Any, limits: RecordLimits | None, decode_images: bool) -> Any:
    """The normalised value of field f, or _Invalid. Images are only decoded when decode_images is set."""
    n, t = f.name, f.type
    if t == "float64" and f.nullable and isinstance(v, (float, np.floating)) and math.isnan(v):
        v = None  # numpy batches (Ray) have no null for floats: a null arrives as NaN
    if v is _MISSING or v is None:
        if t in ("strs", "images"):
            return []
        if f.nullable or t == "id":
            return None  # a missing own id is filled by validate() from the content hash
        raise _Invalid(n, "missing required field" if v is _MISSING else "null is not allowed")
    if t in ("str", "id"):
        v = _text(n, v, limits)
        if f.choices and v not in f.choices:
            raise _Invalid(n, f"{v!r} is not one of {'|'.join(f.choices)}")
        return v
    if t == "json":
        if not isinstance(v, (str, bytes, bytearray, memoryview)):
            try:  # structured values are accepted and stored as canonical JSON text
                v = json.dumps(v, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
            except (TypeError, ValueError) as e:
                raise _Invalid(n, f"expected JSON text or a JSON-serialisable value ({e})") from None
        v = _text(n, v, limits)
        try:
            json.loads(v, parse_constant=_reject_constant)
        except ValueError as e:
            raise _Invalid(n, f"invalid JSON ({e})") from None
        return v
    if t == "int32":
        if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)):
            raise _Invalid(n, f"expected int, got {type(v).__name__}")
        if not -2**31 <= int(v) < 2**31:
            raise _Invalid(n, f"{v} is outside the int32 range")
        return int(v)
    if t == "float64":
        if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, float, np.integer, np.floating)):
            raise _Invalid(n, f"expected float, got {type(v).__name__}")
        try:
            v = float(v)
        except OverflowError:
            raise _Invalid(n, f"{v} is outside the float64 range") from None
        if not math.isfinite(v):
            raise _Invalid(n, f"non-finite value {v}")
        return v
    if not isinstance(v, (list, tuple, np.ndarray)):
        raise _Invalid(n, f"expected list, got {type(v).__name__}")
    if t == "strs":
        return [_text(f"{n}[{i}]", x, limits) for i, x in enumerate(v)]
    if limits is not None and len(v) > limits.max_images:
        raise _Invalid(n, f"{len(v)} images exceeds max_images={limits.max_images}")
    out = []
    for i, x in enumerate(v):
        if not isinstance(x, (bytes, bytearray, memoryview)):
            raise _Invalid(f"{n}[{i}]", f"expected image bytes, got {type(x).__name__}")
        try:
            out.append(as_png(bytes(x), max_pixels=limits.max_image_pixels, max_bytes=limits.max_image_bytes)
                       if decode_images else bytes(x))
        except ImageError as e:
            raise _Invalid(f"{n}[{i}]", str(e)) from None
    return out


# ---------------------------------------------------------------- ids and hashes
def _canonical(values: list) -> bytes:
    """Canonical text of a list of field values; images enter by their sha256, so hashing stays cheap."""
    def enc(v):
        if isinstance(v, bytes):
            return "sha256:" + hashlib.sha256(v).hexdigest()
        return [enc(x) for x in v] if isinstance(v, list) else v
    return json.dumps([enc(v) for v in values], ensure_ascii=True, separators=(",", ":")).encode()


def make_id(kind: str, row: dict) -> str:
    """Content-hash id: sha256 over the kind's content fields (never Python's salted hash())."""
    try:
        vals = [_value(f, row.get(f.name, _MISSING), None, False) for f in _spec(kind) if f.content]
    except _Invalid as e:
        raise ValueError(f"make_id({kind}): {e}") from None
    return f"{_PREFIX[kind]}_{hashlib.sha256(kind.encode() + b'|' + _canonical(vals)).hexdigest()[:20]}"


def with_ids(kind: str, rows: Iterable[dict]) -> list[dict]:
    """Copies of rows with a missing id filled. Rows whose id cannot be computed are returned unchanged:
    validate() then quarantines them naming the bad field, instead of one bad row failing the batch."""
    out, key = [], id_field(kind)
    for row in rows:
        if isinstance(row, dict) and row.get(key) is None:
            try:
                row = {**row, key: make_id(kind, row)}
            except ValueError:
                pass
        out.append(row)
    return out


def content_hash(kind: str, data: pa.Table | pa.RecordBatch | list[dict]) -> str:
    """sha256 over every field of every row, in order, independent of Parquet encoding (see Manifest)."""
    return ContentHasher(kind).update(data).hexdigest()


def _pyrows(data: pa.Table | pa.RecordBatch | list[dict]) -> Iterable[dict]:
    if isinstance(data, pa.Table):
        for batch in data.to_batches():  # a record batch at a time: never the whole table as Python objects
            yield from batch.to_pylist()
    else:
        yield from data.to_pylist() if isinstance(data, pa.RecordBatch) else data


def hash_lines(kind: str, data: pa.Table | pa.RecordBatch | list[dict]) -> bytes:
    """What content_hash() feeds sha256 for these rows: one line of canonical JSON per row (ASCII, so a row never
    holds a newline). A process that made the rows (a Ray actor) sends these instead of the rows themselves."""
    names = [f.name for f in _spec(kind)]
    return b"".join(_canonical([row[n] for n in names]) + b"\n" for row in _pyrows(data))


class ContentHasher:
    """content_hash() fed chunk by chunk, in row order: after every row has gone in, hexdigest() equals
    content_hash(kind, all the rows), so a dataset is hashed (written or verified) without holding it whole."""

    def __init__(self, kind: str):
        self.kind = kind
        self._names = [f.name for f in _spec(kind)]
        self._h = hashlib.sha256(kind.encode() + b"\n")
        self.rows = 0

    def update(self, data: pa.Table | pa.RecordBatch | list[dict]) -> ContentHasher:
        for row in _pyrows(data):
            self._h.update(_canonical([row[n] for n in self._names]) + b"\n")
            self.rows += 1
        return self

    def update_lines(self, lines: bytes) -> int:
        """Feed hash_lines() output made elsewhere; returns the number of rows it held."""
        if lines and not lines.endswith(b"\n"):
            raise ValueError("hash lines must end with a newline (one line per row, from hash_lines)")
        n = lines.count(b"\n")
        self._h.update(lines)
        self.rows += n
        return n

    def hexdigest(self) -> str:
        return self._h.hexdigest()


def config_hash(obj: Any) -> str:
    """sha256 of canonical JSON (sorted keys) of a config dict or pydantic model."""
    if isinstance(obj, BaseModel):
        obj = obj.model_dump(mode="json")
    text = json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False)
    return hashlib.sha256(text.encode()).hexdigest()


# ---------------------------------------------------------------- validation and quarantine
def _cross_checks(kind: str, r: dict) -> list[_Invalid]:
    """Rules spanning fields, run once every field is well-typed."""
    errs = []
    if kind == "judgment":
        n, proto = len(r["candidate_ids"]), r["protocol"]
        want = {"pointwise": (1,), "pairwise": (2,)}.get(proto, (1, 2))
        if n not in want or len(set(r["candidate_ids"])) != n:
            errs.append(_Invalid("candidate_ids", f"{proto} needs {' or '.join(map(str, want))} distinct ids, got {n}"))
        if (r["order"] is None) != (n != 2):
            errs.append(_Invalid("order", "required (AB|BA) for two candidates, null for one"))
        parsed = [k for k in ("parsed", "score", "verdict") if r[k] is not None]
        if parsed and r["parse_error"] is not None:
            errs.append(_Invalid("parse_error", f"has both a parse_error and a parsed value ({', '.join(parsed)})"))
        elif not parsed and r["parse_error"] is None:
            errs.append(_Invalid("parse_error", "has neither a parsed value (parsed/score/verdict) nor a parse_error"))
    elif kind == "candidate" and r["output_text"] is None and not r["output_images"]:
        errs.append(_Invalid("output_text", "candidate has neither output_text nor output_images"))
    elif kind == "pair" and r["chosen_id"] == r["rejected_id"]:
        errs.append(_Invalid("rejected_id", "equals chosen_id"))
    elif kind in ("sft", "dpo", "image_pref"):
        errs.extend(_training_row_checks(kind, r))
    return errs


def _messages(name: str, text: str, roles: tuple[str, ...]) -> tuple[list, int] | _Invalid:
    """(messages, image placeholders) of a JSON chat, or the reason it is not one."""
    msgs = json.loads(text)
    if not isinstance(msgs, list) or not msgs:
        return _Invalid(name, "expected a non-empty JSON list of chat messages")
    n_images = 0
    for i, m in enumerate(msgs):
        if not isinstance(m, dict) or m.get("role") not in roles or "content" not in m:
            return _Invalid(name, f"message {i} needs a role in {'|'.join(roles)} and a content")
        content = m["content"]
        if isinstance(content, list):
            for part in content:
                if not isinstance(part, dict) or part.get("type") not in ("text", "image"):
                    return _Invalid(name, f"message {i}: content parts must be {{type: text|image}} dicts")
                n_images += part["type"] == "image"
        elif not isinstance(content, str):
            return _Invalid(name, f"message {i}: content must be a string or a list of parts")
    return msgs, n_images


def _training_row_checks(kind: str, r: dict) -> list[_Invalid]:
    errs: list[_Invalid] = []
    if kind == "image_pref":
        for f in ("chosen", "rejected"):
            if len(r[f]) != 1:
                errs.append(_Invalid(f, f"expected exactly one image, got {len(r[f])}"))
        if not errs and r["chosen"][0] == r["rejected"][0]:
            errs.append(_Invalid("rejected", "is the same image as chosen"))
        return errs
    if kind == "sft":
        got = _messages("messages", r["messages"], ("system", "user", "assistant"))
        if isinstance(got, _Invalid):
            return [got]
        msgs, n_images = got
        if msgs[-1]["role"] != "assistant":
            errs.append(_Invalid("messages", "the last message must be the assistant's answer to train on"))
    else:
        got = _messages("prompt", r["prompt"], ("system", "user", "assistant"))
        if isinstance(got, _Invalid):
            return [got]
        n_images = got[1]
        answers = []
        for f in ("chosen", "rejected"):
            a = _messages(f, r[f], ("assistant",))
            if isinstance(a, _Invalid):
                errs.append(a)
            elif a[1]:
                errs.append(_Invalid(f, "image parts belong in the prompt"))
            else:
                answers.append(a[0])
        if len(answers) == 2 and answers[0] == answers[1]:
            errs.append(_Invalid("rejected", "equals chosen"))
    if n_images != len(r["images"]):
        errs.append(_Invalid("images", f"{n_images} image placeholder(s) in the messages but {len(r['images'])} "
                                       "image(s)"))
    return errs


def _validate_row(kind: str, row: Any, limits: RecordLimits) -> dict:
    if not isinstance(row, dict):
        raise _Rejected([_Invalid("row", f"expected dict, got {type(row).__name__}")])
    specs = _spec(kind)
    known = {f.name for f in specs}
    errs = [_Invalid(str(k), "unknown field") for k in row if k not in known]
    out = {}
    for f in specs:
        try:
            out[f.name] = _value(f, row.get(f.name, _MISSING), limits, True)
        except _Invalid as e:
            errs.append(e)
    errs = errs or _cross_checks(kind, out)
    if not errs:
        key, computed = specs[0].name, make_id(kind, out)  # after normalisation: ids cover the stored PNG bytes
        if out[key] is None:
            out[key] = computed
        elif out[key] != computed:
            errs.append(_Invalid(key, f"{out[key]!r} does not match the content hash {computed!r} "
                                      "(compute it with make_id on the final row, or omit it to have it filled)"))
    if errs:
        raise _Rejected(errs)
    return out


class _Rejected(Exception):
    def __init__(self, errors: list[_Invalid]):
        super().__init__("; ".join(map(str, errors)))
        self.field = errors[0].field


def json_safe(v: Any) -> Any:
    """A JSON-safe copy of any row: bytes become {"$bytes": base64}, so nothing is lost (see restore_raw)."""
    if isinstance(v, (bytes, bytearray, memoryview)):
        return {"$bytes": base64.b64encode(bytes(v)).decode("ascii")}
    if isinstance(v, dict):
        return {str(k): json_safe(x) for k, x in v.items()}
    if isinstance(v, (list, tuple, np.ndarray)):
        return [json_safe(x) for x in v]
    if isinstance(v, np.generic):
        return json_safe(v.item())
    if v is None or isinstance(v, (str, int, float)):
        return v
    return {"$repr": repr(v)}  # e.g. a PIL image passed by mistake: keep what can be kept


def restore_raw(v: Any) -> Any:
    """Inverse of json_safe for bytes: {"$bytes": b64} back to bytes."""
    if isinstance(v, dict):
        if set(v) == {"$bytes"}:
            return base64.b64decode(v["$bytes"])
        return {k: restore_raw(x) for k, x in v.items()}
    return [restore_raw(x) for x in v] if isinstance(v, list) else v


def validate(kind: str, rows: Iterable[Any], limits: RecordLimits | None = None) -> tuple[list[dict], list[dict]]:
    """Split rows into normalised valid rows (ids filled, images PNG) and quarantine items with reasons."""
    limits = limits or RecordLimits()
    _spec(kind)
    valid, quarantined = [], []
    for i, row in enumerate(rows):
        try:
            valid.append(_validate_row(kind, row, limits))
        except _Rejected as e:
            quarantined.append({"kind": kind, "index": i, "reason": str(e), "field": e.field, "raw": json_safe(row)})
    return valid, quarantined


def to_rows(data: Any) -> list:
    """Rows from a list of dicts, a pyarrow Table/RecordBatch, or a Ray-style dict of numpy arrays/lists."""
    if isinstance(data, (pa.Table, pa.RecordBatch)):
        return data.to_pylist()
    if isinstance(data, dict):
        lengths = {k: len(v) for k, v in data.items()}
        if len(set(lengths.values())) > 1:
            raise ValueError(f"batch columns have different lengths: {lengths}")
        return [dict(zip(data, vals, strict=True)) for vals in zip(*data.values(), strict=True)]
    return list(data)


def to_table(kind: str, rows: list[dict]) -> pa.Table:
    """Arrow table of already-valid rows, in record batches small enough for 32-bit binary offsets."""
    image_fields = [f.name for f in _spec(kind) if f.type == "images"]
    schema, batches, start, size = SCHEMAS[kind], [], 0, 0
    for i, row in enumerate(rows):
        size += sum(len(b) for name in image_fields for b in row[name])
        if size > 2**30 or i + 1 == len(rows):
            batches.append(pa.RecordBatch.from_pylist(rows[start:i + 1], schema=schema))
            start, size = i + 1, 0
    return pa.Table.from_batches(batches, schema=schema)


def validate_table(kind: str, data: Any, limits: RecordLimits | None = None) -> tuple[pa.Table, list[dict]]:
    """validate() for batches (e.g. Ray Data map_batches): returns a typed Arrow table plus quarantine items."""
    valid, quarantined = validate(kind, to_rows(data), limits)
    return to_table(kind, valid), quarantined


def __getattr__(name: str):
    # The dataset API (Manifest, write_dataset, read_dataset, ...) lives in flywheel.datasets to keep files short;
    # it is reachable from here too, imported lazily because datasets imports this module.
    from flywheel import datasets
    if name in datasets.__all__:
        return getattr(datasets, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
