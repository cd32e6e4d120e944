#!/usr/bin/env bash
# The GPU acceptance check (bench/gpu_check.py): exits 0 when every check passes, 1 when one
# fails, 2 on a machine without a GPU.
set -uo pipefail
cd "$(dirname "$0")/.."
exec tools/py bench/gpu_check.py "$@"
