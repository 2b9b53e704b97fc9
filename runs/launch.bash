# runs/launch.bash -- sourced by the sweep scripts (runs/*.sh), not run: the one place that says how a run is
# launched, skipped when finished, resumed when preempted, and reported. Usage, after `cd` to the repo root:
#     source runs/launch.bash "$@"      # reads --dry-run and --only FILE from the script's arguments; needs NPROC
#     launch RUN_DIR TRAIN_ARGS...      # one run per call
#     finish "message when all runs succeeded"
# --only FILE: only the runs FILE names (first word per line = the run folder's name, e.g. C1e18_r2_s8; # comments
# and blank lines skipped; design.py plan writes such lists). The sweep's launches are collected first and finish()
# starts them, so a name the sweep does not have is refused before anything runs.
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
if [[ -n "$ONLY" ]]; then
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
FAILED=()

launch() {  # launch RUN_DIR TRAIN_ARGS...: skip a finished run; else train it (--dry-run: print the command)
  local run=$1; shift
  if [[ -n "$ONLY" ]]; then      # --only: keep the listed runs for finish() to start
    [[ -n "${WANT[${run##*/}]:-}" ]] || return 0
    SEEN[${run##*/}]=1; QUEUE+=("$(printf '%q ' "$run" "$@")"); return 0
  fi
  if [[ -f "$run/done.json" ]]; then echo "skip $run (done.json exists)"; return 0; fi
  # --resume: a preempted run continues from its ckpt.pt; train.py writes done.json last, atomically
  local cmd=(torchrun --standalone --nproc_per_node="$NPROC" train.py "$@" --out-dir "$run" --resume)
  if (( DRY_RUN )); then echo "${cmd[*]}"; return 0; fi
  mkdir -p "$run"
  "${cmd[@]}" 2>&1 | tee -a "$run/train.log" || FAILED+=("$run")    # one failure does not stop the sweep
}

finish() {  # finish MESSAGE: a dry run stops here; a sweep with failures exits 1 and names them
  if [[ -n "$ONLY" ]]; then      # every listed name must be one of this sweep's runs; then start the queue
    local n missing=() q
    for n in "${!WANT[@]}"; do [[ -n "${SEEN[$n]:-}" ]] || missing+=("$n"); done
    if (( ${#missing[@]} )); then
      echo "$0: --only $ONLY names ${#missing[@]} run(s) this sweep does not have: ${missing[*]:0:3}" >&2; exit 2
    fi
    ONLY=""
    for q in "${QUEUE[@]}"; do eval "launch $q"; done
  fi
  (( DRY_RUN )) && exit 0
  if (( ${#FAILED[@]} )); then printf 'FAILED: %s\n' "${FAILED[@]}" >&2; exit 1; fi
  echo "$*"
}
