#!/usr/bin/env bash
# runs/gpu_session.sh -- every GPU measurement of issue 25 in one prepared call (a lent H200: ~15 min of device time,
# start-up included, so this script keeps to --budget seconds, 450 by default: under 8 minutes, compiles included).
#
# Purpose: in priority order, each step started only while the budget lasts (whatever was measured is kept):
#          1. the environment: nvidia-smi's line, torch / CUDA / cuDNN / NCCL / triton versions   (OUT/env.txt)
#          2. runs/gpu_check.py under --check-budget, stages --check-stages (default 1,5: the environment and the
#             2-rank check, whose gloo fallback no CPU test can prove on CUDA tensors)          (OUT/gpu_check.json)
#          3. the small-width levers (runs/bench_train.py --levers), one JSON per cell (OUT/levers/sS_rR_LEVER.json):
#             a. baseline: s = 6 and 10, r = 1 and 8 (the grid's step: 32 rows x 4, compile default, SDPA auto)
#             b. s = 6, r = 1 and 8: cuDNN attention, CUDA graphs (reduce-overhead), 64 rows x 2
#             c. s = 6, r = 1: the three together, then max-autotune-no-cudagraphs (a compile of minutes)
#             d. s = 10, r = 1 and 8: the levers of b
#          Each cell prints one line "bench | ... | tok/s .. | mfu 41.0% .. | lever cudnn: .. compile .. s"; the
#          targets: s = 6 >= 42 %, s = 10 >= 50 % MFU, r = 8 within 3 % of r = 1. A compile takes 50-60 s per cell
#          (H200, cold); inductor's on-disk cache (TORCHINDUCTOR_CACHE_DIR, kept outside OUT) serves repeats.
# Usage:   bash runs/gpu_session.sh [--budget S] [--check-stages LIST|none] [--check-budget S] [OUT]
#          bash runs/gpu_session.sh --cpu-smoke [OUT]     tiny models on CPU: every step above, in ~2 min (CI)
#          bash runs/gpu_session.sh --dry-run             the plan: each command, nothing run
# Output:  OUT (default: $OUT, else out/gpu_session; a folder this script owns: common.py claim): env.txt,
#          gpu_check.json, levers/*.json (each written as soon as measured), session.log (this stdout), stderr.log
#          (compile warnings, tracebacks: kept out of stdout, whose tail the device tool returns).
set -euo pipefail
cd "$(dirname "$0")/.."
BUDGET=450; CHECK_STAGES=1,5; CHECK_BUDGET=130; SMOKE=""; DRY=0; DIR=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --budget) BUDGET=$2; shift ;;
    --check-stages) CHECK_STAGES=$2; shift ;;
    --check-budget) CHECK_BUDGET=$2; shift ;;
    --cpu-smoke) SMOKE=--cpu-smoke ;;
    --dry-run) DRY=1 ;;
    -*) echo "runs/gpu_session.sh: unknown flag $1 (usage: bash runs/gpu_session.sh [--budget S] [--check-stages" \
             "LIST|none] [--check-budget S] [--cpu-smoke] [--dry-run] [OUT])" >&2; exit 2 ;;
    *) DIR=$1 ;;
  esac
  shift
done
for n in "$BUDGET" "$CHECK_BUDGET"; do
  [[ $n =~ ^[0-9]+$ ]] || { echo "runs/gpu_session.sh: a budget is whole seconds, got '$n'" >&2; exit 2; }
done
OUT=${DIR:-${OUT:-out/gpu_session}}

# ---- the plan ---------------------------------------------------------------------------------------------------
# One runs/bench_train.py call per line "s r LEVER...", in priority order: the grid's step is 32 rows x 4 (B = 262,144
# tokens at T = 2048). Smoke: d = 4 s on CPU (3 or 5 heads, as at d = 64 s), 8 layers, T = 64, 4 rows; rows2 for rows64.
STEP=(--device-batch 32 --accum 4 --steps 3); R=rows64; MIN_S=60
if [[ -n $SMOKE ]]; then
  STEP=(--aspect-ratio 4 --head-dim 8 --n-layers-prelude 0 --n-layers-coda 0 --n-layers-eff 8 --vocab-size 256
        --seq-len 64 --device-batch 4 --accum 1 --steps 2); R=rows2; MIN_S=5
fi
CELLS=("6 1 base" "6 8 base" "10 1 base" "10 8 base"
       "6 1 cudnn reduce-overhead $R" "6 8 cudnn reduce-overhead $R"
       "6 1 $R+cudnn+reduce-overhead max-autotune-no-cudagraphs"
       "10 1 cudnn reduce-overhead $R" "10 8 cudnn reduce-overhead $R")
cell_cmd() { set -- $1; echo "runs/bench_train.py --scale $1 --n-loops $2 ${STEP[*]} --levers ${*:3} --out $OUT/levers"; }
CHECK=(runs/gpu_check.py --stages "$CHECK_STAGES" --budget "$CHECK_BUDGET" --out "$OUT/gpu_check.json" $SMOKE)
if [[ $DRY == 1 ]]; then
  echo "gpu-session: budget $BUDGET s, OUT $OUT, inductor cache \${TMPDIR:-/tmp}/nanoloop-inductor"
  [[ $CHECK_STAGES == none ]] || echo "gpu-session: python ${CHECK[*]}"
  for c in "${CELLS[@]}"; do echo "gpu-session: python $(cell_cmd "$c")"; done
  exit 0
fi

# ---- ownership, caches -------------------------------------------------------------------------------------------
# OUT is this script's (common.py claim: new, empty, or its own for the same budget); the flock is then held here
state=$(python common.py claim "$OUT" gpu_session "budget $BUDGET $SMOKE" 2>&1) ||
  { state=${state%$'\n'}; echo "runs/gpu_session.sh: ${state##*error: }" >&2; exit 2; }
exec 9<"$OUT/.nanoloop-gpu_session"
flock -n 9 || { echo "runs/gpu_session.sh: OUT $OUT is being written by another gpu_session.sh" >&2; exit 2; }
# One inductor cache for every process of the session (FX graph + AOT autograd caches): a graph compiled once is
# loaded, not compiled, by the next process that builds it. Outside OUT: the device tool returns OUT's files.
export TORCHINDUCTOR_CACHE_DIR=${TORCHINDUCTOR_CACHE_DIR:-${TMPDIR:-/tmp}/nanoloop-inductor}
export TORCHINDUCTOR_FX_GRAPH_CACHE=1 TORCHINDUCTOR_AUTOGRAD_CACHE=1
T0=$(date +%s); END=$((T0 + BUDGET))
log() { echo "gpu-session [$(( $(date +%s) - T0 ))s] $*" | tee -a "$OUT/session.log"; }

# ---- 1. environment ------------------------------------------------------------------------------------------------
{ nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv,noheader 2>/dev/null ||
    echo "no nvidia-smi"
  python -c "import importlib.util as u, torch; c = torch.cuda.is_available(); print('torch', torch.__version__,
'cuda', torch.version.cuda, 'cudnn', torch.backends.cudnn.version(), 'nccl', c and torch.cuda.nccl.version(),
'triton', u.find_spec('triton') and __import__('triton').__version__, 'flash_attn', bool(u.find_spec('flash_attn')),
'device', c and torch.cuda.get_device_name())"; } > "$OUT/env.txt" 2>&1
log "env: $(tr '\n' ' ' < "$OUT/env.txt")"

# ---- 2. gpu_check under its budget ---------------------------------------------------------------------------------
if [[ $CHECK_STAGES != none ]]; then
  rc=0; timeout $((CHECK_BUDGET + 30)) python "${CHECK[@]}" 2>>"$OUT/stderr.log" | cut -c1-400 |
    tee -a "$OUT/session.log" || rc=$?
  log "gpu_check exit $rc"
fi

# ---- 3. the levers, one (s, r) at a time while the budget lasts -----------------------------------------------------
for c in "${CELLS[@]}"; do
  left=$((END - $(date +%s)))
  if (( left < MIN_S )); then log "budget spent: skipped $c"; continue; fi
  rc=0
  # shellcheck disable=SC2046
  timeout --kill-after=10 "$left" python $(cell_cmd "$c") 2>>"$OUT/stderr.log" | cut -c1-700 |
    sed -E 's/mfu n\/a[^|]*/mfu n\/a /' | tee -a "$OUT/session.log" || rc=$?
  (( rc == 0 )) || log "bench_train exit $rc ($c)"
done
log "done; the cells (MFU %, tok/s, peak GiB, compile s):"
python - "$OUT/levers" <<'PY'
import glob, json, os, sys
for f in sorted(glob.glob(os.path.join(sys.argv[1], "*.json")), key=os.path.getmtime):
    c = json.load(open(f))
    ok, mem = "error" not in c, c.get("cuda_max_allocated", c.get("peak_rss", 0)) / 2**30
    mfu = f"{100 * c['mfu']:5.1f}" if ok and c["mfu"] else "  n/a"
    print(f"  s{c['scale']:<2} r{c['n_loops']} {c['lever']:<36} " + (f"{mfu} {c['tok_per_s']:>10,.0f} {mem:6.1f} "
          f"{c['compile_s']:5.0f}" if ok else "failed: " + c["error"][:80]))
PY
