"""The `flywheel` command. Thin: each command loads the config and calls one library function."""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.logging import RichHandler

from flywheel.clitools import ConfigOpt, error, load_or_exit, one_line_paragraphs, says_why_it_stopped
from flywheel.serve.cli import serve_command
from flywheel.train.cli import train_app

app = typer.Typer(help="A Ray-based data flywheel for multimodal judge models.", no_args_is_help=True,
                  pretty_exceptions_enable=False)
models_app = typer.Typer(help="Model checkpoints.", no_args_is_help=True)
config_app = typer.Typer(help="Configuration.", no_args_is_help=True)
app.add_typer(models_app, name="models")
app.add_typer(config_app, name="config")
app.add_typer(train_app, name="train")
app.command("serve")(serve_command)
# Logs of a job (a file, `ray job logs`) would wrap at 80 columns and split paths; use a wide line there.
console = Console(soft_wrap=True, width=None if sys.stdout.isatty() else 160)

Overrides = Annotated[list[str] | None, typer.Argument(help="Dotted overrides, e.g. judge.engine=vllm train.lr=1e-5; "
                                                      "a {key: value} value replaces that mapping whole.")]


def _setup_logging() -> None:
    logging.basicConfig(level=logging.INFO, format="%(message)s",
                        handlers=[RichHandler(console=console, show_path=False)])


def _load(config: Path, overrides: list[str] | None):
    return load_or_exit(config, overrides, console)


@config_app.command("show")
def config_show(config: ConfigOpt = Path("configs/local.yaml"), overrides: Overrides = None) -> None:
    """Print the resolved config (file + overrides + defaults) as YAML."""
    cfg = _load(config, overrides)
    typer.echo(cfg.to_yaml(), nl=False)
    typer.echo(f"# config hash: {cfg.hash()}")


@models_app.command("build")
def models_build(config: ConfigOpt = Path("configs/local.yaml"), overrides: Overrides = None,
                 force: Annotated[bool, typer.Option(help="Rebuild even if cached.")] = False) -> None:
    """Build the tiny checkpoints and the oracle world's base models the config uses; cached.

    The tiny random-initialised checkpoints (`zoo:*`), then the base models trained from them (`world:judge`,
    `world:policy`, `world:generator`): 1-2.5 hours on 2 CPU cores, once; a killed build goes on from its last
    save."""
    _setup_logging()
    from flywheel.models.zoo import build_world, build_zoo

    cfg = _load(config, overrides)
    with says_why_it_stopped(console, "A base build goes on from its last save when run again."):
        for name, path in build_zoo(cfg, force=force).items():
            console.print(f"zoo:{name:10s} {path}")
        for name, (path, metrics) in build_world(cfg).items():
            shown = ", ".join(f"{k} {v:.3g}" for k, v in sorted(metrics.items()) if isinstance(v, int | float))
            console.print(f"world:{name:8s} {path}  ({shown})")


@app.command("run")
def run(config: ConfigOpt = Path("configs/local.yaml"), overrides: Overrides = None,
        iterations: Annotated[int, typer.Option(help="How many iterations, numbered from --start, each from the last's "
                                                       "champions; finished ones are skipped, so --iterations 3 after "
                                                       "iterations 0-1 runs iteration 2.")] = 1,
        start: Annotated[int, typer.Option(min=0, help="Number of the first iteration.")] = 0,
        resume: Annotated[bool, typer.Option("--resume", show_default=False,
                                             help="Accepted for clarity; always on: a finished iteration is "
                                                  "skipped, an unfinished one resumes from the models it started "
                                                  "from, and each stage skips work whose output exists with the "
                                                  "same config and inputs.")] = False) -> None:
    """Run whole flywheel iterations: data → judge training → meta-eval → gate → serve → policy training."""
    _setup_logging()
    from flywheel.iteration import run_iteration
    from flywheel.raycluster import init_ray
    from flywheel.track import Tracker
    from flywheel.workdir_lock import WorkdirBusy, holding

    cfg = _load(config, overrides)
    for warning in cfg.recipe_warnings():
        logging.getLogger("flywheel").warning("config: %s", warning)
    if iterations < 1:
        error(console, f"--iterations {iterations}: must be at least 1")
        raise typer.Exit(2)
    last = start + iterations - 1
    resume = "Finished stages, and the finished batches of the one that stopped, are kept: the same command again " \
             "resumes there."
    try:  # taken before Ray starts, so a busy workdir is refused at once; each iteration holds it again (nested)
        with holding(cfg.run.workdir, f"iteration {start}" if iterations == 1 else f"iterations {start}-{last}"), \
                says_why_it_stopped(console, resume):
            init_ray(cfg)
            tracker = Tracker(cfg)
            for n in range(start, last + 1):
                _print_iteration(n, run_iteration(cfg, n, tracker))
    except WorkdirBusy as e:
        error(console, str(e))
        raise typer.Exit(2) from None
    console.print(f"Browse it: {tracker.ui_hint()}")


def _print_iteration(n: int, res) -> None:
    from flywheel import gate
    from flywheel.stage_clock import busy_note, time_line

    console.rule(f"iteration {n}: {'finished earlier' if res.skipped else 'done'} (MLflow run {res.run_id})")
    for d in res.decisions:
        console.print(f"{d['model']:14s} {'PROMOTED' if d['promoted'] else 'kept champion'}: {d['reason']}")
        if nxt := d.get("next_start"):
            console.print(f"{'':14s} {gate.next_start_line(nxt)}")
    if line := time_line(res.seconds):
        console.print(line)
    if note := busy_note(res.load, res.cpus):
        console.print(f"[yellow]{note}: those stages took longer than they would alone[/yellow]")


@app.command("eval")
def eval_judge(data: Annotated[str, typer.Option(help="Labeled JSONL (format: flywheel/evaluate/labeled.py): a "
                                                  "path or a storage URI (s3://...).")],
               judge: Annotated[str, typer.Option(help="The judge: models:/judge@champion, models:/judge/3, a "
                                                       "checkpoint folder, a hub id or zoo:judge.")],
               config: ConfigOpt = Path("configs/local.yaml"), overrides: Overrides = None) -> None:
    """Evaluate any judge on any labeled set (pointwise scores and/or pairwise winners), e.g. human labels."""
    _setup_logging()
    from flywheel.engines import make_text_engine
    from flywheel.evaluate.labeled import evaluate_labeled, load_labeled

    cfg = _load(config, [*(overrides or []), f"models.judge.path={judge}"])
    try:
        items, refused = load_labeled(data)
    except OSError as e:  # a missing local file, or an object store's missing key
        error(console, f"--data {data}: cannot read it ({e})")
        raise typer.Exit(2) from None
    for reason in refused:
        error(console, f"refused {reason}", style="yellow")
    if not items:
        error(console, f"no valid items in {data}")
        raise typer.Exit(2)
    with says_why_it_stopped(console):
        metrics = evaluate_labeled(make_text_engine(cfg, "judge"), items, cfg.judge.prompt_style,
                                   cfg.judge.rating_readout, seed=cfg.run.seed)
    j = cfg.judge
    how = (f", each rated by {j.samples} sampled answers at temperature {j.generation.temperature:g} "
           "(judge.samples)" if j.samples > 1 else "")
    console.print(f"{len(items)} items ({len(refused)} refused) judged by {judge}{how}:")
    for k, v in metrics.items():
        console.print(f"  {k:36s} {v:.4f}")


@app.command("report")
def report(config: ConfigOpt = Path("configs/local.yaml"), overrides: Overrides = None,
           as_json: Annotated[bool, typer.Option("--json", help="One JSON object per iteration "
                                                                "(all of them).")] = False,
           last: Annotated[int, typer.Option(min=1, help="Show the latest N iterations, a column each.")] = 6,
           ) -> None:
    """The flywheel's progress across iterations, from MLflow.

    The judge vs gold beside its noisy teacher (and against it pair by pair), the policies before and after their
    updates, promotions and wall time."""
    import json
    import os

    from flywheel.report import iteration_rows
    from flywheel.report_view import print_report

    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")  # a bar per summary read
    cfg = _load(config, overrides)
    with says_why_it_stopped(console, traceback=False):  # e.g. a tracking server that does not answer
        rows = iteration_rows(cfg)
    if not rows:  # with --json too: an empty answer is not a success
        error(console, f"no iterations in experiment {cfg.experiment!r} of {cfg.tracking.uri}")
        raise typer.Exit(1)
    if as_json:
        for r in rows:
            typer.echo(json.dumps(r.to_dict()))
        return
    registry = {role: getattr(cfg.train.registry, role) for role in ("policy", "generator")}
    print_report(console, rows[-last:], cfg.experiment, registry, shown_of=len(rows))


@app.command("data")
def data(config: ConfigOpt = Path("configs/local.yaml"), overrides: Overrides = None,
         iteration: Annotated[int | None, typer.Option(min=0, help="The iteration (default: the latest "
                                                                    "started).")] = None,
         dataset: Annotated[str | None, typer.Option(help="A dataset to show: a name from the listing (labels, "
                                                          "gold, ...) or a dataset's path or URI.")] = None,
         top: Annotated[int, typer.Option(help="Quarantine reasons shown (most frequent first).")] = 10,
         rows: Annotated[int, typer.Option(help="Also show the dataset's first rows (images as their size).")] = 0,
         as_json: Annotated[bool, typer.Option("--json", help="JSON instead of tables.")] = False) -> None:
    """The datasets of an iteration, or one dataset's manifest and quarantined rows.

    The listing gives each dataset's rows, quarantined rows and producer; one dataset, its manifest and why its
    quarantined rows were refused, grouped, with an example of each."""
    from flywheel.datasets import ManifestMismatch

    cfg = _load(config, overrides)
    try:
        _show_data(cfg, iteration, dataset, top, rows, as_json)
    except OSError as e:  # storage unreachable or unreadable (an object store's credentials, a missing mount)
        error(console, f"cannot read {cfg.storage.uri}: {e}")
        raise typer.Exit(2) from None
    except ManifestMismatch as e:  # a dataset changed or damaged since it was written
        error(console, str(e))
        raise typer.Exit(2) from None


def _show_data(cfg, iteration: int | None, dataset: str | None, top: int, rows: int, as_json: bool) -> None:
    import json

    from flywheel import data_view, retention, storage
    from flywheel.datasets import MissingManifest
    from flywheel.iteration import iteration_dir, paths

    n = iteration if iteration is not None else data_view.latest_iteration(cfg.storage.uri)
    if iteration is not None and not storage.exists(iteration_dir(cfg, n)):
        latest = data_view.latest_iteration(cfg.storage.uri)
        error(console, f"--iteration {n}: it has not started under {cfg.storage.uri} (" +
              (f"the latest started is {latest})" if latest is not None else "none has)"))
        raise typer.Exit(2)
    names = paths(cfg, n) if n is not None else {}
    if dataset is None:
        if n is None:
            error(console, f"no iteration has started under {cfg.storage.uri}")
            raise typer.Exit(2)
        listed = data_view.datasets_of(names)
        if as_json:
            typer.echo(json.dumps({x.name: x.manifest and {**x.manifest.model_dump(mode="json"), "uri": x.uri,
                                                           "bytes": data_view.size_bytes(x.uri, x.manifest)}
                                   for x in listed}, indent=1))
        else:
            console.print(data_view.listing_table(n, listed, retention.pruned_names(iteration_dir(cfg, n))))
        return
    uri = data_view.resolve_name(names, dataset)
    try:
        shown = data_view.describe(uri, top, rows)
    except MissingManifest as e:
        if n is not None and (when := retention.pruned_names(iteration_dir(cfg, n)).get(dataset)):
            error(console, f"--dataset {dataset}: iteration {n}'s was deleted by retention at {when} "
                           f"(storage.keep_iterations, flywheel prune); {iteration_dir(cfg, n)}/{retention.MARKER} "
                           "has its rows and content hash")
        else:  # with no iteration started, a name is no name: it was read as a path
            known = (f" (names: {', '.join(names)})" if names else
                     f" (no iteration has started under {cfg.storage.uri}, so it was read as a path)")
            error(console, f"--dataset {dataset}: {e}{known}")
        raise typer.Exit(2) from None
    if as_json:
        typer.echo(json.dumps(shown, indent=1))
    else:
        data_view.print_description(console, shown)


@app.command("prune")
def prune(config: ConfigOpt = Path("configs/local.yaml"), overrides: Overrides = None,
          keep: Annotated[int | None, typer.Option(min=1, help="Finished iterations kept whole, the newest "
                                                               "(default: storage.keep_iterations).")] = None,
          yes: Annotated[bool, typer.Option("--yes", help="Delete; without it, only show what would go.")] = False,
          as_json: Annotated[bool, typer.Option("--json", help="JSON instead of a table.")] = False) -> None:
    """Delete what old finished iterations left and nothing reads any more (a dry run without --yes).

    The datasets of old finished iterations that nothing reads any more: not those a kept dataset was
    made from, nor the preference data a pool may still read (flywheel/retention.py); and the checkpoints of the
    trainings they registered, with this node's local copies of the versions they registered that nothing kept uses
    and, with storage.prune_model_versions, those versions themselves. Records and MLflow runs stay."""
    from flywheel import retention
    from flywheel.workdir_lock import WorkdirBusy

    cfg = _load(config, overrides)
    if keep is None and cfg.storage.keep_iterations is None:
        error(console, "--keep N: how many finished iterations to keep whole (storage.keep_iterations is not set)")
        raise typer.Exit(2)
    try:
        p = retention.prune(cfg, keep) if yes else retention.plan_for(cfg, keep)
    except (ValueError, WorkdirBusy, retention.UnreadableManifest, OSError) as e:  # ValueError: a damaged record
        error(console, str(e))
        raise typer.Exit(2) from None
    if as_json:
        import json

        typer.echo(json.dumps({**retention.plan_json(p), "deleted": yes}, indent=1))
        return
    console.print(retention.plan_table(p))
    verb = "deleted" if yes else "would be deleted (--yes deletes them)"
    console.print(f"{p.counts()}, {p.bytes / 1e6:.1f} MB {verb}; iterations kept whole: "
                  f"{', '.join(map(str, p.kept)) or 'none'}")


@app.command("smoke")
def smoke(config: ConfigOpt = Path("configs/local.yaml"), overrides: Overrides = None) -> None:
    """Build the tiny models and run each engine once (judge, policy, generator), logged to MLflow."""
    _setup_logging()
    from flywheel.smoke import run_smoke
    from flywheel.track import Tracker

    cfg = _load(config, overrides)
    result = run_smoke(cfg)
    console.rule("engine smoke: done")
    for role, out in result.outputs.items():
        console.print(f"[bold]{role}[/bold] ({result.seconds[role]:.1f} s): {out[:120]!r}")
    console.print("These are random-initialised tiny models: their outputs are noise by design.")
    console.print(f"MLflow run [bold]{result.run_id}[/bold] (experiment {cfg.experiment!r}) in {cfg.tracking.uri}")
    console.print(f"To browse it: {Tracker(cfg).ui_hint()}")


# Recurring iterations on a Ray cluster through the Jobs API; the logic is in flywheel/schedule.py.
@app.command("schedule")
def schedule(config: ConfigOpt = Path("configs/local.yaml"), overrides: Overrides = None,
             every: Annotated[str | None, typer.Option(help="Tick interval: 30s, 10m, 6h, 1d (first tick at once).")]
             = None,
             cron: Annotated[str | None, typer.Option(help="Tick times as a cron expression in UTC, e.g. "
                                                           "'0 */6 * * *'.")] = None,
             address: Annotated[str | None, typer.Option(help="The cluster's Jobs API, http://<head>:8265; default "
                                                              "RAY_API_SERVER_ADDRESS, then RAY_ADDRESS. The token "
                                                              "comes from RAY_AUTH_TOKEN / RAY_AUTH_TOKEN_PATH "
                                                              "(with RAY_AUTH_MODE=token).")] = None,
             once: Annotated[bool, typer.Option(help="One tick (decide, maybe submit) and exit: for a cron job.")]
             = False,
             max_runs: Annotated[int | None, typer.Option(help="Exit after this many submissions, once the last "
                                                               "has ended (exit 0 if it succeeded).")] = None,
             start: Annotated[int, typer.Option(help="Iteration to run when this schedule has no job yet, or "
                                                     "none at or past it (e.g. after finishing one by hand).")] = 0,
             max_attempts: Annotated[int, typer.Option(help="Attempts of one iteration (the first and its "
                                                            "resumptions) before the scheduler halts.")] = 3,
             name: Annotated[str | None, typer.Option(help="Schedule name that marks our jobs; default the "
                                                           "config's MLflow experiment and a hash of run.workdir.")]
             = None,
             job: Annotated[str, typer.Option(help="Entrypoint script, relative to the working dir.")]
             = "jobs/iteration.py",
             working_dir: Annotated[Path, typer.Option(help="Uploaded with every job (the project; .gitignore "
                                                            "and .rayignore apply).")] = Path("."),
             decision_log: Annotated[Path | None, typer.Option(help="JSON-lines decision log; default decisions.jsonl "
                                                                    "in <run.workdir>/schedule.")] = None,
             poll: Annotated[float, typer.Option(help="Seconds between status polls while waiting for the last "
                                                      "run (--max-runs).")] = 30.0) -> None:
    """Submit flywheel iterations to a Ray cluster on a schedule: one at a time, a failed one resumed first."""
    _setup_logging()
    from flywheel.schedule import DecisionLog, IterationJobs, Scheduler, ScheduleError, Timing, \
        config_relative_to, default_name, make_client

    cfg = _load(config, overrides)
    try:
        timing = None if once else Timing.parse(every, cron)
        if not (working_dir / job).is_file():
            raise ScheduleError(f"--job {job}: no such file under {working_dir.resolve()}")
        # The job gets the workdir as it resolves here (absolute), so it writes where this process reads.
        job_overrides = [*(o for o in overrides or [] if not o.startswith("run.workdir=")),
                         f"run.workdir={cfg.run.workdir}"]
        jobs = IterationJobs(None, name or default_name(cfg.experiment, cfg.run.workdir),
                             config_relative_to(config, working_dir), job_overrides,
                             str(working_dir.resolve()), job)
        log_path = decision_log or Path(cfg.run.workdir) / "schedule" / "decisions.jsonl"
        scheduler = Scheduler(jobs, DecisionLog(log_path), start, max_attempts, workdir=cfg.run.workdir)
        jobs.client = make_client(address)  # last: every input is checked before the cluster is contacted
        code = scheduler.run(timing, once=once, max_runs=max_runs, poll_s=poll)
    except (ScheduleError, OSError) as e:
        error(console, f"schedule: {e}")
        raise typer.Exit(2) from None
    except Exception as e:
        if type(e).__name__ != "AuthenticationError":  # ray.exceptions: a missing or wrong cluster token
            raise
        error(console, f"schedule: the cluster refused the token: {e}")
        raise typer.Exit(2) from None
    except KeyboardInterrupt:
        console.print("schedule: stopped (jobs already submitted keep running)")
        code = 0
    raise typer.Exit(code)


one_line_paragraphs(app)  # every command is registered by now


def run_as_job(command: str) -> None:
    """A jobs/ entrypoint (`python jobs/<job>.py ...` under `ray job submit`): one sub-command as the whole
    program, so its usage line and errors name the script, not `<script> <command>`."""
    import sys

    typer.main.get_command(app).commands[command].main(sys.argv[1:], prog_name=sys.argv[0])


if __name__ == "__main__":
    app()
