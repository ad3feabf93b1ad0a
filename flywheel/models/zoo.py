"""Tiny random-initialised checkpoints of the real architectures, built here because no weights can be fetched.

Each checkpoint is written in the standard transformers/diffusers layout (safetensors, config, tokenizer,
processor, chat template) and is loaded by the same `from_pretrained` path a real 7B checkpoint takes:
`AutoProcessor` + `AutoModelForImageTextToText` for the Qwen2-VL judge and the LLaVA policy,
`StableDiffusionXLPipeline.from_pretrained` for the SDXL generator.

Builds are deterministic for a seed and cached: the folder name carries a hash of the sizes, the seed and
ZOO_VERSIONS, and a `.complete` marker is written last, so a second build is a no-op and a killed build is redone.
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
from collections.abc import Iterable
from contextlib import contextmanager
from pathlib import Path

import torch

from flywheel.config import Config, ModelRef, ZooConfig
from flywheel.models.processors import ImageOnlyQwen2VLProcessor
from flywheel.models.tokenizers import train_bpe, write_clip_vocab

log = logging.getLogger(__name__)

# Bump a model's number when its build recipe changes, so cached checkpoints of it are rebuilt.
ZOO_VERSIONS = {"judge": 1, "policy": 1, "generator": 2}
ZOO_NAMES = ("judge", "policy", "generator")
ZOO_PREFIX = "zoo:"
WORLD_PREFIX = "world:"  # the oracle world's base policies, trained from the zoo (flywheel/worlds/shapes)
WORLD_NAMES = ("judge", "policy", "generator")

QWEN_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>",
                 "<|image_pad|>", "<|video_pad|>"]
LLAVA_SPECIALS = ["<pad>", "<s>", "</s>", "<image>"]

# Qwen2-VL's own chat format; `{{ '\n' }}` because transformers renders templates with trim_blocks=True.
QWEN_CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}{{ '\n' }}"
    "{% if m['content'] is string %}{{ m['content'] }}{% else %}{% for c in m['content'] %}"
    "{% if c['type'] == 'image' %}<|vision_start|><|image_pad|><|vision_end|>{% else %}{{ c['text'] }}{% endif %}"
    "{% endfor %}{% endif %}<|im_end|>{{ '\n' }}{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant{{ '\n' }}{% endif %}"
)
# LLaVA-1.5's format. The assistant prefix renders identically with and without the answer, which TRL's DPO
# needs (it takes the prompt as the common prefix of prompt and prompt+chosen).
LLAVA_CHAT_TEMPLATE = (
    "{% for m in messages %}{% if m['role'] == 'user' %}USER: "
    "{% if m['content'] is string %}{{ m['content'] }}{% else %}{% for c in m['content'] %}"
    "{% if c['type'] == 'image' %}<image>{{ '\n' }}{% else %}{{ c['text'] }}{% endif %}{% endfor %}{% endif %} "
    "{% elif m['role'] == 'assistant' %}ASSISTANT: "
    "{% if m['content'] is string %}{{ m['content'] }}{% else %}{% for c in m['content'] %}{{ c['text'] }}"
    "{% endfor %}{% endif %}</s>{% else %}{{ m['content'] if m['content'] is string else '' }}{{ '\n' }}"
    "{% endif %}{% endfor %}{% if add_generation_prompt %}ASSISTANT:{% endif %}"
)


def zoo_root(cfg: Config) -> Path:
    return Path(cfg.run.workdir) / "models"


def spec_hash(zoo: ZooConfig, seed: int, name: str) -> str:
    # Only the judge reads the judge_* sizes: leaving them out of the others' hash keeps their caches valid, and
    # an unset judge_text_* size is left out of the judge's so that judges built before it existed stay valid.
    optional = ("judge_text_layers", "judge_text_hidden")
    judge_only = {"judge_image_size", *optional}
    unset = {k for k in optional if getattr(zoo, k) is None}
    exclude = unset if name == "judge" else judge_only
    sizes = zoo.model_dump(mode="json", exclude=exclude)
    blob = json.dumps({"zoo": sizes, "seed": seed, "version": ZOO_VERSIONS[name]}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


def zoo_path(cfg: Config, name: str) -> Path:
    if name not in ZOO_NAMES:
        raise ValueError(f"unknown zoo model '{name}'; the zoo builds {', '.join(ZOO_NAMES)}")
    return zoo_root(cfg) / f"{name}-{spec_hash(cfg.models.zoo, cfg.run.seed, name)}"


def world_path(cfg: Config, name: str) -> Path:
    from flywheel.worlds.shapes.base_policies import generator_dir, judge_dir, policy_dir

    if name not in WORLD_NAMES:
        raise ValueError(f"unknown world model '{name}'; the world trains {', '.join(WORLD_NAMES)}")
    w = cfg.world
    make = {"judge": judge_dir, "policy": policy_dir, "generator": generator_dir}[name]
    return make(zoo_path(cfg, name), zoo_root(cfg), w.shapes, w.base_policies, cfg.run.seed)


def world_models(cfg: Config, only: Iterable[str] | None = None) -> list[str]:
    """The world's base models the config uses (`world:<name>`), of `only` if given."""
    wanted = set(WORLD_NAMES if only is None else only)
    return [m for m in WORLD_NAMES if m in wanted and getattr(cfg.models, m).path == WORLD_PREFIX + m]


def world_built(cfg: Config, name: str) -> bool:
    return (world_path(cfg, name) / ".complete").exists()


def build_world(cfg: Config, only: Iterable[str] | None = None) -> dict[str, tuple[Path, dict]]:
    """Build the zoo, then the world's base models the config uses (cached); name -> (folder, metrics).
    only: of those, just these names (e.g. a bench of the policy alone need not build the judge base).
    Torch runs `resources.base_models.num_cpus` threads meanwhile: the same build on another thread count sums
    in another order and ends elsewhere after thousands of steps (stages/base_models.py runs it in a Ray task)."""
    from flywheel.worlds.shapes.base_policies import build_base_generator, build_base_judge, build_base_policy

    builders = {"judge": build_base_judge, "policy": build_base_policy, "generator": build_base_generator}
    zoo = build_zoo(cfg)
    w = cfg.world
    threads = max(1, int(cfg.resources.base_models.num_cpus))
    with torch_threads(threads):
        out = {m: builders[m](zoo[m], zoo_root(cfg), w.shapes, w.base_policies, cfg.run.seed)
               for m in world_models(cfg, only)}
    return out


@contextmanager
def torch_threads(n: int):
    """torch's intra-op thread count set to `n` for the block, then restored."""
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def resolve_model_path(ref: ModelRef, cfg: Config) -> str:
    """What to pass to from_pretrained: the zoo folder for `zoo:<name>`, the base policy for `world:<name>`,
    a local copy of a registered version for `models:/<name>/<version>` or `models:/<name>@<alias>`, else the
    path or hub id as given."""
    if ref.path.startswith("models:/"):
        from flywheel.train.registry import local_path

        return local_path(cfg, ref.path)
    if ref.path.startswith(WORLD_PREFIX):
        path = world_path(cfg, ref.path[len(WORLD_PREFIX):])
        if not (path / ".complete").exists():
            raise FileNotFoundError(f"{ref.path} is not built at {path}: run `flywheel models build` first")
        return str(path)
    if ref.path.startswith(ZOO_PREFIX):
        path = zoo_path(cfg, ref.path[len(ZOO_PREFIX):])
        if not (path / ".complete").exists():
            raise FileNotFoundError(f"{ref.path} is not built at {path}: run `flywheel models build` first")
        return str(path)
    return ref.path


def build_zoo(cfg: Config, force: bool = False) -> dict[str, Path]:
    """Build (or find cached) the three tiny checkpoints; returns name -> folder."""
    builders = {"judge": build_judge, "policy": build_policy, "generator": build_generator}
    out = {}
    for name in ZOO_NAMES:
        path = zoo_path(cfg, name)
        if (path / ".complete").exists() and not force:
            log.info("zoo: %s cached at %s", name, path)
        else:
            tmp = path.with_name(path.name + ".tmp")
            shutil.rmtree(tmp, ignore_errors=True)
            torch.manual_seed(cfg.run.seed)
            builders[name](cfg.models.zoo, tmp)
            (tmp / ".complete").write_text(spec_hash(cfg.models.zoo, cfg.run.seed, name))
            shutil.rmtree(path, ignore_errors=True)
            tmp.rename(path)  # the finished folder appears at once; a killed build leaves only .tmp
            log.info("zoo: built %s at %s", name, path)
        out[name] = path
    return out


def _check_sizes(z: ZooConfig) -> None:
    for key in ("image_size", "judge_image_size"):
        if getattr(z, key) % 28:
            raise ValueError(f"models.zoo.{key}={getattr(z, key)}: must be a multiple of 28 (14-px patches, 2x2 merge)")
    for key in ("text_hidden", "judge_text_hidden"):
        hidden = getattr(z, key)
        if hidden is not None and (hidden % z.text_heads or hidden // z.text_heads < 32):
            raise ValueError(
                f"models.zoo: {key}/text_heads = {hidden}/{z.text_heads} must divide evenly into a "
                "head_dim of at least 32 (vLLM's CPU attention)"
            )


def build_judge(z: ZooConfig, out: Path) -> None:
    """A tiny Qwen2-VL (the UFEval judge's architecture)."""
    from transformers import PreTrainedTokenizerFast, Qwen2VLConfig, Qwen2VLForConditionalGeneration
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    _check_sizes(z)
    tok = PreTrainedTokenizerFast(
        tokenizer_object=train_bpe(z.vocab_size, QWEN_SPECIALS),
        eos_token="<|im_end|>", pad_token="<|endoftext|>", padding_side="left",
    )
    pixels = z.judge_image_size * z.judge_image_size
    # Fixed pixel budget: every image becomes (judge_image_size/28)^2 tokens, so sequence lengths stay predictable.
    processor = ImageOnlyQwen2VLProcessor(
        image_processor=Qwen2VLImageProcessorPil(min_pixels=pixels, max_pixels=pixels),
        tokenizer=tok, chat_template=QWEN_CHAT_TEMPLATE,
    )
    ids = {s: tok.convert_tokens_to_ids(s) for s in QWEN_SPECIALS}
    hidden = z.judge_text_hidden or z.text_hidden
    head_dim = hidden // z.text_heads
    half = head_dim // 2  # mrope sections (temporal, height, width) must sum to head_dim / 2
    mrope = [half - 2 * (half * 3 // 8), half * 3 // 8, half * 3 // 8]
    config = Qwen2VLConfig(
        text_config=dict(
            vocab_size=len(tok), hidden_size=hidden, intermediate_size=2 * hidden,
            num_hidden_layers=z.judge_text_layers or z.text_layers, num_attention_heads=z.text_heads,
            num_key_value_heads=z.text_heads, max_position_embeddings=4096,
            rope_scaling={"type": "mrope", "mrope_section": mrope},
            tie_word_embeddings=True, bos_token_id=None, eos_token_id=ids["<|im_end|>"],
            pad_token_id=ids["<|endoftext|>"],
        ),
        vision_config=dict(
            depth=z.vision_layers, embed_dim=z.vision_hidden, hidden_size=hidden,  # merger out = text width
            num_heads=max(1, z.vision_hidden // 32), mlp_ratio=2, patch_size=14, spatial_merge_size=2,
            temporal_patch_size=2, in_channels=3,
        ),
        image_token_id=ids["<|image_pad|>"], video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"], vision_end_token_id=ids["<|vision_end|>"],
        eos_token_id=ids["<|im_end|>"], pad_token_id=ids["<|endoftext|>"], tie_word_embeddings=True,
    )
    model = Qwen2VLForConditionalGeneration(config)
    model.generation_config.update(eos_token_id=ids["<|im_end|>"], pad_token_id=ids["<|endoftext|>"])
    model.save_pretrained(out)
    processor.save_pretrained(out)


def build_policy(z: ZooConfig, out: Path) -> None:
    """A tiny LLaVA-1.5 (CLIP vision tower + projector + Llama)."""
    from transformers import (CLIPVisionConfig, LlamaConfig, LlavaConfig, LlavaForConditionalGeneration,
                              LlavaProcessor, PreTrainedTokenizerFast)
    from transformers.models.clip.image_processing_pil_clip import CLIPImageProcessorPil

    _check_sizes(z)
    tok = PreTrainedTokenizerFast(
        tokenizer_object=train_bpe(z.vocab_size, LLAVA_SPECIALS),
        bos_token="<s>", eos_token="</s>", pad_token="<pad>", padding_side="left",
    )
    size = {"shortest_edge": z.image_size}
    image_processor = CLIPImageProcessorPil(size=size, crop_size={"height": z.image_size, "width": z.image_size})
    processor = LlavaProcessor(
        image_processor=image_processor, tokenizer=tok, patch_size=14, vision_feature_select_strategy="default",
        num_additional_image_tokens=1, chat_template=LLAVA_CHAT_TEMPLATE, image_token="<image>",
    )
    n_image_tokens = (z.image_size // 14) ** 2
    config = LlavaConfig(
        vision_config=CLIPVisionConfig(
            hidden_size=z.vision_hidden, intermediate_size=2 * z.vision_hidden, num_hidden_layers=z.vision_layers,
            num_attention_heads=max(1, z.vision_hidden // 32), image_size=z.image_size, patch_size=14,
            projection_dim=z.vision_hidden,
        ),
        text_config=LlamaConfig(
            vocab_size=len(tok), hidden_size=z.text_hidden, intermediate_size=2 * z.text_hidden,
            num_hidden_layers=z.text_layers, num_attention_heads=z.text_heads, num_key_value_heads=z.text_heads,
            max_position_embeddings=2048, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
            pad_token_id=tok.pad_token_id, tie_word_embeddings=True,
        ),
        image_token_index=tok.convert_tokens_to_ids("<image>"), image_seq_length=n_image_tokens,
        vision_feature_select_strategy="default", vision_feature_layer=-1, pad_token_id=tok.pad_token_id,
        tie_word_embeddings=True,
    )
    model = LlavaForConditionalGeneration(config)
    model.generation_config.update(
        bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id
    )
    model.save_pretrained(out)
    processor.save_pretrained(out)


def build_generator(z: ZooConfig, out: Path) -> None:
    """A tiny SDXL: two CLIP text encoders, a text_time UNet, a VAE, an Euler scheduler."""
    from diffusers import AutoencoderKL, EulerDiscreteScheduler, StableDiffusionXLPipeline, UNet2DConditionModel
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTextModelWithProjection, CLIPTokenizer

    _check_sizes(z)
    vocab_file, merges_file = write_clip_vocab(out / "_clip_vocab", z.vocab_size)
    max_len = 32
    tokenizer = CLIPTokenizer(str(vocab_file), str(merges_file), model_max_length=max_len, pad_token="<|endoftext|>")
    shutil.rmtree(out / "_clip_vocab")
    text_cfg = dict(
        vocab_size=len(tokenizer), hidden_size=z.clip_hidden, intermediate_size=2 * z.clip_hidden,
        num_hidden_layers=2, num_attention_heads=2, max_position_embeddings=max_len, projection_dim=z.clip_hidden,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
    )
    text_encoder = CLIPTextModel(CLIPTextConfig(**text_cfg))
    text_encoder_2 = CLIPTextModelWithProjection(CLIPTextConfig(**text_cfg))
    for enc in (text_encoder, text_encoder_2):
        # The encoders stay frozen and random; CLIP's default init gives ~0.02-scale embeddings under which all
        # prompts look alike, so re-draw them wider to keep prompts distinguishable (measured in cpu-stack.md).
        emb = enc.get_input_embeddings()
        torch.nn.init.normal_(emb.weight, std=1.0)
        pos = next(m for n, m in enc.named_modules() if n.endswith("position_embedding"))
        torch.nn.init.normal_(pos.weight, std=0.3)

    time_dim = 8
    vae_scale = 2 ** (len(z.vae_channels) - 1)
    unet = UNet2DConditionModel(
        sample_size=z.image_size // vae_scale, in_channels=4, out_channels=4, layers_per_block=1,
        block_out_channels=tuple(z.unet_channels),
        down_block_types=("DownBlock2D",) + ("CrossAttnDownBlock2D",) * (len(z.unet_channels) - 1),
        up_block_types=("CrossAttnUpBlock2D",) * (len(z.unet_channels) - 1) + ("UpBlock2D",),
        cross_attention_dim=2 * z.clip_hidden,  # SDXL concatenates both encoders' hidden states
        attention_head_dim=tuple(max(1, c // 16) for c in z.unet_channels), norm_num_groups=8,
        addition_embed_type="text_time", addition_time_embed_dim=time_dim,
        # 6 micro-conditioning numbers (original size, crop, target size) + text_encoder_2's pooled projection
        projection_class_embeddings_input_dim=6 * time_dim + z.clip_hidden,
    )
    vae = AutoencoderKL(
        in_channels=3, out_channels=3, latent_channels=4, block_out_channels=tuple(z.vae_channels),
        down_block_types=("DownEncoderBlock2D",) * len(z.vae_channels),
        up_block_types=("UpDecoderBlock2D",) * len(z.vae_channels), layers_per_block=1, norm_num_groups=8,
        sample_size=z.image_size,
    )
    scheduler = EulerDiscreteScheduler(
        num_train_timesteps=1000, beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear",
        timestep_spacing="trailing",
    )
    pipe = StableDiffusionXLPipeline(
        vae=vae, text_encoder=text_encoder, text_encoder_2=text_encoder_2, tokenizer=tokenizer,
        tokenizer_2=tokenizer, unet=unet, scheduler=scheduler, add_watermarker=False,
    )
    pipe.save_pretrained(out)
