# runs/launch.bash -- sourced, not run: the one place that says how a sweep's run is launched, resumed and
# reported, and how a launch line is printed. Usage, after `cd` to the repo root:
#     source runs/launch.bash "$@"      # a sweep script: reads --dry-run, --only FILE from its arguments; needs NPROC
#     launch RUN_DIR TRAIN_ARGS...      # one run per call
#     finish "message when all runs succeeded"
#     source runs/launch.bash --functions   # runs/mini.sh, runs/slurm.sh: shell_line only, no argument parsing
# "Finished" is train.py's decision, never this file's: every run is handed to `train.py --resume`, which hands
# back the record of a finished run of the same identity (exit 0 at once), continues a preempted one from its
# ckpt.pt, and refuses a done.json that is torn or of another run (one line, exit 2). A 0-byte done.json, or one
# copied from another run, therefore never counts as finished here; a run folder copied whole is the same run.
# --only FILE: only the runs FILE names (the first word of a line is a run folder's name, e.g. C1e18_r2_s8; blank
# lines and # comments skipped; design.py plan writes such lists). The sweep's launches are collected first and
# finish() starts them, so a name the sweep does not have is refused (one line, exit 2) before anything runs.

shell_line() {  # shell_line WORD...: one line that bash (`read -a`, or pasted) and Python's shlex read back as WORDs
  # Characters special to a shell get a backslash; bytes above ASCII pass untouched. printf %q is not used: under
  # LC_ALL=C it writes $'\303\251' for an "é", which shlex (runs/mini.sh's workers) reads as other characters.
  local w c i s out=()
  for w in "$@"; do
    if [[ -z $w ]]; then out+=("''"); continue; fi
    s=""
    for (( i = 0; i < ${#w}; i++ )); do
      c=${w:i:1}
      case $c in [\ \	\'\"\\\$\`\*\?\[\]\{\}\(\)\<\>\|\&\;\#\~\!]) s+="\\$c" ;; *) s+=$c ;; esac
    done
    out+=("$s")
  done
  printf '%s\n' "${out[*]}"
}
if [[ ${1:-} == --functions ]]; then return 0; fi

DRY_RUN=0; ONLY=""
while (( $# )); do               # a typo must not launch a sweep (issue 12, rule 5): these are the only flags
  case "$1" in
    --dry-run) DRY_RUN=1 ;;
    --only) [[ -n "${2:-}" ]] || { echo "$0: --only needs a FILE (a run list, e.g. from design.py plan)" >&2; exit 2; }
            ONLY=$2; shift ;;
    *) echo "$0: unknown argument '$1' (usage: bash $0 [--dry-run] [--only FILE]; settings go in NPROC=N, OUT=DIR)" >&2
       exit 2 ;;
  esac
  shift
done
declare -A WANT=() SEEN=(); QUEUE=()
if [[ -n "$ONLY" ]]; then        # the list is read (and refused) before any run starts
  [[ -f "$ONLY" && -r "$ONLY" ]] || { echo "$0: --only $ONLY: not a readable file" >&2; exit 2; }
  while read -r name _ || [[ -n "${name:-}" ]]; do
    [[ -z "$name" || "$name" == \#* ]] && continue
    [[ "$name" =~ ^[A-Za-z0-9][A-Za-z0-9._+-]*$ ]] || {
      echo "$0: --only $ONLY: '$name' is not a run name (one per line, e.g. C1e18_r2_s8)" >&2; exit 2; }
    WANT[$name]=1
  done < "$ONLY"
  (( ${#WANT[@]} )) || { echo "$0: --only $ONLY lists no runs" >&2; exit 2; }
fi
if ! [[ "${NPROC:-}" =~ ^[1-9][0-9]*$ ]]; then
  echo "$0: NPROC=${NPROC:-} must be a whole number >= 1 (GPUs per run), e.g. NPROC=8" >&2; exit 2
fi
N_RUNS=0; N_RECORDS=0; FAILED=()
# Ctrl-C / a scheduler's TERM stops the whole sweep (torchrun exits non-zero on SIGINT, which would otherwise read as
# one failed run and go on to the next); the trap runs once the run in the foreground has stopped.
trap 'echo "$0: interrupted at run $N_RUNS; rerun the same command to resume" >&2; exit 130' INT TERM

launch() {  # launch RUN_DIR TRAIN_ARGS...: train.py --resume decides (see the header); --dry-run prints the line
  local run=$1 rc=0; shift
  if [[ -z $run || $run == *$'\n'* ]]; then          # a line-based listing cannot carry it; nothing launched yet
    echo "$0: run folder '${run//$'\n'/\\n}' is empty or holds a newline: set OUT to a plain folder name" >&2; exit 2
  fi
  [[ $run == -* ]] && run=./$run                     # OUT=-x: a folder, never read as a flag by mkdir or argparse
  if [[ -n "$ONLY" ]]; then                          # --only: keep the listed runs for finish() to start
    [[ -n "${WANT[${run##*/}]:-}" ]] || return 0
    SEEN[${run##*/}]=1; QUEUE+=("$(shell_line "$run" "$@")"); return 0
  fi
  N_RUNS=$((N_RUNS + 1)); [[ -e $run/done.json ]] && N_RECORDS=$((N_RECORDS + 1))   # counted for the summary only
  local cmd=(torchrun --standalone --nproc_per_node="$NPROC" train.py "$@" --out-dir "$run" --resume)
  if (( DRY_RUN )); then shell_line "${cmd[@]}"; return 0; fi
  if [[ -L $run/train.log ]]; then                   # appending would write through the link into someone's file
    echo "$0: $run/train.log is a link; move it away (this run is counted failed)" >&2; FAILED+=("$run (link)")
    return 0
  fi
  # one failure (a refused record or flag, a crash) is counted and named with train.py's one-line reason, and the
  # sweep goes on; the reason is read from what this launch appended to the log (it starts at byte `seen`)
  local seen=0 why
  if ! mkdir -p -- "$run" 2>/dev/null; then FAILED+=("$run (cannot make this folder: a file in the way?)"); return 0; fi
  [[ -f $run/train.log ]] && seen=$(wc -c < "$run/train.log")
  "${cmd[@]}" 2>&1 | tee -a -- "$run/train.log" || rc=$?
  if (( rc )); then
    why=$(tail -c +$((seen + 1)) -- "$run/train.log" 2>/dev/null | grep -a 'train.py: error: ' | tail -n 1) || true
    FAILED+=("$run (exit $rc${why:+: ${why#*train.py: error: }})")
  fi
}

finish() {  # finish MESSAGE: the summary line; a sweep with a failed run exits 1 naming each, else prints MESSAGE
  if [[ -n "$ONLY" ]]; then      # every listed name must be one of this sweep's runs; then the queue starts
    local n missing=() q
    for n in "${!WANT[@]}"; do [[ -n "${SEEN[$n]:-}" ]] || missing+=("$n"); done
    if (( ${#missing[@]} )); then
      echo "$0: --only $ONLY names ${#missing[@]} run(s) this sweep does not have: ${missing[*]:0:3}" >&2; exit 2
    fi
    ONLY=""
    for q in ${QUEUE[@]+"${QUEUE[@]}"}; do eval "launch $q"; done
  fi
  if (( DRY_RUN )); then
    echo "$0: $N_RUNS runs listed (dry run); $N_RECORDS have a done.json, which train.py --resume checks" >&2
    exit 0
  fi
  echo "$0: $N_RUNS runs: $((N_RUNS - ${#FAILED[@]})) finished, ${#FAILED[@]} failed"
  if (( ${#FAILED[@]} )); then printf 'FAILED: %s\n' "${FAILED[@]}" >&2; exit 1; fi
  echo "$*"
}
