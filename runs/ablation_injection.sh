#!/usr/bin/env bash
# runs/ablation_injection.sh -- the input-injection ablation of Table 5 (paper App. C.2), plus random state init.
#
# Purpose: s=10, r=4, C=1e18, one run per variant: linear (Eq. 5, the default: 3,642 steps = 955M tokens), additive
#          and passthrough (parameter-free: 3,712 steps = 973M tokens), hyperconnections with K=2 (973M), and the
#          project's random-state-init ablation (h(0) ~ N(0, I) after Huginn; linear injection, so 955M tokens).
#          Paper: 2.793 / 2.797 / 7.400 / 2.757 nats (passthrough fails to train).
# Usage:   NPROC=8 bash runs/ablation_injection.sh [--dry-run]     OUT=out/ablation_injection by default
# Cost:    5 runs, 5.0e18 training FLOPs = ~3.5 H100-hours at 40% MFU of 989 TFLOP/s (bf16 dense).
# Resume:  run it again: every run goes to train.py --resume, which hands back a finished run's record (same run
#          identity), continues a preempted one from its ckpt.pt and refuses a foreign done.json (runs/launch.bash).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-out/ablation_injection}
NPROC=${NPROC:-8}

BUDGET=1e18                                               # C (Table 5)
SCALE=10                                                  # s, d = 640 (the reference width)
LOOPS=4                                                   # r, 2-4-2 layout
VARIANTS=(linear additive passthrough hyper random)       # Table 5 rows + the random-state ablation
declare -A FLAGS=(                                        # variant -> train.py flags
  [linear]="--injection linear" [additive]="--injection additive" [passthrough]="--injection passthrough"
  [hyper]="--injection hyper --hc-lanes 2" [random]="--injection linear --state-init random --state-init-std 1.0")

source runs/launch.bash "$@"                              # launch / finish / --dry-run

for v in "${VARIANTS[@]}"; do
  read -ra flags <<< "${FLAGS[$v]}"                      # a flag list: split at blanks, never globbed
  launch "$OUT/$v" --flops-budget "$BUDGET" --scale "$SCALE" --n-loops "$LOOPS" "${flags[@]}" --case injection
done

finish "all runs done"
for v in "${VARIANTS[@]}"; do
  python -c "import json,sys; r=json.load(open(sys.argv[1])); print(f\"{sys.argv[2]:>12} {r['tokens']/1e6:6.0f}M tokens  val_loss {r['val_loss']:.3f}\")" \
    "$OUT/$v/done.json" "$v"
done
