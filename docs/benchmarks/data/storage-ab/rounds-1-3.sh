#!/usr/bin/env bash
# A/B of kvtier bench storage: the tier code before (worktree /work/before) and after (/work/main).
set -u
OUT=/work/scratch/ab/out; mkdir -p $OUT
PY=/work/main/.venv/bin/python
D=/work/abbench
run() { # code round bs
  local code=$1 round=$2 bs=$3 src
  if [ $code = before ]; then src=/work/before/src; else src=/work/main/src; fi
  rm -rf $D; mkdir -p $D
  local extra=(); [ $bs != default ] && extra=(--block-size $bs)
  echo "$(date +%T) start $code r$round $bs" >> $OUT/log
  PYTHONPATH=$src $PY -c "import kvtier,sys; assert kvtier.__file__.startswith('$src'), kvtier.__file__; from kvtier.cli.main import app; sys.argv=['kvtier','bench','storage']+sys.argv[1:]; app()" \
    --tier "memory://?size=2GiB" --tier "slab://$D/s?size=2GiB" --tier "file://$D/f?size=2GiB" \
    "${extra[@]}" --repeat 3 --json > $OUT/$code-r$round-$bs.json 2> $OUT/$code-r$round-$bs.err
  echo "$(date +%T) done $code r$round $bs rc=$?" >> $OUT/log
}
for round in 1 2 3; do
  if [ $round = 2 ]; then order="after before"; else order="before after"; fi
  for code in $order; do
    for bs in 256KiB 1MiB default; do run $code $round $bs; done
  done
done
echo "$(date +%T) all done" >> $OUT/log
