#!/usr/bin/env bash
# The real-browser test (Tests/browser/sign_in_browser.py): headless Chromium signs in through the
# Apple ID simulator across two sites. Selenium comes from PyPI into a venv under .build/.
set -euo pipefail
venv=.build/browser-venv
if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c 'import selenium' 2>/dev/null; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet --disable-pip-version-check selenium
fi
exec "$venv/bin/python" Tests/browser/sign_in_browser.py .build/debug/sessiongate .build/browser-test
