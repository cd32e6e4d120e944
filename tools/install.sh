#!/usr/bin/env bash
# Install the OpenMMLab stack mmddp_ext needs, and mmddp_ext itself.
#
#   bash tools/install.sh               # stack + mmddp_ext (editable)
#   bash tools/install.sh --with-tests  # ... plus the test requirements and, as root with
#                                       # apt-get, Slurm + munge for tests/slurm and OpenMPI
#                                       # for tests/mpi (else skipped)
#
# Where: into the Python that tools/py picks ($PYTHON, else the active virtual environment, else
# <repo>/.venv, else python, else python3), when pip may install into it. When it may not (no
# environment active and the Python on PATH is "externally managed" (PEP 668, Debian/Ubuntu's
# python3), has no pip, or is older than 3.8), the script creates the project's own virtual
# environment <repo>/.venv from it, says so, and installs there; tools/py uses it from then on.
#
# Steps (each announced; each skipped when already satisfied, so a second run takes seconds):
#   1. torch + matching torchvision, only when torch is missing (an installed torch is kept)
#   2. build tools (setuptools<82: mmengine 0.10.7 still imports pkg_resources)
#   3. runtime dependencies of the stack
#   4. mmengine 0.10.7
#   5. mmcv 2.1.0 with compiled ops, built from source once and cached outside the repository
#      (key: python + torch + CUDA version + ops kind). CPU ops unless a GPU is visible and nvcc
#      exists (mmcv's own rule); FORCE_CUDA=1 / FORCE_CUDA=0 override it.
#   6. xtcocotools built against the installed numpy
#   7. mmpose 1.3.2 and mmdet 3.3.0 without their declared deps (mmpose's chumpy does not build)
#   8. albumentations 1.4.24 for MMPose's Albumentation transform (RTMPose recipes), --no-deps
#      (requirements/albumentations.txt: its opencv-python-headless would shadow opencv-python)
#   9. mmddp_ext itself (pip install -e .)
#  10. one import of the whole stack, so a broken pairing fails here and not in training
#  11. with --with-tests: the test requirements; 12. slurm-wlm + munge for tests/slurm and
#  13. openmpi-bin for tests/mpi, when missing and root with apt-get (if that fails, the
#      install goes on: those tests skip)
# Missing system packages (python3-venv, a C++ compiler and Python headers for the builds,
# OpenCV's libraries) are installed with apt-get when running as root; otherwise the script
# stops and prints the command to run.
#
# Environment: PYTHON (see tools/py), MMDDP_EXT_CACHE (default: ~/.cache/mmddp_ext),
# TORCH_SPEC (default: "torch==2.14.1 torchvision==0.29.1").
# A failing step stops the script with the step's name and the tail of its output.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
CACHE=${MMDDP_EXT_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/mmddp_ext}
TORCH_SPEC=${TORCH_SPEC:-"torch==2.14.1 torchvision==0.29.1"}
WITH_TESTS=0
for arg in "$@"; do
  case "$arg" in
    --with-tests) WITH_TESTS=1 ;;
    -h|--help) sed -n '2,36p' "$0"; exit 0 ;;
    *) echo "install.sh: unknown argument '$arg' (expected --with-tests)" >&2; exit 2 ;;
  esac
done

LOG_DIR=$(mktemp -d "${TMPDIR:-/tmp}/mmddp_ext_install.XXXXXX")
TOTAL=$((10 + 3 * WITH_TESTS))
N=0
exec 3>&1  # step bodies print their decisions on fd 3; everything else goes to the step's log

say() { echo "    $*" >&3; }

step() {  # step NAME FUNCTION
  N=$((N + 1))
  local log="$LOG_DIR/$N.log" t0=$SECONDS
  echo "[install $N/$TOTAL] $1"
  # Not `if ! "$2"`: bash ignores `set -e` inside a function called as a condition.
  local rc
  set +e
  ( set -e; "$2" ) >"$log" 2>&1
  rc=$?
  set -e
  if [ "$rc" != 0 ]; then
    echo "[install] step $N/$TOTAL '$1' FAILED. Last 40 lines of its output:" >&2
    tail -n 40 "$log" >&2
    echo "[install] full log: $log" >&2
    exit 1
  fi
  echo "    done in $((SECONDS - t0)) s"
}

py() { "$PYTHON" -c "$@"; }

dist_version() {  # dist_version NAME -> installed version or nothing (fast: no import)
  py "import importlib.metadata as m
try: print(m.version('$1'))
except m.PackageNotFoundError: pass"
}

die() { echo "[install] $*" >&2; exit 1; }

# which Python to install into (choose_python; may create <repo>/.venv), and the system packages
# and source builds (apt_install, need_compiler, build_mmcv)
. "$ROOT/tools/install/python.sh"
. "$ROOT/tools/install/build.sh"

torch_step() {
  if [ -n "$(dist_version torch)" ]; then
    say "keeping installed torch $(dist_version torch)"
    if [ -z "$(dist_version torchvision)" ]; then
      # torchvision 0.(m+15) pairs with torch 2.m
      local tv
      tv=$(py 'import torch; m = int(torch.__version__.split(".")[1]); print(f"0.{m + 15}.*")')
      say "torchvision missing: installing torchvision==$tv for it"
      "${PIP[@]}" install "torchvision==$tv" "torch==$(py 'import torch; print(torch.__version__.split("+")[0])')"
    fi
  else
    say "no torch: installing $TORCH_SPEC (a few minutes)"
    # shellcheck disable=SC2086
    "${PIP[@]}" install $TORCH_SPEC
  fi
}

satisfied() {  # satisfied REQUIREMENT_FILE...: every line installed at an allowed version
  "$PYTHON" "$ROOT/tools/install/satisfied.py" "$@"
}

pip_requirements() {  # pip_requirements FILE...: pip install -r each, unless already satisfied
  if satisfied "$@"; then
    say "already satisfied: ${*#"$ROOT/"}"
    return
  fi
  local args=() f
  for f in "$@"; do args+=(-r "$f"); done
  "${PIP[@]}" install "${args[@]}"
}

build_tools_step() { pip_requirements "$ROOT/requirements/build.txt"; }

stack_deps_step() {
  pip_requirements "$ROOT/requirements/stack.txt" "$ROOT/requirements/runtime.txt"
  if ! py 'import cv2' 2>/dev/null && command -v apt-get >/dev/null; then
    if ! is_root; then
      echo "[install] OpenCV cannot load its system libraries. Run:  sudo apt-get install" \
           "libgl1 libglib2.0-0  and then the command again." >&2
      return 1
    fi
    say "OpenCV cannot load its system libraries: installing libgl1 libglib2.0-0"
    apt_install libgl1 libglib2.0-0
  fi
  py 'import cv2'
}

mmengine_step() {
  if [ "$(dist_version mmengine)" = 0.10.7 ]; then say "mmengine 0.10.7 already installed"; return; fi
  "${PIP[@]}" install mmengine==0.10.7
}

mmcv_ok() {
  py 'import mmcv, mmcv._ext; assert mmcv.__version__ == "2.1.0", mmcv.__version__' 2>/dev/null
}

mmcv_step() {
  if mmcv_ok; then say "mmcv 2.1.0 with compiled ops already installed"; return; fi
  local force_cuda=${FORCE_CUDA:-}
  if [ -z "$force_cuda" ]; then
    force_cuda=0
    if py 'import torch; assert torch.cuda.is_available()' 2>/dev/null; then
      if command -v nvcc >/dev/null; then
        force_cuda=1
      else
        say "a GPU is visible but nvcc is not on PATH: mmcv's ops are built for the CPU only," \
          "so MMDetection's ops on CUDA tensors (sigmoid_focal_loss, nms, roi_align) fail in the" \
          "first iteration (MMPose's top-down recipes need none). For GPU ops: put the CUDA" \
          "toolkit $(py 'import torch; print(torch.version.cuda)') on PATH (nvcc)," \
          "pip uninstall -y mmcv, and run this again"
      fi
    fi
  fi
  local key dir wheel
  key=$(py "import sys, torch; print(f'py{sys.version_info[0]}{sys.version_info[1]}-torch{torch.__version__}-cuda{torch.version.cuda}')")
  key="$key-$([ "$force_cuda" = 1 ] && echo cudaops || echo cpuops)"
  dir="$CACHE/mmcv-2.1.0/$key"
  wheel=$(ls "$dir"/mmcv-2.1.0-*.whl 2>/dev/null | head -n 1 || true)
  if [ -z "$wheel" ]; then
    build_mmcv "$force_cuda" "$dir"
    wheel=$(ls "$dir"/mmcv-2.1.0-*.whl | head -n 1)
  else
    say "using cached wheel $wheel"
  fi
  "${PIP[@]}" install --no-deps --force-reinstall "$wheel"
  py 'import mmcv, mmcv._ext; from mmcv.ops import nms; print("mmcv", mmcv.__version__, "ops ok")'
}

xtcocotools_step() {
  if py 'import xtcocotools.coco, xtcocotools._mask' 2>/dev/null; then
    say "xtcocotools already works with numpy $(py 'import numpy; print(numpy.__version__)')"
    return
  fi
  need_compiler xtcocotools
  "${PIP[@]}" uninstall -y xtcocotools || true
  "${PIP[@]}" install --no-deps --no-build-isolation --no-binary xtcocotools --no-cache-dir \
    xtcocotools==1.14.3
  py 'import xtcocotools.coco, xtcocotools._mask'
}

openmmlab_step() {
  if [ "$(dist_version mmpose)" = 1.3.2 ] && [ "$(dist_version mmdet)" = 3.3.0 ]; then
    say "mmpose 1.3.2 and mmdet 3.3.0 already installed"
    return
  fi
  "${PIP[@]}" install --no-deps mmpose==1.3.2 mmdet==3.3.0
}

# The RTMPose recipes' CoarseDropout(max_holes=1, max_height=0.4, ..., min_width=0.2) must be
# honoured (2.x ignores those arguments). NO_ALBUMENTATIONS_UPDATE: no version check at import.
albumentations_ok() {
  local want
  want=$(sed -n 's/^albumentations==\([0-9.]*\).*/\1/p' "$ROOT/requirements/albumentations.txt")
  NO_ALBUMENTATIONS_UPDATE=1 py "import warnings; warnings.simplefilter('ignore')
import albumentations as A, cv2, numpy as np
from mmpose.datasets.transforms.common_transforms import Albumentation
assert A.__version__ == '$want', (A.__version__, '$want')
t = Albumentation([dict(type='MedianBlur', p=0.1), dict(type='CoarseDropout', max_holes=1,
    max_height=0.4, max_width=0.4, min_holes=1, min_height=0.2, min_width=0.2, p=1.0)])
d = t.aug.transforms[1]
got = (d.num_holes_range, d.hole_height_range, d.hole_width_range)
assert got == ((1, 1), (0.2, 0.4), (0.2, 0.4)), got
assert (t.transform(dict(img=np.full((64, 48, 3), 255, np.uint8)))['img'] == 0).any()
print('albumentations', A.__version__, 'with cv2', cv2.__version__)"
}

albumentations_step() {
  local msg
  if msg=$(albumentations_ok 2>/dev/null); then say "$msg: already installed"; return; fi
  "${PIP[@]}" install --no-deps -r "$ROOT/requirements/albumentations.txt"
  msg=$(albumentations_ok)
  say "$msg"
}

self_step() {
  # The import leaves out the working directory: run from the checkout, it finds the checkout
  # itself, and an install pointing at another (or a deleted) clone would pass for this one.
  if [ -e "$ROOT/mmddp_ext/.mim/configs" ] && [ -n "$(dist_version mmddp_ext)" ] && py "
import os, sys
sys.path[:] = [p for p in sys.path if p not in ('', os.getcwd())]
import mmddp_ext
assert os.path.samefile(os.path.dirname(mmddp_ext.__file__), '$ROOT/mmddp_ext')" 2>/dev/null
  then
    say "mmddp_ext already installed from $ROOT"
    return
  fi
  "${PIP[@]}" install --no-deps --no-build-isolation -e "$ROOT"
}

verify_step() {  # one import of everything: catches a broken torch/torchvision/mmcv pairing
  NO_ALBUMENTATIONS_UPDATE=1 \
  py 'import torch, torchvision.ops, mmcv._ext, mmengine, xtcocotools.coco
import albumentations, mmpose.models, mmdet.models, mmddp_ext
print("torch", torch.__version__, "torchvision", torchvision.__version__, "mmcv", mmcv.__version__,
      "mmpose", mmpose.__version__, "mmdet", mmdet.__version__, "mmddp_ext", mmddp_ext.__version__)' >&3
}

tests_step() { pip_requirements "$ROOT/requirements/tests.txt"; }

apt_or_warn() {  # apt_or_warn TESTS PACKAGE...: apt_install, or a warning that says why not
  local out
  if out=$(apt_install "${@:2}" 2>&1); then echo "$out"; return 0; fi
  echo "$out"
  { echo "    WARNING: apt-get could not install ${*:2}, so $1 will SKIP and .ci/run will fail."
    echo "    apt-get said (last lines; the step's whole log is in $LOG_DIR):"
    echo "$out" | tail -n 5 | sed 's/^/      | /'; } >&3
  return 1
}

slurm_step() {  # tests/slurm start a local Slurm cluster; without one they are skipped
  if command -v slurmctld >/dev/null && command -v slurmd >/dev/null && command -v munged >/dev/null; then
    say "$(slurmctld -V) and munge already installed"
  elif ! is_root || ! command -v apt-get >/dev/null; then
    say "no Slurm here: tests/slurm will be skipped (Debian/Ubuntu: apt-get install slurm-wlm munge)"
  else
    if apt_or_warn "tests/slurm" slurm-wlm munge; then say "installed $(slurmctld -V) and munge"; fi
  fi
}

mpi_step() {  # tests/mpi start two ranks with OpenMPI's mpirun; without it they are skipped
  if command -v mpirun >/dev/null; then
    say "$(mpirun --version 2>/dev/null | head -1) already installed"
  elif ! is_root || ! command -v apt-get >/dev/null; then
    say "no mpirun here: tests/mpi will be skipped (Debian/Ubuntu: apt-get install openmpi-bin)"
  else
    if apt_or_warn "tests/mpi" openmpi-bin; then
      say "installed $(mpirun --version 2>/dev/null | head -1)"
    fi
  fi
}

t_all=$SECONDS
choose_python
PIP=("$PYTHON" -m pip --disable-pip-version-check)
echo "[install] python: $(command -v "$PYTHON") ($("$PYTHON" --version 2>&1)); logs in $LOG_DIR"
step "torch + torchvision" torch_step
step "build tools (setuptools<82, wheel, ninja, cython)" build_tools_step
step "runtime dependencies of the stack" stack_deps_step
step "mmengine 0.10.7" mmengine_step
step "mmcv 2.1.0 with compiled ops" mmcv_step
step "xtcocotools (against the installed numpy)" xtcocotools_step
step "mmpose 1.3.2 + mmdet 3.3.0 (--no-deps)" openmmlab_step
step "albumentations 1.4.24 (--no-deps)" albumentations_step
step "mmddp_ext (editable)" self_step
step "check that the stack imports" verify_step
[ "$WITH_TESTS" = 1 ] && step "test requirements" tests_step
[ "$WITH_TESTS" = 1 ] && step "Slurm + munge for tests/slurm (optional)" slurm_step
[ "$WITH_TESTS" = 1 ] && step "OpenMPI for tests/mpi (optional)" mpi_step
echo "[install] all done in $((SECONDS - t_all)) s"
