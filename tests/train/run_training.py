"""Run one training in a process of its own (the resume test SIGKILLs it mid-way).

    python tests/train/run_training.py '{"overrides": [...], "training": "judge_sft", "data": "...", "run_name": "..."}'
"""

import json
import sys

from flywheel.config import REPO_ROOT, load_config
from flywheel.raycluster import start_embedded
from flywheel.train.api import train


def main() -> None:
    start_embedded(2, log_to_driver=False)
    spec = json.loads(sys.argv[1])
    cfg = load_config(REPO_ROOT / "configs" / "local.yaml", spec["overrides"])
    result = train(cfg, spec["training"], spec["data"], run_name=spec["run_name"], register=False)
    print("FINISHED", result.final.get("final_step"), flush=True)


if __name__ == "__main__":
    main()
