"""The vision side of an image-text-to-text model, whatever its architecture: the parameters that make the image
features its language model reads (the vision encoder and the projector), and those features for a batch of
images.

Qwen2-VL keeps both in `model.visual` (the patch merger is its projector); LLaVA has `model.vision_tower` and
`model.multi_modal_projector`. Recipes that fine-tune such models commonly keep this side fixed (LLaVA's
instruction tuning freezes the CLIP encoder; LLaMA-Factory freezes a VLM's vision tower and projector by default).
"""

from __future__ import annotations

import re

import torch

VISION_MODULES = ("visual", "vision_tower", "multi_modal_projector")
# PEFT's exclude_modules: no LoRA adapter inside the vision side when it is frozen
LORA_EXCLUDE = r".*\b(" + "|".join(VISION_MODULES) + r")\..*"
_VISION = re.compile(r"(^|\.)(" + "|".join(VISION_MODULES) + r")\.")


def is_vision(name: str) -> bool:
    """Is this parameter (or module) name part of the vision encoder or its projector?"""
    return bool(_VISION.search(name))


def vision_parameters(model: torch.nn.Module) -> list[torch.nn.Parameter]:
    params = [p for n, p in model.named_parameters() if is_vision(n)]
    if not params:
        raise ValueError(f"{type(model).__name__} has no parameters under {', '.join(VISION_MODULES)}: "
                         "not an image-text-to-text model this project knows")
    return params


def freeze_vision(model: torch.nn.Module) -> int:
    """Stop gradients into the vision encoder and projector; returns how many parameters were frozen."""
    params = vision_parameters(model)
    for p in params:
        p.requires_grad_(False)
    return sum(p.numel() for p in params)


def image_features(model, processor, images: list) -> torch.Tensor:
    """(batch, tokens, hidden): each image's features as the language model receives them, in the raster order
    of the image's token grid (every image of the batch must give the same number of tokens)."""
    inputs = processor.image_processor(images=images, return_tensors="pt")
    inner = model.model
    if "image_grid_thw" in inputs:  # Qwen2-VL: variable grids, described per image
        out = inner.get_image_features(inputs["pixel_values"], inputs["image_grid_thw"])
    else:  # LLaVA: which layer and whether the CLS token is dropped live in the config
        out = inner.get_image_features(inputs["pixel_values"],
                                       vision_feature_layer=model.config.vision_feature_layer,
                                       vision_feature_select_strategy=model.config.vision_feature_select_strategy)
    return torch.stack(list(out.pooler_output))
