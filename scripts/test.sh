#!/usr/bin/env bash
# Runs anemone's whole test suite on a fresh machine: installs what the tests need (coremltools for
# the package validator), fetches the real models, then runs every test of the workspace.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! python3 -c 'import coremltools' >/dev/null 2>&1; then
  echo "test.sh: installing coremltools (package validator)"
  python3 -m pip install --quiet coremltools "numpy<2.4"
fi
scripts/fetch-models.sh models

if [ -z "${ANEMONE_VALIDATOR:-}" ]; then
  for candidate in ../shared/tools/validate_mlpackage.py shared/tools/validate_mlpackage.py; do
    if [ -f "$candidate" ]; then export ANEMONE_VALIDATOR="$(cd "$(dirname "$candidate")" && pwd)/$(basename "$candidate")"; break; fi
  done
fi
export ANEMONE_MODELS="${ANEMONE_MODELS:-$PWD/models}"

cargo test --workspace --all-targets "$@"
