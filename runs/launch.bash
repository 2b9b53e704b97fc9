# runs/launch.bash -- sourced by the sweep scripts (runs/*.sh), not run: the one place that says how a run is
# launched, skipped when finished, resumed when preempted, and reported. Usage, after `cd` to the repo root:
#     source runs/launch.bash "$@"      # reads --dry-run from the script's arguments; needs NPROC
#     launch RUN_DIR TRAIN_ARGS...      # one run per call
#     finish "message when all runs succeeded"
DRY_RUN=0
for arg in "$@"; do              # a typo must not launch a sweep (issue 12, rule 5): --dry-run is the only flag
  case "$arg" in
    --dry-run) DRY_RUN=1 ;;
    *) echo "$0: unknown argument '$arg' (usage: bash $0 [--dry-run]; settings go in NPROC=N, OUT=DIR)" >&2; exit 2 ;;
  esac
done
if ! [[ "${NPROC:-}" =~ ^[1-9][0-9]*$ ]]; then
  echo "$0: NPROC=${NPROC:-} must be a whole number >= 1 (GPUs per run), e.g. NPROC=8" >&2; exit 2
fi
FAILED=()

launch() {  # launch RUN_DIR TRAIN_ARGS...: skip a finished run; else train it (--dry-run: print the command)
  local run=$1; shift
  if [[ -f "$run/done.json" ]]; then echo "skip $run (done.json exists)"; return 0; fi
  # --resume: a preempted run continues from its ckpt.pt; train.py writes done.json last, atomically
  local cmd=(torchrun --standalone --nproc_per_node="$NPROC" train.py "$@" --out-dir "$run" --resume)
  if (( DRY_RUN )); then echo "${cmd[*]}"; return 0; fi
  mkdir -p "$run"
  "${cmd[@]}" 2>&1 | tee -a "$run/train.log" || FAILED+=("$run")    # one failure does not stop the sweep
}

finish() {  # finish MESSAGE: a dry run stops here; a sweep with failures exits 1 and names them
  (( DRY_RUN )) && exit 0
  if (( ${#FAILED[@]} )); then printf 'FAILED: %s\n' "${FAILED[@]}" >&2; exit 1; fi
  echo "$*"
}
