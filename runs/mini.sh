#!/usr/bin/env bash
# The whole study on a laptop CPU, offline: corpus -> BPE tokenizer -> 2049-style packed rows -> a miniature
# iso-FLOP grid over r in {1,2,4,8} at one effective depth -> validation loss -> the joint law fit -> phi with a
# 95% block-bootstrap CI, the report and the figures. Paper §4.1 (grid), §4.2-4.3 and App. F (fit), scaled down.
#
# Usage: bash runs/mini.sh [--quick] [--dry-run] [--case NAME] [--overwrite] [OUT]   (OUT: out/mini, or out/mini_quick)
#   --quick      a smaller grid (2 budgets, 24 runs) and a lighter fit protocol: a ~2.5 minute smoke test
#   --dry-run    print the launch list (one train.py line per run) and exit
#   --case NAME  a case study (§5, Table 3) at mini scale, NAME in CASES below: trains the looped cells (r = 2, 4, 8)
#                of the same grid with the case's flags into OUT/runs/case_NAME/, reuses the baseline runs already in
#                OUT/runs (training any that are missing: the baseline's r = 1 runs join the case's fit and the whole
#                baseline is refitted for the paired comparison), fits with `fit.py --case NAME` into OUT/case_NAME,
#                and ends with `delta_phi(NAME) = X [lo, hi]` (paired block-bootstrap CI); OUT/report.md then gets
#                the case-study table of every case fitted so far (fit.py --cases OUT). Point OUT at a copy of a
#                finished baseline study (cp -a out/mini out/mini_cases) to train only the case's 33 runs.
# After the fit, the lowest-loss model of each looped r at the largest budget is evaluated at test-time loop
# counts r' in SWEEP (eval.py --n-loops-sweep; App. A loop extrapolation) and the report gets loop_sweep.png.
#   --overwrite  adopt an OUT mini.sh did not make, or made for another grid (nothing deleted; OUT/runs joins the fit)
# OUT is mini.sh's own folder (common.py claim-dir, the ownership rule every tool shares): a new or empty one is
# adopted (OUT/.nanoloop-mini records its grid), a folder mini.sh made for the same grid is resumed (a --case run
# shares its baseline's grid), anything else is refused in one line (exit 2) before any work; mini.sh deletes only
# files it wrote. Cost: 0 GPU-hours; ~15 minutes on a 2-core CPU (README states the measured time). JOBS=2 worker
# processes, one thread each (tiny models use one core better than two). Resumable: every run of the grid goes to
# train.main with --resume, which hands back the record of a finished run of the same identity, resumes a killed
# run from its last checkpoint and refuses a done.json of another run; fit.py reads only done.json, which train.py
# writes atomically as its very last act, so a half-finished run never enters the fit.
#
# How the paper's setup is scaled down (README, "What the mini study can and cannot show"):
#   - l_eff = 10 = 1 + r * l_recur + 1 for r > 1 (l_recur = 8 / r), and the 0-10-0 stack for r = 1 (paper: 20, 2-2);
#   - d = 8 s (aspect ratio 8, head_dim 8) instead of 64 s, s in {1, 2, 3, 4}: at 1e11-3e11 FLOPs per run the
#     compute-optimal models hold only ~10-40K non-embedding parameters (a first grid at d = 16-48 put every
#     minimum at its smallest width; head_dim 4 to reach d = 12 cost more than the width gained), so the widths
#     straddle d ~ 8-32 and the parabolas have their minimum inside the width range;
#   - T = 128, B = 1,024 tokens (8 rows), a 1,024-piece BPE (small, so the unembedding does not dominate FLOPs,
#     yet ~2.2 characters per token on Shakespeare);
#   - HyperP transfer re-anchored at the mini study's own reference: batch rule B_ref = 1,024, width reference
#     10 x aspect = 80, D_ref = 10 x the effective params of that s = 10 model (1-2-1 for looped runs) counted at
#     the run's own r, as the release counts its 2-4-2 reference (train.py prints all three). The
#     base MuonH LR 0.01 came from a 3-point sweep {0.005, 0.01, 0.02} at s = 3, C = 2e11 for r = 1 and r = 4:
#     all within 0.05 nats, 0.01 within 0.02 nats of the best for both (App. D: one LR serves every r).
set -euo pipefail
cd "$(dirname "$0")/.."

# case -> train.py flags of its looped runs (bptt's window is per r: r_bwd = ceil(r / 2), §5.1). A new variant is
# one more line here; its Delta-phi is then `bash runs/mini.sh --case NAME`.
declare -A CASES=([bptt]="" [hc]="--injection hyper --hc-lanes 2" [diagonal]="--injection diagonal"
                  [additive]="--injection additive" [random]="--state-init random --state-init-std 1.0")
QUICK=0; DRY=0; OUT=""; CASE=""; CASE_GIVEN=0; OVERWRITE=0
while (( $# )); do
  case "$1" in
    --quick) QUICK=1 ;;
    --dry-run) DRY=1 ;;
    --overwrite) OVERWRITE=1 ;;
    --case) (( $# >= 2 )) || { echo "runs/mini.sh: --case needs a NAME (one of: ${!CASES[*]})" >&2; exit 2; }
            CASE=$2; CASE_GIVEN=1; shift ;;
    -*) echo "runs/mini.sh: unknown flag $1 (usage: bash runs/mini.sh [--quick] [--dry-run] [--case NAME]" \
             "[--overwrite] [OUT])" >&2; exit 2 ;;
    *) [[ -z $OUT ]] || { echo "runs/mini.sh: two OUT folders given ('$OUT', '${1//$'\n'/\\n}'): name one" >&2
                          exit 2; }
       OUT="$1"; [[ -n "$OUT" ]] || { echo "runs/mini.sh: OUT is empty: name a folder, e.g. out/mini" >&2; exit 2; }
       [[ $OUT != *$'\n'* ]] || { echo "runs/mini.sh: OUT holds a newline: name a plain folder" >&2; exit 2; } ;;
  esac
  shift
done
known=0                                       # compared key by key: bash < 5.2 expands a subscript twice, so
for k in "${!CASES[@]}"; do [[ $k == "$CASE" ]] && known=1; done   # `-v CASES[$CASE]` could run a $(...) in NAME
if [[ $CASE_GIVEN == 1 && $known == 0 ]]; then
  echo "runs/mini.sh: --case wants one of: ${!CASES[*]} (got '${CASE}')" >&2; exit 2
fi
JOBS=${JOBS:-2}
if ! [[ "$JOBS" =~ ^[1-9][0-9]*$ ]]; then
  echo "runs/mini.sh: JOBS=$JOBS must be a whole number >= 1 (worker processes), e.g. JOBS=2" >&2; exit 2
fi
SWEEP=1,2,4,8,16                              # test-time loop counts r' (App. A)

# ---- parameters (the grid) ----------------------------------------------------------------------------------
LOOPS=(1 2 4 8)
VOCAB=1024; SEQ=128; DOC_CHARS=250; BATCH=1024; DEVICE_BATCH=8; LR=0.01; EVAL_TOKENS=65536
ARCH=(--aspect-ratio 8 --head-dim 8 --n-layers-eff 10 --n-layers-prelude 1 --n-layers-coda 1
      --seq-len "$SEQ" --batch-tokens "$BATCH" --device-batch "$DEVICE_BATCH" --lr-batch-ref "$BATCH"
      --muonh-lr "$LR" --eval-tokens "$EVAL_TOKENS" --ckpt-every 100 --resume true)
if [[ $QUICK == 1 ]]; then
  OUT=${OUT:-out/mini_quick}
  BUDGETS=(3e10 6e10)
  declare -A SCALES=([3e10]="1 2 3" [6e10]="1 2 3")
  FIT=(--restarts 100 --bootstrap 50)
else
  OUT=${OUT:-out/mini}
  BUDGETS=(1e11 2e11 3e11)
  declare -A SCALES=([1e11]="1 2 3" [2e11]="1 2 3 4" [3e11]="1 2 3 4")
  FIT=()                                      # the paper's protocol: 500 restarts, 200 bootstrap resamples
fi
DATA="$OUT/data"; RUNS="$OUT/runs"

# ---- the launch list: one train.py invocation per (budget, r, width) ---------------------------------------
# Each entry of ARGS is shell-quoted (shell_line), so an OUT with spaces or non-ASCII characters reaches train.py as
# one argument in any locale.
source runs/launch.bash --functions
NAMES=(); ARGS=(); BASE_NAMES=()   # BASE_NAMES: the baseline grid (a case adds its runs to NAMES)
for C in "${BUDGETS[@]}"; do for r in "${LOOPS[@]}"; do for s in ${SCALES[$C]}; do
  NAMES+=("C${C}_r${r}_s${s}")
  ARGS+=("$(shell_line --flops-budget "$C" --n-loops "$r" --scale "$s" --data "$DATA" \
            --out-dir "$RUNS/C${C}_r${r}_s${s}")")
  BASE_NAMES+=("C${C}_r${r}_s${s}")
  if [[ -n $CASE && $r != 1 ]]; then         # the case's looped cell beside the baseline's (same C, r, s)
    flags=${CASES[$CASE]}; [[ $CASE == bptt ]] && flags="--n-loops-bwd $(( (r + 1) / 2 ))"
    NAMES+=("case_${CASE}/C${C}_r${r}_s${s}")
    ARGS+=("$(shell_line --flops-budget "$C" --n-loops "$r" --scale "$s" --data "$DATA" \
              --out-dir "$RUNS/case_${CASE}/C${C}_r${r}_s${s}")")
    ARGS[-1]+=" $flags --case $CASE"
  fi
done; done; done
if [[ $DRY == 1 ]]; then
  for i in "${!NAMES[@]}"; do echo "python train.py ${ARCH[*]} ${ARGS[$i]}"; done
  exit 0
fi

die() { echo "runs/mini.sh: $*" >&2; exit 1; }
refuse() { echo "runs/mini.sh: $*" >&2; exit 2; }              # a refusal: one line, before any work
# ---- 0. OUT must be mini.sh's own folder (rule 2: never write into, or delete from, a folder it did not make) --
# The request is the grid: a --quick study and a full one (or two versions of the grid) never mix in one runs/
# folder, where fit.py would fit them together. A --case study shares its baseline's grid (BASE_NAMES), so it
# resumes the baseline's folder. common.py claim-dir keeps the marker, OUT/.nanoloop-mini.
GRID="grid $(printf '%s\n' "${ARCH[*]}" "${BASE_NAMES[*]}" | cksum | cut -d' ' -f1) ($([[ $QUICK == 1 ]] && echo quick || echo full))"
MARK="$OUT/.nanoloop-mini"
claim=(python common.py claim-dir "$OUT" mini "$GRID")
(( OVERWRITE )) && claim+=(--overwrite)
if [[ -f $MARK && ! -L $MARK && $(head -c 100 "$MARK") == "grid "* ]]; then   # a marker in words (mini.sh before
  legacy=$(head -c 100 "$MARK")                                                # claim-dir): the grid it names
  [[ $legacy == "$GRID" || $OVERWRITE == 1 ]] ||
    refuse "OUT $OUT holds another mini study ($legacy; this one is $GRID): pick another OUT"
  claim+=(--overwrite)                                         # our own study of this grid: re-marked, as it is
fi
state=$("${claim[@]}" 2>&1) || { state=${state%$'\n'}; refuse "${state##*error: }"; }
mkdir -p -- "$OUT" "$RUNS" ${CASE:+"$RUNS/case_$CASE" "$OUT/case_$CASE"}
if command -v flock >/dev/null; then             # one mini.sh per OUT; the kernel drops the lock when we exit
  exec 9<"$OUT"
  flock -n 9 || die "OUT $OUT is in use by another runs/mini.sh: wait for it, or pick another OUT"
fi

T0=$(date +%s)
say() { printf '[mini %4ds] %s\n' "$(( $(date +%s) - T0 ))" "$*"; }
trap 'kill $(jobs -p) 2>/dev/null; wait 2>/dev/null; echo "[mini] interrupted: rerun the same command to resume" >&2; exit 130' INT TERM
export OMP_NUM_THREADS=1
[[ $state != overwrite ]] || say "adopted $OUT (--overwrite): nothing in it deleted; its runs/ joins this study"

for tmp in "$OUT"/.*.tmp; do                  # temporaries of an interrupted atomic write (never complete files)
  if [[ -f "$tmp" && "$(basename "$tmp")" =~ ^\..+\.([0-9a-f]{8}|[0-9]+)\.tmp$ ]]; then
    rm -f "$tmp"; say "removed $tmp, a temporary file left by an interrupted write"
  fi
done

# A worker claims a run with the folder RUNS/NAME.claim and marks it NAME.claim/ok once train.main has returned its
# record; the claims of an interrupted invocation go first (a claim holding anything else is not mini.sh's).
unclaim() {  # unclaim RUNS/NAME.claim: remove a claim; anything else inside it is not mini.sh's to delete
  rm -f -- "$1/ok"; rmdir -- "$1" 2>/dev/null || refuse "$1 holds what mini.sh did not put there: move it away"
}
for n in "${NAMES[@]}"; do [[ ! -e "$RUNS/$n.claim" ]] || unclaim "$RUNS/$n.claim"; done

# ---- 1. tokenizer and packed data (each step skipped when its output exists; both are written atomically) -----
if [[ ! -f "$OUT/tokenizer.model" ]]; then
  say "training a ${VOCAB}-piece BPE on the default corpus"
  python data.py tokenizer --corpus default --vocab-size "$VOCAB" --doc-chars "$DOC_CHARS" --out "$OUT/tokenizer.model"
fi
if [[ ! -f "$DATA/meta_val.json" ]]; then
  # a prepare killed midway resumes by itself (data.py keeps its state in DATA); nothing is deleted here
  say "packing the default corpus into rows of $((SEQ + 1)) tokens"
  python data.py prepare --source default --doc-chars "$DOC_CHARS" --tokenizer "$OUT/tokenizer.model" \
      --out "$DATA" --seq-len "$SEQ"
fi

# ---- 2. the iso-FLOP grid, JOBS worker processes ---------------------------------------------------------------
# Each worker is one Python process that imports torch once and calls train.main() for the next unclaimed run of
# the launch list -- the same code path as `python train.py <flags>`, minus ~5 s of start-up per run. Every run goes
# to train.main (--resume true): a finished run of the same identity hands back its record at once (and is not
# announced again), a killed one resumes from its ckpt.pt, a done.json of another run stops the grid naming why.
say "grid: ${#NAMES[@]} runs, budgets ${BUDGETS[*]}, r in {${LOOPS[*]}}, $JOBS workers"
for (( i = ${#NAMES[@]} - 1; i >= 0; i-- )); do echo "${NAMES[$i]} ${ARCH[*]} ${ARGS[$i]}"; done > "$OUT/.launch.txt.$$.tmp"
mv -f "$OUT/.launch.txt.$$.tmp" "$OUT/launch.txt"           # atomic, like every file nanoloop writes
worker() {  # take the next unclaimed run of launch.txt (largest budget first) until none is left
  exec python - "$OUT/launch.txt" "$RUNS" "$T0" <<'PY'    # exec: the job pid is python itself, so a kill reaches it
import contextlib, os, shlex, sys, time, traceback
import train
launch, runs, t0 = sys.argv[1], sys.argv[2], int(sys.argv[3])
for line in open(launch).read().splitlines():
    name, *argv = shlex.split(line)
    had_record = os.path.exists(os.path.join(runs, name, "done.json"))    # for the progress line only
    try:
        os.mkdir(os.path.join(runs, name + ".claim"))       # atomic: exactly one worker gets each run
    except FileExistsError:
        continue
    t, log_path = time.time(), os.path.join(runs, name + ".log")
    with open(log_path, "a") as log, contextlib.redirect_stdout(log), contextlib.redirect_stderr(log):
        try:
            rec = train.main(*train.parse_args(argv))
        except (Exception, SystemExit) as err:              # the run's full story goes to its log, one line here
            traceback.print_exc()
            msg = (f"exit status {err.code}" if isinstance(err, SystemExit) else
                   str(err).strip().splitlines()[-1] if str(err).strip() else type(err).__name__)
            sys.__stderr__.write(f"runs/mini.sh: run {name} failed: {msg} (log: {log_path})\n")
            sys.exit(1)
    open(os.path.join(runs, name + ".claim", "ok"), "w").close()   # this run is accounted for
    if not had_record:
        print(f"[mini {time.time() - t0:5.0f}s] done {name}: val_loss {rec['val_loss']:.4f} nats "
              f"({time.time() - t:.0f} s)", flush=True)
PY
}
PIDS=()
for k in $(seq 1 "$JOBS"); do worker & PIDS+=($!); done
unfinished() {  # unfinished claimed|all: the runs without a record from train.main (claimed: only those started)
  for n in "${NAMES[@]}"; do [[ -f "$RUNS/$n.claim/ok" || ( $1 == claimed && ! -d "$RUNS/$n.claim" ) ]] ||
    printf '%s ' "$n"; done
}
left=("${PIDS[@]}")
while (( ${#left[@]} )); do       # poll, not `wait -n`: a worker that exited before the first wait is seen too
  still=()
  for pid in "${left[@]}"; do
    if kill -0 "$pid" 2>/dev/null; then still+=("$pid"); continue; fi
    wait "$pid" && continue                                 # one worker failed: stop the others, then say which run
    kill "${PIDS[@]}" 2>/dev/null || true; wait || true
    die "a worker failed (its run and log are named above; unfinished runs: $(unfinished claimed)); the other" \
        "workers were stopped. Fix the cause and rerun the same command to resume"
  done
  left=(${still[@]+"${still[@]}"})
  (( ${#left[@]} == 0 )) || sleep 1
done
missing=$(unfinished all)                                  # every run accounted for by train.main, none assumed
[[ -z $missing ]] || die "runs without a record from train.main: $missing; rerun the same command to resume"
for n in "${NAMES[@]}"; do unclaim "$RUNS/$n.claim"; done   # every run is done: the claims go

# ---- 3. test-time loop extrapolation (App. A): the lowest-loss model of each looped r at the largest budget ----
# is evaluated at every r' in SWEEP; fit.py picks the curves up from eval.json (skipped when already there)
C=${BUDGETS[-1]}
for SWEEP_DIR in "$RUNS" ${CASE:+"$RUNS/case_$CASE"}; do    # the baseline's models, and the case's
  if [[ $SWEEP_DIR == */case_hc ]]; then
    say "loop sweep skipped for hc: its scalars exist for exactly the trained r (eval.py refuses r' != r)"; continue
  fi
  for r in 2 4 8; do
    best=$(python -c 'import json, sys, os
d, C, r, scales = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4].split()
runs = [os.path.join(d, f"C{C}_r{r}_s{s}") for s in scales]
print(min(runs, key=lambda p: json.load(open(os.path.join(p, "done.json")))["val_loss"]))' \
      "$SWEEP_DIR" "$C" "$r" "${SCALES[$C]}")
    if ! python -c 'import json, sys; sys.exit("n_loops_sweep" not in json.load(open(sys.argv[1])))' \
        "$best/eval.json" 2>/dev/null; then
      say "loop sweep r' in {$SWEEP} of $best"
      python eval.py "$best" --n-loops-sweep "$SWEEP" --tasks none > "$best/sweep.log"
    fi
  done
done

# ---- 4. the joint fit: phi with its bootstrap CI, per-r laws, frontier, report.md and figures ------------------
if [[ -n $CASE ]]; then                       # §5: the case's looped runs in place of the baseline's, paired CI
  say "fitting case $CASE (fit.py --case $CASE ${FIT[*]:-paper protocol})"
  # --overwrite: OUT is mini.sh's own folder (its marker says so), so the fit outputs there are its own to replace,
  # including those of an earlier nanoloop version whose fit.json did not record its request
  python fit.py "$RUNS" --case "$CASE" --out "$OUT/case_$CASE" --overwrite "${FIT[@]}" | tee "$OUT/case_$CASE/fit.log"
  if ! python -c 'import json, sys; sys.exit("loop_sweep" not in json.load(open(sys.argv[1])))' "$OUT/fit.json" \
      2>/dev/null; then                       # the baseline's fit, with its loop sweep, for the case table
    say "refitting the baseline (its fit.json is missing or has no loop sweep)"
    python fit.py "$RUNS" --out "$OUT" --overwrite "${FIT[@]}" > "$OUT/fit.log"
  fi
  python fit.py --cases "$OUT" > /dev/null    # the case-study table of every case so far -> OUT/report.md
  say "report: $OUT/case_$CASE/report.md | case table: $OUT/report.md | total $(( $(date +%s) - T0 )) s"
  grep -E '^delta_phi\(' "$OUT/case_$CASE/fit.log"
  exit 0
fi
say "fitting (fit.py ${FIT[*]:-paper protocol})"
python fit.py "$RUNS" --out "$OUT" --overwrite "${FIT[@]}" | tee "$OUT/fit.log"   # OUT is mini.sh's own

# ---- 5. look at a model: a KV-cached sample from the r = 4 run at the middle width of the largest budget -------
read -r _ S _ <<< "${SCALES[$C]}"                  # the middle width
say "sample from $RUNS/C${C}_r4_s${S} (r = 4, KV-cached decoding):"
python eval.py "$RUNS/C${C}_r4_s${S}" --sample "ROMEO." --max-new-tokens 48 --seed 0 || true
say "report: $OUT/report.md | figures: $OUT/*.png | total $(( $(date +%s) - T0 )) s"
grep -E '^phi = ' "$OUT/fit.log" || true
