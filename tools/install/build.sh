# Sourced by tools/install.sh: system packages (apt-get, as root) and the builds from source
# (the compiler check; mmcv's ops, built once and cached as a wheel). Uses PYTHON, PIP, LOG_DIR,
# py and say from install.sh.

is_root() { [ "$(id -u)" = 0 ]; }

apt_install() {  # apt_install PACKAGE...: Debian/Ubuntu, as root; `apt-get update` once per run
  if [ ! -e "$LOG_DIR/apt-updated" ]; then apt-get update && touch "$LOG_DIR/apt-updated"; fi
  DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "$@"
}

need_compiler() {  # need_compiler WHAT: a C/C++ compiler and Python's headers, to build WHAT
  local missing=() headers
  { command -v cc && command -v c++; } >/dev/null || missing+=(g++)
  if ! py 'import os, sysconfig
assert os.path.isfile(os.path.join(sysconfig.get_paths()["include"], "Python.h"))' 2>/dev/null; then
    # Debian/Ubuntu's own Python (base prefix /usr) ships them as python3.X-dev
    headers=$(py 'import sys; print("python%d.%d-dev" % sys.version_info[:2] if sys.base_prefix == "/usr" else "")')
    missing+=("${headers:-Python headers (Python.h) for $PYTHON}")
  fi
  [ ${#missing[@]} = 0 ] && return 0
  if is_root && command -v apt-get >/dev/null && [[ "${missing[*]}" != *Python.h* ]]; then
    say "building $1 needs ${missing[*]}: installing with apt-get"
    apt_install "${missing[@]}"
    return
  fi
  echo "[install] building $1 needs a C/C++ compiler and Python's headers; missing: ${missing[*]}." >&2
  if command -v apt-get >/dev/null && [[ "${missing[*]}" != *Python.h* ]]; then
    echo "[install] Run:  sudo apt-get install ${missing[*]}  and then the command again." >&2
  else
    echo "[install] Install them with your system's package manager, then run the command again." >&2
  fi
  return 1
}

build_mmcv() {  # build_mmcv FORCE_CUDA OUT_DIR
  local src
  need_compiler "mmcv's ops"
  src=$(mktemp -d "${TMPDIR:-/tmp}/mmcv_src.XXXXXX")
  say "building mmcv 2.1.0 from source ($([ "$1" = 1 ] && echo CUDA || echo CPU) ops):" \
      "about 10-15 min on 2 cores, once; the wheel is cached in $2"
  "${PIP[@]}" download --no-deps --no-binary mmcv --no-build-isolation -d "$src" mmcv==2.1.0
  tar -xzf "$src"/mmcv-2.1.0.tar.gz -C "$src"
  local inc
  inc=$(py 'import os, torch; print(os.path.join(os.path.dirname(torch.__file__), "include"))')
  if grep -rqs "C++20 or later compatible compiler is required" "$inc/c10/macros" "$inc/ATen"; then
    say "torch $(py 'import torch; print(torch.__version__)') needs C++20: patching mmcv's -std=c++17"
    grep -q -- '-std=c++17' "$src/mmcv-2.1.0/setup.py"
    sed -i 's/-std=c++17/-std=c++20/g' "$src/mmcv-2.1.0/setup.py"
  fi
  mkdir -p "$2"
  local t_build=$SECONDS ticker rc=0
  ( while sleep 60; do
      say "... still compiling mmcv ($(( (SECONDS - t_build) / 60 )) min so far)"
    done ) &
  ticker=$!
  set +e
  MMCV_WITH_OPS=1 FORCE_CUDA="$1" MAX_JOBS="${MAX_JOBS:-$(nproc)}" \
    "${PIP[@]}" wheel --no-deps --no-build-isolation --no-cache-dir -w "$2" "$src/mmcv-2.1.0"
  rc=$?
  set -e
  kill "$ticker" 2>/dev/null || true
  rm -rf "$src"
  return $rc
}
