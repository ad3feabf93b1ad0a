"""Tokenizers trained on this machine for the tiny zoo checkpoints (no hub download is possible here).

Byte-level BPE with the full 256-byte initial alphabet: every string encodes, so there are no unknown tokens,
and merges learnt from a small corpus of the oracle world's and the judge protocols' vocabulary keep sequences
short enough for tiny models.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

COLOURS = ["red", "green", "blue", "yellow", "purple", "orange", "black", "white", "gray", "pink", "brown", "cyan"]
SHAPES = ["circle", "square", "triangle", "star", "rectangle", "ellipse"]
RELATIONS = ["left of", "right of", "above", "below", "next to", "on top of", "under"]
NUMBERS = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten"]
JUDGE_WORDS = (
    "Analysis: Rating: Score: Verdict: Response Output Question Answer Reference Criterion Task Aspect "
    "The image shows There is There are no a an the and of in with is are not which how many what colour color "
    "Draw describe Describe scene picture image text response better worse equal tie A B 1 2 3 4 5 6 7 8 9 10 "
    "correct incorrect missing extra hallucinated object objects shape shapes count position relation "
    "true false not sure yes no Yes No overall quality fluency coherence accuracy faithfulness rubric item "
    "appearance intrinsic relationship caption entities attributes relations explanation user assistant system"
)


def protocol_text() -> list[str]:
    """The judge protocols' templates and the guidelines: the judge reads them in every request, so learning
    their words as merges keeps requests a few hundred tokens long instead of a few thousand bytes."""
    import importlib

    from flywheel.config import REPO_ROOT

    lines = []
    for name in ("pointwise", "pairwise", "aspects", "rubric", "decomposed"):
        module = importlib.import_module(f"flywheel.judge.{name}")
        lines += [v for k, v in vars(module).items() if k.isupper() and isinstance(v, str)]
    for path in sorted((REPO_ROOT / "configs" / "guidelines").glob("*.yaml")):
        lines.append(path.read_text())
    return lines


def corpus(seed_lines: int = 3000) -> list[str]:
    """Deterministic training text covering scene descriptions, questions, judge prompts and outputs."""
    lines = [JUDGE_WORDS, *protocol_text()]
    combos = itertools.product(COLOURS, SHAPES)
    for i, (c, s) in enumerate(combos):
        c2, s2 = COLOURS[(i * 5 + 3) % len(COLOURS)], SHAPES[(i * 7 + 1) % len(SHAPES)]
        rel = RELATIONS[i % len(RELATIONS)]
        n = NUMBERS[1 + i % 4]
        lines += [
            f"A {c} {s} {rel} a {c2} {s2}.",
            f"The image shows a {c} {s} and a {c2} {s2}.",
            f"What colour is the {s}? The {s} is {c}.",
            f"How many {s}s are there? There are {n} {s}s. {1 + i % 4}",
            f"Is there a {c2} {s2} in the image? Yes. No.",
            f"Draw a {c} {s} {rel} a {c2} {s2}.",
            f"Analysis: the response mentions a {c} {s} that is not in the image. Rating: {1 + i % 5}",
            "Analysis: Response A is more accurate than Response B. Verdict: A",
        ]
    return (lines * (1 + seed_lines // max(len(lines), 1)))[:seed_lines]


def train_bpe(vocab_size: int, special_tokens: list[str]) -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=special_tokens,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus(), trainer=trainer)
    return tok


def _bpe_merges(words: dict[str, int], n_merges: int) -> list[tuple[str, str]]:
    """Plain BPE over word counts, ties broken by the pair itself: deterministic in every process (the
    `tokenizers` trainer breaks ties by hash order, so its merges can differ between two identical builds)."""
    seqs = {w: list(w[:-1]) + [w[-1] + "</w>"] for w in words}
    merges = []
    for _ in range(n_merges):
        counts: dict[tuple[str, str], int] = {}
        for w, seq in seqs.items():
            for pair in itertools.pairwise(seq):
                counts[pair] = counts.get(pair, 0) + words[w]
        if not counts:
            break
        best = max(counts.items(), key=lambda kv: (kv[1], kv[0]))[0]
        merges.append(best)
        for w, seq in seqs.items():
            out, i = [], 0
            while i < len(seq):
                if i + 1 < len(seq) and (seq[i], seq[i + 1]) == best:
                    out.append(seq[i] + seq[i + 1])
                    i += 2
                else:
                    out.append(seq[i])
                    i += 1
            seqs[w] = out
    return merges


def write_clip_vocab(out_dir: Path, vocab_size: int) -> tuple[Path, Path]:
    """vocab.json + merges.txt in CLIPTokenizer's format (lower-case words ending in `</w>`), from a BPE whose
    merges respect rank order. The world's prompts are weighted heavily, so "an orange triangle to the left of a
    yellow circle" is a dozen tokens, well inside the text encoders' 32 positions, not spelt out letter by letter.
    """
    world = [f"{n} {c} {s}" for n in ("a", "an", "two", "three") for c in COLOURS for s in [*SHAPES, "squares",
             "circles", "triangles"]] + [f"a {c} {s} {r} the {s}" for c in COLOURS for s in SHAPES for r in RELATIONS]
    counts: dict[str, int] = {}
    for line in world * 20 + corpus(400):
        for w in line.lower().split():
            w = "".join(ch for ch in w if ch.isalnum())
            if w:
                counts[w] = counts.get(w, 0) + 1
    alphabet = sorted(set("abcdefghijklmnopqrstuvwxyz0123456789.,?:!'-"))
    vocab: dict[str, int] = {}
    for tok in ["<|startoftext|>", "<|endoftext|>"] + alphabet + [c + "</w>" for c in alphabet]:
        vocab.setdefault(tok, len(vocab))
    merges = _bpe_merges(counts, max(vocab_size - len(vocab), 0))
    for a, b in merges:
        vocab.setdefault(a + b, len(vocab))
    out_dir.mkdir(parents=True, exist_ok=True)
    vocab_file, merges_file = out_dir / "vocab.json", out_dir / "merges.txt"
    vocab_file.write_text(json.dumps(vocab))
    merges_file.write_text("#version: 0.2\n" + "\n".join(f"{a} {b}" for a, b in merges) + "\n")
    return vocab_file, merges_file
