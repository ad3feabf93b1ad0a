"""constraints/: the pins scripts/setup.sh installs under. cpu.txt names the stack's versions; cpu-lock.txt pins
every other package at the versions the suites passed with, so a fresh clone gets the tested environment."""

import re
from importlib.metadata import PackageNotFoundError, version

from flywheel.config import REPO_ROOT

PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;#]+)$")


def _pins(name: str) -> dict[str, str]:
    pins = {}
    for line in (REPO_ROOT / "constraints" / name).read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            m = PIN.match(line.strip())
            assert m, f"constraints/{name}: {line!r} is not an exact pin (name==version)"
            pins[m[1].lower().replace("_", "-")] = m[2]
    return pins


def test_the_lock_agrees_with_the_stacks_pins():
    """A version bumped in cpu.txt and not in the lock would make pip refuse the install as a conflict."""
    lock, stack = _pins("cpu-lock.txt"), _pins("cpu.txt")
    assert "torch" not in lock  # its CPU build is installed from disk first, pinned in cpu.txt alone
    differ = {k: (v, lock.get(k)) for k, v in stack.items() if k != "torch" and lock.get(k) != v}
    assert not differ, f"cpu.txt and cpu-lock.txt disagree (cpu.txt, lock): {differ}; run `make lock`"


def test_the_venv_holds_the_locked_versions():
    """setup.sh installed under the lock: every locked package is there at its version."""
    wrong = {}
    for name, pinned in _pins("cpu-lock.txt").items():
        try:
            have = version(name)
        except PackageNotFoundError:
            have = None
        if have != pinned:
            wrong[name] = (pinned, have)
    assert not wrong, f"installed versions differ from constraints/cpu-lock.txt (lock, installed): {wrong}"
