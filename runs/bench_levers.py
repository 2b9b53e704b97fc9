"""
runs/bench_levers.py -- the small-width levers of issue 25 (item 4), measured one cell at a time: MFU per cell.

At s = 6 the grid's step ran at 36 % MFU against 45 % at s = 10 (one H200, SDPA). A cell is (s, r, lever); the
lever is applied right where the step is built (bench_train.train_bench), so this benchmark needs no trainer flag:
    base                         the grid's step: 32 rows x 4 micro-batches = B = 262,144 tokens, torch.compile's
                                 default mode, the SDPA kernel PyTorch picks (flash on Hopper), bf16
    rows64, rows128, ...         N rows per micro-batch (accumulation keeps B): fewer, larger kernels
    cudnn, flash, efficient, math   that SDPA backend forced (torch.nn.attention.sdpa_kernel around each step)
    reduce-overhead              torch.compile mode with CUDA graphs: the per-kernel launch cost gone
    max-autotune-no-cudagraphs   autotuned GEMM / reduction configs (its compile takes minutes)
  and any '+' combination of them, e.g. rows64+cudnn+reduce-overhead.
One process runs its cells in order, each from a clean compile state (torch._dynamo.reset). Each cell's record --
s, r, rows, accum, lever, tok/s, MFU, peak memory, compile seconds -- is written to OUT/s6_r1_cudnn.json as soon
as it is measured (common.write_json), and printed as one line, so a killed session keeps every cell it finished.
A cell that fails (out of memory, a kernel this device lacks) is recorded with its error; the next cell runs.
--until EPOCH: no cell starts after that time minus --cell-s (the session's budget; a compile is ~50-60 s on H200).
Run:  python runs/bench_levers.py --scale 6 --n-loops 1 8 --levers base cudnn rows64 --out OUT [--steps 3]
      --cpu-smoke: tiny models on CPU, eager-compiled (aot_eager), every line of the above exercised.
MFU = F_train (flops.py) x tok/s / peak (train.PEAK_FLOPS); the targets (issue 25): s = 6 >= 42 %, s = 10 >= 50 %,
looped cells within 3 % of r = 1. Numbers belong in this output, never in a timed test.
"""
import os
import sys
import time

import torch
from torch.nn.attention import SDPBackend

from gpu_check import cfg_for, release_rows, setup     # first: bench_train (imported there) sets sys.path
from bench_train import train_bench                    # noqa: I100
import common                                          # noqa: E402

TOOL = "runs/bench_levers.py"
MODES = ("reduce-overhead", "max-autotune-no-cudagraphs")
KERNELS = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION,
           "efficient": SDPBackend.EFFICIENT_ATTENTION, "math": SDPBackend.MATH}


def lever(text) -> dict:
    """'rows64+cudnn' -> {rows, mode, sdpa}; argparse makes the refusal a one-line error."""
    out = dict(rows=None, mode=None, sdpa=None)
    for part in text.split("+"):
        if part.startswith("rows") and part[4:].isdigit() and int(part[4:]) > 0:
            out["rows"] = int(part[4:])
        elif part in MODES or part in KERNELS:
            out["mode" if part in MODES else "sdpa"] = part
        elif part != "base":
            raise ValueError(f"unknown lever {part!r}: base, rowsN, {', '.join(KERNELS)}, {', '.join(MODES)}")
    return out


def cell(s, r, name, smoke, steps) -> dict:
    """One cell: the grid's step at (s, r) with the lever applied -> its record (what the session table shows)."""
    device, bf16, backend, attn = setup(smoke)
    kw, batch = lever(name), 4 if smoke else 128        # rows of B = 262,144 tokens at T = 2048 (smoke: 4 of 64)
    rows = kw["rows"] or release_rows(s, smoke)
    torch._dynamo.reset()                                # a clean compile state: the cell's own compile seconds
    rec = train_bench(cfg_for(smoke, s, r), device, rows, steps, batch // rows, bf16, backend, attn,
                      mode=None if smoke else kw["mode"], sdpa=KERNELS.get(kw["sdpa"]), warmup=2)[0]
    mem = {k: v for k, v in rec.items() if "max" in k or "rss" in k}
    return dict(s=s, r=r, rows=rows, accum=batch // rows, lever=name, mode=kw["mode"] or "default",
                sdpa=kw["sdpa"] or "auto", tok_per_s=rec["tok_per_s"], mfu=rec["mfu"], step_s=rec["step_s"],
                compile_s=rec["first_step_s"] - rec["step_s"], optim_share=rec["optim_share"], **mem,
                device=rec["device"], compiler=backend, attn=attn, status="ok")


def main(argv=None) -> int:
    """The CLI: flags and --out checked first (one line, exit 2); then the cells, each recorded as it ends."""
    p = common.Parser(prog=TOOL, description="MFU per (s, r, lever) cell (issue 25 item 4)")
    p.add_argument("--scale", type=common.number(int, "[1, 64]"), nargs="+", default=[6])
    p.add_argument("--n-loops", type=common.number(int, "[1, 16]"), nargs="+", default=[1, 8])
    p.add_argument("--levers", type=str, nargs="+", default=["base"], help="cells per (s, r), in order")
    p.add_argument("--steps", type=common.number(int, "[1, 100]"), default=3, help="timed steps per cell")
    p.add_argument("--until", type=common.number(float, "(0, inf)"), help="epoch seconds: no cell starts later")
    p.add_argument("--cell-s", type=common.number(float, "[0, inf)"), default=60.0, help="a cell's cost, est.")
    p.add_argument("--out", required=True, help="the folder the cells' JSON go to")
    p.add_argument("--cpu-smoke", action="store_true", help="tiny models on CPU (CI)")
    a = p.parse_args(argv)
    batch = 4 if a.cpu_smoke else 128
    try:                                                 # every refusal before any work
        for name in a.levers:
            rows = lever(name)["rows"]
            if rows and batch % rows:
                raise ValueError(f"{name}: rows must divide the {batch} rows of a step")
        if not (a.cpu_smoke or torch.cuda.is_available()):
            raise ValueError("no CUDA device visible; --cpu-smoke runs the cells on CPU")
        common.claim(a.out, "bench_levers", None)         # any earlier run of this tool: the cells are per name
    except ValueError as err:
        common.fail(TOOL, err)
    for s in a.scale:
        for r in a.n_loops:
            for name in a.levers:
                path, key = os.path.join(a.out, f"s{s}_r{r}_{name}.json"), common.request_key(TOOL, [s, r, name])
                if a.until and time.time() + a.cell_s > a.until:
                    print(f"lever | s {s} r {r} {name}: skipped, the session's time is up", flush=True)
                    continue
                try:
                    rec = cell(s, r, name, a.cpu_smoke, a.steps)
                except Exception as err:                 # a cell's failure (OOM, no kernel) must not cost the rest
                    why = " ".join(f"{type(err).__name__}: {err}".split())      # one line, the reason last
                    rec = dict(s=s, r=r, lever=name, status="failed", error=why[:300] + " ... " + why[-300:])
                    if torch.cuda.is_available():
                        torch.cuda.empty_cache()
                common.write_json(path, rec, TOOL, key)
                print(line(rec), flush=True)
    return 0


def line(rec) -> str:
    """One printed line per cell: what the session's table shows."""
    if rec["status"] != "ok":
        return f"lever | s {rec['s']} r {rec['r']} {rec['lever']}: failed: {rec['error'][:300]}"
    mfu = "n/a" if rec["mfu"] is None else f"{100 * rec['mfu']:.1f}%"
    mem = rec.get("cuda_max_allocated", rec.get("peak_rss", 0)) / 2**30
    return (f"lever | s {rec['s']} r {rec['r']} {rec['lever']:<24} | {rec['rows']} rows x {rec['accum']} | "
            f"{rec['mode']} / sdpa {rec['sdpa']} | tok/s {rec['tok_per_s']:,.0f} | MFU {mfu} | peak {mem:.1f} GiB | "
            f"compile {rec['compile_s']:.0f} s")


if __name__ == "__main__":
    sys.exit(main())
