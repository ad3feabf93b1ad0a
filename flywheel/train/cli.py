"""`flywheel train <judge-sft | judge-dpo | policy-dpo | diffusion-dpo> --config … --data …` (mounted by
flywheel/cli.py as the `train` sub-command)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from flywheel.clitools import ConfigOpt

train_app = typer.Typer(help="Train the judge (SFT, DPO) and the policies (LLaVA DPO, SDXL Diffusion-DPO) "
                        "through Ray Train; results are registered in MLflow.", no_args_is_help=True)

DataOpt = Annotated[str, typer.Option("--data", "-d", help="URI of the training dataset (record kind sft for "
                                      "judge-sft, dpo for judge-dpo/policy-dpo, image_pref for diffusion-dpo).")]
BaseOpt = Annotated[str | None, typer.Option(
    "--base", help="Model to start from: zoo:<name>, a path, a hub id, models:/<name>/<version> or "
    "models:/<name>@<alias>. Default: the configured model; for judge-dpo the newest judge version made by judge-sft.")]
IterOpt = Annotated[int, typer.Option("--iteration", help="Flywheel iteration the MLflow parent run is tagged "
                                      "with (when run outside an iteration).")]
FreshOpt = Annotated[bool, typer.Option("--fresh", help="Start a new run even if the same training is "
                                        "checkpointed or registered (default: resume / reuse it).")]
RunNameOpt = Annotated[str | None, typer.Option(
    "--run-name", help="Ray Train run to continue (or start) by name, e.g. a --fresh run that crashed; by default "
    "the name is a hash of the training, settings, base and data, so re-running the same command resumes.")]
RegisterOpt = Annotated[bool, typer.Option("--register/--no-register", help="Register the result as a model "
                                           "version.")]
MethodOpt = Annotated[str | None, typer.Option(
    "--method", help="Update method of judge-dpo / policy-dpo (dpo | dpo_sft | bon_sft) or diffusion-dpo "
    "(dpo | bon_sft); default: the first of train.<training>.methods.")]
Overrides = Annotated[list[str] | None, typer.Argument(help="Dotted overrides, e.g. train.max_steps=20")]


def _run(training: str, config: Path, data: str, base: str | None, iteration: int, fresh: bool, register: bool,
         run_name: str | None, overrides: list[str] | None, method: str | None = None) -> None:
    from rich.console import Console

    from flywheel.clitools import error, load_or_exit, says_why_it_stopped
    from flywheel.train.api import train
    from flywheel.train.errors import NonFiniteLossError

    console = Console(soft_wrap=True)
    cfg = load_or_exit(config, overrides, console)
    with says_why_it_stopped(console, "Its checkpoints are kept: the same command again goes on from the last."):
        try:
            result = train(cfg, training, data, base=base, iteration=iteration, register=register, fresh=fresh,
                           run_name=run_name, method=method)
        except NonFiniteLossError as e:
            error(console, str(e))
            raise typer.Exit(3) from None
    if result.reused:
        console.print(f"{training}: identical training already registered: [bold]{result.model_uri}[/bold]")
        return
    f = result.final
    console.print(f"{training}: {f.get('final_step')} steps (resumed from {f.get('resumed_from')}), "
                  f"median step {f.get('step_time_median_s', float('nan')):.3f} s")
    console.print(f"checkpoint: {result.checkpoint_path}")
    console.print(f"MLflow run: {result.mlflow_run_id}   model version: [bold]{result.model_uri}[/bold]")
    if "heldout.best_step" in f:
        console.print(f"held-out {f.get('heldout.target')}: best {f.get('heldout.best_value')} at step "
                      f"{f.get('heldout.best_step')} (start {f.get('heldout.start_value')}); exported the best state"
                      + (f"; [red]refused: {f.get('heldout.reason')}[/red]" if f.get("heldout.refused") else ""))


def _command(training: str, doc: str):
    def command(data: DataOpt, config: ConfigOpt = Path("configs/local.yaml"), base: BaseOpt = None,
                iteration: IterOpt = 0, fresh: FreshOpt = False, run_name: RunNameOpt = None,
                register: RegisterOpt = True, method: MethodOpt = None, overrides: Overrides = None) -> None:
        if training == "judge-sft" and method is not None:  # one method: refused rather than ignored
            from rich.console import Console

            from flywheel.clitools import error

            error(Console(), f"--method {method}: judge-sft has one method (SFT); --method is for judge-dpo, "
                             "policy-dpo and diffusion-dpo")
            raise typer.Exit(2)
        _run(training, config, data, base, iteration, fresh, register, run_name, overrides, method)

    command.__doc__ = doc
    train_app.command(training)(command)


_command("judge-sft", "Judge SFT (TRL SFTTrainer + LoRA or full) on an `sft` dataset; registers `judge`.")
_command("judge-dpo", "Judge DPO (TRL DPOTrainer) from the SFT result on judge `dpo` pairs; registers `judge`.")
_command("policy-dpo", "LLaVA policy DPO (TRL DPOTrainer + LoRA) on policy `dpo` pairs; registers `policy-llava`.")
_command("diffusion-dpo", "SDXL Diffusion-DPO (LoRA on the UNet) on `image_pref` pairs; registers `policy-sdxl`.")
