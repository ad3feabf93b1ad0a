"""Diffusion-DPO: the hand-written loss against a hand computation, the sign flip when preferred and dispreferred
swap, SDXL conditioning, and the resumable data order. No Ray here (the launcher runs it in test_trainings)."""

import math
from pathlib import Path

import pytest
import torch
from PIL import Image

from flywheel.records import validate
from flywheel.train import diffusion_dpo as D
from flywheel.train import diffusion_loop
from flywheel.train.guards import NonFiniteLossError, check_step
from flywheel.train.synthetic import image_pref_records


def _nll_sigmoid(x: float) -> float:  # -log sigmoid(x), by hand
    return math.log(1.0 + math.exp(-x))


def test_loss_matches_a_hand_computation():
    mw, ml = torch.tensor([0.10, 0.30]), torch.tensor([0.20, 0.10])
    rw, rl = torch.tensor([0.15, 0.20]), torch.tensor([0.15, 0.20])
    beta = 10.0
    # pair 1: model diff -0.1, ref diff 0 -> inside = -5 * (-0.1) = 0.5 ; pair 2: model diff 0.2 -> inside = -1
    loss, stats = D.diffusion_dpo_loss(mw, ml, rw, rl, beta)
    assert loss.item() == pytest.approx((_nll_sigmoid(0.5) + _nll_sigmoid(-1.0)) / 2, rel=1e-6)
    assert stats["implicit_acc"].item() == pytest.approx(0.5)  # pair 1 prefers w, pair 2 does not
    assert stats["margin"].item() == pytest.approx((0.5 - 1.0) / 2)
    # equal model and reference: log 2, accuracy one half (ties count half), zero margin
    loss0, stats0 = D.diffusion_dpo_loss(rw, rl, rw, rl, 5000.0)
    assert loss0.item() == pytest.approx(math.log(2)) and stats0["implicit_acc"].item() == 0.5
    assert stats0["margin"].item() == 0.0


def test_swapping_preferred_and_dispreferred_flips_the_gradient():
    torch.manual_seed(0)
    mw, ml = torch.rand(4, requires_grad=True), torch.rand(4, requires_grad=True)
    rw, rl = torch.rand(4), torch.rand(4)
    D.diffusion_dpo_loss(mw, ml, rw, rl, 3.0)[0].backward()
    g_w, g_l = mw.grad.clone(), ml.grad.clone()
    mw.grad, ml.grad = None, None
    D.diffusion_dpo_loss(ml, mw, rl, rw, 3.0)[0].backward()  # the same pairs, labels swapped
    assert torch.all(torch.sign(mw.grad) == -torch.sign(g_w)) and torch.all(torch.sign(ml.grad) == -torch.sign(g_l))
    assert torch.all(g_w > 0) and torch.all(g_l < 0)  # descent lowers the preferred image's error


@pytest.fixture(scope="module")
def parts(zoo, cfg):
    settings = cfg.model_copy(deep=True)
    s = settings.train.resolved("diffusion_dpo").model_copy(update={"lora": settings.train.lora.model_copy(
        update={"enabled": True, "r": 4, "alpha": 4, "target_modules": ["to_q", "to_k", "to_v", "to_out.0"]})})
    return D.load_parts(str(zoo["generator"]), s)


def _grads(parts, latents, batch):
    parts.unet.zero_grad(set_to_none=True)
    loss, stats = D.pair_loss(parts, parts.unet, latents, batch, D.PromptCache(parts.pipe), 5000.0,
                              torch.Generator().manual_seed(7))
    loss.backward()
    return torch.cat([p.grad.flatten() for p in parts.unet.parameters() if p.requires_grad]), loss, stats


def test_swap_flips_the_unet_gradient_at_the_reference(parts):
    """At the start the LoRA model equals the reference, so with the same noise and timesteps the swapped
    pairs' gradient is exactly the negative of the original's."""
    batch = D.pair_batch(validate("image_pref", image_pref_records(2, size=56))[0], parts.resolution)
    latents = D.encode_pairs(parts, batch["pixels"], torch.Generator().manual_seed(3))
    chosen, rejected = latents.chunk(2)
    g, loss, stats = _grads(parts, latents, batch)
    g_swapped, _, _ = _grads(parts, torch.cat([rejected, chosen]), batch)
    assert loss.item() == pytest.approx(math.log(2), abs=1e-5) and stats["implicit_acc"].item() == 0.5
    assert g.abs().sum() > 0
    assert torch.nn.functional.cosine_similarity(g, g_swapped, dim=0).item() == pytest.approx(-1.0, abs=1e-6)
    assert torch.allclose(g_swapped, -g, rtol=1e-3, atol=1e-5 * g.abs().max().item())  # float32 rounding only


def test_full_fine_tune_trains_the_unet_against_a_frozen_copy(zoo, cfg):
    s = cfg.train.resolved("diffusion_dpo")  # local.yaml: a full fine-tune
    assert not s.lora.enabled
    full = D.load_parts(str(zoo["generator"]), s)
    assert full.ref_unet is not None and full.ref_unet is not full.unet
    assert all(p.requires_grad for p in full.unet.parameters())
    assert not any(p.requires_grad for p in full.ref_unet.parameters())
    batch = D.pair_batch(validate("image_pref", image_pref_records(2, size=56))[0], full.resolution)
    loss, stats = D.dpo_step(full, full.unet, batch, D.PromptCache(full.pipe), s.beta, torch.Generator().manual_seed(0))
    loss.backward()
    assert loss.item() == pytest.approx(math.log(2), abs=1e-5)  # the model starts as its reference
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in full.unet.parameters())
    assert all(p.grad is None for p in full.ref_unet.parameters())


def test_sdxl_conditioning_uses_both_encoders_and_micro_conditioning(parts):
    pipe = parts.pipe
    embeds, pooled = D.PromptCache(pipe)(["a red square", "a blue circle"])
    width = pipe.text_encoder.config.hidden_size + pipe.text_encoder_2.config.hidden_size
    assert embeds.shape[-1] == width == parts.unet.config.cross_attention_dim
    assert pooled.shape[-1] == pipe.text_encoder_2.config.projection_dim
    assert not torch.allclose(embeds[0], embeds[1])
    # a 40x80 image: short side resized to R, centre-cropped; the time ids carry what happened
    px, original, crop = D.preprocess_pair(Image.new("RGB", (80, 40), "red"), Image.new("RGB", (60, 60), "blue"),
                                           56)
    assert px.shape == (2, 3, 56, 56) and original == (40, 80) and crop == (0, 28)
    ids = D.time_ids(original, crop, 56)
    assert ids.tolist() == [40, 80, 0, 28, 56, 56]
    needed = parts.unet.config.projection_class_embeddings_input_dim
    assert parts.unet.config.addition_time_embed_dim * len(ids) + pooled.shape[-1] == needed


def test_pair_order_is_deterministic_sharded_and_resumable():
    a, b = D.PairOrder(20, 3, 0, 2, seed=5), D.PairOrder(20, 3, 1, 2, seed=5)
    assert a.batches_per_epoch == 3
    first = [a.indices(i) for i in range(6)]
    assert first == [D.PairOrder(20, 3, 0, 2, seed=5).indices(i) for i in range(6)]  # a fresh process agrees
    assert not set(sum(first[:3], [])) & set(sum([b.indices(i) for i in range(3)], []))  # ranks are disjoint
    assert first[:3] != first[3:]  # a new permutation each epoch
    assert torch.equal(torch.randn(3, generator=a.generator(4)), torch.randn(3, generator=a.generator(4)))
    with pytest.raises(ValueError, match="cannot fill"):
        D.PairOrder(3, 4, 0, 1, seed=0)


def test_guard_raises_on_nan_or_inf():
    p = torch.nn.Parameter(torch.ones(2))
    p.grad = torch.tensor([1.0, float("nan")])
    check_step(1, 0.5, None)  # fine
    with pytest.raises(NonFiniteLossError, match="step 3"):
        check_step(3, float("inf"), None)
    with pytest.raises(NonFiniteLossError, match="gradient"):
        check_step(4, 0.5, [p])


class _LocalContext:
    """A stand-in for the Ray Train worker context (flywheel.train.worker.WorkerContext) to run the hand-written
    loop in-process: it keeps reported checkpoints in folders instead of uploading them. The loop itself runs
    through Ray Train in test_trainings."""

    def __init__(self, cfg, data: str, base: str, local_dir: str, restore: str | None = None):
        from flywheel.train.worker import MetricsLogger, StepLog, StepTimer, TrainJob

        self.cfg, self.settings = cfg, cfg.train.resolved("diffusion_dpo")
        self.job = TrainJob(training="diffusion_dpo", config={}, data=data, base=base, run_key="test")
        self.seed, self.rank, self.world, self.is_main = cfg.run.seed, 0, 1, True
        self.steps, self.metrics, self.timer = StepLog(0, Path(local_dir).name), MetricsLogger(None, None), StepTimer()
        self.local_dir, self._restore, self.resumed_from = local_dir, restore, None
        self.checkpoints: dict[int, str] = {}
        self.final = None

    def base_path(self):
        return self.job.base

    def restore_dir(self):
        return self._restore

    def report_checkpoint(self, directory, step, metrics, steps_dir=None):
        import shutil

        self.steps.save(steps_dir or directory, upto=step)
        keep = Path(self.local_dir) / f"kept-{step}"
        shutil.copytree(directory, keep)
        self.checkpoints[step] = str(keep)

    def report_final(self, export, metrics, step):
        self.final = (export, metrics, step)


def test_diffusion_loop_resumes_exactly(zoo, cfg, tmp_path):
    """Resuming the hand-written loop from its step-2 checkpoint gives the same batches, noise and weights as
    the uninterrupted run (the diffusers example would restart the epoch instead)."""
    from safetensors.torch import load_file

    from flywheel.config import load_config
    from flywheel.datasets import write_dataset

    data = str(tmp_path / "pairs")
    write_dataset(data, "image_pref", image_pref_records(12), config_hash="c", producer="test")
    c = load_config(None, [f"run.workdir={cfg.run.workdir}", "train.diffusion_dpo.max_steps=4",
                           "train.diffusion_dpo.batch_size=4", "train.save_steps=2", "train.registry.save_merged=false",
                           "train.diffusion_dpo.lora.enabled=true", "train.diffusion_dpo.lr=1e-3",
                           "train.diffusion_dpo.heldout=null"])  # the last state is exported (no best-state pick)
    for d in ("a", "b"):
        (tmp_path / d).mkdir()
    full = _LocalContext(c, data, str(zoo["generator"]), str(tmp_path / "a"))
    diffusion_loop.worker(full)
    assert sorted(full.checkpoints) == [2] and full.final[2] == 4
    resumed = _LocalContext(c, data, str(zoo["generator"]), str(tmp_path / "b"), restore=full.checkpoints[2])
    diffusion_loop.worker(resumed)
    assert resumed.resumed_from == 2
    assert [e["ids"] for e in resumed.steps.entries] == [e["ids"] for e in full.steps.entries]
    assert [e["step"] for e in resumed.steps.entries] == [1, 2, 3, 4]
    w_full = load_file(str(Path(full.final[0]) / "adapter" / D.LORA_WEIGHTS))
    w_resumed = load_file(str(Path(resumed.final[0]) / "adapter" / D.LORA_WEIGHTS))
    assert w_full.keys() == w_resumed.keys() and all(torch.equal(w_full[k], w_resumed[k]) for k in w_full)
    assert any(w_full[k].abs().max() > 0 for k in w_full if ".up." in k)  # the LoRA did train
