#!/usr/bin/env python
"""Check, as a person would, that an iteration's summary and galleries are visible in the MLflow UI.

Starts `mlflow server` on 127.0.0.1 (a free port) over the given store, opens the iteration's run page in
headless Chromium (Debian's `chromium` package), driven through the DevTools protocol with aiohttp (already a
dependency), and asserts what is on screen — not only in the DOM:

* summary: the run's description (`mlflow.note.content`), expanded with "Show more" as a person would: the
  "Flywheel iteration N" heading, the stage/seconds and dataset/rows tables, the meta-eval and downstream lines and
  every promotion decision (taken from the run's `summary/summary.json` when present);
* galleries: every `gallery/*.json` table logged on the run — else on its stage runs — opened in the Artifacts tab
  (MLflow 3.17 renders a `log_table` JSON listed in the `mlflow.loggedArtifacts` tag as a table, images inline):
  every column header, the first pair's texts, at least one loaded `<img>` per image column (a gallery without
  any image fails), and the first chosen analysis in full in the preview panel a click on its cell opens.

Screenshots go to --out (<prefix>-summary.png, <prefix>-gallery.png, or <prefix>-gallery-<table>.png when there are
several) even when a check fails. Exit status 0 when
everything is visible, 1 with the list of what is not, 2 for set-up errors (no chromium, no such run, ...).
The server and the browser run in their own process groups and are stopped on exit, whatever happens.

    .venv/bin/python scripts/check_mlflow_ui.py --workdir runs/local                 # the latest iteration
    .venv/bin/python scripts/check_mlflow_ui.py --tracking-uri sqlite:////x/mlflow.db --artifact-root /x/mlartifacts \\
        --run-id <id> --out docs --prefix mlflow-iteration

Artifacts: runs logged to a local store have `file://` artifact URIs, which the server reads itself; the UI fetches
them through the server's /get-artifact endpoint. --artifact-root only sets where *new* experiments would put
artifacts (--default-artifact-root and --artifacts-destination, so nothing lands in ./mlartifacts of the cwd).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import io
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  "--disable-dev-shm-usage", "--hide-scrollbars", "--no-first-run", "--mute-audio")
MAX_SCREENSHOT_BYTES = 300_000


class SetupError(RuntimeError):
    """The check could not run (no browser, no server, no such run)."""


class UICheckFailed(AssertionError):
    """The UI does not show what it should; `problems` lists what."""

    def __init__(self, problems: list[str], report: "Report"):
        super().__init__("MLflow UI check failed:\n  - " + "\n  - ".join(problems))
        self.problems, self.report = problems, report


@dataclass
class Report:
    run_id: str
    experiment_id: str
    url: str = ""
    checked: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    screenshots: list[str] = field(default_factory=list)
    galleries: list[str] = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=dict)


# ---------------------------------------------------------------------------------------------- processes


def find_chromium(explicit: str | None = None) -> str:
    """The Chromium binary: `explicit`, $CHROMIUM, or the first of CHROMIUM_NAMES on the PATH."""
    for name in (explicit, os.environ.get("CHROMIUM"), *CHROMIUM_NAMES):
        if name and (path := shutil.which(name)):
            return path
    raise SetupError("chromium not found: apt-get install -y chromium (Debian), or pass --chromium / set $CHROMIUM")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def stop_group(proc: subprocess.Popen, grace: float = 5.0) -> None:
    """Stop a process started with start_new_session=True and everything in its process group (mlflow server's
    uvicorn worker; Chromium's zygote, GPU and renderer processes): SIGTERM, then SIGKILL after `grace` s."""
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            proc.poll()
            if not _group_alive(proc.pid):
                return
            time.sleep(0.1)
    proc.poll()


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # zombies still count for killpg; look for a member that is not one
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                stat = (d / "stat").read_text()
            except OSError:
                continue
            fields = stat[stat.rindex(")") + 2:].split()
            if int(fields[2]) == pgid and fields[0] != "Z":
                return True
    return False


@contextmanager
def mlflow_server(tracking_uri: str, artifact_root: str | None = None, port: int | None = None,
                  timeout: float = 180.0, log_path: str | None = None) -> Iterator[str]:
    """`mlflow server` over the store on 127.0.0.1:<port>; yields its base URL once /health answers."""
    port = port or free_port()
    workdir = tempfile.mkdtemp(prefix="mlflow-ui-check-")
    root = Path(artifact_root).resolve().as_uri() if artifact_root and "://" not in artifact_root else artifact_root
    root = root or Path(workdir, "mlartifacts").as_uri()
    cmd = [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", tracking_uri,
           "--default-artifact-root", root, "--artifacts-destination", root,
           "--host", "127.0.0.1", "--port", str(port), "--workers", "1"]
    log_path = log_path or os.path.join(workdir, "server.log")
    # no job runner: a read-only look needs none, and it forks seven huey consumers on a 2-core box that ignore
    # SIGTERM for seconds
    env = os.environ | {"MLFLOW_DISABLE_TELEMETRY": "true", "DO_NOT_TRACK": "true",
                        "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, cwd=workdir, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env=env, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout
        while True:
            if proc.poll() is not None:
                raise SetupError(f"mlflow server exited with {proc.returncode}:\n{_tail(log_path)}")
            try:
                with urllib.request.urlopen(f"{url}/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise SetupError(f"mlflow server did not answer {url}/health within {timeout:.0f} s:\n"
                                 f"{_tail(log_path)}")
            time.sleep(0.5)
        yield url
    finally:
        stop_group(proc)
        shutil.rmtree(workdir, ignore_errors=True)


def _tail(path: str, n: int = 3000) -> str:
    try:
        return Path(path).read_text(errors="replace")[-n:]
    except OSError:
        return ""


# ---------------------------------------------------------------------------------------------- browser


class Page:
    """One Chromium tab over the DevTools protocol (only what this check needs)."""

    def __init__(self, ws):
        self.ws, self._id = ws, 0

    async def send(self, method: str, **params):
        self._id += 1
        await self.ws.send_json({"id": self._id, "method": method, "params": params})
        while True:  # events are not enabled; anything without our id is skipped
            msg = await self.ws.receive_json(timeout=120)
            if msg.get("id") == self._id:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg.get("result", {})

    async def eval(self, js: str):
        r = await self.send("Runtime.evaluate", expression=js, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in r:
            raise RuntimeError(f"javascript failed: {r['exceptionDetails'].get('exception', r['exceptionDetails'])}")
        return r["result"].get("value")

    async def call(self, fn: str, *args):
        """Call one of the helpers (JS_HELPERS) with JSON arguments."""
        await self.eval(JS_HELPERS)
        return await self.eval(f"window.__fw.{fn}(...{json.dumps(list(args))})")

    async def wait_for(self, js: str, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            await self.eval(JS_HELPERS)
            if await self.eval(js):
                return True
            await asyncio.sleep(0.25)
        return False

    async def settle(self, quiet: float = 1.0, limit: float = 15.0) -> None:
        """Wait until the page's markup stops changing for `quiet` seconds (the SPA re-renders after its fetches
        and after a click), at most `limit` seconds."""
        last, since, deadline = None, time.monotonic(), time.monotonic() + limit
        while time.monotonic() < deadline:
            now = await self.eval("document.body ? document.body.innerHTML.length : 0")
            if now != last:
                last, since = now, time.monotonic()
            elif time.monotonic() - since >= quiet:
                return
            await asyncio.sleep(0.2)

    async def until_visible(self, fn: str, *args, patience: float = 3.0) -> str:
        """A helper's verdict, asked again for `patience` seconds while it is not 'visible' (a re-render)."""
        deadline = time.monotonic() + patience
        while True:
            why = await self.call(fn, *args)
            if why == "visible" or time.monotonic() > deadline:
                return why
            await asyncio.sleep(0.3)

    async def goto(self, url: str) -> None:
        # via about:blank: a new hash route of the same SPA would be a same-document navigation, and each page
        # is meant to be checked from a fresh load, as a person opening the link would see it
        await self.send("Page.navigate", url="about:blank")
        await self.send("Page.navigate", url=url)

    async def viewport(self, width: int, height: int) -> None:
        await self.send("Emulation.setDeviceMetricsOverride", width=width, height=height, deviceScaleFactor=1,
                        mobile=False)

    async def screenshot(self, path: str, clip: dict | None = None) -> str:
        params = {"format": "png", "captureBeyondViewport": False}
        if clip:
            params["clip"] = clip | {"scale": 1}
        data = base64.b64decode((await self.send("Page.captureScreenshot", **params))["data"])
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_bytes(_small_png(data))
        return path


def _small_png(data: bytes, limit: int = MAX_SCREENSHOT_BYTES) -> bytes:
    """PNG bytes no larger than `limit`: palette-quantised (the UI is flat colours), then scaled down if needed."""
    from PIL import Image

    im = Image.open(io.BytesIO(data)).convert("RGB")
    scale = 1.0
    while True:
        w, h = max(1, int(im.width * scale)), max(1, int(im.height * scale))
        small = im if scale == 1.0 else im.resize((w, h), Image.LANCZOS)
        buf = io.BytesIO()
        small.quantize(colors=128, method=Image.Quantize.MEDIANCUT).save(buf, format="PNG", optimize=True)
        if buf.tell() <= limit or scale < 0.3:
            return buf.getvalue()
        scale *= 0.85


@contextmanager
def chromium(binary: str, width: int = 1600, height: int = 1000) -> Iterator[int]:
    """Headless Chromium with remote debugging on a free port (read from DevToolsActivePort); yields the port."""
    profile = tempfile.mkdtemp(prefix="mlflow-ui-chromium-")
    if len(profile) > 60:  # Chromium aborts when its singleton socket path passes 107 bytes ("Socket path too long")
        shutil.rmtree(profile)
        profile = tempfile.mkdtemp(prefix="mlflow-ui-chromium-", dir="/tmp")
    cmd = [binary, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", "--remote-debugging-address=127.0.0.1",
           "--remote-debugging-port=0", f"--window-size={width},{height}", "about:blank"]
    log_path = os.path.join(profile, "chromium.log")
    with open(log_path, "wb") as log:  # TMPDIR: its singleton socket goes inside the profile, removed with it
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=log, stdin=subprocess.DEVNULL,
                                env=os.environ | {"TMPDIR": profile}, start_new_session=True)
    try:
        active = Path(profile, "DevToolsActivePort")
        deadline = time.monotonic() + 60
        while not (active.exists() and len(active.read_text().split()) >= 2):
            if proc.poll() is not None:
                raise SetupError(f"chromium exited with {proc.returncode} before opening its DevTools port "
                                 f"({' '.join(cmd)}):\n{_tail(log_path)}")
            if time.monotonic() > deadline:
                raise SetupError(f"chromium did not open its DevTools port within 60 s:\n{_tail(log_path)}")
            time.sleep(0.1)
        yield int(active.read_text().split()[0])
    finally:
        stop_group(proc)
        shutil.rmtree(profile, ignore_errors=True)


async def _open_page(session, port: int) -> Page:
    async with session.get(f"http://127.0.0.1:{port}/json/list") as r:
        targets = await r.json()
    target = next(t for t in targets if t["type"] == "page")
    ws = await session.ws_connect(target["webSocketDebuggerUrl"], max_msg_size=0)
    return Page(ws)


# The page-side helpers (text search; an on-screen test a person would agree with), in their own file.
JS_HELPERS = Path(__file__).with_name("mlflow_ui_helpers.js").read_text()


# ---------------------------------------------------------------------------------------------- the check


def _store(tracking_uri: str):
    from mlflow import MlflowClient

    return MlflowClient(tracking_uri=tracking_uri)


def find_run(client, run_id: str | None = None, experiment: str | None = None):
    """The run to check: `run_id`, else the most recent iteration (parent) run of `experiment` (or any)."""
    if run_id and run_id != "latest":
        try:
            return client.get_run(run_id)
        except Exception as e:  # noqa: BLE001 — MLflow raises several kinds for an unknown id
            raise SetupError(f"no run {run_id} in the store: {e}") from e
    if experiment:
        exp = client.get_experiment_by_name(experiment)
        if exp is None:
            raise SetupError(f"no experiment named {experiment!r}")
        ids = [exp.experiment_id]
    else:
        ids = [e.experiment_id for e in client.search_experiments()]
    runs = client.search_runs(ids, "tags.`flywheel.iteration` != ''", order_by=["attributes.start_time DESC"],
                              max_results=200)
    runs = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    if not runs:
        raise SetupError(f"no iteration run (a parent run tagged flywheel.iteration) in experiments {ids}")
    return runs[0]


def _summary(client, run) -> dict | None:
    try:
        return _load_json(client, run.info.run_id, "summary/summary.json")
    except Exception:  # noqa: BLE001 — no summary artifact: only the generic items are checked
        return None


def _load_json(client, run_id: str, path: str):
    with tempfile.TemporaryDirectory() as d:
        return json.loads(Path(client.download_artifacts(run_id, path, d)).read_text())


def _num(v) -> str:
    return f"{float(v):.3f}"


def expected_summary(run, summary: dict | None) -> dict:
    """What the description must show, from the data (summary/summary.json) rather than from its markdown layout,
    which changes: the heading; per meta-eval split, the challenger's pairwise accuracy in the same line or row;
    per downstream role, a score after the update; each decision's model beside its reason; and tables whose
    first column names every stage and every dataset."""
    n = (summary or {}).get("iteration", run.data.tags.get("flywheel.iteration", "?"))
    exp = {"texts": [f"Flywheel iteration {n}"], "pairs": [], "decisions": [], "tables": {}}
    if summary:
        for split, m in summary.get("meta_eval", {}).get("challenger", {}).items():
            if "all/pairwise/accuracy" in m:
                exp["pairs"].append((f"meta-eval {split}", split, _num(m["all/pairwise/accuracy"])))
        for role, d in summary.get("downstream", {}).items():
            after = {k: v for k, v in d.get("after", {}).items() if not k.startswith("dim")}
            if after:
                exp["pairs"].append((f"downstream {role}", role, _num(next(iter(after.values())))))
        exp["decisions"] = [(d["model"], " ".join(str(d["reason"]).split())[:60]) for d in summary.get("decisions", [])]
        exp["tables"] = {"stage": list(summary.get("seconds", {})), "dataset": list(summary.get("counts", {}))}
    return exp


def find_galleries(client, run) -> list[tuple[str, str]]:
    """(run id, artifact path) of every gallery table on the run, else on its nested stage runs."""
    def tables(r):
        logged = json.loads(r.data.tags.get("mlflow.loggedArtifacts", "[]") or "[]")
        return [(r.info.run_id, a["path"]) for a in logged
                if a.get("type") == "table" and a["path"].startswith("gallery/")]

    own = tables(run)
    if own:
        return own
    children = client.search_runs([run.info.experiment_id], f"tags.mlflow.parentRunId = '{run.info.run_id}'",
                                  max_results=500)
    return [g for c in children for g in tables(c)]


def _cell_text(v) -> str:
    return v if isinstance(v, str) else json.dumps(v)


async def _check_summary(page: Page, base: str, run, exp: dict, report: Report, shot: str | None,
                         timeout: float, expand: bool = True) -> None:
    url = f"{base}/#/experiments/{run.info.experiment_id}/runs/{run.info.run_id}"
    report.url = url
    await page.viewport(1600, 1000)
    await page.goto(url)
    if not await page.wait_for("!!window.__fw.descriptionBox() && document.querySelectorAll('h4').length > 2",
                               timeout):
        report.problems.append(f"run page {url} did not render a Description section within {timeout:.0f} s")
        if shot:
            report.screenshots.append(await page.screenshot(shot))
        return
    await page.settle()
    await page.call("closeAssistant")  # the MLflow Assistant side panel takes a third of the width
    if expand and await page.call("click", '[data-testid="show-comment-toggle"]'):  # a long one starts collapsed
        report.checked.append('clicked "Show more" on the description')
    await page.settle()
    for text in exp["texts"]:
        why = await page.until_visible("visibleText", text, "description")
        (report.checked if why == "visible" else report.problems).append(f"summary: {text!r} {why}")
    for label, a, b in exp["pairs"]:
        why = await page.until_visible("pairCheck", a, b)
        (report.checked if why == "visible" else report.problems).append(f"summary: {label} ({a} … {b}) {why}")
    for model, reason in exp["decisions"]:
        why = await page.until_visible("decisionCheck", model, reason)
        (report.checked if why == "visible" else report.problems).append(
            f"summary: decision {model}: {reason!r} {why}")
    for kind, names in exp["tables"].items():
        why = await page.until_visible("rowsCheck", names)
        (report.checked if why == "visible" else report.problems).append(
            f"summary: {kind} table ({len(names)} {kind}s) {why}")
    n, bad = await page.call("blocksCheck")
    if n and not bad:
        report.checked.append(f"summary: all {n} blocks of the description visible")
    for text, why in bad[:8]:
        report.problems.append(f"summary: block {text!r} {why}")
    if len(bad) > 8:
        report.problems.append(f"summary: and {len(bad) - 8} more blocks of the description not visible")
    if shot:
        await page.call("scrollTop")
        extra = await page.call("overflow")
        await page.viewport(1600, min(6000, 1000 + int(extra)))
        await asyncio.sleep(0.5)
        await page.call("scrollTop")
        box, pane = await page.call("rectOf", "description"), await page.call("contentRect")
        clip = None
        if box and pane:
            x = max(0, pane["x"] - 16)
            clip = {"x": x, "y": 0, "width": pane["width"] + pane["x"] - x, "height": box["y"] + box["height"] + 24}
        report.screenshots.append(await page.screenshot(shot, clip))


async def _check_gallery(page: Page, base: str, client, run, run_id: str, path: str, report: Report,
                         shot: str | None, timeout: float) -> None:
    table = _load_json(client, run_id, path)
    columns, rows = table["columns"], table["data"]
    url = f"{base}/#/experiments/{run.info.experiment_id}/runs/{run_id}/artifactPath/{path}"
    where = "" if run_id == run.info.run_id else f" (stage run {run_id})"
    report.galleries.append(url)
    await page.viewport(2000, 1150)
    await page.goto(url)
    if not await page.wait_for("window.__fw.tableReady()", timeout):
        report.problems.append(f"gallery {path}{where}: no table rendered at {url} within {timeout:.0f} s")
        if shot:
            report.screenshots.append(await page.screenshot(shot))
        return
    await page.settle()
    await page.call("closeAssistant")
    await page.call("click", 'button[aria-label="Toggle sidebar"]')  # more room for the gallery's columns
    await page.settle()
    for c in columns:
        why = await page.until_visible("columnCheck", c)
        (report.checked if why == "visible" else report.problems).append(f"gallery {path}: column {c!r} {why}")
    first = dict(zip(columns, rows[0])) if rows else {}
    for c in ("chosen_analysis", "rejected_analysis", "chosen_text", "prompt"):
        v = first.get(c)
        if isinstance(v, str) and v.strip():
            needle = " ".join(v.split())[:60]
            why = await page.until_visible("cellCheck", needle)
            (report.checked if why == "visible" else report.problems).append(
                f"gallery {path}: first row's {c} {needle!r} {why}")
    images = [c for i, c in enumerate(columns)
              if any(isinstance(r[i], dict) and r[i].get("type") == "image" for r in rows)]
    if not images:
        report.problems.append(f"gallery {path}{where}: no images — columns "
                               f"{[c for c in columns if c.endswith('_image')] or 'none'} hold none")
    for c in images:
        why = "not checked"
        for _ in range(int(timeout * 2)):  # images load after the table
            why = await page.call("imageCheck", c)
            if why == "visible" or "no column" in why:
                break
            await asyncio.sleep(0.5)
        (report.checked if why == "visible" else report.problems).append(f"gallery {path}: image column {c!r} {why}")
    # a cell shows one ellipsised line; a person clicks it to read the whole analysis in the preview panel
    v = first.get("chosen_analysis")
    if isinstance(v, str) and v.strip():
        full = " ".join(v.split())
        why = "its cell was not found"
        if await page.call("clickCell", full[:60]):
            for _ in range(int(timeout)):
                await asyncio.sleep(0.5)
                why = await page.call("previewCheck", full)
                if why == "visible":
                    break
        (report.checked if why == "visible" else report.problems).append(
            f"gallery {path}: the full chosen_analysis {full[:60]!r} {why}"
            + (" after clicking its cell" if why == "visible" else ""))
    if shot:
        await page.call("scrollTop")
        report.screenshots.append(await page.screenshot(shot, await page.call("galleryRect")))


async def _run_checks(port: int, base: str, client, run, exp: dict, galleries, report: Report,
                      out: Path | None, prefix: str, timeout: float, expand: bool) -> None:
    import aiohttp

    async with aiohttp.ClientSession() as session:
        page = await _open_page(session, port)
        try:
            await _check_summary(page, base, run, exp, report, str(out / f"{prefix}-summary.png") if out else None,
                                 timeout, expand)
            for i, (rid, path) in enumerate(galleries):
                name = "gallery" if len(galleries) == 1 else f"gallery-{Path(path).stem}"
                await _check_gallery(page, base, client, run, rid, path, report,
                                     str(out / f"{prefix}-{name}.png") if out else None, timeout)
        finally:
            try:
                await page.send("Browser.close")
            except Exception:  # noqa: BLE001 — the browser is stopped by its process group anyway
                pass
            await page.ws.close()


def check(tracking_uri: str, run_id: str | None = None, *, artifact_root: str | None = None,
          experiment: str | None = None, out: str | os.PathLike | None = None, prefix: str = "mlflow-iteration",
          chromium_path: str | None = None, server_url: str | None = None, timeout: float = 60.0,
          server_timeout: float = 180.0, expand: bool = True) -> Report:
    """Run the whole check; returns the report, raises UICheckFailed listing what is not visible, SetupError
    when it cannot run. `server_url`: use a running MLflow server over the same store instead of starting one;
    `expand=False`: do not click the description's "Show more" (what a person sees before clicking)."""
    binary = find_chromium(chromium_path)
    client = _store(tracking_uri)
    run = find_run(client, run_id, experiment)
    exp = expected_summary(run, _summary(client, run))
    galleries = find_galleries(client, run)
    report = Report(run.info.run_id, run.info.experiment_id)
    if not galleries:
        report.problems.append(f"no gallery table (gallery/*.json logged with mlflow.log_table) on run "
                               f"{run.info.run_id} or its stage runs")
    out_dir = Path(out) if out else None

    def go(base: str) -> None:
        t0 = time.monotonic()
        with chromium(binary) as port:
            asyncio.run(_run_checks(port, base, client, run, exp, galleries, report, out_dir, prefix, timeout,
                                    expand))
        report.seconds["browser"] = time.monotonic() - t0

    if server_url:
        go(server_url.rstrip("/"))
    else:
        t0 = time.monotonic()
        with mlflow_server(tracking_uri, artifact_root, timeout=server_timeout) as base:
            report.seconds["server start"] = time.monotonic() - t0
            go(base)
    if report.problems:
        raise UICheckFailed(report.problems, report)
    return report


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workdir", help="a flywheel run.workdir: sqlite:///<workdir>/mlflow.db, <workdir>/mlartifacts")
    ap.add_argument("--tracking-uri", help="the backend store, e.g. sqlite:////abs/path/mlflow.db")
    ap.add_argument("--artifact-root", help="the store's artifact root (default: <workdir>/mlartifacts)")
    ap.add_argument("--run-id", default="latest", help="the iteration's parent run (default: the latest one)")
    ap.add_argument("--experiment", help="where to look for the latest iteration (default: every experiment)")
    ap.add_argument("--out", default=None, help="directory for the screenshots (default: none taken)")
    ap.add_argument("--prefix", default="mlflow-iteration", help="screenshot file names: <prefix>-summary.png, ...")
    ap.add_argument("--chromium", help="the Chromium binary (default: $CHROMIUM, else chromium on the PATH)")
    ap.add_argument("--server-url", help="use this running MLflow server instead of starting one")
    ap.add_argument("--timeout", type=float, default=60.0, help="seconds to wait for each page to render")
    a = ap.parse_args(argv)
    if not (a.tracking_uri or a.workdir):
        ap.error("give --workdir or --tracking-uri")
    tracking_uri = a.tracking_uri or f"sqlite:///{Path(a.workdir).resolve()}/mlflow.db"
    artifact_root = a.artifact_root or (str(Path(a.workdir).resolve() / "mlartifacts") if a.workdir else None)
    try:
        report = check(tracking_uri, a.run_id, artifact_root=artifact_root, experiment=a.experiment, out=a.out,
                       prefix=a.prefix, chromium_path=a.chromium, server_url=a.server_url, timeout=a.timeout)
    except SetupError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except UICheckFailed as e:
        _print(e.report)
        print(str(e), file=sys.stderr)
        return 1
    _print(report)
    print("OK: the summary and the galleries are visible")
    return 0


def _print(r: Report) -> None:
    print(f"run {r.run_id} (experiment {r.experiment_id}): {r.url}")
    for g in r.galleries:
        print(f"  gallery: {g}")
    for c in r.checked:
        print(f"  ok   {c}")
    for p in r.problems:
        print(f"  FAIL {p}")
    for s in r.screenshots:
        print(f"  screenshot: {s} ({os.path.getsize(s) // 1024} KB)")
    if r.seconds:
        print("  seconds: " + ", ".join(f"{k} {v:.0f}" for k, v in r.seconds.items()))


if __name__ == "__main__":
    sys.exit(main())
