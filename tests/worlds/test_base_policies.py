"""Base-policy training at reduced size: both trainings run through the real trainers and leave standard,
cached, loadable checkpoints (the full-size runs and their oracle scores are in the issue notes)."""

from pathlib import Path

import pytest

from flywheel.config import GenerationConfig, ImageGenerationConfig
from flywheel.engines import ImageRequest, TextRequest
from flywheel.worlds.shapes.base_policies import build_base_generator, build_base_judge, build_base_policy
from flywheel.worlds.shapes.policy_config import BasePoliciesConfig, JudgeBaseConfig, LookupCurriculumConfig


@pytest.fixture(scope="module")
def small():
    # vision pretraining off (steps 0) here; test_base_vlms_pretrain_their_vision_first covers it
    return BasePoliciesConfig(policy={"steps": 3, "batch_size": 4, "warmup_steps": 0}, eval_items=12,
                              policy_vision={"steps": 0},
                              judge={"pretrain": {"steps": 2, "batch_size": 4, "warmup_steps": 0},
                                     "vision": {"steps": 0}},
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


def test_a_cached_base_built_on_another_thread_count_is_reused_with_a_warning(tmp_path, caplog):
    """A seeded build ends elsewhere on another thread count: the cache is reused (a rebuild costs up to ~25
    minutes), but the log says so, naming both counts and how to rebuild."""
    import json

    import torch

    from flywheel.models.zoo import torch_threads
    from flywheel.worlds.shapes.base_policies import _build

    out = tmp_path / "judge-base-x"
    out.mkdir()
    (out / ".complete").write_text(json.dumps({"torch_threads": 7, "sft_loss": 0.5}))
    never = lambda tmp: pytest.fail("a cached base must not be trained again")  # noqa: E731
    with torch_threads(1), caplog.at_level("WARNING"):
        assert _build(out, never) == (out, {"torch_threads": 7, "sft_loss": 0.5})
    assert "built with 7 torch threads, this build would run 1" in caplog.text and "delete the folder" in caplog.text
    caplog.clear()
    (out / ".complete").write_text(json.dumps({"torch_threads": torch.get_num_threads()}))
    with caplog.at_level("WARNING"):
        _build(out, never)
    assert "torch threads" not in caplog.text  # the same count: nothing to say


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
    plain = lambda share: JudgeBaseConfig(degraded_share=share, reading_share=0, matching_share=0)  # noqa: E731
    clean = perception_examples(world, plain(0.0))(np.random.default_rng(3), 40)
    blurred = perception_examples(world, plain(1.0))(np.random.default_rng(3), 40)
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


def test_reading_examples_name_the_quoted_value_and_never_judge(cfg):
    import re

    import numpy as np

    from flywheel.worlds.shapes.policy_data import perception_examples
    from flywheel.worlds.shapes.vocab import number_word

    world = cfg.world.shapes
    make = perception_examples(world, JudgeBaseConfig(reading_share=1.0, matching_share=0.0))
    rows = make(np.random.default_rng(0), 200)
    differ = asked_reference = 0
    for row in rows:
        head, _, sentence = (row["prompt"][0]["content"][0]["text"] + row["prompt"][0]["content"][2]["text"]) \
            .partition("\n")
        response, reference = re.search(r'the response is "(.*)", the reference answer is "(.*)"\.$', sentence).groups()
        target = row["completion"][0]["content"][0]["text"]
        assert not re.search(r"right|wrong|Rating", target)  # reads; never a verdict or a rating
        quoted = reference if "reference" in head else response
        value = re.fullmatch(r"The (?:answer|reference) says (\w+)\.", target).group(1)
        words = set(re.findall(r"\w+", quoted.lower())) | ({number_word(0)} if "none" in quoted else set())
        assert value in words, (quoted, target)  # the value of the quote asked about, not of the other one
        differ += response != reference
        asked_reference += "reference" in head
    assert 70 <= differ <= 130 and 30 <= asked_reference <= 70  # wrong answers ~half, the reference asked ~1/4
    none = perception_examples(world, JudgeBaseConfig(reading_share=0.0))(np.random.default_rng(0), 50)
    assert not any("Reading" in str(r["prompt"]) for r in none)


def test_matching_examples_name_both_values_and_say_whether_they_match(cfg, monkeypatch):
    """Matching rows: what holds, the response's value, and "matches" exactly when the two agree, in the
    teacher's own words up to its verdict - never a verdict or a rating. At 0 the base's rows and cache key are
    those from before the field; set, the key carries the rows' version."""
    import re

    import numpy as np

    from flywheel.worlds.shapes import base_policies
    from flywheel.worlds.shapes.base_policies import judge_dir
    from flywheel.worlds.shapes.policy_data import perception_examples

    world = cfg.world.shapes
    rows = perception_examples(world, JudgeBaseConfig(reading_share=0.0, matching_share=1.0))(
        np.random.default_rng(0), 200)
    matches = 0
    for row in rows:
        assert row["prompt"][0]["content"][0]["text"].startswith("Matching.")
        target = row["completion"][0]["content"][0]["text"]
        assert not re.search(r"right|wrong|Rating", target)
        colour = re.fullmatch(r"The answer says (\w+)\. The \w+ is (not \1 but \w+|\1), which (matches|differs)\.",
                              target)
        if colour:  # colour: the answer's colour checked against the image ("The circle is not red but blue")
            said, holds, word = colour.groups()
            assert (word == "matches") == (holds == said), target
            matches += word == "matches"
            continue
        holds, said, word = re.fullmatch(r"(.+)\. The answer says (\w+), which (matches|differs)\.", target).groups()
        if said in ("yes", "no"):  # existence: "There is no red circle in the image." holds "no"
            agree = (" no " in f" {holds} ") == (said == "no")
        else:  # count: the value is a word of what holds ("There are two circles.")
            agree = said in holds.split()
        assert (word == "matches") == agree, target
        matches += word == "matches"
    assert 70 <= matches <= 130
    plain = perception_examples(world, JudgeBaseConfig(matching_share=0.0))(np.random.default_rng(0), 50)
    assert not any("Matching" in str(r["prompt"]) for r in plain)

    def key(**judge):
        policies = cfg.world.base_policies.model_copy(update={"judge": JudgeBaseConfig(**judge)})
        return judge_dir(Path("judge-x"), Path("models"), world, policies, 0)

    before = key(matching_share=0.25)
    monkeypatch.setattr(base_policies, "MATCHING_ROWS_VERSION", base_policies.MATCHING_ROWS_VERSION + 1)
    assert key(matching_share=0.25) != before  # new words, new base
    assert key() == key(matching_share=0.25) != key(matching_share=0.0)
    with pytest.raises(ValueError, match="reading_share \\+ matching_share"):
        JudgeBaseConfig(reading_share=0.5, matching_share=0.6)


def test_judge_base_config_refuses_a_reversed_resolution_range():
    import pydantic

    with pytest.raises(pydantic.ValidationError, match="low_res must be"):
        JudgeBaseConfig(low_res=(36, 20))
    with pytest.raises(pydantic.ValidationError, match="low_res must be"):
        JudgeBaseConfig(low_res=(0, 20))


def test_cell_labels_name_the_object_at_each_centre_and_ignore_the_rest_of_it():
    from flywheel.models.pretrain_vision import IGNORE
    from flywheel.worlds.shapes.policy_data import cell_labels
    from flywheel.worlds.shapes.scene import Obj, Scene

    classes = ("red circle", "blue square", "background")
    scene = Scene(objects=(Obj("circle", "red", 0.2, 0.1, 0.1), Obj("square", "blue", 0.3, 0.62, 0.62)))
    grid = cell_labels(scene, 4, classes).reshape(4, 4)
    assert grid[0, 0] == 0 and grid[2, 2] == 1  # the cells of the two centres
    # the square's box (0.47-0.77) reaches cells 1-3 on both axes: part of it, not which object - ignored
    assert {(int(r), int(c)) for r, c in zip(*(grid == IGNORE).nonzero())} == \
        {(r, c) for r in (1, 2, 3) for c in (1, 2, 3)} - {(2, 2)}
    assert (grid == 2).sum() == 16 - 1 - 1 - 8  # everything else is background


def test_vision_task_labels_match_its_images(cfg):
    import numpy as np

    from flywheel.worlds.shapes.policy_data import vision_task
    from flywheel.worlds.shapes.segment import segment

    world = cfg.world.shapes
    task = vision_task(world)
    images, labels = task.make(np.random.default_rng(0), 20, 4)
    assert labels.shape == (20, 16) and task.classes[task.background] == "background"
    for image, row in zip(images, labels):
        named = sorted(task.classes[k] for k in row if 0 <= k != task.background)
        seen = sorted(f"{d.colour} {d.shape}" for d in segment(image, world).detections)
        assert set(named) <= set(seen)  # every labelled cell names an object the image shows
    degraded = vision_task(world, JudgeBaseConfig(degraded_share=1.0)).make(np.random.default_rng(0), 20, 4)
    assert (degraded[1] == labels).all()  # the same scenes and labels, drawn worse
    assert any(np.abs(np.asarray(a, float) - np.asarray(b, float)).mean() > 0.1
               for a, b in zip(images, degraded[0]))


def test_see_blur_gives_degraded_objects_classes_of_their_own_and_changes_nothing_else(cfg):
    import numpy as np

    from flywheel.worlds.shapes.base_policies import judge_dir
    from flywheel.worlds.shapes.policy_data import vision_task

    world = cfg.world.shapes
    plain = vision_task(world, JudgeBaseConfig(degraded_share=0.5))
    seeing = vision_task(world, JudgeBaseConfig(degraded_share=0.5, see_blur=True))
    assert len(seeing.classes) == 2 * len(plain.classes) - 1 and seeing.classes[seeing.background] == "background"
    (im_p, lab_p), (im_s, lab_s) = (t.make(np.random.default_rng(3), 40, 4) for t in (plain, seeing))
    # the same images (the same draws); the same objects named, each degraded image's as "<colour> <shape> blurred"
    assert all((np.asarray(a) == np.asarray(b)).all() for a, b in zip(im_p, im_s))
    blurred_rows = 0
    for row_p, row_s in zip(lab_p, lab_s):
        names_p = [plain.classes[k] if k >= 0 else k for k in row_p]
        names_s = [seeing.classes[k] if k >= 0 else k for k in row_s]
        objects = [i for i, k in enumerate(row_p) if 0 <= k != plain.background]
        suffixes = {str(names_s[i]).removeprefix(str(names_p[i])) for i in objects}
        assert suffixes <= {"", " blurred"} and len(suffixes) <= 1  # one image is degraded or not, whole
        assert [names_s[i] for i in range(16) if i not in objects] == [names_p[i] for i in range(16) if i not in
                                                                       objects]
        blurred_rows += suffixes == {" blurred"}
    assert 10 <= blurred_rows <= 30  # about half of the 40 images were degraded
    # off stays out of the base's key (bases built before the field stay valid); on names a new base
    policies = cfg.world.base_policies

    def key(**judge):
        return judge_dir(Path("judge-x"), Path("models"), world,
                         policies.model_copy(update={"judge": policies.judge.model_copy(update=judge)}), 0)

    assert key(see_blur=False) == key() != key(see_blur=True)


def test_base_vlms_pretrain_their_vision_first_and_leave_nothing_behind(cfg, zoo, small, tmp_path):
    from flywheel.models.pretrain_config import VisionPretrainConfig

    vision = VisionPretrainConfig(steps=2, batch_size=4, eval_images=4)
    seeing = small.model_copy(update={"judge": small.judge.model_copy(update={"vision": vision})})
    path, metrics = build_base_judge(zoo["judge"], tmp_path, cfg.world.shapes, seeing, seed=0)
    assert metrics["vision_seconds"] > 0 and 0 <= metrics["vision/object_cells"] <= 1 and metrics["sft_loss"] > 0
    assert sorted(p.name for p in tmp_path.iterdir()) == [path.name]  # the vision stage's checkpoint is gone
    assert not (path / "vision").exists()


def test_look_up_phases_train_one_question_type_each_before_the_faulty_sft(cfg, zoo, small, tmp_path):
    from flywheel.worlds.shapes.base_policies import policy_dir
    from flywheel.worlds.shapes.policy_data import question_examples

    looked = BasePoliciesConfig.model_validate(
        {**small.model_dump(), "policy_lookup": {"steps": 2, "subtasks": ["iu_color", "iu_existence"]}})
    # off (steps 0) leaves the folder name of bases built before the phases existed; on names a new base
    assert policy_dir(zoo["policy"], tmp_path, cfg.world.shapes, small, 0) != policy_dir(
        zoo["policy"], tmp_path, cfg.world.shapes, looked, 0)
    path, metrics = build_base_policy(zoo["policy"], tmp_path, cfg.world.shapes, looked, seed=0)
    assert metrics["iu_color/sft_loss"] > 0 and metrics["iu_existence/sft_loss"] > 0 and metrics["sft_loss"] > 0
    assert sorted(p.name for p in tmp_path.iterdir()) == [path.name]  # no phase checkpoint left behind
    assert not any(p.name.startswith("phase-") for p in path.iterdir())
    import numpy as np

    rows = question_examples(cfg.world.shapes, "iu_existence")(np.random.default_rng(0), 20)
    answers = {r["completion"][0]["content"][0]["text"] for r in rows}
    assert answers <= {"Yes.", "No."} and len(answers) == 2  # fault-free: both answers, as the scene says
    assert all(r["prompt"][0]["content"][1]["text"].startswith("Is there") for r in rows)


def test_look_up_phases_name_only_question_sub_tasks():
    with pytest.raises(ValueError, match="iu_caption"):
        BasePoliciesConfig(policy_lookup={"steps": 10, "subtasks": ["iu_caption"]})


def test_judge_look_up_phases_train_and_name_a_new_base(cfg, zoo, small, tmp_path):
    from flywheel.worlds.shapes.base_policies import judge_dir

    looked = small.model_copy(update={"judge": small.judge.model_copy(
        update={"lookup": LookupCurriculumConfig(steps=2, subtasks=["iu_color"])})})
    # off (steps 0) leaves the folder name of judge bases built before the phases existed; on names a new base
    assert judge_dir(zoo["judge"], tmp_path, cfg.world.shapes, small, 0) != judge_dir(
        zoo["judge"], tmp_path, cfg.world.shapes, looked, 0)
    # off, the phases' other settings stay out of the key too: the key is that of a base without the field
    off = small.model_copy(update={"judge": small.judge.model_copy(
        update={"lookup": LookupCurriculumConfig(steps=0, subtasks=["iu_count"])})})
    assert judge_dir(zoo["judge"], tmp_path, cfg.world.shapes, off, 0) == judge_dir(
        zoo["judge"], tmp_path, cfg.world.shapes, small, 0)
    path, metrics = build_base_judge(zoo["judge"], tmp_path, cfg.world.shapes, looked, seed=0)
    assert metrics["iu_color/sft_loss"] > 0 and metrics["sft_loss"] > 0
    assert sorted(p.name for p in tmp_path.iterdir()) == [path.name]  # no phase checkpoint left behind


class Killed(Exception):
    """Stands in for the SIGKILL of a build's Ray task (as the iteration's kill-and-resume test does for real)."""


def test_a_killed_base_build_goes_on_where_it_stopped(cfg, zoo, small, tmp_path, monkeypatch, caplog):
    """A base takes up to ~2 hours on 2 cores: a run killed in its SFT keeps its vision pretraining and goes on
    from its last complete Trainer checkpoint, and ends with the weights of a build never killed."""
    import logging

    import torch
    import trl
    from safetensors.torch import load_file

    from flywheel.worlds.shapes import base_policies

    seeing = BasePoliciesConfig.model_validate({
        **small.model_dump(), "policy": {**small.policy.model_dump(), "steps": 4},
        "policy_vision": {"steps": 2, "batch_size": 4, "eval_images": 4}})
    reference, ref_metrics = build_base_policy(zoo["policy"], tmp_path / "a", cfg.world.shapes, seeing, seed=0)

    step = trl.SFTTrainer.training_step

    def dies_after_step_2(self, *args, **kwargs):
        if self.state.global_step == 2:  # checkpoints 1 and 2 are written (one every step at 4 steps)
            raise Killed
        return step(self, *args, **kwargs)

    with monkeypatch.context() as m:
        m.setattr(trl.SFTTrainer, "training_step", dies_after_step_2)
        with pytest.raises(Killed):
            build_base_policy(zoo["policy"], tmp_path / "b", cfg.world.shapes, seeing, seed=0)
    (tmp,) = (tmp_path / "b").iterdir()
    assert tmp.name.endswith(".tmp") and (tmp / "vision" / ".complete").is_file()
    (tmp / "sft-state" / "checkpoint-3").mkdir()  # a checkpoint killed while being written: passed over

    visions = []
    monkeypatch.setattr(base_policies, "pretrain_vision", lambda *a, **k: visions.append(a))
    with caplog.at_level(logging.INFO):
        resumed, metrics = build_base_policy(zoo["policy"], tmp_path / "b", cfg.world.shapes, seeing, seed=0)
    assert visions == []  # the vision pretraining the killed run finished is not redone
    assert f"going on from {tmp / 'sft-state' / 'checkpoint-2'}" in caplog.text
    assert metrics["vision/object_cells"] == ref_metrics["vision/object_cells"]
    assert metrics["sft_loss"] == pytest.approx(ref_metrics["sft_loss"], rel=1e-6)  # the whole run's, not 2 steps'
    assert sorted(p.name for p in (tmp_path / "b").iterdir()) == [resumed.name]
    assert not (resumed / "vision").exists() and not (resumed / "sft-state").exists()
    want, got = load_file(reference / "model.safetensors"), load_file(resumed / "model.safetensors")
    assert want.keys() == got.keys()
    for name in want:
        assert torch.equal(want[name], got[name]), name


def test_a_build_that_is_not_resumable_starts_from_nothing(tmp_path):
    from flywheel.worlds.shapes.base_policies import _build

    def train(tmp):
        found = sorted(p.name for p in tmp.iterdir()) if tmp.is_dir() else []
        tmp.mkdir(exist_ok=True)
        return {"found": found}

    (tmp_path / "base.tmp").mkdir()
    (tmp_path / "base.tmp" / "left-over").write_text("x")
    assert _build(tmp_path / "base", train)[1]["found"] == []  # the generator's build: no partial state to trust
    (tmp_path / "other.tmp").mkdir()
    (tmp_path / "other.tmp" / "left-over").write_text("x")
    assert _build(tmp_path / "other", train, resume=True)[1]["found"] == ["left-over"]


def test_a_resumed_sft_reports_the_whole_runs_loss():
    from flywheel.models.pretrain_vlm import run_loss

    history = [{"loss": 1.0, "step": 2}, {"loss": 3.0, "step": 4}, {"loss": 9.0, "step": 6}]  # 6: this call's
    assert run_loss(history, 5.0, start=4, steps=6) == pytest.approx((2 * 1 + 2 * 3 + 2 * 5) / 6)
    assert run_loss([], 5.0, start=0, steps=6) == 5.0
    with pytest.raises(ValueError, match="step 3 logged losses only up to step 2"):
        run_loss(history, 5.0, start=3, steps=6)


def test_a_killed_generator_build_goes_on_where_it_stopped(cfg, zoo, small, tmp_path, monkeypatch):
    """Killed once in its VAE phase and once in its UNet phase, the SDXL build goes on from its last saves each
    time and ends with the weights, scaling factor and metrics of a build never killed."""
    import json

    import torch
    from safetensors.torch import load_file

    from flywheel.worlds.shapes import base_policies

    gen = BasePoliciesConfig.model_validate(small.model_dump() | {"generator": {
        "vae_steps": 4, "unet_steps": 4, "batch_size": 2, "vae_batch_size": 2}})
    reference, ref_metrics = build_base_generator(zoo["generator"], tmp_path / "a", cfg.world.shapes, gen, seed=0)
    make = base_policies.generator_examples

    def dies_at(call: int):
        """Examples that stop the build at the call-th draw: the VAE draws once a step then once to scale its
        latents (4 + 1 here), the UNet once a step."""
        def examples_of(world):
            inner, calls = make(world), []

            def draw(rng, n):
                calls.append(n)
                if len(calls) == call:
                    raise Killed
                return inner(rng, n)
            return draw
        return examples_of

    # killed at VAE step 2 (steps 0-1 saved); then, going on from there (VAE steps 2-3, the scaling draw, UNet steps
    # 0-1 saved), at UNet step 2
    for call in (3, 6):
        monkeypatch.setattr(base_policies, "generator_examples", dies_at(call))
        with pytest.raises(Killed):
            build_base_generator(zoo["generator"], tmp_path / "b", cfg.world.shapes, gen, seed=0)
    (tmp,) = (tmp_path / "b").iterdir()
    assert sorted(p.name for p in (tmp / "state").iterdir()) == ["unet", "vae", "vae-done"]
    draws = []
    monkeypatch.setattr(base_policies, "generator_examples",
                        lambda world: lambda rng, n: draws.append(n) or make(world)(rng, n))
    resumed, metrics = build_base_generator(zoo["generator"], tmp_path / "b", cfg.world.shapes, gen, seed=0)
    assert draws == [2, 2]  # UNet steps 2-3 only: the VAE and the UNet's first steps were not made again
    assert not (resumed / "state").exists() and sorted(p.name for p in (tmp_path / "b").iterdir()) == [resumed.name]
    for k in ("vae_loss", "vae_psnr_db", "unet_loss"):
        assert metrics[k] == ref_metrics[k], k
    for part in ("unet", "vae"):
        want = load_file(reference / part / "diffusion_pytorch_model.safetensors")
        got = load_file(resumed / part / "diffusion_pytorch_model.safetensors")
        assert want.keys() == got.keys() and all(torch.equal(want[n], got[n]) for n in want), part
    assert json.loads((resumed / "vae" / "config.json").read_text())["scaling_factor"] == json.loads(
        (reference / "vae" / "config.json").read_text())["scaling_factor"]
