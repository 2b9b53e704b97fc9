#!/usr/bin/env bash
# The whole study on a laptop CPU, offline: corpus -> BPE tokenizer -> 2049-style packed rows -> a miniature
# iso-FLOP grid over r in {1,2,4,8} at one effective depth -> validation loss -> the joint law fit -> phi with a
# 95% block-bootstrap CI, the report and the figures. Paper §4.1 (grid), §4.2-4.3 and App. F (fit), scaled down.
#
# Usage: bash runs/mini.sh [--quick] [--dry-run] [--case NAME | --design] [--overwrite] [OUT]
#        bash runs/mini.sh --list-cases       (the case names, one a line)
#        (OUT: out/mini, out/mini_quick or out/mini_design)
#   --quick      a smaller grid (2 budgets, 24 runs) and a lighter fit protocol: a ~2.5 minute smoke test
#   --dry-run    print the launch list (one train.py line per run) and exit
#   --case NAME  a case study (§5, Table 3) at mini scale, NAME in CASES below: trains the looped cells (r = 2, 4, 8)
#                of the same grid with the case's flags into OUT/runs/case_NAME/, reuses the baseline runs already in
#                OUT/runs (training any that are missing: the baseline's r = 1 runs join the case's fit and the whole
#                baseline is refitted for the paired comparison), fits with `fit.py --case NAME` into OUT/case_NAME,
#                and ends with `delta_phi(NAME) = X [lo, hi]` (paired block-bootstrap CI); OUT/report.md then gets
#                the case-study table of every case fitted so far (fit.py --cases OUT). Point OUT at a copy of a
#                finished baseline study (cp -a out/mini out/mini_cases) to train only the case's 33 runs.
#   --design     phi for less (design.py, issue 20): a 20-run pilot (the grid's cells at 1e11 and s <= 2 at 2e11),
#                its fit as the prior, then design.py picks the rest from a wider pool (DESIGN_POOL below) at the same
#                total training FLOPs as the grid above (OUT/reference.txt), with the noise raised until the grid
#                would move phi by +-0.1 (data order, README); trains them and fits pilot + designed runs into OUT
#                (the prior: OUT/pilot/, the design: OUT/design.txt). No loop sweep, no sample.
# After the fit, the lowest-loss model of each looped r at the largest budget is evaluated at test-time loop
# counts r' in SWEEP (eval.py --n-loops-sweep; App. A loop extrapolation) and the report gets loop_sweep.png. A model
# that cannot run r' != r (eval.py asks the model and refuses in one line) is skipped with that line.
#   --overwrite  adopt an OUT mini.sh did not make, or made for another grid (nothing deleted; OUT/runs joins the fit)
# OUT is mini.sh's own folder (`python common.py claim OUT mini GRID`, the ownership rule every tool shares): a new or
# empty one is adopted (OUT/.nanoloop-mini names the grid), a folder mini.sh made for the same grid is resumed (a
# --case run shares its baseline's grid; a cp -a copy is the same study: the marker holds content only), anything
# else is refused in one line (exit 2) before any work, leaving it as it was. One mini.sh per OUT: it holds a flock
# on that marker for its whole run. Cost: 0 GPU-hours; ~15 minutes on a 2-core CPU (README states the measured time).
# JOBS=2 worker processes, one thread each (tiny models use one core better than two). Resumable: every run of the
# grid goes to train.main with --resume, which hands back the record of a finished run of the same identity, resumes
# a killed run from its last checkpoint and refuses a done.json of another run; fit.py reads only done.json, which
# train.py writes atomically as its very last act, so a half-finished run never enters the fit.
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
QUICK=0; DRY=0; OUT=""; CASE=""; CASE_GIVEN=0; OVERWRITE=0; DESIGN=0
while (( $# )); do
  case "$1" in
    --quick) QUICK=1 ;;
    --dry-run) DRY=1 ;;
    --design) DESIGN=1 ;;
    --overwrite) OVERWRITE=1 ;;
    --list-cases) printf '%s\n' "${!CASES[@]}" | sort; exit 0 ;;   # for tests and scripts: no hand-kept copy
    --case) (( $# >= 2 )) || { echo "runs/mini.sh: --case needs a NAME (one of: ${!CASES[*]})" >&2; exit 2; }
            CASE=$2; CASE_GIVEN=1; shift ;;
    -*) echo "runs/mini.sh: unknown flag $1 (usage: bash runs/mini.sh [--quick] [--dry-run] [--case NAME |" \
             "--design] [--overwrite] [OUT], or --list-cases)" >&2; exit 2 ;;
    *) [[ -z $OUT ]] || { echo "runs/mini.sh: two OUT folders given ('$OUT', '${1//$'\n'/\\n}'): name one" >&2
                          exit 2; }
       OUT="$1"; [[ -n "$OUT" ]] || { echo "runs/mini.sh: OUT is empty: name a folder, e.g. out/mini" >&2; exit 2; }
       [[ $OUT != *$'\n'* ]] || { echo "runs/mini.sh: OUT holds a newline: name a plain folder" >&2; exit 2; } ;;
  esac
  shift
done
known=0                                       # compared key by key: bash < 5.2 expands a subscript twice, so
for k in "${!CASES[@]}"; do [[ $k == "$CASE" ]] && known=1; done   # `-v CASES[$CASE]` could run a $(...) in NAME
if [[ $DESIGN == 1 && ( $CASE_GIVEN == 1 || $QUICK == 1 ) ]]; then
  echo "runs/mini.sh: --design takes no --case or --quick (it designs the full study's budget)" >&2; exit 2
fi
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
[[ $DESIGN == 1 ]] && OUT=${OUT:-out/mini_design}
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
if [[ $DESIGN == 1 ]]; then                   # the grid above is only the reference; the pilot is what trains first
  REFERENCE=$(for C in "${BUDGETS[@]}"; do for r in "${LOOPS[@]}"; do for s in ${SCALES[$C]}; do
    echo "C${C}_r${r}_s${s}"; done; done; done)
  BUDGETS=(1e11 2e11); SCALES=([1e11]="1 2 3" [2e11]="1 2")
  DESIGN_POOL=(--budgets 5e10,1e11,1.5e11,2e11,3e11,4e11 --scales 1,2,3,4,5 --tpp 1.1,540 --aspect-ratio 8
               --n-layers-eff 10 --n-layers-prelude 1 --n-layers-coda 1 --seq-len "$SEQ" --vocab-size "$VOCAB"
               --batch-tokens "$BATCH")
fi
DATA="$OUT/data"; RUNS="$OUT/runs"

# ---- the launch list: one train.py invocation per (budget, r, width) ---------------------------------------
# Each entry of ARGS is shell-quoted (shell_line), so an OUT with spaces or non-ASCII characters reaches train.py as
# one argument in any locale.
source runs/launch.bash --functions
NAMES=(); ARGS=(); BASE_NAMES=()   # BASE_NAMES: the baseline grid (a case adds its runs to NAMES)
add_run() {  # add_run C r s: one baseline run of the launch list
  NAMES+=("C$1_r$2_s$3")
  ARGS+=("$(shell_line --flops-budget "$1" --n-loops "$2" --scale "$3" --data "$DATA" --out-dir "$RUNS/C$1_r$2_s$3")")
}
for C in "${BUDGETS[@]}"; do for r in "${LOOPS[@]}"; do for s in ${SCALES[$C]}; do
  add_run "$C" "$r" "$s"
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
# ---- 0. OUT must be mini.sh's own folder (rule 2: never write into a folder it did not make) -----------------------
# The request is the grid: a --quick study and a full one (or two versions of the grid) never mix in one runs/
# folder, where fit.py would fit them together. A --case study shares its baseline's grid (BASE_NAMES), so it
# resumes the baseline's folder. The grid names no path, so a copied study is the same request.
GRID="grid $(printf '%s\n' "${ARCH[*]}" "${BASE_NAMES[*]}" | cksum | cut -d' ' -f1) ($([[ $QUICK == 1 ]] && echo quick || echo full))"
claim=(python common.py claim "$OUT" mini "$GRID")
(( OVERWRITE )) && claim+=(--overwrite)
state=$("${claim[@]}" 2>&1) || refuse "${state##*error: }"    # refused: OUT is left exactly as it was
# One writer: claim's own flock ends with its process, so the script holds one on the same marker until it exits.
# <> opens without truncating (> would empty the marker). The tools mini.sh starts inherit fd 9 and so keep the
# study locked while they write; none of them locks this file (each flocks its own .nanoloop-TOOL in its folder).
exec 9<>"$OUT/.nanoloop-mini"
if command -v flock >/dev/null; then           # no flock(1) (macOS) or no flock on this filesystem: unlocked, as
  flock -n -E 75 9 || [[ $? != 75 ]] ||        # common.claim; 75: the lock is held
    refuse "OUT $OUT is being written by another runs/mini.sh: wait for it, or pick another OUT"
fi
mkdir -p -- "$RUNS" ${CASE:+"$RUNS/case_$CASE"}

T0=$(date +%s)
say() { printf '[mini %4ds] %s\n' "$(( $(date +%s) - T0 ))" "$*"; }
trap 'kill $(jobs -p) 2>/dev/null; wait 2>/dev/null; echo "[mini] interrupted: rerun the same command to resume" >&2; exit 130' INT TERM
export OMP_NUM_THREADS=1
[[ $state != overwrite ]] || say "adopted $OUT (--overwrite): nothing in it deleted; its runs/ joins this study"

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
# The workers share the launch list and a claims folder outside OUT (mktemp: removed when the list is done or mini.sh
# exits), where mkdir takes run i for exactly one worker. A worker exits 0 only after every run it took returned.
CLAIMS=""
trap '[[ -z $CLAIMS ]] || rm -rf -- "$CLAIMS"' EXIT
train_list() {  # section 2 as a function (--design trains twice): every run of NAMES / ARGS, JOBS workers
say "grid: ${#NAMES[@]} runs, budgets ${BUDGETS[*]}, r in {${LOOPS[*]}}, $JOBS workers"
CLAIMS=$(mktemp -d)
for (( i = ${#NAMES[@]} - 1; i >= 0; i-- )); do echo "${NAMES[$i]} ${ARCH[*]} ${ARGS[$i]}"; done > "$CLAIMS/launch.txt"
worker() {  # take the next unclaimed run of the launch list (largest budget first) until none is left
  exec python - "$CLAIMS" "$RUNS" "$T0" <<'PY'    # exec: the job pid is python itself, so a kill reaches it
import contextlib, os, shlex, sys, time, traceback
import train
claims, runs, t0 = sys.argv[1], sys.argv[2], int(sys.argv[3])
for i, line in enumerate(open(os.path.join(claims, "launch.txt")).read().splitlines()):
    name, *argv = shlex.split(line)
    try:
        os.mkdir(os.path.join(claims, str(i)))             # atomic: exactly one worker gets each run
    except FileExistsError:
        continue
    had_record = os.path.exists(os.path.join(runs, name, "done.json"))    # for the progress line only
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
    if not had_record:
        print(f"[mini {time.time() - t0:5.0f}s] done {name}: val_loss {rec['val_loss']:.4f} nats "
              f"({time.time() - t:.0f} s)", flush=True)
PY
}
PIDS=()
for k in $(seq 1 "$JOBS"); do worker & PIDS+=($!); done
left=("${PIDS[@]}")
while (( ${#left[@]} )); do       # poll, not `wait -n`: a worker that exited before the first wait is seen too
  still=()
  for pid in "${left[@]}"; do
    if kill -0 "$pid" 2>/dev/null; then still+=("$pid"); continue; fi
    wait "$pid" && continue                                 # one worker failed: stop the others, then say which run
    kill "${PIDS[@]}" 2>/dev/null || true; wait || true
    die "a worker failed (its run and log are named above); the other workers were stopped. Fix the cause and" \
        "rerun the same command to resume"
  done
  left=(${still[@]+"${still[@]}"})
  (( ${#left[@]} == 0 )) || sleep 1
done
rm -rf -- "$CLAIMS"; CLAIMS=""                             # every worker exited 0: every run returned its record
}
train_list
if [[ $DESIGN == 1 ]]; then                   # issue 20: pilot fit -> design.py -> the designed runs -> one fit
  printf '%s\n' "$REFERENCE" > "$OUT/.reference.txt.$$.tmp" && mv -f "$OUT/.reference.txt.$$.tmp" "$OUT/reference.txt"
  say "pilot fit (the design's prior): fit.py --restarts 100 --bootstrap 0"
  python fit.py "$RUNS" --out "$OUT/pilot" --overwrite --restarts 100 --bootstrap 0 > "$OUT/pilot.log"
  python design.py plan --runs "$RUNS" --prior "$OUT/pilot/fit.json" --reference "$OUT/reference.txt" \
    --noise-phi 0.1 "${DESIGN_POOL[@]}" --out "$OUT/design.txt" --overwrite > /dev/null
  say "$(head -n 1 "$OUT/design.txt")"
  while read -r name _; do                    # C<budget>_r<n_loops>_s<scale>, design.py's run names
    [[ $name =~ ^C([0-9.e]+)_r([0-9]+)_s([0-9]+)$ ]] && add_run "${BASH_REMATCH[@]:1:3}"
  done < "$OUT/design.txt"
  train_list
  say "fitting pilot + designed runs (fit.py ${FIT[*]:-paper protocol})"
  python fit.py "$RUNS" --out "$OUT" --overwrite "${FIT[@]}" | tee "$OUT/fit.log"
  say "report: $OUT/report.md | design: $OUT/design.txt | total $(( $(date +%s) - T0 )) s"
  grep -E '^phi = ' "$OUT/fit.log" || true
  exit 0
fi

# ---- 3. test-time loop extrapolation (App. A): the lowest-loss model of each looped r at the largest budget ----
# is evaluated at every r' in SWEEP; fit.py picks the curves up from eval.json (skipped when already there)
C=${BUDGETS[-1]}
for SWEEP_DIR in "$RUNS" ${CASE:+"$RUNS/case_$CASE"}; do    # the baseline's models, and the case's
  for r in 2 4 8; do
    best=$(python -c 'import json, sys, os
d, C, r, scales = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4].split()
runs = [os.path.join(d, f"C{C}_r{r}_s{s}") for s in scales]
print(min(runs, key=lambda p: json.load(open(os.path.join(p, "done.json")))["val_loss"]))' \
      "$SWEEP_DIR" "$C" "$r" "${SCALES[$C]}")
    if ! python -c 'import json, sys; sys.exit("n_loops_sweep" not in json.load(open(sys.argv[1])))' \
        "$best/eval.json" 2>/dev/null; then
      say "loop sweep r' in {$SWEEP} of $best"
      # eval.py decides which models can run r' != r (the model says so) and refuses the others in one line, exit 2
      rc=0; why=$(python eval.py "$best" --n-loops-sweep "$SWEEP" --tasks none 2>&1 >> "$OUT/sweep.log") || rc=$?
      case $rc in
        0) ;;
        2) say "loop sweep skipped: ${why##*$'\n'}" ;;
        *) die "eval.py failed on $best (exit $rc): ${why##*$'\n'}" ;;
      esac
    fi
  done
done

# ---- 4. the joint fit: phi with its bootstrap CI, per-r laws, frontier, report.md and figures ------------------
if [[ -n $CASE ]]; then                       # §5: the case's looped runs in place of the baseline's, paired CI
  say "fitting case $CASE (fit.py --case $CASE ${FIT[*]:-paper protocol})"
  # --overwrite: OUT is mini.sh's own folder (its marker says so), so the fit outputs there are its own to replace,
  # including those of an earlier nanoloop version whose fit.json did not record its request
  python fit.py "$RUNS" --case "$CASE" --out "$OUT/case_$CASE" --overwrite "${FIT[@]}" | tee "$OUT/fit_case_$CASE.log"
  if ! python -c 'import json, sys; sys.exit("loop_sweep" not in json.load(open(sys.argv[1])))' "$OUT/fit.json" \
      2>/dev/null; then                       # the baseline's fit, with its loop sweep, for the case table
    say "refitting the baseline (its fit.json is missing or has no loop sweep)"
    python fit.py "$RUNS" --out "$OUT" --overwrite "${FIT[@]}" > "$OUT/fit.log"
  fi
  # the case-study table of every case so far -> OUT/report.md (mini.sh's own, like the fits above: --overwrite)
  python fit.py --cases "$OUT" --overwrite > /dev/null
  say "report: $OUT/case_$CASE/report.md | case table: $OUT/report.md | total $(( $(date +%s) - T0 )) s"
  grep -E '^delta_phi\(' "$OUT/fit_case_$CASE.log"
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
