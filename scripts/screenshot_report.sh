#!/usr/bin/env bash
# Render a gpubench report in headless Chromium (Debian's `chromium` package) and save a
# screenshot, to look at the page as a person would:
#   bash scripts/screenshot_report.sh reports/<run_id>/index.html out.png [height_px]
# Chromium runs offline: the report is self-contained, and these flags stop it from trying
# to reach the network.
set -euo pipefail
page=$1; out=$2; height=${3:-5000}
browser=$(command -v chromium || command -v chromium-browser || command -v google-chrome || true)
[ -n "$browser" ] || { echo "no chromium found (apt-get install chromium)" >&2; exit 3; }
profile=$(mktemp -d)
trap 'rm -rf "$profile"' EXIT
"$browser" --headless --no-sandbox --disable-gpu --disable-quic --no-first-run --disable-background-networking \
  --disable-component-update --disable-sync --hide-scrollbars --user-data-dir="$profile" \
  --window-size=1280,"$height" --screenshot="$(realpath -m "$out")" "file://$(realpath "$page")" >/dev/null 2>&1
[ -s "$out" ] || { echo "chromium wrote no screenshot" >&2; exit 1; }
echo "$out"
