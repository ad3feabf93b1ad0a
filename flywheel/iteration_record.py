"""What an iteration pins when it starts and records when it finishes: <storage>/iterations/<n>/iteration.json.

An iteration starts from the registered champions, and its own judge gate moves the judge's champion alias
midway. Without a record, a driver killed after that gate would resume from the iteration's own new judge (a
different training, so different results), and a finished iteration run again would train and gate once more
against its successors. So the start models are written before the first stage and read back on resume, and a
finished iteration is skipped whole.
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass, field

from flywheel import storage

log = logging.getLogger(__name__)

ROLES = ("judge", "policy", "generator")


@dataclass
class IterationRecord:
    iteration: int
    config_hash: str  # the config it started with (a resumed run may differ: it is logged, not refused)
    start: dict[str, str]  # role -> the model reference the iteration starts from
    run_id: str | None = None  # its MLflow parent run, reopened on resume
    finished: bool = False
    decisions: list[dict] = field(default_factory=list)  # the gates' decisions, once finished

    @staticmethod
    def uri(iteration_dir: str) -> str:
        return storage.join(iteration_dir, "iteration.json")

    @classmethod
    def load(cls, iteration_dir: str) -> IterationRecord | None:
        uri = cls.uri(iteration_dir)
        if not storage.exists(uri):
            return None
        try:
            raw = json.loads(storage.read_bytes(uri))
            return cls(**raw)
        except (ValueError, TypeError) as e:  # written whole (storage.write_bytes): someone edited it
            raise ValueError(f"{uri}: unreadable iteration record ({e}); fix it, or delete it to start the "
                             f"iteration afresh from the current champions") from e

    def save(self, iteration_dir: str) -> None:
        storage.write_bytes(self.uri(iteration_dir), json.dumps(asdict(self), indent=1).encode())
