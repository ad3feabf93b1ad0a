"""`flywheel serve --config ... [key=value ...]`: deploy the judge app and keep it up until Ctrl-C (embedded Ray),
or deploy onto a running cluster and return (`--detach`, the default when joining a cluster: Serve keeps the app
running after the driver exits).

Mounted in flywheel/cli.py as `app.command("serve")(serve_command)`; jobs/serve.py runs `serve_app` directly.
Imports stay inside the function so `flywheel --help` does not load Ray.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from flywheel.clitools import ConfigOpt

if TYPE_CHECKING:
    from rich.console import Console

    from flywheel.config import Config
    from flywheel.serve.model import ServedModel

Overrides = Annotated[list[str] | None, typer.Argument(help="Dotted overrides, e.g. serve.port=8001 "
                                                            "serve.model=models:/judge@champion")]
DetachOpt = Annotated[bool | None, typer.Option(
    "--detach/--block", help="Return after deploying (the app lives as long as the Ray cluster) or block until "
    "Ctrl-C and then shut the app down. Default: detach when joining a cluster (ray.address or RAY_ADDRESS set), "
    "block with an embedded Ray (which ends with this process).")]


def serve_command(config: ConfigOpt = Path("configs/local.yaml"), overrides: Overrides = None,
                  detach: DetachOpt = None) -> None:
    """Serve the judge model (Ray Serve): judging routes, OpenAI-compatible chat completions, /healthz.

    On serve.host:serve.port (default 127.0.0.1:8000), the model serve.model names (default: models.judge)."""
    import logging
    import signal
    import threading

    from rich.console import Console

    from flywheel.clitools import error, load_or_exit

    logging.basicConfig(level=logging.INFO, format="%(message)s")
    console = Console(soft_wrap=True)
    cfg = load_or_exit(config, overrides, console)
    from flywheel.raycluster import cluster_address_from_env

    joined = bool(cfg.ray.address or cluster_address_from_env())  # not an embedded Ray's address a parent left
    if detach is None:
        detach = joined
    if detach and not joined:
        console.print("[red]--detach needs a Ray cluster (ray.address or RAY_ADDRESS): an embedded Ray ends with "
                      "this process, and the app with it[/red]")
        raise typer.Exit(2)

    import ray
    from ray import serve

    from flywheel.serve.app import deploy

    try:
        d = deploy(cfg)
    except Exception as e:
        error(console, f"serve failed: {type(e).__name__}: {e}")
        raise typer.Exit(1) from None
    console.print(f"judge [bold]{d.served.version}[/bold] serving at {d.url}")
    alias = pin_or_warn(cfg, d.served, d.app_name, console)
    console.print(f"  health:  curl {d.url}/healthz")
    console.print(f"  OpenAI:  base_url={d.openai_base_url}  model={cfg.serve.model_name}")
    if cfg.serve.auth_token_env:
        console.print(f"  auth:    Authorization: Bearer ${cfg.serve.auth_token_env}")
    if detach:
        console.print(f"deployed as Serve application {d.app_name!r}; it keeps running on the cluster "
                      f"(stop it with `serve delete {d.app_name}` or serve.delete"
                      + (f", then delete the alias {alias!r})" if alias else ")"))
        return
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    console.print("Ctrl-C to stop")
    stop.wait()
    console.print("shutting down")
    if joined:  # the cluster's Serve may hold other apps (an iteration's judge): only this one goes
        serve.delete(d.app_name)
    else:
        serve.shutdown()
    ray.shutdown()
    if alias:
        unpin_or_warn(cfg, d.served, d.app_name, console)


def pin_or_warn(cfg: Config, served: ServedModel, app_name: str, console: Console) -> str | None:
    """Pin the served version (flywheel/serve/model.py) and say so; a registry that cannot be written is a warning,
    not a failed serve: the app is up, only retention's protection is missing. Returns the alias set, if any."""
    from flywheel.serve.model import pin

    try:
        alias = pin(cfg, served, app_name)
    except Exception as e:  # noqa: BLE001 - the app serves all the same; say what is not protected
        console.print(f"[yellow]not pinned in the registry ({type(e).__name__}: {e}): a prune with "
                      "storage.prune_model_versions may delete this version's weights[/yellow]")
        return None
    if alias:
        console.print(f"  pinned:  registry alias {alias!r}; retention keeps the version an alias names")
    return alias


def unpin_or_warn(cfg: Config, served: ServedModel, app_name: str, console: Console) -> None:
    """Unpin after the app stopped; a registry that cannot be written leaves the alias, which only keeps the version
    from retention: a warning naming it, not an error (the app is already down)."""
    from flywheel.serve.model import serving_alias, unpin

    try:
        unpin(cfg, served, app_name)
    except Exception as e:  # noqa: BLE001 - the app is stopped; what is left is an alias to delete by hand
        console.print(f"[yellow]the registry alias {serving_alias(app_name)!r} on {served.version} was not removed "
                      f"({type(e).__name__}: {e}): retention keeps that version until the alias is deleted[/yellow]")


serve_app = typer.Typer(help="Serve the judge model.", add_completion=False, pretty_exceptions_enable=False)
serve_app.command()(serve_command)
