#!/usr/bin/env bash
# Runs anemone's whole test suite on a fresh machine: makes .venv with the Python tools the tests
# use (coremltools for tools/validate_mlpackage.py; no PyTorch), fetches the real models, then runs
# every test of the workspace, reporting every failure (--no-fail-fast).
#
# Environment: ANEMONE_PYTHON (a python with coremltools, instead of .venv), ANEMONE_MODELS
# (default models/), extra arguments go to `cargo test`.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ -z "${ANEMONE_PYTHON:-}" ]; then
  if [ ! -x .venv/bin/python ]; then
    echo "test.sh: making .venv (Python tools for the tests)"
    python3 -m venv .venv
  fi
  if ! .venv/bin/python -c 'import coremltools' >/dev/null 2>&1; then
    echo "test.sh: installing coremltools into .venv (package validator)"
    .venv/bin/python -m pip install --quiet coremltools "numpy<2.4"
  fi
  if ! .venv/bin/python -c 'import openai' >/dev/null 2>&1; then
    echo "test.sh: installing openai into .venv (client of the anemone serve tests)"
    .venv/bin/python -m pip install --quiet openai
  fi
  export ANEMONE_PYTHON="$PWD/.venv/bin/python"
fi
scripts/fetch-models.sh models
export ANEMONE_MODELS="${ANEMONE_MODELS:-$PWD/models}"

cargo test --workspace --all-targets --no-fail-fast "$@"
