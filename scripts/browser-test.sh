#!/usr/bin/env bash
# The real-browser test (Tests/browser/sign_in_browser.py): headless Chromium signs in through the
# Apple ID simulator across two sites. Selenium comes from PyPI into a venv under .build/.
# Usage: scripts/browser-test.sh [BINARY]   (default .build/debug/sessiongate; make test passes its own)
set -euo pipefail
binary=${1:-.build/debug/sessiongate}
venv=.build/browser-venv
if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c 'import selenium' 2>/dev/null; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet --disable-pip-version-check selenium
fi
exec "$venv/bin/python" Tests/browser/sign_in_browser.py "$binary" .build/browser-test
