import re
from pathlib import Path

import pytest

from flywheel.config import HASHED_ONLY_WHEN_SET, REPO_ROOT, Config, ConfigError, load_config, parse_override

# Run configs are the top-level YAML files; sub-folders (guidelines/) and aspects.yaml hold data, not run configs.
SHIPPED = sorted(p for p in (REPO_ROOT / "configs").glob("*.yaml") if p.name != "aspects.yaml")


def test_at_least_local_and_gpu_configs_ship():
    names = {p.name for p in SHIPPED}
    assert {"local.yaml", "gpu_7b.yaml"} <= names


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.name)
def test_every_shipped_config_loads(path):
    cfg = load_config(path)
    assert isinstance(cfg, Config)
    assert "${workdir}" not in cfg.to_yaml()  # placeholders are resolved
    assert Path(cfg.run.workdir).is_absolute()


def test_local_config_is_tiny_cpu_embedded(tmp_path):
    cfg = load_config(REPO_ROOT / "configs/local.yaml", [f"run.workdir={tmp_path}"])
    assert cfg.ray.address is None
    assert cfg.tracking.uri == f"sqlite:///{tmp_path}/mlflow.db"
    assert cfg.storage.uri == f"{tmp_path}/data"
    assert cfg.models.judge.path == "world:judge"  # sees the world, has never judged: the flywheel trains it
    assert cfg.models.policy.path == "world:policy" and cfg.models.generator.path == "world:generator"
    assert all(getattr(cfg.resources, s).num_gpus == 0 for s in ("labeling", "candidates", "train", "serve"))


def test_gpu_config_names_real_checkpoints_vllm_gpus_and_shared_storage():
    cfg = load_config(REPO_ROOT / "configs/gpu_7b.yaml")
    assert cfg.models.judge.path == "Qwen/Qwen2-VL-7B-Instruct"
    assert cfg.models.policy.path == "llava-hf/llava-1.5-7b-hf"
    assert cfg.models.generator.path == "stabilityai/stable-diffusion-xl-base-1.0"
    assert cfg.judge.engine == "vllm"
    assert all(getattr(cfg.resources, s).num_gpus >= 1 for s in ("labeling", "candidates", "train", "serve"))
    assert cfg.storage.uri.startswith(("s3://", "gs://", "/mnt/"))
    assert cfg.train.dpo_beta == 0.03 and cfg.train.lr == 2e-6  # Minos' judge DPO settings


def test_gpu_own_data_config_is_the_gpu_config_on_user_files_judged_without_the_oracle():
    gpu, own = load_config(REPO_ROOT / "configs/gpu_7b.yaml"), load_config(REPO_ROOT / "configs/gpu_7b_own_data.yaml")
    # extends gpu_7b.yaml: its checkpoints, engines, resources and recipes, named once
    assert own.models == gpu.models and own.resources == gpu.resources and own.judge == gpu.judge
    assert own.train.policy_dpo.lr == gpu.train.policy_dpo.lr and own.train.judge_sft == gpu.train.judge_sft
    assert not own.prompts.oracle_world and own.prompts.sources and own.preferences.sources
    assert own.teacher.engine == "http" and own.teacher.http.api_key_env == "OPENAI_API_KEY"
    assert own.meta_eval.gold_files and own.world.gold.splits == ["id-test"]
    assert own.gate.policy_metric == own.gate.generator_metric == "judge/pointwise/score"
    probes = own.train.judge_dpo.heldout, own.train.policy_dpo.heldout, own.train.diffusion_dpo.heldout
    assert probes[0].gold_file and all(p.prompts_file and p.judge == "champion" for p in probes[1:])
    # the GPU config's oracle-only guards are replaced, not merged into
    assert "caption_recall" in gpu.train.policy_dpo.heldout.max_drop and not probes[1].max_drop
    assert "probe/score10" in gpu.train.diffusion_dpo.heldout.max_drop and not probes[2].max_drop


def test_dotted_overrides_are_typed():
    cfg = load_config(None, ["judge.engine=vllm", "train.lr=1e-5", "resources.labeling.actors=4",
                             "models.zoo.unet_channels=[16, 32]"])
    assert cfg.judge.engine == "vllm"
    assert cfg.train.lr == pytest.approx(1e-5)
    assert cfg.resources.labeling.actors == 4
    assert cfg.models.zoo.unet_channels == [16, 32]


def test_unknown_key_names_key_and_file(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("judge:\n  engin: hf\n")
    with pytest.raises(ConfigError) as e:
        load_config(bad)
    assert "unknown key 'judge.engin'" in str(e.value)
    assert str(bad) in str(e.value)


def test_wrong_type_names_key_and_file(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("train:\n  lr: fast\n")
    with pytest.raises(ConfigError) as e:
        load_config(bad)
    assert "'train.lr'" in str(e.value) and str(bad) in str(e.value) and "fast" in str(e.value)


def test_bad_override_is_blamed_not_the_file():
    with pytest.raises(ConfigError) as e:
        load_config(None, ["judge.engine=tensorrt"])
    msg = str(e.value)
    assert "override 'judge.engine=tensorrt'" in msg and "local.yaml" not in msg
    with pytest.raises(ConfigError, match="unknown key 'train.learning_rate'"):
        load_config(None, ["train.learning_rate=1"])
    with pytest.raises(ConfigError, match="expected key=value"):
        parse_override("train.lr")
    # an override that creates an unknown section is blamed too, not the file it was applied to
    with pytest.raises(ConfigError) as e:
        load_config(None, ["faults.caption_share=0.1"])
    assert "override 'faults.caption_share=0.1': unknown key 'faults'" in str(e.value)
    assert "local.yaml" not in str(e.value)
    # an empty value (`run.workdir=$WD` with WD unset) is refused, not taken as the current directory
    for key in ("run.workdir", "run.name", "models.judge.path"):
        with pytest.raises(ConfigError, match=f"override '{key}=': '{key}': String should have at least 1"):
            load_config(None, [f"{key}="])


def test_expected_rating_readout_needs_the_ratings_logprobs():
    with pytest.raises(ConfigError, match="judge.generation.top_logprobs >= 5"):
        load_config(None, ["judge.rating_readout=expected", "judge.generation.top_logprobs=0"])
    cfg = load_config(None, ["judge.rating_readout=expected", "judge.generation.top_logprobs=5"])
    assert cfg.judge.rating_readout == "expected"


def test_a_gate_on_balanced_verdicts_needs_their_probabilities():
    metric = "gate.judge_metric=id-test/all/pairwise_balanced/accuracy"
    with pytest.raises(ConfigError, match="read only with judge.rating_readout: expected"):
        load_config(None, [metric, "judge.rating_readout=text"])
    cfg = load_config(None, [metric, "judge.rating_readout=expected", "judge.generation.top_logprobs=5",
                             "gate.judge_test=mcnemar"])  # a per-pair accuracy: the paired test applies
    assert cfg.gate.judge_metric == metric.split("=")[1]


def test_micro_batches_that_do_not_divide_the_batch_fail_at_load_naming_the_training():
    with pytest.raises(ConfigError, match=r"train.judge_sft: batch_size 16 does not divide into micro_batches 3"):
        load_config(REPO_ROOT / "configs" / "local.yaml", ["train.judge_sft.micro_batches=3"])
    settings = load_config(None, []).train.resolved("judge_sft").model_copy(update={"batch_size": 6,
                                                                                    "micro_batches": 4})
    with pytest.raises(ValueError, match="batch_size 6 does not divide into micro_batches 4"):
        settings.micro_batch_size()  # settings changed past validation are checked where they are used


def test_the_judge_gates_paired_test_needs_a_per_pair_accuracy():
    from flywheel.config import GateConfig

    assert GateConfig().judge_test == "mcnemar" and GateConfig().judge_alpha == 0.05  # the default
    assert load_config(None).gate.judge_test == "none"  # local.yaml: the tiny judge's gains pile up (its comment)
    for metric in ("id-test/all/pointwise/kendall_tau_b", "id-test/all/pairwise/position_bias_rate",
                   "id-test/all/pointwise/exact", "accuracy"):
        with pytest.raises(ConfigError, match=r"gate.judge_test 'mcnemar' needs a per-pair accuracy as "
                                              r"gate.judge_metric .*" + re.escape(repr(metric))):
            load_config(None, [f"gate.judge_metric={metric}", "gate.judge_test=mcnemar"])
        assert load_config(None, [f"gate.judge_metric={metric}", "gate.judge_test=none"]).gate.judge_test == "none"
    for metric in ("id-test/all/pairwise/accuracy", "ood-test/task/iu/pointwise_ranking/accuracy",
                   "ood-test/task_generalization/pairwise/accuracy"):
        assert load_config(None, [f"gate.judge_metric={metric}"]).gate.judge_metric == metric
    for alpha in (0, 1, 1.5):
        with pytest.raises(ConfigError, match="gate.judge_alpha"):
            load_config(None, [f"gate.judge_alpha={alpha}"])
    with pytest.raises(ConfigError, match="gate.judge_test"):
        load_config(None, ["gate.judge_test=ttest"])


def test_missing_and_malformed_files(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "nope.yaml")
    (tmp_path / "list.yaml").write_text("- a\n- b\n")
    with pytest.raises(ConfigError, match="mapping"):
        load_config(tmp_path / "list.yaml")
    (tmp_path / "broken.yaml").write_text("a: [\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(tmp_path / "broken.yaml")


def test_hash_changes_with_content_only():
    a, b = load_config(None), load_config(None)
    assert a.hash() == b.hash()
    assert load_config(None, ["train.lr=0.5"]).hash() != a.hash()


def test_a_new_judge_request_format_redoes_only_the_stages_that_render_requests(monkeypatch):
    import flywheel.config as config

    cfg = Config()
    before = {s: cfg.stage_hash(s) for s in config.STAGE_SECTIONS}
    monkeypatch.setattr(config, "JUDGE_REQUEST_FORMAT", config.JUDGE_REQUEST_FORMAT + 1)
    changed = {s for s in config.STAGE_SECTIONS if cfg.stage_hash(s) != before[s]}
    assert changed == {"curate", "judgments-judge", "meta-eval-judge", "downstream-judge"}


# named as well as read from the set, so a field dropped from it fails here
@pytest.mark.parametrize("dotted", sorted(set(HASHED_ONLY_WHEN_SET) | {
    "judge.samples", "judgments.claim_images", "judgments.claim_context", "curate.claim_balance"}))
def test_a_field_added_later_hashes_at_its_default_as_before_it_existed(monkeypatch, dotted):
    """Finished stages are not redone after an upgrade, nor finished iterations reported as made with another
    config, while the new field keeps its default (config.HASHED_ONLY_WHEN_SET)."""
    import flywheel.config as config

    cfg = Config()
    now = {s: cfg.stage_hash(s) for s in config.STAGE_SECTIONS} | {"whole": cfg.hash()}
    dump = Config.model_dump
    *parents, key = dotted.split(".")

    def before(self, **kw):  # the config as it was before the field existed
        d = node = dump(self, **kw)
        for p in parents:
            node = node[p]
        node.pop(key)
        return d

    monkeypatch.setattr(Config, "model_dump", before)
    assert {s: cfg.stage_hash(s) for s in config.STAGE_SECTIONS} | {"whole": cfg.hash()} == now


def test_claim_checks_without_images_redo_the_stages_that_ask_claims():
    import flywheel.config as config

    on, off = load_config(None), load_config(None, ["judgments.claim_images=false"])
    changed = {s for s in config.STAGE_SECTIONS if off.stage_hash(s) != on.stage_hash(s)}
    # curate reads it from the rows it rebuilds requests of (parsed.with_images), not from the config
    assert changed == {"judgments-teacher", "judgments-judge", "meta-eval-teacher", "meta-eval-judge",
                       "downstream-judge"}
    # the other claim settings the judge scorer reads key a judge-scored evaluation too
    split = load_config(None, ["judgments.claim_splitter=judge"])
    assert "downstream-judge" in {s for s in config.STAGE_SECTIONS if split.stage_hash(s) != on.stage_hash(s)}


def test_claims_checked_against_their_sentences_redo_the_stages_that_ask_claims():
    import flywheel.config as config

    whole = load_config(None)
    for setting in ("sentences", "all_sentences"):
        narrowed = load_config(None, [f"judgments.claim_context={setting}"])
        # curate reads the text each check was asked against from its rows (parsed.against), not from the config
        assert {s for s in config.STAGE_SECTIONS if narrowed.stage_hash(s) != whole.stage_hash(s)} == {
            "judgments-teacher", "judgments-judge", "meta-eval-teacher", "meta-eval-judge", "downstream-judge"}


def test_a_claim_balance_redoes_curation_alone():
    import flywheel.config as config

    plain, balanced = load_config(None), load_config(None, ["curate.claim_balance.method=q3"])
    assert {s for s in config.STAGE_SECTIONS if balanced.stage_hash(s) != plain.stage_hash(s)} == {"curate"}
    assert balanced.hash() != plain.hash()


def test_every_field_has_a_description():
    def walk(model):
        for name, field in model.model_fields.items():
            assert field.description, f"{model.__name__}.{name} has no description"
            ann = field.annotation
            if isinstance(ann, type) and issubclass(ann, __import__("pydantic").BaseModel):
                walk(ann)

    walk(Config)


def test_a_plain_storage_path_is_pinned_where_the_config_is_loaded(tmp_path, monkeypatch):
    """Every process of a cluster resolves storage.uri itself, each in its own cwd and HOME (a job's working dir is a
    per-node copy): a relative or ~ path is made absolute once, at load; a URI with a scheme is left alone."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert load_config(None, ["storage.uri=data/x"]).storage.uri == str(tmp_path / "data" / "x")
    assert load_config(None, ["storage.uri=~/store"]).storage.uri == str(tmp_path / "home" / "store")
    assert load_config(None, ["storage.uri=s3://bucket/flywheel"]).storage.uri == "s3://bucket/flywheel"


def test_loading_a_config_imports_no_heavy_library():
    """The CLI, the scheduler and every Ray worker load the config tree: it must not pull in torch and friends
    (each section's module is light; heavy imports live inside the functions that need them)."""
    import subprocess
    import sys

    code = ("import sys; from flywheel.config import load_config; load_config('configs/local.yaml'); "
            "print(sorted(m for m in ('torch', 'transformers', 'ray', 'mlflow', 'diffusers', 'trl', 'peft', 'vllm') "
            "if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout


def test_recipe_warnings_name_an_sft_term_without_the_look_up_base(tmp_path):
    """dpo_sft at a high lr was measured to help only on the look-up base LLaVA: apart, the run says so."""
    assert load_config(REPO_ROOT / "configs/local.yaml", [f"run.workdir={tmp_path}"]).recipe_warnings() == []
    apart = load_config(REPO_ROOT / "configs/local.yaml",
                        [f"run.workdir={tmp_path}", "world.base_policies.policy_lookup.steps=0"])
    (warning,) = apart.recipe_warnings()
    assert "dpo_sft at lr 0.001" in warning and "policy_lookup.steps" in warning
    for fix in ("train.policy_dpo.methods=[dpo]", "train.policy_dpo.lr=1e-4"):
        assert load_config(REPO_ROOT / "configs/local.yaml", [f"run.workdir={tmp_path}",
                           "world.base_policies.policy_lookup.steps=0", fix]).recipe_warnings() == []
    assert load_config(REPO_ROOT / "configs/gpu_7b.yaml").recipe_warnings() == []  # a real LLaVA: no world base


def test_recipe_warnings_name_a_real_teacher_asked_the_tiny_judges_requests(tmp_path):
    http = [f"run.workdir={tmp_path}", "teacher.engine=http"]
    (warning,) = load_config(REPO_ROOT / "configs/local.yaml", http).recipe_warnings()  # local.yaml: compact
    assert "judge.prompt_style=minos" in warning
    assert load_config(REPO_ROOT / "configs/local.yaml", [*http, "judge.prompt_style=minos"]).recipe_warnings() == []


def test_how_an_http_endpoint_is_reached_does_not_redo_its_labels(tmp_path):
    base = [f"run.workdir={tmp_path}", "teacher.engine=http", "teacher.http.base_url=https://api.example/v1"]
    hashed = load_config(None, base).stage_hash("judgments-teacher")
    how = ["teacher.http.max_concurrency=64", "teacher.http.max_retries=9", "teacher.http.timeout_s=600",
           "teacher.http.backoff_max_s=120", "teacher.http.price_per_1m_prompt_tokens=2.5",
           "teacher.http.api_key_env=MY_KEY"]
    assert load_config(None, [*base, *how]).stage_hash("judgments-teacher") == hashed
    for what in ("teacher.http.model=gpt-y", "teacher.http.base_url=https://other.example/v1",
                 "teacher.generation.temperature=0.7"):
        assert load_config(None, [*base, what]).stage_hash("judgments-teacher") != hashed, what


def test_a_cost_cap_is_a_labelling_stages(tmp_path):
    cfg = load_config(None, [f"run.workdir={tmp_path}", "judge.http.max_cost_per_stage=3"])
    assert cfg.judge.http.max_cost_per_stage == 3
    with pytest.raises(ConfigError, match="policy.http.max_cost_per_stage: a cost cap stops a labelling stage"):
        load_config(None, [f"run.workdir={tmp_path}", "policy.http.max_cost_per_stage=3"])


def test_keep_promoted_needs_prune_model_versions(tmp_path):
    """Without prune_model_versions no version is deleted: a bound on the promoted ones would silently do nothing."""
    cfg = load_config(None, [f"run.workdir={tmp_path}", "storage.prune_model_versions=true", "storage.keep_promoted=3"])
    assert cfg.storage.keep_promoted == 3
    with pytest.raises(ConfigError, match="storage.keep_promoted: .*storage.prune_model_versions: true"):
        load_config(None, [f"run.workdir={tmp_path}", "storage.keep_promoted=3"])


def test_preference_protocols_must_judge_every_sampled_task():
    """A preferences.protocols mapping replaces the default whole: one naming iu alone (the claims override) left the
    ig sub-tasks' candidates sampled and never judged, so the SDXL never got a pair (runs/clw). Refused by name."""
    with pytest.raises(ConfigError, match=r"no entry for the task of sub-tasks \['ig_attribute_binding', "
                                          r"'ig_relation', 'ig_single_object'\]"):
        load_config(None, ["preferences.protocols={iu: [pointwise, claims]}"])
    ok = load_config(None, ["preferences.protocols={iu: [pointwise, claims]}", "preferences.subtasks=[iu_color]"])
    assert ok.preferences.protocols == {"iu": ["pointwise", "claims"]}  # no ig sub-task sampled: nothing unjudged
    assert load_config(REPO_ROOT / "configs/local_claims.yaml").preferences.protocols["ig"] == ["pointwise"]


def test_local_claims_doubles_the_judges_sft_passes_and_keeps_the_rest_of_its_training():
    """configs/local_claims.yaml names judge_sft.epochs alone; the mapping merges key by key, so the judge still
    trains at local.yaml's lr, micro-batches and without LoRA (a replaced mapping would reset them to the pydantic
    defaults silently)."""
    base = load_config(REPO_ROOT / "configs/local.yaml").train.judge_sft
    claims = load_config(REPO_ROOT / "configs/local_claims.yaml").train.judge_sft
    assert claims.epochs == 2 * base.epochs
    assert claims.model_dump(exclude={"epochs"}) == base.model_dump(exclude={"epochs"})
