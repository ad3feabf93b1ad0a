"""Deduplication: exact (by content-hash id) for any record kind, and near-duplicate prompts (same task,
normalised query text and image hashes).

Near-dup keeps, of each group, the prompt with the smallest prompt_id (so the result does not depend on row
order) and counts the rest as "near_duplicate". Run it before splitting or balancing: balanced sets repeat rows
on purpose.
"""
from __future__ import annotations

import hashlib
import io
import re
import unicodedata
from collections import Counter
from collections.abc import Iterable

from PIL import Image

from flywheel.curate.config import DedupConfig
from flywheel.curate.report import FilterReport, make_report
from flywheel.records import id_field, make_id


def dedup_exact(rows: Iterable[dict], kind: str) -> tuple[list[dict], FilterReport]:
    """First row of each content id (computed with make_id when a row has none) of a record kind."""
    rows = list(rows)
    key, seen, out, dropped = id_field(kind), set(), [], Counter()
    for r in rows:
        rid = r.get(key) or make_id(kind, r)
        if rid in seen:
            dropped["duplicate_id"] += 1
            continue
        seen.add(rid)
        out.append(r)
    return out, make_report(f"dedup_{kind}", len(rows), len(out), dropped)


_PUNCT = re.compile(r"[^\w\s]", re.UNICODE)


def normalise_text(text: str | None) -> str:
    """NFKC, case-folded, punctuation removed, whitespace collapsed: 'A red  Circle!' == 'a red circle'."""
    t = unicodedata.normalize("NFKC", text or "").casefold()
    return " ".join(_PUNCT.sub(" ", t).split())


def image_hash(png: bytes, method: str = "pixels") -> str:
    """pixels: sha256 of the decoded RGB pixels and size (PNG encoding does not matter); ahash: the 8x8 average
    hash (64 bits as hex), equal for slightly altered copies."""
    with Image.open(io.BytesIO(bytes(png))) as im:
        rgb = im.convert("RGB")
    if method == "pixels":
        return hashlib.sha256(f"{rgb.size}".encode() + rgb.tobytes()).hexdigest()
    if method == "ahash":
        small = list(rgb.convert("L").resize((8, 8), Image.Resampling.BOX).tobytes())
        mean = sum(small) / 64
        return f"{sum(1 << i for i, v in enumerate(small) if v > mean):016x}"
    raise ValueError(f"unknown image hash {method!r}; valid: pixels, ahash")


def prompt_key(prompt: dict, method: str = "pixels") -> tuple:
    """What near-duplicate prompts share: task, normalised query, hashes of the input images in order."""
    return (prompt.get("task"), normalise_text(prompt.get("query")),
            tuple(image_hash(b, method) for b in prompt.get("images") or []))


def dedup_prompts(prompts: Iterable[dict], cfg: DedupConfig | None = None) -> tuple[list[dict], FilterReport]:
    """Exact dedup by prompt_id, then (if cfg.prompts) near-dup by prompt_key."""
    cfg = cfg or DedupConfig()
    rows, rep = dedup_exact(prompts, "prompt")
    dropped = Counter(rep.dropped)
    if cfg.prompts:
        ids = [r.get("prompt_id") or make_id("prompt", r) for r in rows]
        best: dict[tuple, str] = {}
        keys = [prompt_key(r, cfg.image_hash) for r in rows]
        for k, pid in zip(keys, ids, strict=True):
            best[k] = min(best.get(k, pid), pid)
        kept = [r for r, k, pid in zip(rows, keys, ids, strict=True) if best[k] == pid]
        dropped["near_duplicate"] += len(rows) - len(kept)
        rows = kept
    return rows, make_report("dedup_prompts", rep.rows_in, len(rows), dropped)
