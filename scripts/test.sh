#!/usr/bin/env bash
# Runs the whole suite: lint, then pytest (tests start the services they need themselves).
set -euo pipefail
cd "$(dirname "$0")/.."
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
# Every process of the suite binds loopback where a server or client would bind every interface
# (Mooncake's transfer engine takes no address): the bind shim of kvtier.testing.loopback.
shim=$(.venv/bin/python -m kvtier.testing.loopback .venv/loopback)
export LD_PRELOAD="$shim${LD_PRELOAD:+:$LD_PRELOAD}"
.venv/bin/ruff check src tests
# pytest writes the report when its session ends: a run that ended otherwise (a test that
# replaced or killed the process) has none, and fails here whatever its exit status
report=.venv/pytest-report.xml
rm -f "$report"
.venv/bin/python -m pytest --durations=25 --junitxml="$report" "$@"
if [ ! -s "$report" ]; then
    echo "error: pytest ended before its session did (no $report)" >&2
    exit 1
fi
