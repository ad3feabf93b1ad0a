"""Config overrides shared by tests. TINY: an iteration small enough for the default suite (about 2 minutes on 2
shared cores): the random zoo policies, 3 prompts per sub-task, 2 training steps. Shared by the resume test and the
`ray job submit` tests."""

# The random zoo models instead of the trained world bases (minutes each; they have their own tests).
ZOO_MODELS = ["models.judge.path=zoo:judge", "models.policy.path=zoo:policy", "models.generator.path=zoo:generator"]

TINY = [*ZOO_MODELS, "world.suites.prompts_per_subtask=3", "world.gold.prompts_per_subtask=1",
        "world.gold.max_pairs_per_prompt=1", "candidates.samples_per_prompt=2",
        "judgments.samples_per_item=1", "generator.generation.num_inference_steps=2",
        "policy.generation.max_new_tokens=8", "judge.generation.max_new_tokens=16", "train.max_steps=2",
        "preferences.prompts_per_subtask=2", "preferences.samples_per_prompt=2", "gate.eval_items=10",
        "resources.labeling.actors=1",
        "preferences.update_min_pairs={policy: 0, generator: 0}"]  # the updates train on a few pairs, not a pool
