#!/usr/bin/env bash
# The GPU check of the transfer engine, run as one call on a lent device machine (an H100 with
# torch and CUDA, no vLLM, no package registry): the CUDA tests, then `kvtier bench transfer
# --device cuda` (GPUDirect Storage through kvikio among its figures), every result written
# under $OUT. The wheels the machine lacks travel in .whl
# (`make gpu-wheels` here; name .whl in the call's carry).
set -uo pipefail
out=${OUT:-/tmp/kvtier-gpu-check}
mkdir -p "$out"
if compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/kvtier-site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/kvtier-site
fi
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv || true
  python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)'
} 2>&1 | tee "$out/device.txt"
python3 -m pytest -q -p no:cacheprovider --confcutdir=tests/engines/transfer \
  tests/engines/transfer/test_cuda_transfer.py 2>&1 | tee "$out/pytest.txt"
python3 -m pytest -q -p no:cacheprovider --confcutdir=tests/tiers/files \
  tests/tiers/files/test_per_block_gds.py 2>&1 | tee -a "$out/pytest.txt"
kvtier() { python3 -c 'import sys; from kvtier.cli.main import app; sys.argv[0] = "kvtier"; app()' "$@"; }
kvtier bench transfer --device "${DEVICE:-cuda}" ${TOKENS:+--tokens "$TOKENS"} --json \
  >"$out/transfer.json" 2>"$out/transfer.err"
echo "bench transfer rc=$?"
tail -3 "$out/transfer.err"
python3 - "$out/transfer.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
print(d["device_name"], {k: round(v["share_of_plain"], 3) for k, v in d["copies"].items()})
print({k: v for k, v in d["overlap"].items()}, d["targets"], d["gds"])
print("file io", d["file_io"])
PY
