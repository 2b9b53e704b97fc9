#!/usr/bin/env bash
# runs/gpu_check.sh -- the one-shot GPU check: run it the first time a GPU is available (issue 13 §7).
#
# Purpose: every figure a cluster launch depends on, from the code paths a grid run uses, printed then written as
#          JSON: the attention backend --attn auto picks (FA-3 on 9.x, FA-2 on >= 8.0, else SDPA) and why; bf16
#          FlashAttention vs SDPA max |diff| on the logits of an s=10 r=4 forward (next to bf16 vs fp32 SDPA, the
#          scale of bf16 rounding); compiled (inductor) vs eager loss and gradients; tok/s, MFU and the optimizer
#          (MuonH + AdamW) step time of s=10 and s=20 at r=1 and r=4 (train.py bench mode, seq 2048,
#          B = 262,144 by accumulation at the default device batch, compiled, bf16); peak CUDA memory of the
#          largest grid cells, s=34 at r=1 and r=8, at their default device batch (8 rows), a few steps.
# Usage:   bash runs/gpu_check.sh [--out FILE]         one GPU; FILE defaults to out/gpu_check.json
#          bash runs/gpu_check.sh --cpu-smoke [--out FILE]   the same steps on CPU with tiny sizes (CI, ~10 s);
#                                                    compile there uses aot_eager (inductor's C++ build takes minutes)
#          bash runs/gpu_check.sh --dry-run             the bench rows as train.py launch lines
# Cost:    designed for < 8 minutes on one H100/H200 (six compiles dominate); not yet measured on a GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
exec python train.py gpu-check "$@"
