#!/usr/bin/env bash
# runs/depth.sh -- effective depth 18 and 24 instead of 20 (earlier arXiv version, App. G.4; architecture.md §1).
#
# Purpose: the iso-FLOP grid at the four lower budgets with l_eff = 18 (prelude 1, coda 1) and l_eff = 24
#          (prelude 4, coda 4), keeping r l_recur = 16, for r in {1, 2, 4, 8}; r=1 is an 18- or 24-block stack.
#          Pooled with the l_eff = 20 grid (240 runs) the earlier version reports phi = 0.468 [0.442, 0.494].
#          LRs are left unchanged: HyperP gives no depth rule while the depth barely moves (optimizer.md §2.4).
#          Runs carry --case depth18 / depth24 and land inside the grid tree.
# Usage:   NPROC=8 bash runs/depth.sh [--dry-run]         OUT=out/grid/depth by default
#          then: python fit.py out/grid --case depth18 (or depth24)
# Cost:    160 runs, 3.64e20 training FLOPs = ~255 H100-hours at 40% MFU of 989 TFLOP/s (bf16 dense).
# Resume:  run it again: every run goes to train.py --resume, which hands back a finished run's record (same run
#          identity), continues a preempted one from its ckpt.pt and refuses a foreign done.json (runs/launch.bash).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-out/grid/depth}
NPROC=${NPROC:-8}

DEPTHS=(18 24)                                            # l_eff
declare -A PRELUDE_CODA=([18]=1 [24]=4)                   # l_eff -> l_prelude = l_coda (r l_recur = 16)
BUDGETS=(4.64e17 1e18 2.15e18 4.64e18)                   # the four lower budgets of Table 6
declare -A WIDTHS=(                                       # Table 6 widths
  [4.64e17]="6 8 10 12" [1e18]="6 8 10 12 14" [2.15e18]="8 10 12 14 16" [4.64e18]="10 12 14 16 18 20")
LOOPS=(1 2 4 8)                                           # r

source runs/launch.bash "$@"                              # launch / finish / --dry-run

for L in "${DEPTHS[@]}"; do
  pc=${PRELUDE_CODA[$L]}
  for C in "${BUDGETS[@]}"; do
    for r in "${LOOPS[@]}"; do
      for s in ${WIDTHS[$C]}; do
        launch "$OUT/L${L}_C${C}_r${r}_s${s}" --flops-budget "$C" --n-loops "$r" --scale "$s" \
          --n-layers-eff "$L" --n-layers-prelude "$pc" --n-layers-coda "$pc" --case "depth$L"
      done
    done
  done
done

finish "depth runs complete -> python fit.py out/grid --case depth18 / --case depth24"
