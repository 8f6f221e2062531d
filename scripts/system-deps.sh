#!/usr/bin/env bash
# Installs the system tools the tests use when they are missing: fio (the storage reference),
# redis-server and redis-tools (redis-cli joins the test cluster) for the shared tier's servers,
# openssl for the TLS server's test certificate.
# Mooncake Store's client and servers (the mooncake extra) load libibverbs, libnuma and libcurl; the
# test store is kept on loopback by a shim built with cc.
# Loop-mounted test filesystems (kvtier.testing.mounts) need losetup/mount (mount), mkfs.ext4
# (e2fsprogs), and root.
set -euo pipefail
need=()
command -v fio >/dev/null 2>&1 || need+=(fio)
command -v redis-server >/dev/null 2>&1 || need+=(redis-server)
command -v redis-cli >/dev/null 2>&1 || need+=(redis-tools)
command -v openssl >/dev/null 2>&1 || need+=(openssl)
command -v cc >/dev/null 2>&1 || need+=(gcc)
for lib in libibverbs.so.1:libibverbs1 libnuma.so.1:libnuma1 libcurl.so.4:libcurl4; do
  /sbin/ldconfig -p 2>/dev/null | grep -q "${lib%%:*}" || need+=("${lib##*:}")
done
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
