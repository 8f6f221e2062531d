#!/usr/bin/env bash
# Runs the whole suite: lint, then pytest (tests start the services they need themselves).
set -euo pipefail
cd "$(dirname "$0")/.."
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
.venv/bin/ruff check src tests
.venv/bin/python -m pytest --durations=25 "$@"
