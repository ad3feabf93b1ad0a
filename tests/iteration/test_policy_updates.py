"""Which policy updates an iteration attempts: Diffusion-DPO needs one full batch of training pairs."""

from flywheel.config import load_config
from flywheel.iteration import _too_few_pairs
from flywheel.train.synthetic import write_synthetic


def test_diffusion_dpo_is_skipped_with_its_reason_when_pairs_cannot_fill_a_batch(tmp_path):
    one_worker = load_config(None, ["train.diffusion_dpo.batch_size=8", "resources.train.actors=1"])
    two_workers = load_config(None, ["train.diffusion_dpo.batch_size=8", "resources.train.actors=2"])
    few, some = str(tmp_path / "few"), str(tmp_path / "some")
    write_synthetic(few, "image_pref", 7, size=16)
    write_synthetic(some, "image_pref", 12, size=16)
    assert "7 training pairs cannot fill one batch of 8" in _too_few_pairs(one_worker, "diffusion_dpo", few)
    assert _too_few_pairs(one_worker, "diffusion_dpo", some) is None
    assert "(16 pairs)" in _too_few_pairs(two_workers, "diffusion_dpo", some)  # a full batch on each worker
    assert _too_few_pairs(one_worker, "policy_dpo", few) is None  # TRL's DPO takes a partial batch
