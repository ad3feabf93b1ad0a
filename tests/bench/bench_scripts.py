"""bench/'s scripts as modules: they are scripts, not a package, so their tests load them by path (once each)."""

import functools
import importlib.util
from types import ModuleType

from flywheel.config import REPO_ROOT


@functools.cache
def load_bench(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, REPO_ROOT / "bench" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
