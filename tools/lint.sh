#!/usr/bin/env bash
# Lint as OpenMMLab projects do: flake8, isort and yapf, with the settings in setup.cfg.
#
#   bash tools/lint.sh         # check only; exits non-zero and shows the diff on a finding
#   bash tools/lint.sh --fix   # sort the imports and format the code in place, then check
#
# CI runs the check before the tests (README's test command). `pre-commit install` runs the same
# three tools on every commit (.pre-commit-config.yaml).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PY=tools/py
PATHS=(mmddp_ext mmddp_launch tools tests bench configs setup.py)
case "${1:-}" in
  --fix) "$PY" -m isort "${PATHS[@]}" && "$PY" -m yapf -r -i -p "${PATHS[@]}" ;;
  '') ;;
  *) echo "lint.sh: unknown argument '$1' (expected --fix or nothing)" >&2; exit 2 ;;
esac
# the project's own folders only: a virtual environment in the checkout (venv/, .venv/, any
# name) is not ours to lint
"$PY" -m flake8 "${PATHS[@]}"
"$PY" -m isort --check-only --diff "${PATHS[@]}"
if ! "$PY" -m yapf -r -d -p "${PATHS[@]}"; then  # -p: one process per core
  echo "lint.sh: the code above is not formatted as setup.cfg's [yapf] asks:" \
       "run 'bash tools/lint.sh --fix'" >&2
  exit 1
fi
