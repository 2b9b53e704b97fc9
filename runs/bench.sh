#!/usr/bin/env bash
# nanoloop's performance figures in one run, each against its baseline where a ratio exists (issue 8):
#   1. training tok/s and MFU on CPU, r = 1 vs r = 4 at the same width (per executed layer: looping must not cost
#      speed), and peak memory for r = 1 vs r = 8 under full BPTT and truncated BPTT (Eq. 6);
#   2. MuonH step time for the matrix stack of one s = 10 model (d = 640); 2b. the optimizer step on 1 rank vs
#      sharded over 2 ranks (gloo on CPU, one thread per rank: each rank orthogonalises half of the matrices);
#   3. tokenise + pack tokens/s on all cores vs a single-threaded encode loop, and the streaming prepare's MB/s
#      and peak RSS on a generated corpus (16 MB here; `python runs/bench_data.py --mb 1000` for the 1 GB figure);
#   4. the full fit protocol (9 fits x 500 restarts + 200 bootstrap refits) vs naive serial scipy;
#   5. batched vs one-at-a-time continuation scoring.
# Usage: bash runs/bench.sh [--dry-run] [--overwrite] [OUT]  (OUT: out/bench; ~3-5 min on a 2-core CPU, no GPU)
# OUT is bench.sh's own folder (common.py claim): a new or empty one is adopted (OUT/.nanoloop-bench marks it),
# one it made for the same parameters is reused, and any other non-empty folder is refused (exit 2), so files
# bench.sh did not write are never replaced; --overwrite adopts such a folder (and lets part 1 replace its files).
# Numbers are wall clock on whatever else the machine is doing: run it on an idle machine to compare commits.
set -euo pipefail
cd "$(dirname "$0")/.."
DRY=0; OUT=""; OVERWRITE=""
for arg in "$@"; do
  case "$arg" in
    --dry-run) DRY=1 ;;
    --overwrite) OVERWRITE=--overwrite ;;
    -*) echo "runs/bench.sh: unknown flag $arg (usage: bash runs/bench.sh [--dry-run] [--overwrite] [OUT])" >&2
        exit 2 ;;
    *) OUT="$arg" ;;
  esac
done
OUT=${OUT:-out/bench}

# ---- parameters -----------------------------------------------------------------------------------------------
# A CPU-sized model: d = 128 (aspect 32, s = 4), head_dim 32, l_eff = 10 as in the mini study, T = 256.
# 16 rows of 256 tokens per step (4,096 tokens), one micro-batch.
TRAIN=(--aspect-ratio 32 --scale 4 --head-dim 32 --n-layers-eff 10 --n-layers-prelude 1 --n-layers-coda 1
       --seq-len 256 --device-batch 16 --vocab-size 2048)
STEPS=6
NAMES=(r1 r4 r8 r8_bptt4 r8_bptt1)
CASES=("--n-loops 1" "--n-loops 4" "--n-loops 8" "--n-loops 8 --n-loops-bwd 4" "--n-loops 8 --n-loops-bwd 1")

if [[ $DRY == 1 ]]; then
  for i in "${!CASES[@]}"; do
    echo "python runs/bench_train.py ${TRAIN[*]} --steps $STEPS ${CASES[$i]} --out $OUT/train/${NAMES[$i]}.json"
  done
  exit 0
fi
# ---- ownership: OUT is bench.sh's own folder (common.py claim, the rule every tool shares; issue 18 §2) ---------
# The request is the benchmark's parameters: a folder made for other ones is refused, not mixed. claim() exits with
# its process, so the script then holds the flock on the marker itself (read-only open: the marker keeps its text).
state=$(python common.py claim "$OUT" bench "${TRAIN[*]} steps $STEPS" ${OVERWRITE:+"$OVERWRITE"} 2>&1) ||
  { state=${state%$'\n'}; echo "runs/bench.sh: ${state##*error: }" >&2; exit 2; }
exec 9<"$OUT/.nanoloop-bench"
flock -n 9 || { echo "runs/bench.sh: OUT $OUT is being written by another bench.sh; pick another folder" >&2; exit 2; }
mkdir -p -- "$OUT/train"
T0=$(date +%s)
hdr() { printf '\n==== %s  [%ds]\n' "$*" "$(( $(date +%s) - T0 ))"; }

hdr "1. training throughput and memory (CPU, fp32 eager, $STEPS timed steps each; tiny models run on 1 thread)"
# One process per case (peak RSS is per process); each writes OUT/train/NAME.json (runs/bench_train.py --out), which
# the ratios below read, and prints the line kept in OUT/train_bench.txt. tok/s per executed layer is the same
# ratio as tok/s here: every case executes l_eff = 10 layers per token.
for i in "${!CASES[@]}"; do
  # shellcheck disable=SC2086
  OMP_NUM_THREADS=1 python runs/bench_train.py "${TRAIN[@]}" --steps "$STEPS" ${CASES[$i]} \
    --out "$OUT/train/${NAMES[$i]}.json" ${OVERWRITE:+"$OVERWRITE"}
done | tee "$OUT/train_bench.txt"
python - "$OUT/train" <<'PY'
import json, os, sys
r = {n: json.load(open(os.path.join(sys.argv[1], n + ".json"))) for n in ("r1", "r4", "r8", "r8_bptt4", "r8_bptt1")}
mem = "peak_rss" if "peak_rss" in r["r1"] else "cuda_max_allocated"
print(f"ratio | tok/s r=4 / r=1 (both execute l_eff = 10 layers per token): "
      f"{r['r4']['tok_per_s'] / r['r1']['tok_per_s']:.2f} (>= ~1: looping costs no speed per executed layer)")
print(f"ratio | memory r=8 / r=1, full BPTT: {r['r8'][mem] / r['r1'][mem]:.2f} | truncated (last 4 / last 1 of 8): "
      f"{r['r8_bptt4'][mem] / r['r1'][mem]:.2f} / {r['r8_bptt1'][mem] / r['r1'][mem]:.2f}")
PY

hdr "2. MuonH step (polar express + sphere retraction) for the 120 matrices of an s = 10 model"
python runs/bench_optim.py --bench-steps 2

hdr "2b. optimizer step, 1 rank vs sharded MuonH on 2 ranks (gloo on CPU, 1 thread per rank, d = 256, 120 matrices)"
OMP_NUM_THREADS=1 python runs/bench_optim.py --scale 4 --bench-steps 3 | tee "$OUT/optim_shard.txt"
OMP_NUM_THREADS=1 python -m torch.distributed.run --standalone --nproc_per_node=2 runs/bench_optim.py --scale 4 \
  --bench-steps 3 2>"$OUT/optim_shard.err" | tee -a "$OUT/optim_shard.txt"
python - "$OUT/optim_shard.txt" <<'PY'
import re, sys
(w1, c1), (w2, c2) = (map(float, re.search(r"([\d.]+) s/step.*CPU ([\d.]+) s", l).groups()) for l in open(sys.argv[1]))
print(f"ratio | optimizer step 1 rank / 2 ranks: wall {w1 / w2:.2f}, CPU per rank {c1 / c2:.2f} (2 = a perfect split "
      "of the Polar Express work; the all-gather and the stacking copies are the rest; wall needs an idle machine)")
PY

hdr "3. tokenise + pack, all cores vs one thread (default corpus, 1,024-piece BPE); the streaming prepare"
python runs/bench_data.py --mb 16 --out "$OUT/data"   # the issue-13 1 GB figure: --mb 1000 (~5 min idle)

hdr "4. fit protocol on the 116-run synthetic grid vs naive scipy"
python runs/bench_fit.py

hdr "5. continuation scoring, batched vs one example at a time (equal-length prompts, then mixed lengths)"
python runs/bench_eval.py --equal-length 64 --out "$OUT/eval_bench_equal.json"
python runs/bench_eval.py --out "$OUT/eval_bench_mixed.json"

hdr "done in $(( $(date +%s) - T0 )) s"
