#!/usr/bin/env bash
# Rounds 7-9: file:// at depth 16 (the cells rounds 1-6 left under 0.95), the final code.
set -u
OUT=/work/scratch/ab/out; PY=/work/main/.venv/bin/python; D=/work/abbench
run() { local code=$1 round=$2 bs=$3
  local src=/work/main/src; [ $code = before ] && src=/work/before/src
  rm -rf $D; mkdir -p $D
  echo "$(date +%T) start $code r$round $bs" >> $OUT/log3
  PYTHONPATH=$src $PY -c "import kvtier,sys; assert kvtier.__file__.startswith('$src'); from kvtier.cli.main import app; sys.argv=['kvtier','bench','storage']+sys.argv[1:]; app()" \
    --tier "file://$D/f?size=2GiB" --block-size $bs --depth 16 --repeat 3 --no-lookup --json > $OUT/$code-r$round-f16-$bs.json 2> $OUT/$code-r$round-f16-$bs.err
  echo "$(date +%T) done $code r$round $bs rc=$?" >> $OUT/log3
}
for round in 7 8 9; do
  if [ $round = 8 ]; then order="after before"; else order="before after"; fi
  for code in $order; do run $code $round 256KiB; run $code $round 1MiB; done
done
echo "$(date +%T) all done" >> $OUT/log3
