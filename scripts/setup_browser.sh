#!/usr/bin/env bash
# Installs what tests/test_serve_browser.py drives: Debian's Chromium and its WebDriver, and selenium.
# Why Debian's packages: a browser build downloaded at test time (playwright install, selenium
# manager) needs hosts that CI and the developers' machines cannot reach; apt and PyPI they can.
# Idempotent and quick when everything is there. Without it the browser test is skipped, saying so.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}

if command -v chromium >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1; then
  echo "setup_browser: chromium and chromedriver already installed"
elif command -v apt-get >/dev/null 2>&1; then
  SUDO=()
  if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null 2>&1 || { echo "setup_browser: run as root (apt-get) or install chromium and chromium-driver" >&2; exit 1; }
    SUDO=(sudo)
  fi
  echo "setup_browser: installing chromium and chromium-driver (Debian packages)"
  "${SUDO[@]}" apt-get update -q >/dev/null
  DEBIAN_FRONTEND=noninteractive "${SUDO[@]}" apt-get install -y -q \
    chromium chromium-driver >/dev/null
else
  echo "setup_browser: no apt-get here; install Chromium and its chromedriver, then rerun" >&2
  exit 1
fi

"$VENV/bin/python" -m pip install --disable-pip-version-check -q "selenium>=4.20"
echo "setup_browser: $(chromium --version 2>/dev/null | head -1), $(chromedriver --version | cut -d' ' -f1-2)," \
     "selenium $("$VENV/bin/python" -c 'import selenium; print(selenium.__version__)')"
