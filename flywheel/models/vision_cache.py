"""Each image's vision features computed once per training while the vision side is frozen.

A VLM training here keeps the vision encoder and projector fixed (train.freeze_vision), so an image's features are
a pure function of its pixels, yet every step runs the vision tower again on every image of the batch: an SFT
sees each image once per epoch and per row that shows it (a prompt's candidates share its input image), and DPO
runs it for the chosen and the rejected row and again for the reference pass. Profiled on the local judge SFT, the
vision tower was ~40% of the forward pass. No library memoises encoder outputs inside a trainer (TRL's
precompute_ref_log_probs is refused for image datasets), hence this wrapper of the model's own
`get_image_features`: images it has seen come from the cache, the rest go through the tower in one call.

The cache is off whenever a vision parameter requires a gradient (the features would then change), and bounded
in bytes (least recently used entries go first). Kept on the features' device: a GPU model's features stay there.
"""

from __future__ import annotations

import hashlib
import logging
from collections import OrderedDict
from itertools import pairwise

import torch

log = logging.getLogger(__name__)


class ImageFeatureCache:
    """Per-image features of one model's frozen vision side, keyed by the image's pixels (and how they were read)."""

    def __init__(self, vision: list[torch.nn.Parameter], max_bytes: int):
        self.vision, self.max_bytes = vision, max_bytes
        self.entries: OrderedDict[bytes, torch.Tensor] = OrderedDict()
        self.bytes = self.hits = self.misses = 0

    def frozen(self) -> bool:
        return not any(p.requires_grad for p in self.vision)

    def lookup(self, keys: list[bytes], compute) -> list[torch.Tensor]:
        """Each key's features: cached ones as they are, the missing ones (each distinct key once) from
        `compute(positions)`, which returns the features of the images at those positions, in order."""
        found = {}
        for k in keys:
            if k in self.entries:
                self.entries.move_to_end(k)
                found[k] = self.entries[k]
        missing = [k for k in dict.fromkeys(keys) if k not in found]
        self.hits += len(keys) - len(missing)
        self.misses += len(missing)
        if missing:
            for k, feats in zip(missing, compute([keys.index(k) for k in missing]), strict=True):
                found[k] = feats.detach()
                self._put(k, found[k])
        return [found[k] for k in keys]

    def _put(self, key: bytes, feats: torch.Tensor) -> None:
        size = feats.numel() * feats.element_size()
        if size > self.max_bytes:
            return
        self.entries[key] = feats
        self.bytes += size
        while self.bytes > self.max_bytes:
            _, old = self.entries.popitem(last=False)
            self.bytes -= old.numel() * old.element_size()


def _key(pixels: torch.Tensor, *extra) -> bytes:
    h = hashlib.blake2b(pixels.detach().cpu().contiguous().numpy().tobytes(), digest_size=16)
    h.update(repr(extra).encode())
    return h.digest()


def _vlm_inner(model: torch.nn.Module):
    """The module whose `get_image_features` runs the vision side (Qwen2-VL's `visual`, LLaVA's `vision_tower`),
    through any PEFT wrapping; None if there is none."""
    for module in model.modules():
        if hasattr(module, "get_image_features") and (hasattr(module, "visual") or hasattr(module, "vision_tower")):
            return module
    return None


def cache_image_features(model: torch.nn.Module, max_bytes: int) -> ImageFeatureCache | None:
    """Wrap the model's `get_image_features` with a per-image cache (once); returns the cache, or None for a
    model without a known vision side."""
    inner = _vlm_inner(model)
    if inner is None:
        return None
    if isinstance(getattr(inner, "_image_feature_cache", None), ImageFeatureCache):
        return inner._image_feature_cache
    from transformers.modeling_outputs import BaseModelOutputWithPooling

    from flywheel.models.vision import vision_parameters

    cache = ImageFeatureCache(vision_parameters(inner), max_bytes)
    original = inner.get_image_features

    if hasattr(inner, "visual"):  # Qwen2-VL: an image is grid.prod() consecutive patch rows
        def get_image_features(pixel_values, image_grid_thw=None, **kwargs):
            if image_grid_thw is None or kwargs.get("return_dict") is False or not cache.frozen():
                return original(pixel_values, image_grid_thw, **kwargs)
            bounds = torch.cat([image_grid_thw.new_zeros(1), image_grid_thw.prod(-1).cumsum(0)]).tolist()
            rows = [pixel_values[a:b] for a, b in pairwise(bounds)]
            keys = [_key(r, tuple(g)) for r, g in zip(rows, image_grid_thw.tolist(), strict=True)]

            def compute(idx):
                picked = torch.cat([rows[i] for i in idx])
                return original(picked, image_grid_thw[idx], **kwargs).pooler_output

            with torch.no_grad():
                return BaseModelOutputWithPooling(pooler_output=tuple(cache.lookup(keys, compute)))
    else:  # LLaVA: one image per leading index
        def get_image_features(pixel_values, **kwargs):
            if (kwargs.get("image_sizes") is not None or kwargs.get("return_dict") is False
                    or not cache.frozen()):
                return original(pixel_values, **kwargs)
            # None means the config's choice (merged in by transformers): key on what is actually read
            read = tuple(getattr(inner.config, k) if kwargs.get(k) is None else kwargs[k]
                         for k in ("vision_feature_layer", "vision_feature_select_strategy"))
            keys = [_key(p, read) for p in pixel_values]

            def compute(idx):
                return original(pixel_values[idx], **kwargs).pooler_output

            with torch.no_grad():
                return BaseModelOutputWithPooling(pooler_output=list(cache.lookup(keys, compute)))

    inner.get_image_features = get_image_features
    inner._image_feature_cache = cache
    log.info("vision frozen: each image's features computed once (cache up to %d MB)", max_bytes >> 20)
    return cache

