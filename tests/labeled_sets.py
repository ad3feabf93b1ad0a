"""Labeled items in `flywheel eval --data`'s JSONL format (flywheel/evaluate/labeled.py), for the tests that
write small human-labelled sets: gold files, eval jobs, prompt files."""

import base64
import io
import json
from pathlib import Path

from PIL import Image


def png_b64(colour: str = "red", size: int = 56) -> str:
    """A flat image as the base64 PNG string the JSONL formats carry."""
    buf = io.BytesIO()
    Image.new("RGB", (size, size), colour).save(buf, format="PNG")
    return base64.b64encode(buf.getvalue()).decode()


def point(prompt: dict, text: str, score) -> dict:
    return {"type": "pointwise", "prompt": prompt, "response": {"text": text}, "score": score}


def pair(prompt: dict, a: str, b: str, winner) -> dict:
    return {"type": "pairwise", "prompt": prompt, "response_a": {"text": a}, "response_b": {"text": b},
            "winner": winner}


def write_jsonl(path: Path, items: list, tail: str = "") -> Path:
    """One JSON object a line, then `tail` (e.g. a line that is not JSON)."""
    path.write_text("".join(json.dumps(x) + "\n" for x in items) + tail)
    return path
