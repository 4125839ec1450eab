#!/usr/bin/env bash
# Headless Chromium for the dashboard and report tests (tests/report/): the Debian packages
# chromium and chromium-driver, installed when absent (needs root or sudo and a package mirror).
set -euo pipefail
for name in chromium chromium-browser google-chrome; do
  command -v "$name" >/dev/null 2>&1 && exit 0
done
SUDO=()
[ "$(id -u)" = 0 ] || SUDO=(sudo)
echo "installing chromium and chromium-driver (apt-get) for the browser tests" >&2
"${SUDO[@]}" apt-get update -qq
DEBIAN_FRONTEND=noninteractive "${SUDO[@]}" apt-get install -y -qq chromium chromium-driver >/dev/null
