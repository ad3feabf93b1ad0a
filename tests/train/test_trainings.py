"""The four trainings run a few steps on the tiny models through Ray Train (CPU workers), each yielding a
checkpoint on storage and a registered model version that loads back into a working engine; lineage and metrics
land in MLflow. Plus the NaN stop and the kill-and-resume test."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from mlflow import MlflowClient
from typer.testing import CliRunner

from flywheel.engines import ImageRequest, TextRequest
from flywheel import storage
from flywheel.train import registry
from flywheel.train.api import train
from flywheel.train.guards import NonFiniteLossError
from flywheel.train.launcher import read_journal, run_dir
from flywheel.train.synthetic import shape_image

from flywheel.config import REPO_ROOT

from .sessions import kill_session

HERE = Path(__file__).parent
LOCAL = REPO_ROOT / "configs" / "local.yaml"


def _files(export: Path) -> list[str]:
    return sorted(str(p.relative_to(export)) for p in export.rglob("*") if p.is_file())


def _assert_safetensors_only(export: Path) -> None:
    files = _files(export)
    assert any(f.endswith(".safetensors") for f in files)
    assert not [f for f in files if Path(f).suffix in (".bin", ".pt", ".pth", ".pkl")], files


def _stage_run(cfg, result):
    return MlflowClient(tracking_uri=cfg.tracking.uri).get_run(result.mlflow_run_id)


def _ask(engine):
    req = TextRequest(messages=[{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Rate."}]}],
                      images=[shape_image("red", "square")])
    out = engine.generate([req])[0]
    assert out.ok and out.completion_tokens > 0, out


# Judge SFT as a LoRA registered as an adapter only (no merged copy: loading it back merges it into its base),
# 40 steps with a checkpoint every 4: also the uninterrupted reference of the resume test.
SFT_SETTINGS = ["train.judge_sft.lora.enabled=true", "train.registry.save_merged=false",
                "train.judge_sft.max_steps=40", "train.save_steps=4"]


@pytest.fixture(scope="module")
def killed_run(ray_local, overrides, make_cfg, datasets, tmp_path_factory):
    """The same judge SFT in a process of its own, SIGKILLed (driver, its Ray, the Train workers) by a watcher
    thread as soon as its first checkpoint is committed. Started first so that its start-up overlaps the
    reference run; test_resume_after_kill relaunches it."""
    import threading

    cfg = make_cfg(*SFT_SETTINGS)
    run_name = "resume-killed"
    # polled every 0.1 s: checkpoints are committed promptly
    spec = {"overrides": overrides(*SFT_SETTINGS, "ray.train_poll_interval_s=0.1"), "training": "judge_sft",
            "data": datasets["sft"], "run_name": run_name}
    log_path = tmp_path_factory.mktemp("killed") / "killed.log"
    with open(log_path, "w") as log:
        proc = subprocess.Popen([sys.executable, str(HERE / "run_training.py"), json.dumps(spec)], stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)
    state: dict = {"run_name": run_name, "log_path": log_path}

    def watch():
        try:
            state["committed"] = _wait_for_checkpoint(cfg, run_name, proc)
        except Exception as e:
            state["error"] = e
        finally:
            state["survivors"] = kill_session(proc)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    yield state, watcher
    watcher.join(timeout=300)
    kill_session(proc)


@pytest.fixture(scope="module")
def judge_sft(killed_run, make_cfg, datasets):
    cfg = make_cfg(*SFT_SETTINGS)
    return cfg, train(cfg, "judge-sft", datasets["sft"])


@pytest.mark.slow  # ~100 s on 2 cores with its fixture (SFT, then DPO, each loaded and asked)
def test_judge_sft_then_judge_dpo_from_its_adapter(judge_sft, datasets):
    cfg, sft = judge_sft
    mv = registry.get_version(cfg, sft.model_uri)
    assert mv.name == "judge" and mv.tags["flywheel.training"] == "judge_sft"
    assert mv.tags["flywheel.format"] == "lora" and mv.tags["flywheel.final_step"] == "40"
    assert mv.tags["flywheel.data_content_hash"] == registry.export_meta(registry.materialize(cfg, sft.model_uri))[
        "data_content_hash"]
    for key in ("flywheel.base_model", "flywheel.base_model_version", "flywheel.config_hash", "flywheel.run_key",
                "flywheel.data", "flywheel.checkpoint"):
        assert mv.tags[key], key
    export = registry.materialize(cfg, sft.model_uri)
    assert (export / "adapter" / "adapter_model.safetensors").exists() and not (export / "model").exists()
    _assert_safetensors_only(export)
    assert sft.checkpoint_path.startswith(cfg.storage.uri) and sft.final["final_step"] == 40
    # checkpoints every 4 steps, 3 kept to resume: once registered, only the final one stays (train.prune_registered)
    left = [d for d in storage.subdirs(run_dir(cfg, sft.run_name)) if d.startswith("checkpoint_")]
    assert left == [storage.name(sft.checkpoint_path)]
    assert storage.exists(storage.join(sft.checkpoint_path, "export", "flywheel.json"))
    assert [e["step"] for e in sft.steps] == list(range(1, 41)) and all(len(e["ids"]) == 4 for e in sft.steps)
    run = _stage_run(cfg, sft)
    assert run.data.tags["mlflow.parentRunId"] and run.data.tags["flywheel.stage"] == "judge-sft"
    for metric in ("loss", "learning_rate", "grad_norm", "step_time_s", "data.protocol.decomposed"):
        assert metric in run.data.metrics, metric
    _ask(registry.load_engine(cfg, sft.model_uri))

    # the same training again is the same registered version (no second run)
    again = train(cfg, "judge-sft", datasets["sft"])
    assert again.reused and again.model_uri == sft.model_uri

    # judge DPO starts from the newest judge-sft version and keeps training its adapter
    dpo = train(cfg, "judge-dpo", datasets["judge_dpo"])
    mv2 = registry.get_version(cfg, dpo.model_uri)
    assert mv2.name == "judge" and int(mv2.version) > int(mv.version)
    assert mv2.tags["flywheel.base_model"] == sft.model_uri
    assert mv2.tags["flywheel.adapter_base"] == mv.tags["flywheel.adapter_base"]  # the adapter sits on the base
    run2 = _stage_run(cfg, dpo)
    for metric in ("loss", "learning_rate", "rewards/margins", "rewards/accuracies", "step_time_s"):
        assert metric in run2.data.metrics, metric
    _ask(registry.load_engine(cfg, dpo.model_uri))


def _losses(cfg, result) -> list[float]:
    history = MlflowClient(cfg.tracking.uri).get_metric_history(result.mlflow_run_id, "loss")
    return [m.value for m in sorted(history, key=lambda m: m.step)]


@pytest.mark.slow  # ~50 s each on 2 cores (three trainings' Ray Train starts); test_trl_args.py checks the wiring
@pytest.mark.parametrize("training, data", [("judge-sft", "sft"), ("policy-dpo", "policy_dpo")])
def test_batches_collated_in_worker_processes_train_the_same_and_are_the_same_training(ray_local, make_cfg,
                                                                                       datasets, training, data):
    """train.dataloader_workers: processes beside the Ray Train worker's loop collate its batches (images and
    text through the processor). The same rows per step and the same losses as collating in the loop; and the
    count is not part of the training's identity: the registered training is found, not trained again."""
    own = [f"train.{training.replace('-', '_')}.max_steps=3", f"train.{training.replace('-', '_')}.lr=3e-4"]
    plain_cfg = make_cfg(*own)
    plain = train(plain_cfg, training, datasets[data])
    cfg = make_cfg(*own, "train.dataloader_workers=2")
    assert train(cfg, training, datasets[data]).model_uri == plain.model_uri
    forked = train(cfg, training, datasets[data], fresh=True)
    params = MlflowClient(cfg.tracking.uri).get_run(forked.mlflow_run_id).data.params
    assert params["settings.dataloader_workers"] == "2"
    assert [s["ids"] for s in forked.steps] == [s["ids"] for s in plain.steps] and len(plain.steps) == 3
    assert _losses(cfg, forked) == pytest.approx(_losses(plain_cfg, plain), rel=1e-5) and _losses(cfg, forked)


@pytest.mark.slow  # ~50 s on 2 cores
def test_policy_dpo_through_the_cli(ray_local, overrides, make_cfg, datasets):
    from flywheel.train.cli import train_app

    result = CliRunner().invoke(train_app, ["policy-dpo", "--config", str(LOCAL), "--data", datasets["policy_dpo"],
                                            *overrides()])
    assert result.exit_code == 0, result.output
    assert "models:/policy-llava/" in result.output
    cfg = make_cfg()
    mv = registry.latest_version(cfg, "policy-llava", "policy_dpo")
    assert mv.tags["flywheel.format"] == "lora"
    export = registry.materialize(cfg, registry.describe(mv))
    assert (export / "adapter" / "adapter_model.safetensors").exists() and (export / "model").is_dir()
    _assert_safetensors_only(export)
    metrics = MlflowClient(tracking_uri=cfg.tracking.uri).get_run(mv.run_id).data.metrics
    assert {"rewards/margins", "rewards/accuracies", "loss", "learning_rate"} <= set(metrics)
    _ask(registry.load_engine(cfg, registry.describe(mv)))


@pytest.mark.slow  # ~40 s on 2 cores
def test_diffusion_dpo_lora_on_the_unet(ray_local, make_cfg, datasets):
    # adapter only (diffusers' LoRA format): loading the version back fuses it into its base pipeline
    cfg = make_cfg("train.diffusion_dpo.lora.enabled=true", "train.registry.save_merged=false")
    res = train(cfg, "diffusion-dpo", datasets["image_pref"])
    mv = registry.get_version(cfg, res.model_uri)
    assert mv.name == "policy-sdxl" and mv.tags["flywheel.format"] == "lora"
    export = registry.materialize(cfg, res.model_uri)
    assert (export / "adapter" / "pytorch_lora_weights.safetensors").exists() and not (export / "model").exists()
    _assert_safetensors_only(export)
    metrics = _stage_run(cfg, res).data.metrics
    assert {"loss", "rewards/accuracies", "rewards/margins", "learning_rate", "step_time_s"} <= set(metrics)
    assert 0.0 <= metrics["rewards/accuracies"] <= 1.0
    merged = Path(registry.local_path(cfg, res.model_uri))
    assert (merged / "unet" / "diffusion_pytorch_model.safetensors").exists()
    out = registry.load_engine(cfg, res.model_uri).generate([ImageRequest(prompt="a red square", seed=1)])[0]
    assert out.ok and out.image.size == (56, 56)


@pytest.mark.slow  # 36-38 s on 2 cores
def test_nan_loss_stops_the_run_and_registers_nothing(ray_local, make_cfg, datasets):
    cfg = make_cfg("train.judge_sft.lr=1e30", "train.judge_sft.max_steps=6")
    before = registry.latest_version(cfg, "judge")
    with pytest.raises(NonFiniteLossError, match=r"non-finite (loss|gradient) at optimizer step \d") as err:
        train(cfg, "judge-sft", datasets["sft"])
    assert 1 <= err.value.step < 6
    after = registry.latest_version(cfg, "judge")
    assert (before and before.version) == (after and after.version)
    client = MlflowClient(tracking_uri=cfg.tracking.uri)
    runs = client.search_runs([client.get_experiment_by_name(cfg.experiment).experiment_id],
                              "tags.`flywheel.stage` = 'judge-sft'", order_by=["attributes.start_time DESC"])
    assert runs[0].info.status == "FAILED"


def _wait_for_checkpoint(cfg, run_name, proc, timeout=300) -> dict:
    deadline = time.time() + timeout
    while time.time() < deadline:
        committed = [e for e in read_journal(cfg, run_name) if e.get("checkpoint") and not e.get("final")]
        if committed:
            return committed[-1]
        if proc.poll() is not None:
            raise RuntimeError("the training process ended before its first checkpoint")
        time.sleep(0.05)
    raise RuntimeError("no checkpoint committed in time")


@pytest.mark.slow  # ~45 s on 2 cores, after judge_sft's reference run
def test_resume_after_kill_neither_skips_nor_repeats_data(judge_sft, killed_run, datasets):
    """verl #7401: a resumed run must continue at the checkpoint's step with the very next batch. The run is
    SIGKILLed (driver, controller and workers) right after its first checkpoint is committed, then launched
    again; its final step count and per-step sample ids must equal an uninterrupted run's (judge_sft's)."""
    cfg, reference = judge_sft
    assert reference.final["final_step"] == 40 and reference.final["resumed_from"] is None
    state, watcher = killed_run
    watcher.join(timeout=300)
    log = Path(state["log_path"]).read_text()
    assert "error" not in state, f"{state.get('error')}\n{log[-3000:]}"
    committed, run_name = state["committed"], state["run_name"]
    assert not state["survivors"], "processes of the killed run survived"
    assert "FINISHED" not in log
    assert not any(e.get("final") for e in read_journal(cfg, run_name))

    resumed = train(cfg, "judge-sft", datasets["sft"], run_name=run_name, register=False)
    killed_at = resumed.final["resumed_from"]  # the latest checkpoint Ray Train had committed
    assert killed_at is not None, "the relaunched run did not resume"
    assert committed["step"] <= killed_at < 40 and killed_at % 4 == 0
    assert resumed.final["final_step"] == reference.final["final_step"] == 40
    assert [e["step"] for e in resumed.steps] == list(range(1, 41))  # every step exactly once
    assert [e["ids"] for e in resumed.steps] == [e["ids"] for e in reference.steps]  # the same data, in order
    before = {e["attempt"] for e in resumed.steps if e["step"] <= killed_at}
    after = {e["attempt"] for e in resumed.steps if e["step"] > killed_at}
    assert len(before) == 1 and len(after) == 1 and before != after  # killed attempt, then the resumed one
    assert resumed.final["loss"] == pytest.approx(reference.final["loss"], rel=1e-4)


@pytest.mark.slow  # ~140 s on 2 cores (three trainings)
def test_a_resumed_full_fine_tune_goes_on_from_its_checkpointed_weights(ray_local, overrides, make_cfg, datasets,
                                                                         tmp_path):
    """transformers 5 checkpoints Qwen2-VL in the hub's key layout; the Trainer's own resume then loaded none of
    the weights (load_state_dict strict=False) and went on from the start weights: final loss 5.019 against the
    uninterrupted run's 4.611 here (LoRA resumed right). Killed after its first checkpoint, then launched again."""
    settings = ["train.judge_sft.lora.enabled=false", "train.registry.save_merged=false",
                "train.judge_sft.max_steps=16", "train.save_steps=4"]
    cfg, run_name = make_cfg(*settings), "resume-full"
    spec = {"overrides": overrides(*settings, "ray.train_poll_interval_s=0.1"), "training": "judge_sft",
            "data": datasets["sft"], "run_name": run_name}
    with open(tmp_path / "killed.log", "w") as log:
        proc = subprocess.Popen([sys.executable, str(HERE / "run_training.py"), json.dumps(spec)], stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)
    try:
        _wait_for_checkpoint(cfg, run_name, proc)
    finally:
        assert not kill_session(proc)
    resumed = train(cfg, "judge-sft", datasets["sft"], run_name=run_name, register=False)
    reference = train(cfg, "judge-sft", datasets["sft"], run_name="resume-full-reference", register=False)
    assert resumed.final["resumed_from"] is not None and reference.final["resumed_from"] is None
    assert [e["ids"] for e in resumed.steps] == [e["ids"] for e in reference.steps]
    assert resumed.final["loss"] == pytest.approx(reference.final["loss"], rel=1e-5)


@pytest.mark.slow
def test_failed_worker_is_restarted_from_the_latest_checkpoint(judge_sft, make_cfg, datasets):
    """FailureConfig: SIGKILL the Ray Train worker mid-run; Ray Train restarts the worker group, which resumes
    from the latest checkpoint, and the run ends as an uninterrupted one would."""
    import threading

    cfg, reference = judge_sft
    cfg = make_cfg(*SFT_SETTINGS, "train.max_failures=1")
    run_name = "retry-after-worker-kill"
    out: dict = {}
    thread = threading.Thread(target=lambda: out.update(result=train(cfg, "judge-sft", datasets["sft"],
                                                                     run_name=run_name, register=False)))
    thread.start()
    deadline = time.time() + 240
    while time.time() < deadline and not [e for e in read_journal(cfg, run_name) if e.get("checkpoint")]:
        time.sleep(0.05)
    first = [e for e in read_journal(cfg, run_name) if e.get("checkpoint")][0]
    os.kill(first["worker_pids"][0], signal.SIGKILL)
    thread.join(timeout=300)
    result = out["result"]
    assert any("worker_errors" in e for e in read_journal(cfg, run_name))
    assert result.final["resumed_from"] is not None and result.final["final_step"] == 40
    assert [e["ids"] for e in result.steps] == [e["ids"] for e in reference.steps]
