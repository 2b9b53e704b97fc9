#!/usr/bin/env bash
# runs/grid.sh -- the 116-run iso-depth grid behind the joint law (paper §4.1, App. E, Table 6).
#
# Purpose: every (budget C, width s) cell of Table 6 for r in {1, 2, 4, 8}. r=1 is the 0-20-0 baseline, r>1 the
#          2-(16/r)-2 looped stacks with linear injection and full BPTT. Each run trains steps = round(C / (F B)) steps
#          of B = 262,144 tokens (flops.py) at the HyperP LRs (optim.py) and leaves OUT/<run>/done.json for fit.py.
# Usage:   NPROC=8 bash runs/grid.sh [--dry-run]       OUT=out/grid by default; NPROC = GPUs on this node
#          --dry-run prints one `torchrun ... train.py ...` line per run, and exits.
#          python flops.py grid --mfu 0.4             the same 116 runs with N, tokens, steps and the GPU-hour plan
# Cost:    7.26e20 training FLOPs = ~510 H100-hours at 40% MFU of 989 TFLOP/s (bf16 dense); ~1,600 A100-hours.
# Resume:  run it again: every run goes to train.py --resume, which hands back a finished run's record (same run
#          identity), continues a preempted one from its ckpt.pt and refuses a foreign done.json (runs/launch.bash).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-out/grid}
NPROC=${NPROC:-8}

BUDGETS=(4.64e17 1e18 2.15e18 4.64e18 1e19 2.15e19)      # C in FLOPs, the six columns of Table 6
declare -A WIDTHS=(                                       # C -> the widths s swept at that budget (Table 6)
  [4.64e17]="6 8 10 12"       [1e18]="6 8 10 12 14"     [2.15e18]="8 10 12 14 16"
  [4.64e18]="10 12 14 16 18 20" [1e19]="12 16 18 20 24" [2.15e19]="18 24 28 34")
LOOPS=(1 2 4 8)                                           # r; n_layers_eff = 20 for every r (iso-depth, §3.1)

source runs/launch.bash "$@"                              # launch / finish / --dry-run

for C in "${BUDGETS[@]}"; do
  for r in "${LOOPS[@]}"; do
    for s in ${WIDTHS[$C]}; do
      launch "$OUT/C${C}_r${r}_s${s}" --flops-budget "$C" --n-loops "$r" --scale "$s"
    done
  done
done

finish "grid complete -> fit the joint law with: $(shell_line python fit.py "$OUT" --out "$OUT/fit")"
