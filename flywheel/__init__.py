"""A Ray-based data flywheel for multimodal judge models."""

import os

__version__ = "0.1.0"

# Ray fails ray.init() (and `ray start`) when its dashboard is not up within RAY_DASHBOARD_STARTUP_TIMEOUT_S, 60 s
# by default: a loaded 2-core box has taken longer (2026-11-28), and the embedded Ray needs its dashboard (see
# raycluster.start_embedded). Ray reads the variable once, when it is imported, so it is set here, before any
# flywheel module imports ray. A value the user set wins; a dashboard that crashes still fails at once.
DASHBOARD_STARTUP_TIMEOUT_S = 300
os.environ.setdefault("RAY_DASHBOARD_STARTUP_TIMEOUT_S", str(DASHBOARD_STARTUP_TIMEOUT_S))
