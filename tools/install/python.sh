# Sourced by tools/install.sh: which Python to install into. tools/py holds the rule; here we
# only check that pip may install into what it picks and, when it may not, create <repo>/.venv
# (which tools/py picks from then on). Uses ROOT, LOG_DIR, die and say from install.sh, is_root
# and apt_install from build.sh.
VENV="$ROOT/.venv"
USER_PYTHON=${PYTHON:-}

probe() {  # probe INTERPRETER: executable, version, in a venv, has pip, externally managed, scripts dir
  "$1" -c '
import os, sys, sysconfig
venv = sys.prefix != getattr(sys, "base_prefix", getattr(sys, "real_prefix", sys.prefix))
try:
    import pip
    has_pip = 1
except Exception:
    has_pip = 0
marker = os.path.join(sysconfig.get_path("stdlib"), "EXTERNALLY-MANAGED")
brk = os.environ.get("PIP_BREAK_SYSTEM_PACKAGES", "").lower() in ("1", "true", "yes", "on")
managed = int(not venv and not brk and os.path.isfile(marker))
for line in (sys.executable, "%d.%d.%d" % tuple(sys.version_info[:3]), int(venv), has_pip,
             managed, sysconfig.get_path("scripts")):
    print(line)' 2>/dev/null
}

new_enough() {  # new_enough VERSION: 3.8 or newer (setup.py's python_requires)
  local major=${1%%.*} rest=${1#*.}
  [ "$major" -gt 3 ] || { [ "$major" = 3 ] && [ "${rest%%.*}" -ge 8 ]; }
}

make_venv() {  # make_venv BASE_PYTHON MAJOR.MINOR: create $VENV from BASE_PYTHON, with pip
  local log="$LOG_DIR/venv.log" pkg="python$2-venv"
  if ! "$1" -m venv "$VENV" >"$log" 2>&1; then
    rm -rf "$VENV"
    if ! grep -qiE 'ensurepip|No module named venv' "$log"; then
      tail -n 20 "$log" >&2
      die "could not create $VENV with $1 -m venv (output above, full log: $log)."
    fi
    if ! command -v apt-get >/dev/null; then
      die "$1 lacks the venv module or its pip bootstrap (ensurepip). Install them with your" \
        "system's package manager, or set PYTHON to a virtual environment's python; then run" \
        "the command again."
    elif ! is_root; then
      die "$1 lacks the venv module or its pip bootstrap (ensurepip), which Debian/Ubuntu ship" \
        "separately. Run:  sudo apt-get install $pkg  and then the command again."
    fi
    echo "[install] $1 lacks the venv module's pip bootstrap (ensurepip): installing $pkg with apt-get"
    { apt_install "$pkg" || apt_install python3-venv; } >>"$log" 2>&1 || {
      tail -n 20 "$log" >&2; die "apt-get could not install $pkg (output above, full log: $log)."; }
    if ! "$1" -m venv "$VENV" >>"$log" 2>&1; then
      rm -rf "$VENV"; tail -n 20 "$log" >&2
      die "could not create $VENV with $1 -m venv (output above, full log: $log)."
    fi
  fi
  printf '# made by tools/install.sh: keep the environment out of git\n*\n' >"$VENV/.gitignore"
  "$VENV/bin/python" -m pip install --disable-pip-version-check --upgrade pip >>"$log" 2>&1 ||
    echo "[install] (could not upgrade pip in $VENV; continuing with $("$VENV/bin/python" -m pip --version))"
}

choose_python() {  # sets PYTHON to the interpreter to install into; may create $VENV
  local found info exe ver venv has_pip managed scripts reason desc
  found=$(bash "$ROOT/tools/py" --which) || exit 1  # tools/py said why
  info=$(probe "$found") || die "'$found' (chosen by tools/py) does not run as Python. Fix or unset" \
    "PYTHON, or put a working python3 on PATH."
  { read -r exe; read -r ver; read -r venv; read -r has_pip; read -r managed; read -r scripts; } <<<"$info"
  desc=$found; [ "$exe" = "$found" ] || desc="$found ($exe)"
  if [ "$venv" = 1 ]; then  # an active or the project's environment: install into it, as always
    if [ "$has_pip" != 1 ]; then
      echo "[install] the environment of $exe has no pip: adding it (python -m ensurepip)"
      "$exe" -m ensurepip --upgrade >"$LOG_DIR/ensurepip.log" 2>&1 || die "$exe has no pip and" \
        "ensurepip failed (log: $LOG_DIR/ensurepip.log). Install pip into that environment."
    fi
    PYTHON=$found
    export PATH="$scripts:$PATH"  # its console scripts (ninja for the mmcv build) as if activated
    return
  fi
  if ! new_enough "$ver"; then
    reason="it is Python $ver (mmddp_ext needs 3.8 or newer)"
  elif [ "$managed" = 1 ]; then
    reason="it is \"externally managed\" (PEP 668): the system's package manager owns it"
  elif [ "$has_pip" != 1 ]; then
    reason="it has no pip"
  else
    PYTHON=$found  # installable: today's behaviour, unchanged
    return
  fi
  if [ -n "$USER_PYTHON" ]; then
    die "PYTHON=$desc cannot be installed into: $reason. Unset PYTHON to let" \
      "this script create the project's virtual environment $VENV, or point PYTHON at a" \
      "virtual environment's python."
  fi
  echo "[install] $desc, Python $ver, cannot be installed into: $reason."
  local base=$found
  if ! new_enough "$ver"; then  # e.g. `python` is Python 2.7: make the environment from python3
    base=$(command -v python3 || true)
    [ -n "$base" ] && ver=$("$base" -c 'import sys; print("%d.%d.%d" % sys.version_info[:3])')
    if [ -z "$base" ] || ! new_enough "$ver"; then
      die "no Python 3.8 or newer found. Install python3 (Debian/Ubuntu: apt-get install" \
        "python3 python3-venv) or set PYTHON to one, then run the command again."
    fi
  fi
  [ -e "$VENV" ] && die "$VENV exists but has no working bin/python (made by another Python?):" \
    "remove it (rm -rf $VENV) and run the command again."
  echo "[install] Creating the project's own virtual environment $VENV (from $base, Python $ver)"
  echo "          and installing there (about 6 GB with torch's CUDA libraries). tools/py, and so"
  echo "          every command in the README, uses it from now on; rm -rf $VENV removes it."
  make_venv "$base" "${ver%.*}"
  PYTHON=$VENV/bin/python
  export VIRTUAL_ENV="$VENV" PATH="$VENV/bin:$PATH"
}
