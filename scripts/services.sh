#!/usr/bin/env bash
# Starts (or stops) by hand the servers the tests start for themselves: a Redis/Valkey server,
# a SeaweedFS S3 server and a Mooncake Store, on 127.0.0.1 and free ports, telemetry off, data and
# logs under DIR.
#   bash scripts/services.sh start DIR   # prints KVTIER_REDIS_URL=..., KVTIER_S3_ENDPOINT=...,
#                                        # KVTIER_MOONCAKE_URL=... and the S3 credentials as
#                                        # shell lines; PIDs in DIR/pids
#   bash scripts/services.sh stop DIR    # ends them by those PIDs
# Tests marked `services` need no such step: kvtier.testing.service_fixtures starts the servers
# and stops them by PID, also when tests fail.
set -euo pipefail
cd "$(dirname "$0")/.."
exec .venv/bin/python -m kvtier.testing.services "$@"
