"""What every `flywheel` sub-command shares (kept apart from cli.py, which imports the sub-commands)."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from flywheel.config import REPO_ROOT, Config, ConfigError, load_config

# every sub-command's --config (a path from the current directory, like any file argument)
ConfigOpt = Annotated[Path, typer.Option("--config", "-c", help="A YAML config file (the project's are in "
                                        "configs/), relative to the current directory.")]


def load_or_exit(config: Path, overrides: list[str] | None, console: Console) -> Config:
    """The resolved config, or exit code 2 with the reason (key and file) printed."""
    try:
        return load_config(config, overrides or [])
    except ConfigError as e:
        hint = ""
        if not config.is_absolute() and not config.exists() and (REPO_ROOT / config).exists():
            hint = f" (relative to {Path.cwd()}; the project's is {REPO_ROOT / config})"
        error(console, f"{e}{hint}")
        raise typer.Exit(2) from None


def error(console: Console, text: str, style: str = "red") -> None:
    """A line for the user in `style`, printed as is: errors quote data and paths, whose [brackets] rich would
    otherwise read as markup and drop."""
    console.print(text, style=style, markup=False)


@contextmanager
def says_why_it_stopped(console: Console, then: str = "", traceback: bool = True) -> Iterator[None]:
    """A long command that fails ends with one line saying why (flywheel/failures.py), the traceback logged above
    it, then `then` (how to go on), and exit code 1. traceback=False: a short read-only command, whose failures are
    the environment's (a tracking server down); the traceback is logged at DEBUG only."""
    try:
        yield
    except (typer.Exit, typer.Abort, KeyboardInterrupt):
        raise
    except Exception as e:
        from flywheel.failures import summary

        logging.getLogger("flywheel").log(logging.ERROR if traceback else logging.DEBUG, "stopped", exc_info=True)
        error(console, f"stopped: {summary(e)}")
        if then:
            console.print(then)
        raise typer.Exit(1) from None


def one_line_paragraphs(app: typer.Typer) -> typer.Typer:
    """Give each command of `app` (and its sub-apps) its docstring with every paragraph on one line: Typer 0.29's
    help keeps the line breaks of all but the first paragraph and then wraps at the terminal's width, which broke
    lines mid-sentence ("... before and after their" / "updates, ...")."""
    import inspect

    for info in app.registered_commands:
        if info.help is None and info.callback is not None:
            doc = inspect.getdoc(info.callback) or ""
            info.help = "\n\n".join(" ".join(p.split("\n")) for p in doc.split("\n\n"))
    for group in app.registered_groups:
        one_line_paragraphs(group.typer_instance)
    return app
