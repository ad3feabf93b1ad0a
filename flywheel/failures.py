"""One line that says why a stage stopped, for the log's last word, the CLI and the stage's MLflow run.

An error raised in a Ray Data actor or a Ray Train worker reaches the driver wrapped (RayTaskError,
UserCodeException, TrainingFailedError), its own type and message buried in a remote traceback that ends with
Ray's advice on retries. The line wanted is the original exception's: the last `module.Type: message` line of
that text, else the exception's own.
"""

from __future__ import annotations

import re

# A traceback's last line names the exception: `module.Type: message` for any type outside builtins (whatever
# its name ends with: EndpointRefused, ActorsDidNotStart), a bare `Type: message` for a builtin. Bare names are
# held to the usual endings, so that a line such as "Note: ..." is not taken for one.
_EXCEPTION_LINE = re.compile(r"^(?:(?:[A-Za-z_]\w*\.)+([A-Za-z_]\w*)|([A-Za-z_]\w*(?:Error|Exception|Exit|"
                             r"Interrupt|Iteration|Warning))): (.+)$")
_WRAPPERS = ("RayTaskError", "UserCodeException", "RayActorError", "TrainingFailedError", "WorkerGroupError")


def summary(err: BaseException, limit: int = 400) -> str:
    """`Type: message` of the error that started it, shortened to `limit` characters."""
    line = f"{type(err).__name__}: {err}".splitlines()[0] if str(err) else type(err).__name__
    if any(w in type(err).__name__ for w in _WRAPPERS) or any(w in str(err)[:200] for w in _WRAPPERS):
        found = [(m.group(1) or m.group(2), m.group(3)) for m in map(_EXCEPTION_LINE.match, str(err).splitlines())
                 if m]
        found = [(name, message) for name, message in found if not any(w in name for w in _WRAPPERS)]
        if found:
            line = f"{found[-1][0]}: {found[-1][1]}"
    return line if len(line) <= limit else line[: limit - 3] + "..."
