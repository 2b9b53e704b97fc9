#!/usr/bin/env bash
# runs/gpu_check.sh -- the staged device check (issue 19 §5): run it once on one GPU before the first launch.
#
# Purpose: every figure a cluster launch depends on, measured on the code paths a grid run uses, stage by stage in
#          priority order: 1 environment (versions, device, MFU peak key, attention backend), 2 attention (FA vs SDPA
#          vs fp32, forward and backward; KV-cached chunked decoding), 3 memory (peak allocated and reserved at the
#          release's device batch of s16 r8, s28 r8, s34 r1, an eval forward, a checkpoint save), 4 throughput
#          (tok/s, MFU and the optimizer's share at r = 4, s = 10 and 6; --all-cells: r = 1, 4, 8), 5 ddp (2 ranks vs
#          1, compiled, sharded MuonH; gloo on the CUDA tensors where NCCL refuses two ranks on one GPU), 6 compile
#          (graph breaks, recompiles, compile seconds). Details: runs/gpu_check.py.
# Usage:   bash runs/gpu_check.sh [--budget SECONDS] [--all-cells] [--stages 1,3,5] [--out FILE] [--overwrite]
#          (one GPU; FILE: out/gpu_check.json)
#          bash runs/gpu_check.sh --cpu-smoke [--out FILE]      every stage on CPU with tiny sizes (CI, ~30 s idle)
#          bash runs/gpu_check.sh --dry-run [--budget SECONDS]   the plan: stages, estimates, what the budget drops
# Output:  FILE, rewritten atomically after every stage (a killed check keeps the stages it finished); a FILE the
#          check did not write for the same flags is refused unless --overwrite. Exit 1 if a stage failed.
# Cost:    at most --budget seconds (default 480: all six stages on one H100/H200, by the times measured on an H200
#          on 2026-12-04); a stage whose estimate no longer fits is dropped, and the plan says which before anything
#          runs.
set -euo pipefail
# One inductor cache for every stage process (and runs/gpu_session.sh's): a graph compiled once is loaded after
export TORCHINDUCTOR_CACHE_DIR=${TORCHINDUCTOR_CACHE_DIR:-${TMPDIR:-/tmp}/nanoloop-inductor}
exec python "$(dirname "$0")/gpu_check.py" "$@"
