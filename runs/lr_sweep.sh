#!/usr/bin/env bash
# runs/lr_sweep.sh -- the HyperP learning-rate sweep and its transfer checks (paper App. D.1-D.2, Figures 6-7).
#
# Purpose: eight base MuonH LRs eta_base in [0.008, 0.024] for r=1 (0-20-0) and r=4 (2-4-2), at
#            the reference cell   s=10, D = 10 x reuse-weighted params (~1B tokens), B = 256K      (Fig. 6, D.1)
#            width transfer       s in {8, 14} at ratio 10, B = 256K                             (Fig. 7 left)
#            data transfer        ratios {20, 40} at s=10, B = 256K                              (Fig. 7 right)
#            batch sweep          B in {512K, 1M} at s=10, ratio 10                              (D.1)
#          D = int(ratio x (N_once + r N_rec)) via --tokens-per-param; HyperP then applies (D/D_ref)^-0.32 and
#          b = (B/256K)^0.558 to eta_base (optim.py), so a flat regret curve at 0.014 confirms the transfer rules.
#          Validation every 500 steps, as in the authors' sweep.
# Usage:   NPROC=8 bash runs/lr_sweep.sh [--dry-run]      OUT=out/lr_sweep by default
# Cost:    112 runs (7 cells x 2 r x 8 LRs), 2.13e20 training FLOPs = ~150 H100-hours at 40% MFU of 989 TFLOP/s.
# Resume:  run it again: every run goes to train.py --resume, which hands back a finished run's record (same run
#          identity), continues a preempted one from its ckpt.pt and refuses a foreign done.json (runs/launch.bash).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-out/lr_sweep}
NPROC=${NPROC:-8}

LRS=(0.008 0.010 0.012 0.014 0.016 0.018 0.020 0.024)    # eta_base (App. D.1: eight values, dense near 0.014)
LOOPS=(1 4)                                               # r: the baseline and the looped reference
CELLS=(                                                   # "scale tokens-per-param batch-tokens"
  "10 10 262144"                                          #   reference (D.1)
  "8 10 262144" "14 10 262144"                            #   width transfer (D.2)
  "10 20 262144" "10 40 262144"                           #   data transfer (D.2)
  "10 10 524288" "10 10 1048576")                         #   batch sweep (D.1)
EVAL_EVERY=500                                            # steps between val evals (authors' sweep)

source runs/launch.bash "$@"                              # launch / finish / --dry-run

for cell in "${CELLS[@]}"; do
  read -r s rho B <<< "$cell"
  for r in "${LOOPS[@]}"; do
    for lr in "${LRS[@]}"; do
      launch "$OUT/s${s}_rho${rho}_B${B}_r${r}_lr${lr}" --scale "$s" --n-loops "$r" --tokens-per-param "$rho" \
        --batch-tokens "$B" --muonh-lr "$lr" --eval-every "$EVAL_EVERY" --case lr_sweep
    done
  done
done

finish "LR sweep complete: val_loss per (cell, r, eta_base) is in $(shell_line "$OUT")/*/done.json"
