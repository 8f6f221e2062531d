#!/usr/bin/env bash
# Installs the system tools the tests use (fio as the storage reference) when they are missing.
set -euo pipefail
need=()
command -v fio >/dev/null 2>&1 || need+=(fio)
command -v redis-server >/dev/null 2>&1 || need+=(redis-server)
if ((${#need[@]})); then
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -qq >/dev/null
  $sudo apt-get install -y -qq "${need[@]}" >/dev/null
fi
