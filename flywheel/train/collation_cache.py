"""Each row of a vision SFT collated once per training, not once per epoch.

TRL's vision collator (DataCollatorForVisionLanguageModeling) renders the chat template, tokenises and runs the
image processor (resize, normalise, patchify) on every row of every batch, because upfront processing of a large
image set would not fit (its docstring). On the local judge SFT that is ~18% of a step, redone in each of its 2.4
epochs. Here each row's own collation (TRL's collator on that row alone) is kept, keyed by its sample id (a
content hash), and a batch is its rows' outputs put together: sequences right-padded as TRL's flush-left leaves
them, image tensors concatenated. A processed image many rows show (a prompt's candidates share its image) is
kept once. No library keeps processed rows across epochs for a VLM trainer.

The first batch of each mix of row kinds (rows with images, without, both) is also collated by TRL whole and
compared, tensor by tensor: a processor whose batch is not its rows' outputs put together (one that pads images
to the batch's largest, say) turns the cache off, logged, and TRL collates as before. Bounded in bytes, least
recently used rows dropped first.
"""

from __future__ import annotations

import hashlib
import logging
from collections import OrderedDict

import torch

log = logging.getLogger(__name__)
# what TRL's collator leaves in the padding of each sequence tensor (input_ids: the tokenizer's pad id); 0 otherwise
PAD_VALUES = {"labels": -100}


class RowCollationCache:
    """Collates a batch of examples from their ids: TRL's collator once per row, then put together."""

    def __init__(self, inner, pad_token_id: int, max_bytes: int):
        self.inner, self.max_bytes = inner, max_bytes
        self.pads = PAD_VALUES | {"input_ids": pad_token_id}
        self.rows: OrderedDict[str, dict[str, torch.Tensor]] = OrderedDict()
        self.shared: dict[bytes, list] = {}  # an image tensor's digest -> [tensor, rows holding it]
        self.digests: dict[str, list[bytes]] = {}  # sample id -> its image tensors' digests
        self.checked: set[frozenset] = set()  # the mixes of row kinds (their keys) checked against TRL
        self.bytes = self.hits = self.misses = 0
        self.on = True

    def __call__(self, ids: list[str], examples: list[dict]) -> dict:
        if not self.on:
            return self.inner(examples)
        try:  # the collator rewrites its examples' keys: each row gets a copy
            rows = [self._row(i, e) for i, e in zip(ids, examples, strict=True)]
            merged = self._merge(rows)
        except (ValueError, RuntimeError) as e:
            self._off(str(e))
            return self.inner(examples)
        kind = frozenset(frozenset(r) for r in rows)
        if kind in self.checked:
            return merged
        whole = self.inner([dict(e) for e in examples])
        differs = _difference(whole, merged)
        if differs:
            self._off(f"TRL's batch is not its rows' collations put together: {differs}")
        else:
            self.checked.add(kind)
        return whole

    def _off(self, why: str) -> None:
        log.warning("collation cache off: %s", why)
        self.on, self.rows, self.shared, self.digests, self.bytes = False, OrderedDict(), {}, {}, 0

    def _row(self, sample_id: str, example: dict) -> dict[str, torch.Tensor]:
        if sample_id in self.rows:
            self.rows.move_to_end(sample_id)
            self.hits += 1
            return self.rows[sample_id]
        self.misses += 1
        out = dict(self.inner([dict(example)]))
        if not all(isinstance(v, torch.Tensor) for v in out.values()):
            raise ValueError(f"not tensors: {sorted(k for k, v in out.items() if not isinstance(v, torch.Tensor))}")
        if _size(out.values()) > self.max_bytes:
            return out
        digests = self.digests[sample_id] = []
        for key, value in out.items():
            if _sequence(value, out):
                self.bytes += _size([value])
                continue
            digests.append(_digest(value))
            if digests[-1] not in self.shared:
                self.shared[digests[-1]] = [value, 0]
                self.bytes += _size([value])
            self.shared[digests[-1]][1] += 1
            out[key] = self.shared[digests[-1]][0]
        self.rows[sample_id] = out
        while self.bytes > self.max_bytes:
            self._drop(*self.rows.popitem(last=False))
        return out

    def _drop(self, sample_id: str, row: dict[str, torch.Tensor]) -> None:
        self.bytes -= _size([v for v in row.values() if _sequence(v, row)])
        for digest in self.digests.pop(sample_id):
            self.shared[digest][1] -= 1
            if not self.shared[digest][1]:
                self.bytes -= _size([self.shared.pop(digest)[0]])

    def _merge(self, rows: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
        """Sequence tensors ([1, length of input_ids], in every row) right-padded to the longest row; image tensors
        (pixel values, image grids) of the rows that have them concatenated along their first axis."""
        longest = max(r["input_ids"].shape[1] for r in rows)
        out = {}
        for key in dict.fromkeys(k for r in rows for k in r):
            have = [r for r in rows if key in r]
            if not any(_sequence(r[key], r) for r in have):
                out[key] = torch.cat([r[key] for r in have], dim=0)
            elif len(have) == len(rows) and all(_sequence(r[key], r) for r in rows):
                pad = self.pads.get(key, 0)
                out[key] = torch.cat([torch.nn.functional.pad(r[key], (0, longest - r[key].shape[1]), value=pad)
                                      for r in rows], dim=0)
            else:
                raise ValueError(f"{key} is a sequence in some rows only")
        return out


def _sequence(value: torch.Tensor, row: dict[str, torch.Tensor]) -> bool:
    return value.dim() == 2 and value.shape[0] == 1 and value.shape[1] == row["input_ids"].shape[1]


def _size(tensors) -> int:
    return sum(v.numel() * v.element_size() for v in tensors)


def _digest(value: torch.Tensor) -> bytes:
    data = value.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes()
    return hashlib.blake2b(data, digest_size=16).digest() + repr((value.dtype, tuple(value.shape))).encode()


def _difference(whole, merged: dict) -> str | None:
    """What differs between TRL's batch and the merged one (None: identical keys, dtypes, shapes and values)."""
    if set(whole.keys()) != set(merged):
        return f"keys {sorted(whole.keys())} against {sorted(merged)}"
    for key, value in whole.items():
        other = merged[key]
        if not isinstance(value, torch.Tensor):
            return f"{key} is a {type(value).__name__}"
        if value.dtype != other.dtype or value.shape != other.shape or not torch.equal(value, other):
            return f"{key}: {value.dtype} {tuple(value.shape)} against {other.dtype} {tuple(other.shape)}"
    return None
