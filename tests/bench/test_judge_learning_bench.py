"""bench/judge_learning.py --caption-checks: the rows it adds to judge SFT must be the caption-check bench's rows,
whole (image, request, answer), or its number would say the look-up was kept in the mix when it was not."""

import numpy as np
from bench_scripts import load_bench
from PIL import Image

from flywheel.config import REPO_ROOT, load_config
from flywheel.train.data import SAMPLE_ID, sft_rows, to_hf_dataset

bench = load_bench("judge_learning")
CFG = load_config(str(REPO_ROOT / "configs" / "local.yaml"))


def test_caption_check_rows_are_the_check_benchs_rows_as_training_rows(monkeypatch):
    monkeypatch.syspath_prepend(str(REPO_ROOT / "bench"))
    from judge_caption_check import check_row

    rows = bench.caption_check_rows(CFG, 6)
    data = to_hf_dataset(sft_rows(rows))  # the judge SFT's own row conversion takes them as a run's rows
    rng = np.random.default_rng(CFG.run.seed)
    expected = [check_row(rng, CFG.world.shapes, "colour", "teacher")[0] for _ in range(6)]
    assert len({r[SAMPLE_ID] for r in data}) == 6
    for got, want in zip(data, expected, strict=True):
        assert got["completion"][0]["content"][0]["text"] == want["completion"][0]["content"][0]["text"]
        assert [p["text"] for p in got["prompt"][0]["content"]] == [p.get("text") for p in want["prompt"][0]["content"]]
        (image,) = got["images"]
        assert isinstance(image, Image.Image)
        assert np.array_equal(np.asarray(image.convert("RGB")), np.asarray(want["images"][0].convert("RGB")))
