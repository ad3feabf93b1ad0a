#!/usr/bin/env bash
# Debian's chromium for the MLflow UI check (scripts/check_mlflow_ui.py, tests/test_mlflow_ui.py), which opens an
# iteration's summary and galleries as a person would. A no-op where a Chromium is on PATH. Exits 0 when one is
# there afterwards, 1 (saying why) when not: installing needs apt-get and root (or password-less sudo).
set -uo pipefail
found() {  # the names scripts/check_mlflow_ui.py looks for (CHROMIUM_NAMES)
  for b in chromium chromium-browser google-chrome google-chrome-stable; do
    if command -v "$b" >/dev/null; then echo "chromium: $(command -v "$b")"; return 0; fi
  done
  return 1
}
found && exit 0
if ! command -v apt-get >/dev/null; then
  echo "install_chromium: no apt-get on this machine; install Chromium yourself, or pass --chromium" >&2; exit 1
fi
sudo=()
if [ "$(id -u)" != 0 ]; then
  if sudo -n true 2>/dev/null; then sudo=(sudo -n); else
    echo "install_chromium: apt-get needs root, and sudo asks for a password" >&2; exit 1
  fi
fi
echo "install_chromium: apt-get install chromium (about a minute)"
if ! { "${sudo[@]}" apt-get update -qq && DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq chromium \
       >/dev/null; }; then
  echo "install_chromium: apt-get install chromium failed (is Debian's package registry reachable?)" >&2; exit 1
fi
found || { echo "install_chromium: installed, but no chromium on PATH" >&2; exit 1; }
