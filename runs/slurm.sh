#!/usr/bin/env bash
#SBATCH --job-name=nanoloop
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=1
#SBATCH --gpus-per-node=8
#SBATCH --cpus-per-task=32
#SBATCH --time=24:00:00
#SBATCH --requeue
#SBATCH --output=%x-%j.out
# runs/slurm.sh -- one train.py run across several nodes under SLURM: multi-node torchrun, c10d rendezvous.
#
# Purpose: the way a run outgrows one node. srun starts one torchrun per node; they meet at the first node of the
#          allocation (SLURM_JOB_NODELIST) on MASTER_PORT and start NPROC ranks each (nccl). The global batch stays
#          B tokens whatever the world size (train.py asserts B = device_batch x seq_len x world x accum), so a
#          multi-node run trains on exactly the rows and FLOPs of a single-node one. --resume is always passed, so a
#          preempted job (--requeue) continues from its ckpt.pt; a finished one (done.json) is skipped.
# Usage:   sbatch --nodes=4 runs/slurm.sh --flops-budget 2.15e19 --n-loops 4 --scale 34 --out-dir out/grid/C2.15e19_r4_s34
#          (submit from the repo root: sbatch runs a copy of this script, so it cd's to SLURM_SUBMIT_DIR)
#          bash runs/slurm.sh --dry-run TRAIN_ARGS...    print the torchrun line (outside SLURM: 1 node, localhost)
#          A sweep: bash runs/grid.sh --dry-run | sed 's/^.*train.py //' | xargs -L1 sbatch runs/slurm.sh
# Cost:    that of the run passed in (see the sweep scripts and `python flops.py grid --mfu 0.4`).
set -euo pipefail
cd "${SLURM_SUBMIT_DIR:-$(dirname "$0")/..}"
NPROC=${NPROC:-${SLURM_GPUS_ON_NODE:-8}}                 # ranks per node = GPUs per node
NNODES=${SLURM_NNODES:-1}
MASTER_PORT=${MASTER_PORT:-29500}
if [[ -n "${SLURM_JOB_NODELIST:-}" ]]; then               # rendezvous host: the allocation's first node
  MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
else
  MASTER_ADDR=localhost
fi

DRY_RUN=0; [[ "${1:-}" == "--dry-run" ]] && { DRY_RUN=1; shift; }
(( $# )) || { echo "usage: sbatch [--nodes=N] runs/slurm.sh TRAIN_ARGS... (see the header)" >&2; exit 2; }
OUT_DIR=out/run                                           # train.py's default, unless --out-dir is given
args=("$@")
for i in "${!args[@]}"; do [[ "${args[$i]}" == "--out-dir" ]] && OUT_DIR=${args[$((i + 1))]:-$OUT_DIR}; done
if [[ -f "$OUT_DIR/done.json" ]]; then echo "skip $OUT_DIR (done.json exists)"; exit 0; fi

cmd=(torchrun --nnodes="$NNODES" --nproc_per_node="$NPROC" --rdzv_id="${SLURM_JOB_ID:-local}" --rdzv_backend=c10d
     --rdzv_endpoint="$MASTER_ADDR:$MASTER_PORT" train.py "$@" --resume)
if (( DRY_RUN )); then echo "${cmd[*]}"; exit 0; fi
mkdir -p "$OUT_DIR"
srun --ntasks-per-node=1 "${cmd[@]}" 2>&1 | tee -a "$OUT_DIR/train.log"
