#!/usr/bin/env bash
# Installs the system tools the tests use when they are missing: fio (the storage reference),
# redis-server and redis-tools (redis-cli joins the test cluster) for the shared tier's servers,
# openssl for the TLS server's test certificate.
# Loop-mounted test filesystems (kvtier.testing.mounts) need losetup/mount (mount), mkfs.ext4
# (e2fsprogs), and root.
set -euo pipefail
need=()
command -v fio >/dev/null 2>&1 || need+=(fio)
command -v redis-server >/dev/null 2>&1 || need+=(redis-server)
command -v redis-cli >/dev/null 2>&1 || need+=(redis-tools)
command -v openssl >/dev/null 2>&1 || need+=(openssl)
PATH="$PATH:/usr/sbin:/sbin"
command -v losetup >/dev/null 2>&1 || need+=(mount)
command -v mkfs.ext4 >/dev/null 2>&1 || need+=(e2fsprogs)
if ((${#need[@]})); then
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -qq >/dev/null
  $sudo apt-get install -y -qq "${need[@]}" >/dev/null
fi
