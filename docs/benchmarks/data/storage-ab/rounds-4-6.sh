#!/usr/bin/env bash
# Focused A/B rounds 4-6 on the cells rounds 1-3 left in doubt (same tiers and sizes).
set -u
OUT=/work/scratch/ab/out; PY=/work/main/.venv/bin/python; D=/work/abbench
run() { # code round label bs tiers... -- depths
  local code=$1 round=$2 label=$3 bs=$4 depths=$5; shift 5
  local src=/work/main/src; [ $code = before ] && src=/work/before/src
  rm -rf $D; mkdir -p $D
  local extra=(); [ $bs != default ] && extra=(--block-size $bs)
  local tiers=(); for t in "$@"; do case $t in
    memory) tiers+=(--tier "memory://?size=2GiB");; slab) tiers+=(--tier "slab://$D/s?size=2GiB");; file) tiers+=(--tier "file://$D/f?size=2GiB");; esac; done
  echo "$(date +%T) start $code r$round $label" >> $OUT/log2
  PYTHONPATH=$src $PY -c "import kvtier,sys; assert kvtier.__file__.startswith('$src'); from kvtier.cli.main import app; sys.argv=['kvtier','bench','storage']+sys.argv[1:]; app()" \
    "${tiers[@]}" "${extra[@]}" --depth $depths --repeat 3 --no-lookup --json > $OUT/$code-r$round-$label.json 2> $OUT/$code-r$round-$label.err
  echo "$(date +%T) done $code r$round $label rc=$?" >> $OUT/log2
}
for round in 4 5 6; do
  if [ $round = 5 ]; then order="after before"; else order="before after"; fi
  for code in $order; do
    run $code $round 256KiB 256KiB 1,16 file slab
    run $code $round 1MiB 1MiB 16 file
    run $code $round default default 4,16 memory file
  done
done
echo "$(date +%T) all done" >> $OUT/log2
