#!/usr/bin/env bash
# runs/case_bptt.sh -- case study: truncated backpropagation through the loops (paper §5.1, App. G.1, Table 3).
#
# Purpose: rerun the iso-FLOP grid for r in {2, 4, 8} at the four lower budgets with r_bwd = ceil(r/2) = 1, 2, 4
#          (Prairie et al.): early loops run forward only, F_train drops ~24%, so each budget buys ~31% more tokens
#          (Eq. 6; flops.py counts the detached loops forward-only). Budgets from 1e18 up get one extra, wider width,
#          as in the authors' sweep, because truncation moves the optimum wider. The r=1 runs of runs/grid.sh are
#          the baseline and are reused; runs carry --case bptt and land inside the grid tree for fit.py.
# Usage:   NPROC=8 bash runs/case_bptt.sh [--dry-run]    OUT=out/grid/case_bptt by default
#          then: python fit.py out/grid --case bptt --out out/fit_bptt     (and --loops 1,4,8 for Table 3's row 3)
# Cost:    69 runs, 1.60e20 training FLOPs = ~112 H100-hours at 40% MFU of 989 TFLOP/s (bf16 dense).
# Resume:  run it again: every run goes to train.py --resume, which hands back a finished run's record (same run
#          identity), continues a preempted one from its ckpt.pt and refuses a foreign done.json (runs/launch.bash).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-out/grid/case_bptt}
NPROC=${NPROC:-8}

BUDGETS=(4.64e17 1e18 2.15e18 4.64e18)                   # the four lower budgets of Table 6 (§5)
declare -A WIDTHS=(                                       # Table 6 widths, +16 / +18 / +22 from 1e18 up
  [4.64e17]="6 8 10 12" [1e18]="6 8 10 12 14 16" [2.15e18]="8 10 12 14 16 18" [4.64e18]="10 12 14 16 18 20 22")
LOOPS=(2 4 8)                                             # r; r_bwd = ceil(r / 2) below

source runs/launch.bash "$@"                              # launch / finish / --dry-run

for C in "${BUDGETS[@]}"; do
  for r in "${LOOPS[@]}"; do
    for s in ${WIDTHS[$C]}; do
      launch "$OUT/C${C}_r${r}_s${s}" --flops-budget "$C" --n-loops "$r" --scale "$s" \
        --n-loops-bwd $(( (r + 1) / 2 )) --case bptt
    done
  done
done

finish "case study complete -> python fit.py out/grid --case bptt --out out/fit_bptt"
