#!/usr/bin/env bash
# Bootstrap the pypto development environment (idempotent, fast when already done).
#
#   - system packages (root only, via apt): graphviz (`dot`), python3-venv if needed, and
#     Debian's chromium + fonts-dejavu-core for the browser tests (tests/test_browser.py drives
#     /usr/bin/chromium through Playwright; `playwright install` is never run)
#   - .venv with pypto installed editable with the [notebook,dev] extras
#
# A stamp file (.venv/.pypto-installed) holds a hash of pyproject.toml, so the
# pip install is only redone when pyproject.toml changes.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

VENV="$ROOT/.venv"
STAMP="$VENV/.pypto-installed"
export DEBIAN_FRONTEND=noninteractive
export PIP_DISABLE_PIP_VERSION_CHECK=1

log() { printf '[bootstrap] %s\n' "$*"; }
die() { printf '[bootstrap] ERROR: %s\n' "$*" >&2; exit 1; }

is_root() { [ "$(id -u)" -eq 0 ]; }

APT_UPDATED=0
apt_install() {
    if [ "$APT_UPDATED" -eq 0 ]; then
        log "apt-get update"
        apt-get update -qq
        APT_UPDATED=1
    fi
    log "apt-get install -y $*"
    apt-get install -y -qq --no-install-recommends "$@" >/dev/null
}

# ---- pick the interpreter (prefer python3.11) --------------------------------
if [ -n "${PYTHON:-}" ]; then
    PY="$PYTHON"
elif command -v python3.11 >/dev/null 2>&1; then
    PY=python3.11
elif command -v python3 >/dev/null 2>&1; then
    PY=python3
else
    die "no python3 found; install Python >= 3.10 (Debian: apt-get install python3 python3-venv)"
fi
"$PY" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 10) else 1)' \
    || die "$PY is older than 3.10; pypto needs Python >= 3.10"
PYVER="$("$PY" -c 'import sys; print("%d.%d" % sys.version_info[:2])')"

# ---- system packages -----------------------------------------------------------
missing=()

if ! command -v dot >/dev/null 2>&1; then
    if is_root && command -v apt-get >/dev/null 2>&1; then
        apt_install graphviz
    else
        missing+=("graphviz (provides 'dot'; Debian: apt-get install graphviz)")
    fi
fi

# Browser tests (tests/test_browser.py): Debian's headless Chromium at /usr/bin/chromium and a
# font for readable screenshots.  Without them those tests are skipped, not failed.
browser_pkgs=()
[ -x /usr/bin/chromium ] || browser_pkgs+=(chromium)
[ -e /usr/share/fonts/truetype/dejavu/DejaVuSans.ttf ] || browser_pkgs+=(fonts-dejavu-core)
if [ "${#browser_pkgs[@]}" -gt 0 ]; then
    if is_root && command -v apt-get >/dev/null 2>&1; then
        apt_install "${browser_pkgs[@]}"
    else
        log "WARNING: missing ${browser_pkgs[*]} (Debian: apt-get install ${browser_pkgs[*]}); the browser tests will be skipped"
    fi
fi

venv_ok() { "$PY" -c 'import venv, ensurepip' >/dev/null 2>&1; }
install_venv_pkg() {
    # Debian splits venv/ensurepip out of the interpreter package.
    apt_install "python${PYVER}-venv" 2>/dev/null || apt_install python3-venv
}
if [ ! -x "$VENV/bin/python" ] && ! venv_ok; then
    if is_root && command -v apt-get >/dev/null 2>&1; then
        install_venv_pkg
    else
        missing+=("python${PYVER}-venv (Debian: apt-get install python3-venv)")
    fi
fi

if [ "${#missing[@]}" -gt 0 ]; then
    printf '[bootstrap] missing system packages (run as root, or install them yourself):\n' >&2
    for m in "${missing[@]}"; do printf '[bootstrap]   - %s\n' "$m" >&2; done
    venv_ok || [ -x "$VENV/bin/python" ] || die "cannot create a virtualenv without venv/ensurepip"
    log "WARNING: continuing without graphviz 'dot'; graph rendering will not work"
fi

# ---- virtualenv ----------------------------------------------------------------
if [ -e "$VENV" ] && ! "$VENV/bin/python" -c '' >/dev/null 2>&1; then
    log "existing .venv is broken; recreating"
    rm -rf "$VENV"
fi
if [ ! -d "$VENV" ]; then
    log "creating .venv with $PY ($PYVER)"
    if ! "$PY" -m venv "$VENV"; then
        rm -rf "$VENV"
        if is_root && command -v apt-get >/dev/null 2>&1; then
            install_venv_pkg
            "$PY" -m venv "$VENV" || die "'$PY -m venv' failed even after installing python3-venv"
        else
            die "'$PY -m venv' failed; install python3-venv (Debian: apt-get install python3-venv)"
        fi
    fi
fi

# ---- project install (only when pyproject.toml changed) ------------------------
want="$(sha256sum pyproject.toml | cut -d' ' -f1)"
have="$(cat "$STAMP" 2>/dev/null || true)"
# (a package of the extras that went missing from .venv, e.g. uninstalled by hand, also redoes it)
if [ "$want" = "$have" ] && "$VENV/bin/python" -c \
        'import importlib.util as u, sys; sys.exit(any(u.find_spec(m) is None for m in ("playwright", "jupyterlab", "nbval", "distributed", "torch")))' \
        >/dev/null 2>&1; then
    log "up to date (.venv, pyproject.toml unchanged)"
    exit 0
fi

log "upgrading pip"
"$VENV/bin/python" -m pip install -q --upgrade pip
log "pip install -e '.[notebook,dev]'"
"$VENV/bin/python" -m pip install -q -e '.[notebook,dev]'

if [ -f pypto/__init__.py ]; then
    echo "$want" > "$STAMP"
    log "done"
else
    # An editable install made before the package exists would not map it;
    # leave no stamp so that the next run installs again.
    rm -f "$STAMP"
    log "WARNING: pypto/__init__.py does not exist yet; install will be redone on the next run"
fi
