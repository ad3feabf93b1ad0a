"""Every update method trains the tiny models with held-out evaluation on, in this process (tests/train/
local_worker.py: the real TRL / diffusers code, Ray Train's worker context stood in): LLaVA DPO + SFT term and
best-of-N SFT, judge DPO on held-out gold, SDXL Diffusion-DPO and best-of-N SFT with the generic-quality probe,
plus an exact resume of the held-out state. The Ray Train path (guard, registry, gate) is test_policy_guard.py."""

import json
import math
from pathlib import Path

import pytest
from safetensors.torch import load_file
from tiny_iteration import ZOO_MODELS

from flywheel.config import REPO_ROOT, load_config
from flywheel.datasets import write_dataset
from flywheel.train.dpo import loss_terms
from flywheel.train.synthetic import dpo_records, image_pref_records

from .local_worker import LocalContext

TEXT_MEASURES = {"accuracy", "caption_recall", "format_valid", "repetition_rate", "mean_words"}


def _cfg(cfg, *extra):
    return load_config(REPO_ROOT / "configs" / "local.yaml", [
        f"run.workdir={cfg.run.workdir}", *ZOO_MODELS,
        "train.batch_size=4", "train.save_steps=1000", "train.logging_steps=1", "policy.generation.max_new_tokens=12",
        "judge.generation.max_new_tokens=16", *extra])


@pytest.fixture(scope="module")
def text_pairs(cfg, tmp_path_factory):
    out = {}
    for target in ("policy", "judge"):
        uri = str(tmp_path_factory.mktemp("pairs") / target)
        write_dataset(uri, "dpo", dpo_records(12, target=target), config_hash="t", producer="test")
        out[target] = uri
    return out


@pytest.fixture(scope="module")
def image_pairs(tmp_path_factory):
    uri = str(tmp_path_factory.mktemp("pairs") / "image")
    write_dataset(uri, "image_pref", image_pref_records(8), config_hash="t", producer="test")
    return uri


def test_dpo_sft_adds_an_sft_term_to_the_configured_losses(cfg):
    c = load_config(None, ["train.policy_dpo.loss_type=[sigmoid]", "train.policy_dpo.sft_weight=0.5"])
    assert loss_terms(c.train.resolved("policy_dpo", "dpo")) == (["sigmoid"], None)
    assert loss_terms(c.train.resolved("policy_dpo", "dpo_sft")) == (["sigmoid", "sft"], [1.0, 0.5])
    c = load_config(None, ["train.policy_dpo.loss_type=[sigmoid, sft]", "train.policy_dpo.loss_weights=[1, 2]"])
    assert loss_terms(c.train.resolved("policy_dpo", "dpo_sft")) == (["sigmoid", "sft"], [1.0, 2.0])  # once


def _assert_curves(ctx, steps: list[int], measures: set[str]):
    for m in measures:
        assert sorted(ctx.metrics.history(f"heldout.{m}")) == steps, m
    export, final, step = ctx.final
    assert [c["step"] for c in final["heldout.curves"]] == steps
    assert final["heldout.best_step"] in steps and final["heldout.evaluations"] == len(steps)
    start = final["heldout.curves"][0][final["heldout.target"]]
    assert final["heldout.start_value"] == start or math.isnan(start) and math.isnan(final["heldout.start_value"])
    return export, final


@pytest.mark.parametrize("method,judge", [("dpo_sft", "oracle"), ("bon_sft", "zoo:judge")])
def test_llava_update_methods_with_heldout_curves(zoo, cfg, text_pairs, tmp_path, method, judge):
    from flywheel.train import dpo

    c = _cfg(cfg, "train.policy_dpo.max_steps=4", "train.policy_dpo.heldout.every_steps=2",
             "train.policy_dpo.heldout.items=8", f"train.policy_dpo.heldout.judge={judge}")
    ctx = LocalContext(c, "policy_dpo", text_pairs["policy"], str(zoo["policy"]), str(tmp_path), method=method,
                       heldout_judge=judge)
    dpo.worker(ctx)
    export, final = _assert_curves(ctx, [0, 2, 4], TEXT_MEASURES)
    # the judge curve beside the oracle's: the oracle teacher always answers in format; the random zoo judge
    # never does, and its failures are recorded as failures (no score is imputed)
    failures = ctx.metrics.history("heldout.judge/pointwise/parse_failure_rate")
    scores = ctx.metrics.history("heldout.judge/pointwise/score")
    assert sorted(failures) == sorted(scores) == [0, 2, 4]
    if judge == "oracle":
        assert set(failures.values()) == {0.0} and all(1 <= v <= 5 for v in scores.values())
    else:
        assert set(failures.values()) == {1.0} and all(math.isnan(v) for v in scores.values())
    trained = ctx.metrics.keys()
    if method == "bon_sft":  # SFT on the chosen answers: no preference term at all
        assert "rewards/accuracies" not in trained and "loss" in trained
    else:
        assert {"rewards/accuracies", "rewards/margins", "loss"} <= trained
    assert (Path(export) / "adapter" / "adapter_model.safetensors").exists()
    meta = json.loads((Path(export) / "flywheel.json").read_text())
    assert meta["method"] == method and meta["settings"]["method"] == method


def test_judge_dpo_heldout_rates_oracle_gold_and_counts_unparseable_ratings(zoo, cfg, text_pairs, tmp_path):
    from flywheel.train import dpo

    c = _cfg(cfg, "train.judge_dpo.max_steps=2", "train.judge_dpo.heldout.every_steps=2",
             "train.judge_dpo.heldout.items=2")
    ctx = LocalContext(c, "judge_dpo", text_pairs["judge"], str(zoo["judge"]), str(tmp_path))
    dpo.worker(ctx)
    _, final = _assert_curves(ctx, [0, 2], {"pairwise/accuracy", "pointwise/accuracy", "format_valid"})
    # the random zoo judge writes no "Rating:": every rating is a parse failure, recorded as such (not skipped)
    assert final["heldout.start.format_valid"] == 0.0 and final["heldout.start.pairwise/accuracy"] == 0.0


def _user_prompts(tmp_path):
    """A user's held-out prompts (flywheel/sources.py's JSONL), read as the driver reads them."""
    from labeled_sets import png_b64, write_jsonl

    from flywheel.train.heldout_inputs import read_heldout_prompts

    rows = [{"task": "iu", "subtask": "vqa", "query": f"What colour is picture {i}?", "images": [png_b64(c)]}
            for i, c in enumerate(["red", "blue", "green"])]
    rows += [{"task": "ig", "subtask": "text_to_image", "query": f"Draw a {c} square.", "images": []}
             for c in ("red", "blue")]
    path = str(write_jsonl(tmp_path / "heldout-prompts.jsonl", rows))
    return path, lambda cfg, training: read_heldout_prompts(cfg, training, path, items=10)


def test_llava_update_probed_on_user_prompts_rated_by_the_judge_alone(zoo, cfg, text_pairs, tmp_path):
    from flywheel.train import dpo

    path, read = _user_prompts(tmp_path)
    c = _cfg(cfg, "train.policy_dpo.max_steps=2", "train.policy_dpo.heldout.every_steps=2",
             f"train.policy_dpo.heldout.prompts_file={path}", "train.policy_dpo.heldout.judge=zoo:judge",
             "train.policy_dpo.heldout.target=judge/pointwise/score", "train.policy_dpo.heldout.max_drop={}",
             "train.policy_dpo.heldout.min_steps=0")
    prompts = read(c, "policy_dpo")
    assert [p["task"] for p in prompts] == ["iu"] * 3  # the text policy's tasks only
    ctx = LocalContext(c, "policy_dpo", text_pairs["policy"], str(zoo["policy"]), str(tmp_path),
                       heldout_judge="zoo:judge", heldout_prompts=prompts)
    dpo.worker(ctx)
    _, final = _assert_curves(ctx, [0, 2], {"repetition_rate", "mean_words", "judge/pointwise/parse_failure_rate"})
    assert "heldout.accuracy" not in ctx.metrics.keys()  # nothing the oracle world scores
    assert set(ctx.metrics.history("heldout.items").values()) == {3.0}
    # the random zoo judge rates nothing: failures, never scores; its NaN target never improves on the start
    assert set(ctx.metrics.history("heldout.judge/pointwise/parse_failure_rate").values()) == {1.0}
    assert final["heldout.refused"] and final["heldout.best_step"] == 0


def test_sdxl_update_probed_on_user_drawing_prompts(zoo, cfg, image_pairs, tmp_path):
    from flywheel.train import diffusion_loop

    path, read = _user_prompts(tmp_path)
    c = _cfg(cfg, "train.diffusion_dpo.max_steps=2", "train.diffusion_dpo.batch_size=4",
             "train.diffusion_dpo.lora.enabled=true", "train.registry.save_merged=false",
             "train.diffusion_dpo.heldout.every_steps=2", "train.diffusion_dpo.heldout.inference_steps=2",
             f"train.diffusion_dpo.heldout.prompts_file={path}", "train.diffusion_dpo.heldout.judge=zoo:judge",
             "train.diffusion_dpo.heldout.target=judge/pointwise/score", "train.diffusion_dpo.heldout.max_drop={}")
    prompts = read(c, "diffusion_dpo")
    assert [p["query"] for p in prompts] == ["Draw a red square.", "Draw a blue square."]
    ctx = LocalContext(c, "diffusion_dpo", image_pairs, str(zoo["generator"]), str(tmp_path),
                       heldout_judge="zoo:judge", heldout_prompts=prompts)
    diffusion_loop.worker(ctx)
    _assert_curves(ctx, [0, 2], {"items", "judge/pointwise/parse_failure_rate"})
    assert not {"heldout.score10", "heldout.probe/score10"} & ctx.metrics.keys()
    assert set(ctx.metrics.history("heldout.items").values()) == {2.0}


@pytest.mark.parametrize("method", ["dpo", "bon_sft"])
def test_sdxl_update_methods_with_target_and_generic_quality_probe(zoo, cfg, image_pairs, tmp_path, method):
    from flywheel.train import diffusion_loop

    c = _cfg(cfg, "train.diffusion_dpo.max_steps=4", "train.diffusion_dpo.batch_size=4",
             "train.diffusion_dpo.lora.enabled=true", "train.registry.save_merged=false",
             "train.diffusion_dpo.heldout.every_steps=2", "train.diffusion_dpo.heldout.items=3",
             "train.diffusion_dpo.heldout.inference_steps=2", "generator.generation.guidance_scale=1.0")
    ctx = LocalContext(c, "diffusion_dpo", image_pairs, str(zoo["generator"]), str(tmp_path), method=method)
    diffusion_loop.worker(ctx)
    export, final = _assert_curves(ctx, [0, 2, 4], {"score10", "probe/score10"})
    assert ("rewards/accuracies" in ctx.metrics.keys()) == (method == "dpo")
    weights = load_file(str(Path(export) / "adapter" / "pytorch_lora_weights.safetensors"))
    assert weights and json.loads((Path(export) / "flywheel.json").read_text())["method"] == method


def test_heldout_state_resumes_exactly_in_the_diffusion_loop(zoo, cfg, image_pairs, tmp_path):
    """The tracker (best step, patience, guard baseline) and the best weights travel inside each checkpoint: a
    run resumed from step 2 reaches the same decision and exports the same weights as an uninterrupted one."""
    from flywheel.train import diffusion_loop

    c = _cfg(cfg, "train.diffusion_dpo.max_steps=4", "train.diffusion_dpo.batch_size=4", "train.save_steps=2",
             "train.diffusion_dpo.lora.enabled=true", "train.registry.save_merged=false",
             "train.diffusion_dpo.lr=1e-3", "train.diffusion_dpo.heldout.every_steps=1",
             "train.diffusion_dpo.heldout.items=3", "train.diffusion_dpo.heldout.inference_steps=2",
             "train.diffusion_dpo.heldout.probe_guidance_scale=null", "train.diffusion_dpo.heldout.max_drop={}",
             "train.diffusion_dpo.heldout.patience=10")
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    full = LocalContext(c, "diffusion_dpo", image_pairs, str(zoo["generator"]), str(tmp_path / "a"))
    diffusion_loop.worker(full)
    assert sorted(full.checkpoints) == [2]
    assert (Path(full.checkpoints[2]) / "heldout" / "state.json").exists()
    resumed = LocalContext(c, "diffusion_dpo", image_pairs, str(zoo["generator"]), str(tmp_path / "b"),
                           restore=full.checkpoints[2])
    diffusion_loop.worker(resumed)
    assert resumed.resumed_from == 2 and sorted(resumed.metrics.history("heldout.score10")) == [3, 4]
    a, b = full.final[1], resumed.final[1]
    keys = [k for k in a if k.startswith("heldout.") and k != "heldout.curves"]
    assert all(a[k] == b[k] or (isinstance(a[k], float) and math.isnan(a[k]) and math.isnan(b[k])) for k in keys)
    assert a["heldout.curves"] == b["heldout.curves"]
    wa = load_file(str(Path(full.final[0]) / "adapter" / "pytorch_lora_weights.safetensors"))
    wb = load_file(str(Path(resumed.final[0]) / "adapter" / "pytorch_lora_weights.safetensors"))
    assert all((wa[k] == wb[k]).all() for k in wa)


def test_reference_previous_is_the_start_original_is_the_adapters_base(zoo, cfg, text_pairs, tmp_path):
    """A continued adapter (the previous round's policy): with reference=previous the first DPO loss is exactly
    log 2 and the implicit rewards 0 (policy == reference), with reference=original the reference is the base
    without that adapter: the rewards beta * (log pi - log ref) of the chosen answers are not 0. (The loss alone
    does not show it: a random adapter shifts chosen and rejected alike, and the loss moved by 2e-4 in one run.)"""
    from peft import LoraConfig, PeftModel, get_peft_model

    from flywheel.train import dpo, hf
    from flywheel.train.data import dpo_rows, read_training_data, to_hf_dataset

    model, _ = hf.load_vlm(str(zoo["policy"]))
    previous = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules="all-linear",
                                                init_lora_weights=False))  # a non-zero adapter, as after a round
    previous.save_pretrained(str(tmp_path / "previous"))
    dataset = to_hf_dataset(dpo_rows(read_training_data(text_pairs["policy"], "dpo").rows))
    logs = {}
    for reference in ("previous", "original"):
        c = _cfg(cfg, f"train.policy_dpo.reference={reference}", "train.policy_dpo.max_steps=1",
                 "train.policy_dpo.methods=[dpo]")  # DPO's loss alone: local.yaml's dpo_sft adds the SFT term
        base, processor = hf.load_vlm(str(zoo["policy"]))
        start = PeftModel.from_pretrained(base, str(tmp_path / "previous"), is_trainable=True)
        trainer = dpo.build_trainer(start, processor, dataset, c.train.resolved("policy_dpo"),
                                    str(tmp_path / reference), seed=0, peft_config=None)
        if reference == "original":
            dpo.use_original_reference(trainer)
        hf.attach(trainer)
        trainer.train()
        logs[reference] = trainer.state.log_history[0]  # the first step's logged loss and rewards
    assert logs["previous"]["loss"] == pytest.approx(math.log(2), abs=1e-4)
    assert logs["previous"]["rewards/chosen"] == pytest.approx(0.0, abs=1e-6)
    assert abs(logs["original"]["rewards/chosen"]) > 1e-3
