#!/usr/bin/env bash
# runs/extrapolate.sh -- the extrapolation pair beyond the grid (paper App. I, Table 10).
#
# Purpose: r=1 and r=4 at s=34 (d = 2,176) on 47B tokens: 89,645 steps of B = 524,288 tokens, matched tokens (not
#          matched FLOPs: the looped run costs ~3% more, 4.011e20 vs 3.904e20). HyperP: b = (524288/262144)^0.558 =
#          1.4722 and D = steps x B give eta_MuonH = 0.005980 (r=1) / 0.006043 (r=4) (optimizer.md §3).
#          Paper: val loss 2.047 (r=1) vs 2.108 (r=4) nats. FP8 (the release's flagship option) is not used here.
# Usage:   NPROC=8 bash runs/extrapolate.sh [--dry-run]   OUT=out/extrapolate by default
#          multi-node: sbatch --nodes=4 runs/slurm.sh <the train.py flags of one --dry-run line>
# Cost:    2 runs, 7.92e20 training FLOPs = ~556 H100-hours at 40% MFU of 989 TFLOP/s (bf16 dense).
# Resume:  run it again: every run goes to train.py --resume, which hands back a finished run's record (same run
#          identity), continues a preempted one from its ckpt.pt and refuses a foreign done.json (runs/launch.bash).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-out/extrapolate}
NPROC=${NPROC:-8}

SCALE=34                                                  # s (App. I)
LOOPS=(1 4)                                               # r
STEPS=89645                                               # optimizer steps: 89,645 x 524,288 = 46,999,797,760 tokens
BATCH_TOKENS=524288                                       # B, raised from 256K "to reduce gradient variance"
EVAL_EVERY=5000                                           # a val curve for a multi-day run

source runs/launch.bash "$@"                              # launch / finish / --dry-run

for r in "${LOOPS[@]}"; do
  launch "$OUT/s${SCALE}_r${r}" --scale "$SCALE" --n-loops "$r" --steps "$STEPS" --batch-tokens "$BATCH_TOKENS" \
    --eval-every "$EVAL_EVERY" --case extrapolate
done

finish "all runs done"
for r in "${LOOPS[@]}"; do echo "downstream suite (Table 10): $(shell_line python eval.py "$OUT/s${SCALE}_r${r}")"; done
