#!/usr/bin/env bash
#SBATCH --job-name=nanoloop
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=1
#SBATCH --gpus-per-node=8
#SBATCH --cpus-per-task=32
#SBATCH --mem=0
#SBATCH --time=24:00:00
#SBATCH --requeue
#SBATCH --output=%x-%j.out
# runs/slurm.sh -- one train.py run across one or more nodes under SLURM (torchrun, c10d), or a whole sweep.
#
# Purpose: srun starts one torchrun per node; they meet at the allocation's first node on MASTER_PORT and start
#          NPROC ranks each (nccl). The global batch stays B tokens whatever the world size (train.py asserts
#          B = device_batch x seq_len x world x accum), so a multi-node run trains on the rows and FLOPs of a
#          single-node one. --resume is always passed: a preempted job (--requeue) continues from its ckpt.pt; a
#          finished run of the same identity hands back its record at once (train.py decides, never the mere
#          existence of a done.json: a torn, foreign or other run's done.json is refused, exit 2). Rank 0 decides
#          for every rank, so every node must see the same out-dir: put out/ on storage all nodes mount (a folder
#          only some nodes see is the launcher's to avoid; nothing checks it).
#          --mem=0 gives the job all of each node's memory; srun gets --cpus-per-task explicitly (SLURM >= 22.05
#          no longer passes the batch step's value on to srun).
# Usage:   sbatch --nodes=4 runs/slurm.sh --flops-budget 2.15e19 --n-loops 4 --scale 34 --out-dir out/grid/C2.15e19_r4_s34
#          (submit from the repo root: sbatch runs a copy of this script, so it cd's to SLURM_SUBMIT_DIR)
#          bash runs/slurm.sh --dry-run TRAIN_ARGS...      print the launch line (outside SLURM: 1 node, localhost)
#          bash runs/slurm.sh --sweep runs/grid.sh [--dry-run]
#                   one sbatch per run of the sweep, except runs already queued under their job name (squeue);
#                   a finished run's job hands back its record at once. SBATCH_ARGS="--nodes=2 --partition=p" are
#                   passed on (split at blanks, never globbed)
# Environment: NANOLOOP_ENV=FILE is sourced before anything runs (e.g. a venv's bin/activate, or a script with
#          `module load ...; conda activate ...`); srun passes the resulting environment to every node.
# Cost:    that of the run passed in (see the sweep scripts and `python flops.py grid --mfu 0.4`).
set -euo pipefail
cd "${SLURM_SUBMIT_DIR:-$(dirname "$0")/..}"
die() { echo "runs/slurm.sh: $*" >&2; exit 2; }
if [[ -n "${NANOLOOP_ENV:-}" ]]; then                      # the user's environment hook (see the header)
  [[ -f "$NANOLOOP_ENV" ]] || die "NANOLOOP_ENV=$NANOLOOP_ENV is not a file"
  set +u                                                  # activate scripts often read unset variables
  # shellcheck disable=SC1090
  source "$NANOLOOP_ENV"
  set -u
fi

source runs/launch.bash --functions                       # shell_line: a launch line any shell or shlex reads back
DRY_RUN=0; SWEEP=""
while (( $# )); do
  case "$1" in
    --dry-run) DRY_RUN=1; shift ;;
    --sweep) [[ -n "${2:-}" ]] || die "--sweep needs a sweep script, e.g. --sweep runs/grid.sh"; SWEEP=$2; shift 2 ;;
    --sweep=*) SWEEP=${1#--sweep=}; shift ;;
    *) break ;;
  esac
done
whole() { [[ $2 =~ ^[1-9][0-9]*$ ]] || die "$1=$2 must be a whole number >= 1${3:+ ($3)}"; }
[[ -z ${NPROC:-} ]] || whole NPROC "$NPROC" "GPUs per node"

if [[ -n "$SWEEP" ]]; then                                # a sweep: one job per launch line not yet queued
  [[ -f "$SWEEP" ]] || die "--sweep $SWEEP: no such script"
  (( $# )) && die "--sweep takes no train.py flags (got: $*); the sweep script sets them"
  read -ra sb_args <<< "${SBATCH_ARGS:-}"                 # split at blanks on purpose; never globbed
  queued=""
  if command -v squeue >/dev/null; then queued=$(squeue -h -u "${USER:-$(id -un)}" -o %j); fi
  errs=$(mktemp); trap 'rm -f "$errs"' EXIT               # the sweep's own one-line error, if it has one
  listing=$(NPROC=${NPROC:-8} bash "$SWEEP" --dry-run 2>"$errs") ||
    die "bash $SWEEP --dry-run failed: $(grep -v '^$' "$errs" | tail -n 1)"
  n_sub=0; n_rec=0; n_queued=0; n_fail=0
  while IFS= read -r line; do
    [[ $line == *train.py\ * ]] || continue
    read -a words <<< "${line#*train.py }"                # the train.py flags (read undoes shell_line's escapes)
    out=""
    for i in "${!words[@]}"; do
      [[ ${words[$i]} == --out-dir ]] && out=${words[$((i + 1))]:-}
      [[ ${words[$i]} == --out-dir=* ]] && out=${words[$i]#--out-dir=}
    done
    [[ -n "$out" ]] || die "a launch line of $SWEEP has no --out-dir: $line"
    name="nl-${out//\//-}"                              # unique per out-dir
    if grep -qxF -- "$name" <<< "$queued"; then n_queued=$((n_queued + 1)); continue; fi
    [[ -e $out/done.json ]] && n_rec=$((n_rec + 1))      # counted only: the job's train.py --resume decides
    sub=(sbatch --job-name="$name" ${sb_args[@]+"${sb_args[@]}"} runs/slurm.sh "${words[@]}")
    if (( DRY_RUN )); then shell_line "${sub[@]}"; elif ! "${sub[@]}"; then n_fail=$((n_fail + 1)); continue; fi
    n_sub=$((n_sub + 1))
  done <<< "$listing"
  echo "sweep $SWEEP: $n_sub submitted$( ((DRY_RUN)) && echo ' (dry run)') ($n_rec with a done.json: their jobs" \
       "hand back the record if it is the same run), $n_queued already queued (skipped), $n_fail failed to submit" >&2
  (( n_fail == 0 )) || exit 1
  exit 0
fi

(( $# )) || die "usage: sbatch [--nodes=N] runs/slurm.sh TRAIN_ARGS... | bash runs/slurm.sh --sweep SCRIPT (see the header)"
OUT_DIR=out/run                                           # train.py's default, unless --out-dir is given
args=("$@")
for i in "${!args[@]}"; do
  case "${args[$i]}" in
    --out-dir) OUT_DIR=${args[$((i + 1))]:-}; [[ -n "$OUT_DIR" ]] || die "--out-dir needs a value" ;;
    --out-dir=*) OUT_DIR=${args[$i]#--out-dir=}; [[ -n "$OUT_DIR" ]] || die "--out-dir= needs a value" ;;
  esac
done

NPROC=${NPROC:-${SLURM_GPUS_ON_NODE:-8}}                 # ranks per node = GPUs per node
whole NPROC "$NPROC" "GPUs per node; SLURM_GPUS_ON_NODE gives it inside a job"
NNODES=${SLURM_NNODES:-1}
MASTER_PORT=${MASTER_PORT:-29500}
whole MASTER_PORT "$MASTER_PORT" "the rendezvous port"
(( MASTER_PORT <= 65535 )) || die "MASTER_PORT=$MASTER_PORT must be a port number <= 65535"
if [[ -n "${SLURM_JOB_NODELIST:-}" ]]; then               # rendezvous host: the allocation's first node
  MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
else
  MASTER_ADDR=localhost
fi
cmd=(torchrun --nnodes="$NNODES" --nproc_per_node="$NPROC" --rdzv_id="${SLURM_JOB_ID:-local}" --rdzv_backend=c10d
     --rdzv_endpoint="$MASTER_ADDR:$MASTER_PORT" train.py "$@" --resume)
launcher=()
if [[ -n "${SLURM_JOB_ID:-}" ]]; then                     # one torchrun per node, with the job's CPUs
  launcher=(srun --ntasks-per-node=1 --kill-on-bad-exit=1)
  [[ -n "${SLURM_CPUS_PER_TASK:-}" ]] && launcher+=(--cpus-per-task="$SLURM_CPUS_PER_TASK")
fi
if (( DRY_RUN )); then shell_line ${launcher[@]+"${launcher[@]}"} "${cmd[@]}"; exit 0; fi
[[ -L $OUT_DIR/train.log ]] && die "$OUT_DIR/train.log is a link; move it away (the log is never appended through one)"
mkdir -p -- "$OUT_DIR" 2>/dev/null || die "--out-dir $OUT_DIR: cannot make this folder (a file in the way, or not writable)"
${launcher[@]+"${launcher[@]}"} "${cmd[@]}" 2>&1 | tee -a -- "$OUT_DIR/train.log"   # train.py decides finish/resume
