#!/usr/bin/env bash
# Build the report (graphmode report: models/profiles/*.sqlite + the bundled default model) into
# build/report.html (not committed), regenerate the committed docs/report-summary.md and the first-screen
# screenshot docs/images/report-first-screen.png (headless Debian chromium, 1440x1000).
# usage: bench/report_screenshot.sh [extra `graphmode report` options, e.g. --dataset D --model-dir M]
set -euo pipefail
cd "$(dirname "$0")/.."
out=build/report.html; png=docs/images/report-first-screen.png
mkdir -p build docs/images
"${GRAPHMODE:-.venv/bin/graphmode}" report --out "$out" --summary docs/report-summary.md "$@"
browser=$(command -v chromium || command -v chromium-browser || command -v google-chrome || true)
if [ -z "$browser" ]; then echo "no chromium found (apt-get install -y chromium): report only" >&2; exit 0; fi
profile=$(mktemp -d); trap 'rm -rf "$profile"' EXIT
"$browser" --headless --no-sandbox --disable-gpu --disable-quic --no-first-run --disable-background-networking \
  --disable-component-update --disable-sync --user-data-dir="$profile" --hide-scrollbars \
  --window-size=1440,1000 --virtual-time-budget=15000 --screenshot="$png" "file://$PWD/$out" 2>/dev/null
ls -l "$out" "$png"
