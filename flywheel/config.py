"""The one typed config tree, loaded from configs/*.yaml plus dotted command-line overrides.

Every knob of the system lives here (with a description) and in configs/, never as a literal deep in code.
Strings may use `${workdir}`, replaced by the resolved absolute working directory, so one config file says
"MLflow at sqlite:///<workdir>/mlflow.db" without naming a machine's path.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import Field, NonNegativeInt, ValidationError, field_validator, model_validator

from flywheel.config_files import ConfigError, origin_of, parse_override, read_tree, set_dotted
from flywheel.curate.config import CurateConfig
from flywheel.evaluate.metric_names import PER_PAIR, per_pair_accuracy, protocol_of, split_of
from flywheel.records import RecordLimits
from flywheel.strict_model import StrictModel
from flywheel.train.config import TrainConfig
from flywheel.worlds.shapes.policy_config import BasePoliciesConfig
from flywheel.worlds.shapes.config import ShapesWorldConfig
from flywheel.worlds.shapes.oracle_config import GoldConfig, check_protocols
from flywheel.worlds.shapes.oracle_config import TeacherConfig as OracleTeacherConfig
from flywheel.worlds.shapes.suites import TASK_OF, SplitConfig, SuitesConfig

REPO_ROOT = Path(__file__).resolve().parents[1]



class RunConfig(StrictModel):
    name: str = Field("flywheel", min_length=1, description="Name of this flywheel; also the MLflow experiment name.")
    # not empty: `run.workdir=$WD` with WD unset would put the MLflow store and data/ in the current directory
    workdir: str = Field(
        "runs/local", min_length=1,
        description="Working directory for models, datasets and the local MLflow store. Relative paths are "
        "resolved against the current directory when the config is loaded.",
    )
    seed: int = Field(0, description="Global seed; every stage derives its own seeds from it.")


class RayConfig(StrictModel):
    address: str | None = Field(
        None, description="Ray cluster address; null starts an embedded Ray inside the driver (`ray.init()`)."
    )
    num_cpus: int | None = Field(None, ge=1, description="CPUs for an embedded Ray; null lets Ray detect them.")
    train_poll_interval_s: float | None = Field(
        None, gt=0, description="How often Ray Train's controller polls its workers "
        "(RAY_TRAIN_HEALTH_CHECK_INTERVAL_S); it also bounds how soon a finished training is noticed and torn "
        "down. null keeps Ray's default (2 s).",
    )
    wait_for_actors_s: float | None = Field(
        None, gt=0, description="How long a stage's actor pool (Ray Data), a GPU training's first worker, a "
        "training's worker group (each of its 1 + train.max_failures attempts) or the judge app's replicas (Serve) "
        "may wait for room to start (actors and replicas: until they are up, their model loaded); past it "
        "the stage fails (ActorsDidNotStart), naming what each asks. null waits for ever, as under an autoscaler "
        "that adds the nodes; on a fixed cluster with no room, that is a hang (each stage and training warns at its "
        "start when no live node fits one).",
    )


class StorageConfig(StrictModel):
    uri: str = Field(
        "${workdir}/data",
        description="Where every dataset (Parquet + manifest) and checkpoint goes: a local folder, or a shared "
        "URI (s3://, gs://, an NFS mount) that every node of a cluster can see.",
    )
    keep_iterations: int | None = Field(
        None, ge=1,
        description="After each finished iteration, delete the datasets of finished iterations older than the newest "
        "this many, except those a kept dataset was made from or a preference pool may still read, the "
        "checkpoints of the trainings they registered, and this node's local copies of those versions "
        "(<workdir>/registry) that no kept iteration names and no alias points at (flywheel/retention.py; "
        "`flywheel prune` shows what would go). Null keeps everything.",
    )
    prune_model_versions: bool = Field(
        False, description="With keep_iterations, also delete the registered model versions pruned iterations made "
        "(their weights in MLflow's artifact store, and the registry entry) unless a kept iteration names them "
        "(start models, its gates' challengers and champions), an alias points at them or a gate promoted them "
        "(see keep_promoted): the judge SFT versions judge DPO started from, refused challengers, superseded "
        "lineage heads. Their training runs stay, with metrics, logs and lineage tags (tagged "
        "flywheel.weights_pruned). A version with save_merged holds a whole model: at 7B the largest thing an "
        "iteration leaves.",
    )
    keep_promoted: int | None = Field(
        None, ge=1,
        description="With prune_model_versions, of the versions gates promoted (the champions' history, to roll "
        "back to) keep the newest this many of each model; the older ones go on the same terms as the others "
        "(not while a kept iteration names one or an alias points at it). Null keeps every promoted version: a "
        "whole model per promotion.",
    )

    @model_validator(mode="after")
    def _keep_promoted_prunes_versions(self):
        if self.keep_promoted is not None and not self.prune_model_versions:
            raise ValueError("storage.keep_promoted: bounds which promoted versions retention deletes, and it deletes "
                             "versions only with storage.prune_model_versions: true")
        return self


class TrackingConfig(StrictModel):
    uri: str = Field(
        "sqlite:///${workdir}/mlflow.db",
        description="MLflow tracking URI. Always explicit: MLflow's own default is a file in the current directory.",
    )
    artifact_location: str | None = Field(
        "${workdir}/mlartifacts",
        description="Artifact root for a newly created experiment; null lets the tracking server decide.",
    )
    experiment: str | None = Field(None, description="MLflow experiment; null uses run.name.")


class ZooConfig(StrictModel):
    """Sizes of the tiny random-initialised checkpoints built for CPU runs (flywheel/models/zoo.py)."""

    image_size: int = Field(56, description="Side of images the tiny models see and make; a multiple of 28.")
    judge_image_size: int = Field(
        112, description="Side the judge's processor resizes every image to (Qwen2-VL's pixel budget; a multiple "
        "of 28): (side/28)^2 image tokens per image. Measured, 800 steps on the world's 'What colour is the "
        "<shape>?': at 56 px (4 tokens) the tiny judge stayed at chance (0.12), at 112 px it reached 0.56.")
    vocab_size: int = Field(1024, ge=300, description="Target vocabulary of the locally trained byte-level BPE.")
    text_hidden: int = Field(128, description="Hidden size of the judge's and policy's language models "
                             "(judge_text_hidden, when set, sizes the judge's).")
    text_layers: int = Field(2, description="Decoder layers of the judge's and policy's language models.")
    judge_text_layers: int | None = Field(
        None, ge=1, description="Decoder layers of the judge's language model alone; null uses text_layers. "
        "The judge compares what it reads with what it sees, which may need more depth than the policy.")
    judge_text_hidden: int | None = Field(
        None, ge=32, description="Hidden size of the judge's language model alone (and its vision merger's output); "
        "null uses text_hidden. Measured at 256 against 128 (docs/results.md, runs/wide): id-test ranking +0.056 over "
        "three loop iterations (drawings, count), captions unchanged, 1.5x the iteration's time.")
    text_heads: int = Field(4, description="Attention heads; hidden/heads must be ≥ 32 for vLLM's CPU attention.")
    vision_hidden: int = Field(64, description="Width of the tiny vision towers.")
    vision_layers: int = Field(2, description="Depth of the tiny vision towers.")
    unet_channels: list[int] = Field([32, 64], description="UNet block widths of the tiny SDXL.")
    vae_channels: list[int] = Field([16, 32, 32], description="VAE block widths; len-1 downsamplings (4x: 56 px → "
                                    "14×14 latents, cheap on CPU).")
    clip_hidden: int = Field(32, description="Width of each of SDXL's two tiny CLIP text encoders.")


class ModelRef(StrictModel):
    path: str = Field(
        min_length=1,
        description="A Hugging Face id or a local/shared directory passed to from_pretrained, or `zoo:<name>` "
        "for a tiny checkpoint built by `flywheel models build` (judge, policy, generator)."
    )
    revision: str | None = Field(None, description="Hub revision to pin (ignored for zoo and local paths).")
    dtype: Literal["float32", "bfloat16", "float16"] = Field("float32", description="Weights dtype at load time.")


class ModelsConfig(StrictModel):
    judge: ModelRef = Field(ModelRef(path="zoo:judge"), description="The judge being trained (Qwen2-VL family).")
    policy: ModelRef = Field(ModelRef(path="zoo:policy"), description="The text policy (LLaVA family).")
    generator: ModelRef = Field(ModelRef(path="zoo:generator"), description="The image generator (SDXL family).")
    zoo: ZooConfig = Field(ZooConfig(), description="Architecture sizes of the zoo's tiny checkpoints.")


class GenerationConfig(StrictModel):
    max_new_tokens: int = Field(64, ge=1, description="Longest generated answer in tokens.")
    temperature: float = Field(0.0, ge=0, description="0 is greedy decoding; >0 samples.")
    top_p: float = Field(1.0, gt=0, le=1, description="Nucleus sampling mass.")
    top_k: int = Field(0, ge=0, description="0 disables top-k (transformers would otherwise default to 50).")
    batch_size: int = Field(8, ge=1, description="Items per forward batch.")
    top_logprobs: int = Field(0, ge=0, le=20, description="Most likely tokens returned with their "
                              "log-probabilities at every generated position (0: none). The judge's "
                              "rating_readout=expected reads the ratings' probabilities from them.")


class ImageGenerationConfig(StrictModel):
    num_inference_steps: int = Field(25, ge=1, description="Denoising steps.")
    guidance_scale: float = Field(4.0, ge=0, description="Classifier-free guidance; ≤1 disables it.")
    height: int | None = Field(None, description="Output height; null uses the checkpoint's native size.")
    width: int | None = Field(None, description="Output width; null uses the checkpoint's native size.")
    batch_size: int = Field(4, ge=1, description="Prompts per pipeline call.")


class VLLMConfig(StrictModel):
    tensor_parallel_size: int = Field(1, ge=1, description="GPUs one vLLM engine spans.")
    gpu_memory_utilization: float = Field(0.9, gt=0, le=1, description="Share of GPU memory vLLM may take.")
    max_model_len: int = Field(4096, ge=128, description="Longest prompt+answer vLLM schedules.")


class HttpEngineConfig(StrictModel):
    """An OpenAI-compatible chat endpoint as a text engine (flywheel/engines/http.py): GPT-4o, a vLLM server, or
    this project's own Serve app (`flywheel serve`, whose route is <host:port>/v1/chat/completions)."""

    base_url: str = Field("http://127.0.0.1:8000/v1", description="API root; requests go to "
                          "{base_url}/chat/completions (e.g. https://api.openai.com/v1).")
    model: str = Field("judge", description="The `model` sent with every request (the Serve app answers to "
                       "serve.model_name).")
    api_key_env: str | None = Field(None, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$", description="NAME of the "
                                    "environment variable holding the API key (sent as a bearer token); never the "
                                    "key itself. null sends no key.")
    max_concurrency: int = Field(8, ge=1, description="Requests in flight at once (per engine instance).")
    max_retries: int = Field(5, ge=0, description="Retries of one request after a 429, a 5xx, a timeout or a "
                             "connection error (other 4xx are not retried).")
    backoff_initial_s: float = Field(0.5, gt=0, description="First retry delay; doubles each retry, with jitter.")
    backoff_max_s: float = Field(30.0, gt=0, description="Cap on one retry delay (a Retry-After header is "
                                 "honoured up to this cap).")
    timeout_s: float = Field(120.0, gt=0, description="Timeout of one HTTP attempt, connect to last byte.")
    expect_model_version: str | None = Field(
        None, description="The model version every response must name (`model_version`, as this project's Serve "
        "app reports it); a response naming another, or none, is a failed request, never a label. The preference "
        "stage sets it to the judge it deployed: another server answering on the same port (Serve binds with "
        "SO_REUSEPORT) cannot slip its judgments in. Set, it also names the engine in labels (`http#<model>@"
        "<version>`, no address: a resume on another port labels alike). null: any.")
    price_per_1m_prompt_tokens: float = Field(0.0, ge=0, description="Cost of a million prompt tokens "
                                              "(e.g. USD), for the cost estimate logged to MLflow.")
    price_per_1m_completion_tokens: float = Field(0.0, ge=0, description="Cost of a million completion tokens.")
    max_cost_per_stage: float | None = Field(
        None, gt=0, description="Teacher and judge: stop a judgments stage labelling through this endpoint once "
        "its estimated cost (the prices above) passes this with batches left. Each actor checks the stage's cost so "
        "far before it starts a batch, so only the batches already running when it passed (at most one per actor) "
        "add to it. Its finished batches are kept and this field is not part of the stage's key: raise it (or null "
        "it) and run again to go on. null: no cap.")


TextEngineName = Literal["hf", "vllm", "http", "oracle"]


class TeacherConfig(OracleTeacherConfig):
    """The teacher that labels judge training data: the oracle world's noisy teacher (the embedded default; its
    error fields), or a model behind an OpenAI-compatible endpoint (`engine: http`), as GPT-4o labelled Minos'
    and RLAIF-V's data. Requests are rendered in judge.prompt_style (minos spells the task out for a real model)."""

    http: HttpEngineConfig = Field(HttpEngineConfig(), description="Used when engine is http: the endpoint, "
                                   "its model name and the NAME of the variable holding its key.")
    generation: GenerationConfig = Field(GenerationConfig(), description="Decoding of the teacher's answers when "
                                         "engine is http (set max_new_tokens for its analyses: 1024 in the README).")


class JudgeConfig(StrictModel):
    engine: TextEngineName = Field("hf", description="Backend that runs the judge model.")
    prompt_style: Literal["minos", "compact"] = Field(
        "minos", description="How pointwise and pairwise requests are rendered, everywhere the judge is addressed "
        "(teacher labels, judge training data, meta-eval, Serve): minos = the published instructions and rubric "
        "(~480 tokens); compact = a one-line header over the same fields, for judges too small to read "
        "instructions (the embedded tiny judge). The output format is the same.")
    rating_readout: Literal["text", "expected"] = Field(
        "text", description="The score of a pointwise judgment: text = the rating the judge wrote; expected = "
        "the mean rating under the judge's probabilities at the rating it wrote (G-Eval's probability-weighted "
        "score), which orders candidates a small judge would rate equal; and a pairwise verdict's probabilities "
        "are recorded, which meta-eval, `flywheel eval` and Serve combine over both orders into one verdict "
        "(`pairwise_balanced`: Wang et al.'s balanced position calibration). Needs generation.top_logprobs >= 5; "
        "an engine that returns no log-probabilities (the oracle) keeps the written rating.")
    samples: int = Field(
        1, ge=1, le=64, description="Sampled answers per rating request (self-consistency): a pointwise or claim "
        "rating is the mean of the ratings of the samples that parsed, a pairwise verdict the one most of them "
        "gave (a draw is a tie), wherever the judge rates (meta-eval, its preference labels, the gate's "
        "downstream scores, `flywheel eval`, Serve's judge routes). k times the judge's inference; needs "
        "generation.temperature > 0. Measured on the local_claims judges, 40 samples at 0.7 ranked id-test gold "
        "0.856 -> 0.892 (a weak judge) but 0.909 -> 0.917 (within noise), ood-test 0.665 -> 0.761; 5 at 1.0 ranked "
        "below greedy (docs/tuning.md, judge.samples). Rubric, decomposed, aspects and claim-split requests are "
        "answered once.")
    generation: GenerationConfig = Field(GenerationConfig(), description="Decoding of judge outputs.")
    vllm: VLLMConfig = Field(VLLMConfig(), description="Used when engine is vllm.")
    http: HttpEngineConfig = Field(HttpEngineConfig(), description="Used when engine is http.")

    @model_validator(mode="after")
    def _readout_needs_logprobs(self):
        if self.rating_readout == "expected" and self.generation.top_logprobs < 5:
            raise ValueError("judge.rating_readout=expected reads the probabilities of the ratings 1-5: set "
                             f"judge.generation.top_logprobs >= 5 (it is {self.generation.top_logprobs})")
        return self

    @model_validator(mode="after")
    def _samples_need_sampling(self):
        if self.samples > 1 and self.generation.temperature <= 0:
            raise ValueError(f"judge.samples={self.samples} draws the same greedy answer {self.samples} times: set "
                             "judge.generation.temperature > 0 (0.7 measured best), or judge.samples=1")
        return self


class PolicyConfig(StrictModel):
    engine: TextEngineName = Field("hf", description="Backend that samples the text policy.")
    generation: GenerationConfig = Field(
        GenerationConfig(temperature=1.0), description="Sampling of policy candidates."
    )
    vllm: VLLMConfig = Field(VLLMConfig(), description="Used when engine is vllm.")
    http: HttpEngineConfig = Field(HttpEngineConfig(), description="Used when engine is http.")

    @model_validator(mode="after")
    def _no_cost_cap(self):
        if self.http.max_cost_per_stage is not None:  # only the labelling stages sum an endpoint's cost
            raise ValueError("policy.http.max_cost_per_stage: a cost cap stops a labelling stage (teacher.http or "
                             "judge.http); the policy's sampling has none")
        return self


class GeneratorConfig(StrictModel):
    engine: Literal["diffusers"] = Field("diffusers", description="Backend that samples the image generator.")
    generation: ImageGenerationConfig = Field(ImageGenerationConfig(), description="Sampling of images.")


class StageResources(StrictModel):
    actors: int = Field(1, ge=1, description="Actor-pool size (Ray Data) or replicas (Serve).")
    num_cpus: float = Field(1, ge=0, description="CPUs per actor/worker.")
    num_gpus: float = Field(0, ge=0, description="GPUs per actor/worker.")
    resources: dict[str, float] = Field({}, description="Custom Ray resources per actor, e.g. a node-type label.")


class ResourcesConfig(StrictModel):
    labeling: StageResources = Field(StageResources(), description="Judge/teacher labeling actors (Ray Data).")
    candidates: StageResources = Field(StageResources(), description="Policy/generator sampling actors.")
    train: StageResources = Field(StageResources(), description="Ray Train workers (actors = num_workers).")
    serve: StageResources = Field(StageResources(), description="Ray Serve judge replicas.")
    base_models: StageResources = Field(
        StageResources(num_cpus=2), description="The one Ray task that builds the oracle world's base models "
        "(`world:*`) when they are not cached; torch runs max(1, num_cpus) threads in it, and in `flywheel models "
        "build`. A build is reproducible for a seed at one thread count only (floating-point sums run in another "
        "order), so the count is pinned here rather than taken from the machine. `actors` is unused.")


class SourceSpec(StrictModel):
    type: Literal["jsonl", "parquet", "text"] = Field(description="File format (see flywheel/sources.py).")
    path: str = Field(description="The file.")
    source: str | None = Field(None, description="Source name recorded on each prompt (default: file name).")
    task: str | None = Field(None, description="text lists only: the task of every line (nlg|iu|ig|itig).")
    subtask: str | None = Field(None, description="text lists only: the sub-task of every line.")
    split: str | None = Field(None, description="text lists only: the split of every line.")


class PromptsConfig(StrictModel):
    oracle_world: bool = Field(True, description="Generate the oracle world's task suites.")
    sources: list[SourceSpec] = Field([], description="User prompt files, added to the oracle prompts.")


class CandidatesConfig(StrictModel):
    samples_per_prompt: int = Field(4, ge=1, description="N: candidates sampled per prompt.")
    batch_size: int = Field(16, ge=1, description="Prompts per Ray Data batch (each yields N candidates).")
    seeded_variants: int = Field(
        0, ge=0, description="Besides the N policy samples, this many outputs per oracle-world prompt drawn "
        "(seeded) from the world's variant maker (correct, near-miss, wrong, unreadable, ... as in the gold "
        "sets): responses from more than one producer, as Minos drew its training responses from many MLLMs "
        "(VLFeedback). A prompt without oracle ground truth gets none. 0: policy samples only.")
    itig_describe_prompt: str = Field(
        "Describe the image.", description="What the text policy is asked about its own drawing for ITIG prompts "
        "whose meta names no describe_prompt.")


class JudgmentsConfig(StrictModel):
    """The judgments stage (flywheel/stages/judgments.py): which protocols judge which task, k samples each."""

    protocols: dict[str, list[str]] = Field(
        {"nlg": ["pointwise", "pairwise"], "iu": ["pointwise", "pairwise"], "ig": ["decomposed"], "itig": ["rubric"]},
        description="Per task category, the judge protocols its candidates are judged with (pointwise, pairwise, "
        "aspects, rubric, decomposed, claims); a task left out is not judged. claims judges only the sub-tasks "
        "of claim_subtasks.")
    samples_per_item: int = Field(2, ge=1, description="k: judge samples per item (Minos used 10).")
    pairwise_aspects: Literal["overall", "task", "all"] = Field(
        "overall", description="What a pair is compared on: overall (no aspect, with the query), each task "
        "aspect of the prompt, or every aspect of the prompt (universal ones judged without the query).")
    pairwise_orders: list[Literal["AB", "BA"]] = Field(["AB", "BA"], min_length=1, description="Orders each pair "
                                                       "is shown in (both: position-swap consistency).")
    max_pairs_per_prompt: int | None = Field(2, ge=1, description="Candidate pairs judged per prompt, drawn by "
                                             "a seeded choice among all pairs; null judges every pair.")
    rubric_item_calls: Literal["all", "each"] = Field("all", description="Rubric grading: all items in one "
                                                      "request, or one request per item (UEval).")
    batch_size: int = Field(8, ge=1, description="Prompts per Ray Data batch (each with all its candidates).")
    claim_subtasks: list[str] = Field(
        ["iu_caption", "nlg_describe_scene"], description="Sub-tasks the claims protocol judges (RLAIF-V's "
        "divide-and-conquer, flywheel/judge/claims.py): responses that describe, whose claims can be checked one "
        "by one against the prompt's reference. Where a candidate has claim judgments, they rank it.")
    claim_splitter: Literal["world", "judge"] = Field(
        "world", description="What splits a description into claims for the claims protocol: `world`, the oracle "
        "world's parser (no model; it reads only that world's text, and a real caption it finds no claim in is "
        "quarantined saying so); `judge`, the judging engine itself, asked for the claims of the response and "
        "of the reference first (RLAIF-V's divide step, flywheel/judge/claim_split.py): the teacher when it "
        "labels, the judge when it rates, so a judge must be able to split (a pretrained instruct VLM). A split "
        "that does not parse fails its candidate's claim checks as a parse failure.")
    claim_images: bool = Field(
        True, description="Whether a claim check's request carries the prompt's input images. The check asks "
        "whether the other text states the claim, strictly from the text, so the images are context a judge may "
        "use, not evidence; false sends the claim and the text alone (each row records it, so its SFT and DPO rows "
        "are rebuilt as asked), as meta-eval and the preference stage then ask too. docs/tuning.md, "
        "judgments.claim_images.")
    claim_context: Literal["text", "sentences", "all_sentences"] = Field(
        "text", description="What a claim is checked against: `text`, the whole other text; `sentences`, for a "
        "relation claim only the other text's sentences that name both its objects (the world's reading of the "
        "claim; the verdict is the same, the text to read a sentence or two); `all_sentences`, that and for an "
        "object claim only the sentences that introduce objects (not those relating objects named before). Each "
        "row records the text it was checked against (parsed.against), so its SFT and DPO rows are rebuilt as "
        "asked. docs/tuning.md, judgments.claim_context.")

    @field_validator("protocols")
    @classmethod
    def _protocols(cls, v: dict[str, list[str]]) -> dict[str, list[str]]:
        return check_protocols(v)


class PreferencesConfig(StrictModel):
    """Preference data for the policies, scored by the served judge (flywheel/iteration.py)."""

    prompts_per_subtask: int | dict[str, int] = Field(
        60, description="Fresh prompts per sub-task each iteration: one count, or a map from a task ('iu': the "
        "text policy's, 'ig': the generator's) or a sub-task to its count.")
    subtasks: list[str] = Field(
        ["iu_color", "iu_count", "iu_existence", "iu_caption", "ig_single_object", "ig_attribute_binding",
         "ig_relation"], description="Sub-tasks the policies are improved on (text policy: iu_*; generator: ig_*).")
    samples_per_prompt: int = Field(4, ge=2, description="N candidates per prompt; pairs are best vs worst.")
    policy_temperature: float | None = Field(
        None, gt=0, description="Sampling temperature of the text policy's candidates here (None: "
        "policy.generation.temperature). A peaked policy gives N identical answers, which make no pair.")
    protocols: dict[str, list[str]] = Field({"iu": ["pointwise"], "ig": ["pointwise"]},
                                            description="How the served judge scores the candidates, per task.")
    update_min_pairs: dict[Literal["policy", "generator"], NonNegativeInt] = Field(
        {"policy": 0, "generator": 0}, description="Pairs a policy's update waits for (a role left out: 0). "
        "Each iteration pools its pairs with those of earlier iterations that sampled the same policy and tried "
        "no update of it (flywheel/preference_pool.py); the update trains on the pool once it holds this many, "
        "and consumes it. 0: every iteration trains on what it has.")
    relabel_pool: bool = Field(
        True, description="When a pooled update is due, rank the samples of the earlier iterations in its pool "
        "again with the judge serving now (their pairs were ranked by older judges), so the update trains on the "
        "current judge's pairs only. Costs one preference-labels pass per earlier iteration, once per update.")

    sources: list[SourceSpec] = Field(
        [], description="User prompt files the policies' preference prompts come from instead of the oracle world "
        "(flywheel/sources.py's formats): each iteration draws `prompts_per_subtask` train-split prompts of each "
        "of `subtasks` (the files' own sub-task names), a seeded draw of its own, so iterations see different "
        "prompts of a larger pool; their id-test prompts are the policies' held-out prompts, rated by the judge "
        "(gate.policy_metric / generator_metric `judge/pointwise/score`). For real data: the oracle world has "
        "none of it.")

    @model_validator(mode="after")
    def _counts(self) -> PreferencesConfig:
        if not self.sources:  # the files' sub-tasks are only known when they are read
            self.suites()  # unknown sub-tasks or a count map that misses one fail at load, not mid-iteration
            unjudged = sorted(s for s in self.subtasks if TASK_OF[s] not in self.protocols)
            if unjudged:
                # a mapping given here replaces the default whole: {iu: [pointwise, claims]} alone dropped ig,
                # and the generator's candidates were sampled every iteration and never judged
                raise ValueError(
                    f"preferences.protocols {self.protocols} has no entry for the task of sub-tasks {unjudged}: "
                    "their candidates would be sampled and never judged (no pairs, no update). Name every task, "
                    "e.g. {iu: [pointwise], ig: [pointwise]}, or drop those sub-tasks from preferences.subtasks")
        return self

    def count(self, subtask: str, task: str) -> int:
        """Prompts drawn per iteration for a sub-task of `task` (its own entry wins over its task's)."""
        c = self.prompts_per_subtask
        return c if isinstance(c, int) else c.get(subtask, c.get(task, 0))

    def suites(self) -> SuitesConfig:
        """The suite that draws each iteration's fresh preference prompts (no test splits)."""
        return SuitesConfig(prompts_per_subtask=self.prompts_per_subtask, subtasks=self.subtasks,
                            split=SplitConfig(ood_subtasks=[], ood_aspects=[], id_test_fraction=0.0))


# ---- meta-eval (flywheel/evaluate/meta.py): Minos' perturbation checks (issue 7, flywheel/evaluate/perturbation.py)
class PerturbationConfig(StrictModel):
    """Minos' perturbation checks, run on each gold split after meta-eval: images swapped between gold items
    (does the judge's correlation with gold collapse?) and 25% of a response's word spans replaced (does the judge
    score it lower?)."""

    enabled: bool = Field(True, description="Run the checks in every meta-eval (metrics `perturb/...` per split).")
    items: int = Field(64, ge=1, description="Gold pointwise items perturbed per split, per check and (image "
                       "swap) per slot (input images, output images); a seeded choice.")
    span_fraction: float = Field(0.25, gt=0, le=1, description="Share of a response's word spans replaced by "
                                 "words of other prompts' gold responses (Minos: 25%).")
    seed: int = Field(0, description="Seed of the item choice, the donor images and the replaced spans.")


class MetaEvalConfig(StrictModel):
    protocols: list[Literal["pointwise", "pairwise", "claims"]] = Field(
        ["pointwise", "pairwise"], min_length=1, description="Gold protocols the judge is asked in. Without "
        "pairwise, gold pairs are still scored by the judge's pointwise ratings (pointwise_ranking) but not "
        "re-judged in both orders: for a judge never taught the pairwise protocol (judgments.protocols). With "
        "claims, the pointwise items of judgments.claim_subtasks are also claim-checked, and pointwise_ranking "
        "rates those candidates by their claims (flywheel/judge/claims.py), as the preference stage then does; "
        "where the gold has claim checks too (world.gold.protocols), each claim is scored against gold's verdict "
        "(`<slice>/claims/exact`, ...).")
    perturbation: PerturbationConfig = Field(PerturbationConfig(), description="Minos' perturbation checks.")
    gold_files: dict[Literal["id-test", "ood-test"], str] = Field(
        {}, description="Human-labelled gold by split: a JSONL file in `flywheel eval --data`'s format "
        "(flywheel/evaluate/labeled.py), a path the driver can read. A split named here is scored against these "
        "labels instead of the oracle world's gold, by meta-eval and the judge's gate; for real data, where the "
        "oracle world has none. Each output of a labelled pair is also rated by the judge, so pairs are ordered by "
        "its ratings (pointwise_ranking) without pointwise labels.")
# ---- end meta-eval


class GateConfig(StrictModel):
    """Promotion rules: a challenger becomes champion only if it beats the champion by the margin (a judge: and
    passes judge_test)."""

    judge_metric: str = Field("id-test/all/pairwise/accuracy", description="Meta-eval metric (higher is better).")
    judge_margin: float = Field(0.0, description="How much better the new judge must be.")
    judge_test: Literal["none", "mcnemar"] = Field(
        "mcnemar", description="Paired test a judge must also pass: `mcnemar` promotes only if McNemar's exact "
        "one-sided test on the gold pairs both judges were scored on gives p < judge_alpha (one run's accuracy on "
        "~200 gold pairs varies by a few points: the margin alone promotes noise); `none`: the margin alone. Needs "
        "a per-pair accuracy as judge_metric (.../pairwise/accuracy, .../pointwise_ranking/accuracy or "
        ".../pairwise_balanced/accuracy). With `none` the test still runs where it can, and its p goes into the "
        "decision's reason without deciding anything.")
    judge_alpha: float = Field(0.05, gt=0, lt=1, description="Significance level of judge_test.")
    judge_baseline: bool = Field(
        True, description="Iteration 0 (no champion judge yet): meta-evaluate the configured base judge too, and "
        "the first trained judge must beat it. Off for a base that has never judged: the first judge is then "
        "promoted unless its metric is undefined (NaN), and the summary has no baseline row.")
    judge_guards: dict[str, float] = Field(
        {}, description="Meta-eval metric -> the largest drop allowed against the champion's value of it, e.g. "
        "{ood-test/all/pointwise_ranking/accuracy: 0.15}: a judge that wins on judge_metric but falls further "
        "below the champion on a guard metric is refused, and the reason names the guard. Values are recorded "
        "on each judge version; a champion without one (a base model, or promoted before the guard was set) is "
        "not guarded against, and the reason says so. Empty: no guards.")
    judge_lineage: Literal["champion", "within_noise"] = Field(
        "champion", description="What the next iteration's judge trains from: `champion`, the promoted judge; "
        "`within_noise`, the latest challenger unless McNemar's one-sided test on the gold pairs finds it worse "
        "than the champion (p < judge_alpha), else the champion. The champion is the best of several noisy "
        "trainings, so a challenger as good on average scores below it and is kept out; with `within_noise` its "
        "round of training is still built on. Either way the champion alone serves and is gated against.")
    policy_metric: str = Field(
        "accuracy", description="Metric of the text policy on held-out items: an oracle one (`accuracy`, "
        "`accuracy/<type>`, ...), or `judge/pointwise/score`, the serving champion judge's mean pointwise rating "
        "of the same answers, for prompts with no ground truth (flywheel/evaluate/downstream.py; the oracle's "
        "metrics are still reported beside it).")
    policy_margin: float = Field(0.0, description="How much better the new text policy must be.")
    generator_metric: str = Field(
        "score10", description="Metric of the generator on held-out prompts: an oracle one (`score10`, the 0-10 "
        "score, ...), or `judge/pointwise/score`, the serving champion judge's mean rating of the same images.")
    generator_margin: float = Field(0.0, description="How much better the new generator must be.")
    downstream_test: Literal["none", "paired"] = Field(
        "paired", description="Paired test a policy or generator must also pass: `paired` promotes only if a "
        "one-sided test on the held-out items both models answered gives p < downstream_alpha (McNemar's exact "
        "test when the metric is right/wrong per item, as `accuracy`; Wilcoxon's signed-rank test for scores, as "
        "`score10`); `none`: the margin alone. A metric without per-item values (e.g. `accuracy/colour`) is gated "
        "by the margin, and the decision says so.")
    downstream_alpha: float = Field(0.05, gt=0, lt=1, description="Significance level of downstream_test.")
    eval_items: int = Field(120, ge=10, description="Held-out items per downstream evaluation.")


class WorldConfig(StrictModel):
    """The oracle world of the embedded default: a synthetic world whose ground truth is known."""

    shapes: ShapesWorldConfig = Field(ShapesWorldConfig(), description="Scenes, renderer and image checker.")
    suites: SuitesConfig = Field(SuitesConfig(), description="Task suites and their FRABench-style splits.")
    base_policies: BasePoliciesConfig = Field(BasePoliciesConfig(), description="How the base LLaVA and SDXL "
                                              "policies are trained from the zoo's random checkpoints.")
    gold: GoldConfig = Field(GoldConfig(), description="Gold meta-eval sets labelled by the noiseless oracle.")


class ServeLimitsConfig(StrictModel):
    """Limits of one HTTP request to the Serve app; beyond one the app answers 413 with the reason."""

    max_body_bytes: int = Field(8 * 2**20, ge=1024, description="Largest request body in bytes.")
    max_image_pixels: int = Field(2048 * 2048, ge=1, description="Largest width*height of one image, read from "
                                  "the PNG header before decoding.")
    max_images: int = Field(8, ge=0, description="Most images in one request (all items and messages together).")
    max_items: int = Field(16, ge=1, description="Most items in one judging request.")
    max_tokens: int | None = Field(None, ge=1, description="Largest max_tokens a /v1/chat/completions call may "
                                   "ask for; null: judge.generation.max_new_tokens.")


class ServeAutoscalingConfig(StrictModel):
    min_replicas: int = Field(1, ge=0, description="Fewest replicas.")
    max_replicas: int = Field(2, ge=1, description="Most replicas.")
    target_ongoing_requests: float = Field(8, gt=0, description="Ongoing requests per replica autoscaling aims "
                                           "at.")


class ServeConfig(StrictModel):
    """The Ray Serve judge application (flywheel/serve/). Replicas, CPUs and GPUs per replica: resources.serve;
    decoding: judge.generation; backend: judge.engine (hf or vllm) unless `engine` is set."""

    model: str | None = Field(None, description="Model to serve: zoo:<name>, a local/shared path, a hub id, or a "
                              "registered version (models:/judge@champion, models:/judge/3); null serves "
                              "models.judge. An alias is resolved once at deploy time, so every replica serves "
                              "the same version; redeploy to pick up a moved alias.")
    model_name: str = Field("judge", description="Name the OpenAI route answers to (the request's `model`).")
    engine: Literal["hf", "vllm"] | None = Field(None, description="Backend inside each replica; null uses "
                                                 "judge.engine (hf when that is http or oracle).")
    app_name: str = Field("judge", description="Ray Serve application name.")
    route_prefix: str = Field("/", description="HTTP route prefix of the application.")
    host: str = Field("127.0.0.1", description="Address Serve's HTTP proxy binds to (0.0.0.0 on a cluster head "
                      "that clients reach from outside).")
    port: int = Field(8000, ge=1, le=65535, description="Port of Serve's HTTP proxy.")
    max_batch_size: int = Field(16, ge=1, description="@serve.batch: most generations per batch.")
    batch_wait_timeout_s: float = Field(0.01, ge=0, description="@serve.batch: how long a batch waits to fill.")
    max_ongoing_requests: int = Field(32, ge=1, description="Requests one replica works on at once (>= "
                                      "max_batch_size, or batches cannot fill).")
    max_queued_requests: int = Field(64, ge=1, description="Requests waiting for a replica, per caller (HTTP "
                                     "proxy); beyond it Serve answers 503 instead of queueing without bound.")
    retry_after_s: float | None = Field(1.0, ge=0, description="Retry-After header (seconds, rounded up) on "
                                        "those 503s, which the http engine honours; null sends none.")
    autoscaling: ServeAutoscalingConfig | None = Field(None, description="Autoscale replicas; null runs "
                                                       "resources.serve.actors replicas.")
    auth_token_env: str | None = Field(None, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$", description="NAME of the "
                                       "environment variable (read where the app is deployed) holding the bearer "
                                       "token clients must send; null: no auth. /healthz never needs it.")
    limits: ServeLimitsConfig = Field(ServeLimitsConfig(), description="Per-request limits (413 beyond them).")


class Config(StrictModel):
    run: RunConfig = Field(RunConfig(), description="Identity, working directory, seed.")
    ray: RayConfig = Field(RayConfig(), description="Where Ray runs.")
    storage: StorageConfig = Field(StorageConfig(), description="Where datasets and checkpoints go.")
    tracking: TrackingConfig = Field(TrackingConfig(), description="MLflow.")
    models: ModelsConfig = Field(ModelsConfig(), description="Checkpoints of judge, policy and generator.")
    judge: JudgeConfig = Field(JudgeConfig(), description="How the judge runs.")
    policy: PolicyConfig = Field(PolicyConfig(), description="How the text policy samples.")
    generator: GeneratorConfig = Field(GeneratorConfig(), description="How the image generator samples.")
    resources: ResourcesConfig = Field(ResourcesConfig(), description="Ray resources per stage.")
    train: TrainConfig = Field(TrainConfig(), description="Training hyper-parameters.")
    limits: RecordLimits = Field(RecordLimits(), description="Limits every record is validated against.")
    world: WorldConfig = Field(WorldConfig(), description="The oracle world (embedded default and tests).")
    prompts: PromptsConfig = Field(PromptsConfig(), description="Where prompts come from.")
    candidates: CandidatesConfig = Field(CandidatesConfig(), description="Sampling candidates from the policies.")
    curate: CurateConfig = Field(CurateConfig(), description="Curation filters of judge and policy data.")
    preferences: PreferencesConfig = Field(PreferencesConfig(), description="Policy preference data per iteration.")
    gate: GateConfig = Field(GateConfig(), description="Promotion of judges and policies.")
    serve: ServeConfig = Field(ServeConfig(), description="The Ray Serve judge application.")
    teacher: TeacherConfig = Field(TeacherConfig(), description="The teacher that labels judge training data.")
    judgments: JudgmentsConfig = Field(JudgmentsConfig(), description="Judging candidates (teacher or judge).")
    meta_eval: MetaEvalConfig = Field(MetaEvalConfig(), description="Judge meta-evaluation on the gold sets.")

    @model_validator(mode="after")
    def _gate_metric_is_measured(self) -> "Config":
        # a gate on a protocol meta-eval never asks would compare NaNs and never promote
        metric = self.gate.judge_metric
        asked = self.meta_eval.protocols
        needs = protocol_of(metric)
        if needs and needs not in asked:
            raise ValueError(f"gate.judge_metric {metric!r} needs the {needs} protocol in meta_eval.protocols "
                             f"(it is {asked})")
        if "/pairwise_balanced/" in metric and self.judge.rating_readout != "expected":
            raise ValueError(f"gate.judge_metric {metric!r} balances the verdicts' probabilities, which are read "
                             "only with judge.rating_readout: expected (it is 'text')")
        return self

    @model_validator(mode="after")
    def _gold_claims_split_alike(self) -> "Config":
        # gold claim checks are the world parser's claims; a judge's own split names other claims, none would pair
        gold_claims = any("claims" in v for v in self.world.gold.protocols.values())
        if gold_claims and self.judgments.claim_splitter != "world":
            raise ValueError("world.gold.protocols has claims, scored claim by claim against the world parser's "
                             f"split, but judgments.claim_splitter is {self.judgments.claim_splitter!r}: set it to "
                             "world, or take claims out of world.gold.protocols")
        return self

    @model_validator(mode="after")
    def _real_data_asks_no_oracle(self) -> "Config":
        # prompts without ground truth (prompts.oracle_world false, preferences.sources) cannot be labelled,
        # gold-scored or evaluated by the oracle world: each setting that would ask it is named, rather than left
        # to label nothing, build an empty gold or evaluate the policies on the world's shapes instead
        errs = []
        if self.preferences.sources:
            for role in ("policy", "generator"):
                metric = getattr(self.gate, f"{role}_metric")
                if not metric.startswith("judge/"):
                    errs.append(f"gate.{role}_metric {metric!r} is the oracle's, but the held-out prompts come from "
                                "preferences.sources: use judge/pointwise/score")
            errs += [f"train.{t}.heldout evaluates on the oracle world's items: set its prompts_file to held-out "
                     "prompts (rated by heldout.judge), or set it to null" for t in ("policy_dpo", "diffusion_dpo")
                     if (h := self.train.resolved(t).heldout) is not None and not h.prompts_file]
        if not self.prompts.oracle_world:
            if self.teacher.engine == "oracle":
                errs.append("teacher.engine is oracle, which labels only the oracle world's prompts: use http")
            if missing := [s for s in self.world.gold.splits if s not in self.meta_eval.gold_files]:
                errs.append(f"world.gold.splits {missing} have no file in meta_eval.gold_files, and the oracle world "
                            "gives them no gold: name a file or leave them out")
            if not self.preferences.sources:
                errs.append("preferences.sources is empty, so the policies' preference prompts would be the oracle "
                            "world's: name the files")
            heldout = self.train.resolved("judge_dpo").heldout
            if heldout is not None and not heldout.gold_file:
                errs.append("train.judge_dpo.heldout rates the oracle world's gold: set its gold_file to held-out "
                            "human labels, or set it to null")
        if errs:
            raise ValueError("prompts without ground truth: " + "; ".join(errs))
        return self

    @model_validator(mode="after")
    def _heldout_labels_are_not_the_gates(self) -> "Config":
        # early stopping on the labels the gate then scores would pick the state that fits the test
        heldout = self.train.resolved("judge_dpo").heldout
        if heldout is not None and heldout.gold_file:
            same = [s for s, f in self.meta_eval.gold_files.items()
                    if Path(f).expanduser().resolve() == Path(heldout.gold_file).expanduser().resolve()]
            if same:
                raise ValueError(f"train.judge_dpo.heldout.gold_file {heldout.gold_file} is meta_eval.gold_files."
                                 f"{same[0]}, the labels the gate scores the judge on: hold out other labels")
        return self

    @model_validator(mode="after")
    def _gate_test_has_pairs(self) -> "Config":
        # McNemar compares the two judges pair by pair: only a mean of per-pair right/wrong outcomes has pairs
        metric = self.gate.judge_metric
        if self.gate.judge_test == "mcnemar" and per_pair_accuracy(split_of(metric)[1]) is None:
            raise ValueError(f"gate.judge_test 'mcnemar' needs a per-pair accuracy as gate.judge_metric "
                             f"(<split>/<slice>/{{{'|'.join(PER_PAIR)}}}/accuracy), not {metric!r}; "
                             "or set gate.judge_test: none")
        return self

    def recipe_warnings(self) -> list[str]:
        """Settings measured to work only together, found apart. Logged when a run starts; nothing is refused,
        since a user may be measuring exactly that."""
        out = []
        dpo = self.train.resolved("policy_dpo")
        if (self.models.policy.path == "world:policy" and not self.world.base_policies.policy_lookup.steps
                and "dpo_sft" in self.train.policy_dpo.methods and dpo.lr >= 5e-4):
            # docs/results.md (runs/t7's pool, seeds 0-2): 0.542 / 0.475 / 0.492 against DPO's 0.508-0.525
            out.append(f"train.policy_dpo uses dpo_sft at lr {dpo.lr:g} on a base LLaVA without look-up phases "
                       "(world.base_policies.policy_lookup.steps 0): measured, that did no better than dpo at 1e-4 "
                       "and lost colour answers; set policy_lookup.steps (3000 in configs/local.yaml) or "
                       "'train.policy_dpo.methods=[dpo]' train.policy_dpo.lr=1e-4")
        if self.teacher.engine == "http" and self.judge.prompt_style == "compact":
            out.append("teacher.engine is http but judge.prompt_style is compact: the teacher model is asked the "
                       "one-line requests made for the tiny judge, without the task's instructions; set "
                       "judge.prompt_style=minos for a real model")
        return out

    @property
    def experiment(self) -> str:
        return self.tracking.experiment or self.run.name

    def hash(self) -> str:
        """Content hash of the resolved config; stages record it in their manifests."""
        blob = json.dumps(self._hashed(), sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:16]

    def _hashed(self) -> dict:
        """The config as hashes read it: fields added later left out at their default (HASHED_ONLY_WHEN_SET)."""
        data = self.model_dump(mode="json")
        for dotted, default in HASHED_ONLY_WHEN_SET.items():
            *parents, key = dotted.split(".")
            node = data
            for p in parents:
                node = node[p]
            if node.get(key, default) == default:
                node.pop(key, None)
        return data

    def stage_hash(self, stage: str) -> str:
        """Hash of the config sections a stage's output depends on: a change elsewhere does not redo it."""
        if stage not in STAGE_SECTIONS:
            raise KeyError(f"no config sections declared for stage {stage!r}")
        data = self._hashed()
        defaults = HttpEngineConfig().model_dump(mode="json")
        for role in ("teacher", "judge", "policy"):
            data[role]["http"].update({k: defaults[k] for k in HTTP_HOW_NOT_WHAT})
        picked = {}
        for dotted in STAGE_SECTIONS[stage]:
            node = data
            try:
                for key in dotted.split("."):
                    node = node[key]
            except KeyError:
                if dotted in HASHED_ONLY_WHEN_SET:
                    continue  # left out at its default by _hashed: hashed as before the field existed
                raise
            picked[dotted] = node
        if stage in RENDERS_JUDGE_REQUESTS:
            picked["judge_request_format"] = JUDGE_REQUEST_FORMAT
        return hashlib.sha256(json.dumps([stage, picked], sort_keys=True).encode()).hexdigest()[:16]

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.model_dump(mode="json"), sort_keys=False)


# How requests reach an HTTP endpoint, not what it answers: hashed at their defaults, so a stage is not redone (and
# an API teacher not paid again) after a change of concurrency, retries, timeouts, prices, the cost cap or the key's
# variable.
HTTP_HOW_NOT_WHAT = ("max_concurrency", "max_retries", "backoff_initial_s", "backoff_max_s", "timeout_s",
                     "api_key_env", "price_per_1m_prompt_tokens", "price_per_1m_completion_tokens",
                     "max_cost_per_stage")
# Fields added after runs were made, hashed only away from their default (which behaves as before they existed):
# an upgrade does not redo those runs' finished stages.
HASHED_ONLY_WHEN_SET = {"judge.samples": 1, "judgments.claim_images": True, "judgments.claim_context": "text",
                        "curate.claim_balance": CurateConfig().claim_balance.model_dump(mode="json")}
# What each stage's output depends on (besides its input datasets, which manifests track by content hash).
STAGE_SECTIONS: dict[str, tuple[str, ...]] = {
    "prompts": ("run.seed", "world.shapes", "world.suites", "prompts", "limits"),
    "curate": ("curate", "judge.prompt_style", "limits"),  # the SFT rows are rendered in the judge's style
    "preferences": ("world.shapes", "preferences"),
    "pool": ("limits",),  # the pooled pairs depend only on their inputs (flywheel/preference_pool.py)
    "judgments-teacher": ("run.seed", "judgments", "teacher", "world.shapes", "limits"),
    "judgments-judge": ("run.seed", "judgments", "judge", "models.judge", "models.zoo", "teacher", "world.shapes",
                        "limits"),
    "gold": ("run.seed", "world.shapes", "world.gold", "limits"),
    # a downstream evaluation's held-out items and decoding (flywheel/evaluate/downstream.py)
    "downstream-policy": ("run.seed", "world.shapes", "gate.eval_items", "policy.generation"),
    "downstream-generator": ("run.seed", "world.shapes", "gate.eval_items", "generator.generation"),
    # how a judge rates those answers, for a judge-scored gate metric (the judge's weights are keyed apart); its
    # claim checks are asked as the judgments stage asks them (flywheel/train/heldout_probes.py JudgeScorer)
    "downstream-judge": ("judge", "preferences.protocols", "teacher", "judgments.claim_subtasks",
                         "judgments.claim_splitter", "judgments.claim_images", "judgments.claim_context"),
    "candidates": ("run.seed", "models.policy", "models.generator", "models.zoo", "policy", "generator",
                   "candidates", "world.base_policies"),
}
# Bump when the judge protocols render their requests differently (flywheel/judge/): the stages whose output holds
# requests the judge reads (its SFT rows) or its answers to them are then redone, as after a config change.
# 2: pairwise requests show the prompt's reference.
JUDGE_REQUEST_FORMAT = 2
RENDERS_JUDGE_REQUESTS = ("curate", "judgments-judge", "meta-eval-judge", "downstream-judge")
# Meta-eval judges like the judgments stage of its role, asked only the protocols meta_eval.protocols names.
STAGE_SECTIONS |= {f"meta-eval-{role}": STAGE_SECTIONS[f"judgments-{role}"] + ("meta_eval.protocols",)
                   for role in ("teacher", "judge")}


def _resolve_placeholders(node: Any, workdir: str) -> Any:
    if isinstance(node, str):
        return node.replace("${workdir}", workdir)
    if isinstance(node, dict):
        return {k: _resolve_placeholders(v, workdir) for k, v in node.items()}
    if isinstance(node, list):
        return [_resolve_placeholders(v, workdir) for v in node]
    return node


def load_config(path: str | Path | None = None, overrides: list[str] | tuple[str, ...] = ()) -> Config:
    """Load a YAML config (default configs/local.yaml) and the files it extends (flywheel/config_files.py), apply
    `a.b=c` overrides, validate, resolve ${workdir}."""
    path = Path(path) if path is not None else REPO_ROOT / "configs" / "local.yaml"
    tree, origins = read_tree(path)

    overridden: dict[str, str] = {}
    for text in overrides:
        key, value = parse_override(text)
        set_dotted(tree, key, value, f"override '{text}'")
        overridden[key] = text

    try:
        cfg = Config.model_validate(tree)
    except ValidationError as e:
        raise ConfigError(_explain(e, path, origins, overridden)) from None

    workdir = str(Path(cfg.run.workdir).expanduser().resolve())
    data = _resolve_placeholders(cfg.model_dump(mode="python"), workdir)
    data["run"]["workdir"] = workdir
    # A plain relative (or ~) storage path would be resolved by each process against its own cwd and HOME: on a
    # cluster, a different directory on every node (each node's copy of a job's working dir). Pinned here, once,
    # like the workdir; URIs with a scheme (s3://, gs://, file://) are left as they are.
    from flywheel.storage import is_uri

    if not is_uri(data["storage"]["uri"]):
        data["storage"]["uri"] = str(Path(data["storage"]["uri"]).expanduser().resolve())
    return Config.model_validate(data)


def _explain(err: ValidationError, path: Path, origins: dict[str, str], overridden: dict[str, str]) -> str:
    lines = []
    for e in err.errors():
        key = ".".join(str(p) for p in e["loc"])
        # an override names the key, a key under it, or (a section it created) one above it
        source = next((f"override '{t}'" for k, t in overridden.items()
                       if key == k or key.startswith(k + ".") or k.startswith(key + ".")), None)
        where = source or origin_of(key, origins, str(path))
        if e["type"] == "extra_forbidden":
            lines.append(f"{where}: unknown key '{key}'")
        else:
            got = repr(e.get("input"))  # a section's validator would print the whole section: not that
            lines.append(f"{where}: '{key}': {e['msg']}" + (f" (got {got})" if len(got) <= 200 else ""))
    return "invalid config:\n  " + "\n  ".join(lines)
