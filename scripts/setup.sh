#!/usr/bin/env bash
# Creates .venv and installs the project into it. Idempotent: a second run with nothing changed takes seconds.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=${FLYWHEEL_VENV:-.venv}
# constraints/cpu-lock.txt pins every other package at the versions the suites passed with (`make lock`). To move a
# dependency, delete its lines there (pip resolves what is not pinned), pass the suites, then `make lock`.
LOCK=constraints/cpu-lock.txt
stamp="$VENV/.installed-$(cat pyproject.toml constraints/cpu.txt "$LOCK" | sha256sum | cut -c1-16)"
if [ -f "$stamp" ]; then exit 0; fi
echo "[setup] creating $VENV and installing flywheel (a few minutes the first time)" >&2
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
pip() { "$VENV/bin/python" -m pip "$@" 2> >(grep -v "is ignored: it is neither" >&2); }
pip install -q --upgrade pip
# The CPU torch first, on its own: a bare 'torch' requirement would otherwise resolve to a multi-GB CUDA wheel.
# These machines hold its CPU build on disk, which pip takes; elsewhere set TORCH_INDEX_URL to PyTorch's CPU index.
pip install -q "torch==2.13.0" ${TORCH_INDEX_URL:+--index-url "$TORCH_INDEX_URL"}
pip install -q -c constraints/cpu.txt -c "$LOCK" -e ".[test]"
"$VENV/bin/python" -c "import torch; assert not torch.version.cuda, ('a CUDA torch was installed (' + torch.__version__
  + '): remove $VENV and rerun with TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu')"
rm -f "$VENV"/.installed-*
touch "$stamp"
echo "[setup] done: $("$VENV/bin/python" -c 'import torch,ray,transformers,trl,diffusers,mlflow;print("torch",torch.__version__,"ray",ray.__version__,"transformers",transformers.__version__,"trl",trl.__version__,"diffusers",diffusers.__version__,"mlflow",mlflow.__version__)')" >&2
