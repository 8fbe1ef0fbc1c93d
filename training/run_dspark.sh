#!/usr/bin/env bash
# The DSpark draft end to end on one GPU machine (about 8 minutes on an H100/H200):
# a 6-second smoke run (train + export + acceptance on 16 documents), then the real one.
#   training/run_dspark.sh CARRY1 CARRY5 OUTDIR [MINUTES]
# CARRY1 / CARRY5: the carry folders (ids.u32.gz, mask.u8.gz, docs.json.gz) that
# build_data.sh writes for SEED=1 (training) and N=1500 SEED=5 (held out).
# OUTDIR gets train.log, dspark.pt, dspark_eval.json and moonrun-demo-dspark/.
set -euo pipefail
cd "$(dirname "$0")/.."
C1=$1; C5=$2; OUTD=$3; MIN=${4:-5.0}
M=models/moonrun-demo
P=training/dspark_prompts.json
mkdir -p /tmp/d1 /tmp/d5 "$OUTD"
for f in ids.u32 mask.u8 docs.json; do gunzip -c "$C1/$f.gz" > /tmp/d1/$f; gunzip -c "$C5/$f.gz" > /tmp/d5/$f; done
export PYTHONUNBUFFERED=1
python3 training/train_dspark.py --data /tmp/d1 --target $M --out /tmp/smoke --schedule-minutes 0.1 \
    --val-samples 16 --log-every 5 > "$OUTD/smoke.log" 2>&1
python3 training/export_dspark.py --ckpt /tmp/smoke/dspark.pt --target $M --out /tmp/smoke/x --prompts $P \
    --eval-data /tmp/d5 --eval-docs 16 --gen 16 >> "$OUTD/smoke.log" 2>&1
python3 training/train_dspark.py --data /tmp/d1 --target $M --out /tmp/run --schedule-minutes "$MIN" \
    > "$OUTD/train.log" 2>&1
cp /tmp/run/dspark.pt "$OUTD/"
python3 training/export_dspark.py --ckpt /tmp/run/dspark.pt --target $M --out "$OUTD/moonrun-demo-dspark" \
    --prompts $P --eval-data /tmp/d5 --eval-docs 128 --gen 64 --report "$OUTD/dspark_eval.json" >> "$OUTD/train.log" 2>&1
tail -40 "$OUTD/train.log"
