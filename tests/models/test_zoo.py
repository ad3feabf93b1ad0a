"""The tiny zoo: standard formats, loadable like real checkpoints, deterministic, cached."""

import hashlib
import time

import pytest
import torch
from PIL import Image

from flywheel.config import REPO_ROOT, load_config
from flywheel.models.zoo import build_zoo, resolve_model_path, zoo_path


def _weights_digest(folder):
    h = hashlib.sha256()
    for f in sorted(folder.rglob("*.safetensors")):
        h.update(f.read_bytes())
    return h.hexdigest()


def test_build_writes_standard_safetensors_checkpoints(zoo):
    for name, path in zoo.items():
        assert (path / ".complete").exists()
        assert list(path.rglob("*.safetensors")), name
        assert not list(path.rglob("*.bin")) and not list(path.rglob("*.pt")), "weights must be safetensors"
    assert (zoo["judge"] / "chat_template.jinja").exists()
    assert (zoo["generator"] / "model_index.json").exists()


def test_judge_loads_with_auto_classes_and_generates_from_an_image(cfg, zoo):
    from transformers import AutoModelForImageTextToText, AutoProcessor

    import flywheel.models.processors  # noqa: F401  registers the image-only processor

    processor = AutoProcessor.from_pretrained(zoo["judge"])
    model = AutoModelForImageTextToText.from_pretrained(zoo["judge"])
    assert type(model).__name__ == "Qwen2VLForConditionalGeneration"
    text_cfg = model.config.text_config
    assert text_cfg.hidden_size // text_cfg.num_attention_heads >= 32  # vLLM CPU attention
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What colour is it?"}]}]
    prompt = processor.apply_chat_template(messages, add_generation_prompt=True)
    inputs = processor(text=[prompt], images=[[Image.new("RGB", (56, 56), "red")]], return_tensors="pt")
    n_image_tokens = int((inputs["input_ids"] == model.config.image_token_id).sum())
    # a 56-px image is resized to the judge's pixel budget: (judge_image_size / 28)^2 tokens
    assert n_image_tokens == (cfg.models.zoo.judge_image_size // 28) ** 2 == 16
    out = model.generate(**inputs, max_new_tokens=5, do_sample=False)
    assert out.shape[1] > inputs["input_ids"].shape[1]


def test_policy_loads_with_auto_classes_and_generates_from_an_image(zoo):
    from transformers import AutoModelForImageTextToText, AutoProcessor

    processor = AutoProcessor.from_pretrained(zoo["policy"])
    model = AutoModelForImageTextToText.from_pretrained(zoo["policy"])
    assert type(model).__name__ == "LlavaForConditionalGeneration"
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Describe the image."}]}]
    prompt = processor.apply_chat_template(messages, add_generation_prompt=True)
    assert prompt.startswith("USER: <image>") and prompt.endswith("ASSISTANT:")
    inputs = processor(text=[prompt], images=[Image.new("RGB", (56, 56), "blue")], return_tensors="pt")
    assert int((inputs["input_ids"] == model.config.image_token_index).sum()) == 16  # (56/14)^2, CLS dropped
    out = model.generate(**inputs, max_new_tokens=5, do_sample=False)
    assert out.shape[1] > inputs["input_ids"].shape[1]


def test_policy_chat_template_keeps_the_prompt_a_prefix_of_prompt_plus_answer(zoo):
    """TRL's DPO takes the prompt as the common prefix of prompt and prompt+chosen."""
    from transformers import AutoProcessor

    processor = AutoProcessor.from_pretrained(zoo["policy"])
    user = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Describe."}]}]
    prompt = processor.apply_chat_template(user, add_generation_prompt=True)
    full = processor.apply_chat_template(user + [{"role": "assistant", "content": "A red circle."}])
    assert full.startswith(prompt)


def test_generator_loads_as_sdxl_pipeline_and_makes_an_image(zoo):
    from diffusers import StableDiffusionXLPipeline

    pipe = StableDiffusionXLPipeline.from_pretrained(zoo["generator"])
    pipe.set_progress_bar_config(disable=True)
    out = pipe("a red circle", num_inference_steps=2, guidance_scale=1.0,
               generator=torch.Generator().manual_seed(0))
    assert out.images[0].size == (56, 56)


def test_tokenizers_have_no_unknown_tokens(zoo):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(zoo["judge"])
    text = "Ünïcödé ✓ 日本 a red circle"
    assert tok.decode(tok(text)["input_ids"]) == text  # byte-level: every string round-trips
    assert len(tok("The image shows a red circle above a blue square.")["input_ids"]) < 20  # merges were learnt


def test_build_is_cached(cfg, zoo):
    stamp = {n: (p / ".complete").stat().st_mtime_ns for n, p in zoo.items()}
    t0 = time.perf_counter()
    again = build_zoo(cfg)
    assert time.perf_counter() - t0 < 1.0
    assert again == zoo
    assert stamp == {n: (p / ".complete").stat().st_mtime_ns for n, p in again.items()}


def test_build_is_deterministic_for_a_seed(tmp_path, zoo):
    cfg2 = load_config(REPO_ROOT / "configs/local.yaml", [f"run.workdir={tmp_path}"])
    other = build_zoo(cfg2)
    for name in zoo:
        assert _weights_digest(zoo[name]) == _weights_digest(other[name]), name
        for f in zoo[name].rglob("*.json"):
            assert f.read_text() == (other[name] / f.relative_to(zoo[name])).read_text(), f
    cfg3 = load_config(REPO_ROOT / "configs/local.yaml", [f"run.workdir={tmp_path}", "run.seed=1"])
    assert zoo_path(cfg3, "judge") != zoo_path(cfg2, "judge")


def test_resolve_model_path(cfg, zoo):
    from flywheel.config import ModelRef

    assert resolve_model_path(ModelRef(path="zoo:judge"), cfg) == str(zoo["judge"])
    assert resolve_model_path(ModelRef(path="Qwen/Qwen2-VL-7B-Instruct"), cfg) == "Qwen/Qwen2-VL-7B-Instruct"
    with pytest.raises(ValueError, match="unknown zoo model"):
        resolve_model_path(ModelRef(path="zoo:critic"), cfg)


def test_unbuilt_zoo_model_gives_a_clear_error(tmp_path):
    from flywheel.config import ModelRef

    cfg = load_config(None, [f"run.workdir={tmp_path}"])
    with pytest.raises(FileNotFoundError, match="flywheel models build"):
        resolve_model_path(ModelRef(path="zoo:judge"), cfg)


def test_bad_sizes_are_refused(tmp_path):
    from flywheel.models.zoo import build_judge

    cfg = load_config(None, [f"run.workdir={tmp_path}", "models.zoo.text_heads=8"])  # head_dim 16
    with pytest.raises(ValueError, match="head_dim of at least 32"):
        build_judge(cfg.models.zoo, tmp_path / "j")
    cfg = load_config(None, [f"run.workdir={tmp_path}", "models.zoo.image_size=50"])
    with pytest.raises(ValueError, match="multiple of 28"):
        build_judge(cfg.models.zoo, tmp_path / "j")
    cfg = load_config(None, [f"run.workdir={tmp_path}", "models.zoo.judge_image_size=100"])
    with pytest.raises(ValueError, match="judge_image_size=100: must be a multiple of 28"):
        build_judge(cfg.models.zoo, tmp_path / "j")


def test_judge_pixel_budget_only_renames_the_judge(tmp_path):
    """The judge's image size is part of the judge's cache key only: the cached policy and generator (and the
    base policies trained from them) stay valid when it changes."""
    from flywheel.models.zoo import zoo_path

    a = load_config(None, [f"run.workdir={tmp_path}", "models.zoo.judge_image_size=56"])
    b = load_config(None, [f"run.workdir={tmp_path}", "models.zoo.judge_image_size=112"])
    assert zoo_path(a, "judge") != zoo_path(b, "judge")
    assert zoo_path(a, "policy") == zoo_path(b, "policy") and zoo_path(a, "generator") == zoo_path(b, "generator")


@pytest.mark.parametrize("key, value, config_key", [
    ("judge_text_layers", 3, "num_hidden_layers"), ("judge_text_hidden", 256, "hidden_size")])
def test_judge_lm_size_is_its_own_and_renames_only_the_judge(tmp_path, key, value, config_key):
    """models.zoo.judge_text_layers / judge_text_hidden size the judge's language model alone. Unset, the judge's
    cache key is what it was before the fields existed (cached judges and the bases trained from them stay valid)."""
    import json

    from flywheel.models.zoo import ZOO_VERSIONS, build_judge, zoo_path

    unset = load_config(None, [f"run.workdir={tmp_path}"])
    sized = load_config(None, [f"run.workdir={tmp_path}", f"models.zoo.{key}={value}"])
    assert zoo_path(unset, "judge") != zoo_path(sized, "judge")
    assert all(zoo_path(unset, n) == zoo_path(sized, n) for n in ("policy", "generator"))
    sizes = unset.models.zoo.model_dump(mode="json", exclude={"judge_text_layers", "judge_text_hidden"})
    blob = json.dumps({"zoo": sizes, "seed": unset.run.seed, "version": ZOO_VERSIONS["judge"]}, sort_keys=True)
    assert zoo_path(unset, "judge").name == f"judge-{hashlib.sha256(blob.encode()).hexdigest()[:12]}"

    build_judge(sized.models.zoo, tmp_path / "sized")
    cfg = json.loads((tmp_path / "sized" / "config.json").read_text())
    assert cfg["text_config"][config_key] == value != getattr(unset.models.zoo, key.removeprefix("judge_"))
    if key == "judge_text_hidden":  # the vision merger feeds the wider LM
        assert cfg["vision_config"]["hidden_size"] == value


def test_judge_width_must_split_into_heads_vllm_accepts(tmp_path):
    from flywheel.models.zoo import build_judge

    cfg = load_config(None, [f"run.workdir={tmp_path}", "models.zoo.judge_text_hidden=96"])  # head_dim 24
    with pytest.raises(ValueError, match="judge_text_hidden/text_heads = 96/4"):
        build_judge(cfg.models.zoo, tmp_path / "j")


def test_build_world_builds_only_the_named_base_policies(tmp_path):
    from flywheel.models.zoo import build_world, world_path

    cfg = load_config(REPO_ROOT / "configs/local.yaml", [f"run.workdir={tmp_path}"])  # all three are world:<name>
    cached = world_path(cfg, "policy")
    cached.mkdir(parents=True)
    (cached / ".complete").write_text('{"sft_loss": 0.5}')  # a finished build: found, not trained again
    assert build_world(cfg, only=["policy"]) == {"policy": (cached, {"sft_loss": 0.5})}
    assert not world_path(cfg, "judge").exists() and not world_path(cfg, "generator").exists()
    assert build_world(cfg, only=[]) == {}
