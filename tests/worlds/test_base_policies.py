"""Base-policy training at reduced size: both trainings run through the real trainers and leave standard,
cached, loadable checkpoints (the full-size runs and their oracle scores are in the issue notes)."""

import pytest

from flywheel.config import GenerationConfig, ImageGenerationConfig
from flywheel.engines import ImageRequest, TextRequest
from flywheel.worlds.shapes.base_policies import build_base_generator, build_base_judge, build_base_policy
from flywheel.worlds.shapes.policy_config import BasePoliciesConfig, JudgeBaseConfig


@pytest.fixture(scope="module")
def small():
    return BasePoliciesConfig(policy={"steps": 3, "batch_size": 4, "warmup_steps": 0}, eval_items=12,
                              judge={"pretrain": {"steps": 2, "batch_size": 4, "warmup_steps": 0}},
                              generator={"vae_steps": 2, "unet_steps": 2, "batch_size": 4, "vae_batch_size": 4})


def test_base_policy_trains_caches_and_loads(cfg, zoo, small, tmp_path):
    from flywheel.engines.hf import HFTextEngine

    path, metrics = build_base_policy(zoo["policy"], tmp_path, cfg.world.shapes, small, seed=0)
    assert metrics["train_seconds"] > 0 and metrics["sft_loss"] > 0
    again, metrics2 = build_base_policy(zoo["policy"], tmp_path, cfg.world.shapes, small, seed=0)
    assert again == path and metrics2 == metrics  # cached: no second training
    engine = HFTextEngine(str(path), GenerationConfig(max_new_tokens=4))
    msg = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Describe the image."}]}]
    from PIL import Image

    assert engine.generate([TextRequest(msg, [Image.new("RGB", (56, 56), "white")])])[0].ok


def test_base_generator_trains_and_loads(cfg, zoo, small, tmp_path):
    from diffusers import AutoencoderKL

    from flywheel.engines.diffusion import DiffusersImageEngine

    path, metrics = build_base_generator(zoo["generator"], tmp_path, cfg.world.shapes, small, seed=0)
    assert {"vae_psnr_db", "unet_loss", "vae_seconds", "unet_seconds"} <= set(metrics)
    vae = AutoencoderKL.from_pretrained(path / "vae")
    assert vae.config.scaling_factor != 0.18215  # set from the trained latents' spread
    engine = DiffusersImageEngine(str(path), ImageGenerationConfig(num_inference_steps=2))
    assert engine.generate([ImageRequest("a red circle", seed=0)])[0].image.size == (56, 56)


def test_base_judge_trains_caches_and_judges(cfg, zoo, small, tmp_path):
    from PIL import Image

    from flywheel.engines.hf import HFTextEngine
    from flywheel.models.zoo import resolve_model_path, world_path

    path, metrics = build_base_judge(zoo["judge"], tmp_path, cfg.world.shapes, small, seed=0)
    assert metrics["train_seconds"] > 0 and metrics["sft_loss"] > 0
    assert 0 <= metrics["perception/accuracy"] <= 1 and "perception/accuracy/colour" in metrics
    assert build_base_judge(zoo["judge"], tmp_path, cfg.world.shapes, small, seed=0) == (path, metrics)
    assert (path / "config.json").read_text().count("qwen2_vl") and (path / "processor_config.json").exists()
    engine = HFTextEngine(str(path), GenerationConfig(max_new_tokens=4))
    msg = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Rate 1-5."}]}]
    assert engine.generate([TextRequest(msg, [Image.new("RGB", (56, 56), "white")])])[0].ok
    # `world:judge` names the folder the settings hash to; unbuilt, it says how to build it
    from flywheel.config import load_config

    other = load_config(None, [f"run.workdir={tmp_path}/other", "models.judge.path=world:judge"])
    assert world_path(other, "judge").name.startswith("judge-base-")
    with pytest.raises(FileNotFoundError, match="flywheel models build"):
        resolve_model_path(other.models.judge, other)


def test_perception_examples_degrade_images_not_answers(cfg):
    import numpy as np

    from flywheel.worlds.shapes.policy_data import perception_examples
    from flywheel.worlds.shapes.segment import segment

    world = cfg.world.shapes
    clean = perception_examples(world, JudgeBaseConfig(degraded_share=0.0))(np.random.default_rng(3), 40)
    blurred = perception_examples(world, JudgeBaseConfig(degraded_share=1.0))(np.random.default_rng(3), 40)
    assert [r["completion"] for r in clean] == [r["completion"] for r in blurred]  # same questions and answers
    assert all(r["images"][0].size == b["images"][0].size for r, b in zip(clean, blurred))
    assert all(np.abs(np.asarray(r["images"][0], float) - np.asarray(b["images"][0], float)).mean() > 0.1
               for r, b in zip(clean, blurred))
    # what the picture shows survives: the world's own segmenter finds the same colours in most degraded images
    same = sum(sorted(d.colour for d in segment(r["images"][0], world).detections)
               == sorted(d.colour for d in segment(b["images"][0], world).detections)
               for r, b in zip(clean, blurred))
    assert same >= 34, same
    # no faults: an existence question is answered from the scene (the base policy's yes-bias is absent)
    assert {"Yes.", "No."} <= {r["completion"][0]["content"][0]["text"] for r in clean}


def test_judge_base_config_refuses_a_reversed_resolution_range():
    import pydantic

    with pytest.raises(pydantic.ValidationError, match="low_res must be"):
        JudgeBaseConfig(low_res=(36, 20))
    with pytest.raises(pydantic.ValidationError, match="low_res must be"):
        JudgeBaseConfig(low_res=(0, 20))


def test_shape_questions_ask_about_a_colour_one_object_has_alone(cfg):
    import numpy as np

    from flywheel.worlds.shapes.policy_data import shape_examples
    from flywheel.worlds.shapes.segment import segment

    world = cfg.world.shapes
    rows = shape_examples(world)(np.random.default_rng(0), 30)
    answers = set()
    for r in rows:
        question = r["prompt"][0]["content"][1]["text"]
        answer = r["completion"][0]["content"][0]["text"]
        colour = question.removeprefix("What shape is the ").removesuffix(" object?")
        assert answer.startswith(f"The {colour} object is a ")
        seen = [d for d in segment(r["images"][0], world).detections if d.colour == colour]
        assert len(seen) == 1 and answer.endswith(f"a {seen[0].shape}."), (question, answer, seen)
        answers.add(answer.split()[-1])
    assert answers == {"circle.", "square.", "triangle."}


def test_shape_question_share_replaces_a_share_and_leaves_the_rest_alone(cfg):
    import numpy as np

    from flywheel.worlds.shapes.policy_data import perception_examples

    world = cfg.world.shapes
    plain = perception_examples(world, JudgeBaseConfig())(np.random.default_rng(5), 200)
    mixed = perception_examples(world, JudgeBaseConfig(shape_question_share=0.3))(np.random.default_rng(5), 200)
    is_shape = ["What shape is" in r["prompt"][0]["content"][1]["text"] for r in mixed]
    assert 40 <= sum(is_shape) <= 80
    assert all(m["completion"] == p["completion"] for m, p, s in zip(mixed, plain, is_shape) if not s)


def test_a_shape_warmup_trains_first_and_only_a_set_knob_changes_the_cache_key(cfg, zoo, small, tmp_path):
    from flywheel.worlds.shapes.base_policies import judge_dir

    warm = small.model_copy(update={"judge": small.judge.model_copy(update={"shape_warmup_steps": 2})})
    assert judge_dir(zoo["judge"], tmp_path, cfg.world.shapes, small, 0) != \
        judge_dir(zoo["judge"], tmp_path, cfg.world.shapes, warm, 0)
    # the knobs at their defaults leave the key as it was before they existed (cached bases stay valid)
    from flywheel.worlds.shapes.base_policies import BASE_VERSION, _hash

    before = small.judge.model_dump(mode="json", exclude={"shape_warmup_steps", "shape_question_share"})
    assert judge_dir(zoo["judge"], tmp_path, cfg.world.shapes, small, 0).name == \
        f"judge-base-{_hash(cfg.world.shapes, before, 0, BASE_VERSION, zoo['judge'].name)}"
    path, metrics = build_base_judge(zoo["judge"], tmp_path, cfg.world.shapes, warm, seed=0)
    assert metrics["shape_warmup/sft_loss"] > 0 and metrics["sft_loss"] > 0
    assert sorted(p.name for p in tmp_path.iterdir()) == [path.name]  # the warm-up's checkpoint is not left behind
