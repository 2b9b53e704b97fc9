#!/usr/bin/env bash
# runs/case_hc.sh -- case study: loop-level hyperconnections instead of linear injection (paper §5.2, App. G.1).
#
# Purpose: rerun the iso-FLOP grid for r in {2, 4, 8} at the four lower budgets with K = 2 hyperconnection lanes
#          (Eq. 7), full BPTT. The mixing costs 6 r (K^2 + 2K) d FLOPs per token, so runs train ~2% more tokens than
#          with linear injection. s=18 is added at 2.15e18, as in the authors' sweep: 21 cells per r, which with the
#          20 reused r=1 grid runs gives the 83 runs of App. G.2. Runs carry --case hc and land inside the grid tree.
# Usage:   NPROC=8 bash runs/case_hc.sh [--dry-run]      OUT=out/grid/case_hc by default
#          then: python fit.py out/grid --case hc --out out/fit_hc
# Cost:    63 runs, 1.43e20 training FLOPs = ~100 H100-hours at 40% MFU of 989 TFLOP/s (bf16 dense).
# Resume:  run it again: every run goes to train.py --resume, which hands back a finished run's record (same run
#          identity), continues a preempted one from its ckpt.pt and refuses a foreign done.json (runs/launch.bash).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-out/grid/case_hc}
NPROC=${NPROC:-8}

BUDGETS=(4.64e17 1e18 2.15e18 4.64e18)                   # the four lower budgets of Table 6 (§5)
declare -A WIDTHS=(                                       # Table 6 widths, + s=18 at 2.15e18
  [4.64e17]="6 8 10 12" [1e18]="6 8 10 12 14" [2.15e18]="8 10 12 14 16 18" [4.64e18]="10 12 14 16 18 20")
LOOPS=(2 4 8)                                             # r
HC_LANES=2                                                # K (App. G.1)

source runs/launch.bash "$@"                              # launch / finish / --dry-run

for C in "${BUDGETS[@]}"; do
  for r in "${LOOPS[@]}"; do
    for s in ${WIDTHS[$C]}; do
      launch "$OUT/C${C}_r${r}_s${s}" --flops-budget "$C" --n-loops "$r" --scale "$s" \
        --injection hyper --hc-lanes "$HC_LANES" --case hc
    done
  done
done

finish "case study complete -> python fit.py out/grid --case hc --out out/fit_hc"
