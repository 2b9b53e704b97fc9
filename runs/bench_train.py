"""
runs/bench_train.py -- training throughput and memory of one configuration, on synthetic tokens (issue 19 §5, 18 §4).

What `train.py --bench-steps` used to do, outside the trainer: build the model (model.py) and the optimizer
(optim.build_optimizer at optim.hyperp_lrs) as a run does, take one untimed warm-up step (allocation, compile), time
--steps optimizer steps of --accum micro-batches each, and print one line:
    bench | n_loops 4 | bptt full | d_model 128 | tok/s 1,234 | mfu n/a (...) | peak_rss 345 MiB | optimizer 9% ...
With --out FILE the figures are also written as JSON (common.write_json: atomic, with its written_by header); a FILE
this tool did not write for this same request is never replaced without --overwrite (common.check_new).
Run:   python runs/bench_train.py --scale 10 --n-loops 4 --device-batch 16 --steps 5 [--out F.json]
       every ModelConfig field is a flag (--n-loops-bwd, --seq-len, ...; defaults: the paper's s = 10, r = 4).
       CUDA: bf16 autocast and torch.compile (inductor) as a run uses them; CPU: fp32 eager.
Levers (issue 25 item 4: why s = 6 runs at 36 % MFU, s = 10 at 45 %): --levers L1 L2 ... measures one cell per
lever, each applied where the step is built, so no trainer flag is needed, and writes --out DIR/sS_rR_L.json:
    base                        the step as the flags give it (the grid's: --device-batch 32 --accum 4, B = 262,144)
    rowsN                       N rows per micro-batch, accumulation keeping the step's rows (fewer, larger kernels)
    cudnn | flash | efficient | math    that SDPA kernel forced (model.set_attention's sdpa; cuDNN on Hopper)
    reduce-overhead             torch.compile with CUDA graphs (the per-kernel launch cost gone)
    max-autotune-no-cudagraphs  autotuned GEMM and reduction configs (a compile of minutes)
    a+b+...                     together, e.g. rows64+cudnn+reduce-overhead
  Targets (issue 25, one H100/H200, SDPA): s = 6 >= 42 % and s = 10 >= 50 % MFU, r = 8 within 3 % of r = 1. The
  figures belong in this output (and runs/gpu_session.sh's), never in a timed test.
Used by: runs/bench.sh part 1; runs/gpu_session.sh (--levers); runs/gpu_check.py (train_bench, peak_memory): the
one place a benchmark builds a model and its optimizer. (runs/op_count.py builds its own: it must also run
against another checkout's modules, through PYTHONPATH, for a before figure.)
MFU = F_train (flops.py: the budget's FLOPs per token) x tok/s / (world x peak). The peak is the dense bf16 datasheet
figure matched by device name (train.py's PEAK_FLOPS, as a run prints it); any other device (a CPU included) gets
MFU n/a with the reason, never a guessed figure.
"""
import dataclasses, os, resource, sys, time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))   # the flat top-level modules
import torch                                                                          # noqa: E402

import common, flops, train                                                           # noqa: E402
from model import LoopedGPT, ModelConfig, resolve_attention                           # noqa: E402
from optim import build_optimizer, hyperp_lrs                                         # noqa: E402


def peak_memory(device) -> dict:
    """Peak memory since the last call, then a reset: CUDA allocated and reserved bytes (the cache is emptied first,
    so the next reserved peak is its own); on CPU the process's peak RSS (Linux: KiB), which cannot be reset."""
    if device.type != "cuda":
        return dict(peak_rss=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
    stats = torch.cuda.memory_stats(device)      # a snapshot of what max_memory_allocated / _reserved read, then reset
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats(device)
    return {f"cuda_max_{k}": stats.get(f"{k}_bytes.all.peak", 0) for k in ("allocated", "reserved")}


def train_bench(cfg, device, device_batch, steps, accum=1, bf16=False, compile_backend=None, attn="sdpa",
                world=1, rank=0, seed=0, wrap=None, mode=None, sdpa=None, warmup=1) -> tuple:
    """Build as a run does; 1 warm-up + `steps` timed optimizer steps on random tokens -> (figures, model, optimizer).

    The build: seeded init, the attention kernel, the embedding in bf16 on the bf16 path (App. C.1), MuonH + AdamW
    (optim.build_optimizer) at HyperP's LRs for the global batch. The LRs are those of a plausible 100-step run: a
    step's cost does not depend on them, since MuonH and AdamW do the same work at any LR.

    A step is `accum` micro-batches of device_batch rows on each of `world` ranks; rank k takes its rows of one global
    batch drawn from `seed`, so 1 rank at world x device_batch rows computes the same steps as `world` ranks. Several
    ranks: the process group is up and wrap(model) is the DDP module (compiled after wrapping, as train.py does;
    accum must then be 1: no no_sync here). The device is synchronised around the optimizer step to time it alone.
    The levers (--levers): mode (torch.compile's: reduce-overhead = CUDA graphs), sdpa (a kernel name of
    train.SDPA_BACKENDS, forced in every attention call, which the compile traces), `warmup` untimed steps (CUDA
    graphs record on the second call). Each call starts from a clean dynamo state: its own compiles."""
    peak_memory(device)                                          # reset: the figures below are this run's
    torch._dynamo.reset()                                        # and its own compiles
    rows, T = device_batch * world * accum, cfg.seq_len          # global batch rows per optimizer step
    torch.manual_seed(seed)
    model = LoopedGPT(cfg).to(device)
    model.set_attention(attn, sdpa or "auto")                    # sdpa: that SDPA kernel forced (model.attend)
    model.wte.to(dtype=torch.bfloat16 if bf16 else torch.float32)
    opt = build_optimizer(model.param_groups(), hyperp_lrs(cfg.d_model, cfg.n_loops, 100 * rows * T, rows * T),
                          polar_bf16=bf16)
    # CUDA graphs own their outputs: a first micro-step's gradient adopted as .grad would be overwritten by the next
    # replay (pytorch#169545), so under reduce-overhead the grads are allocated once, accumulated into and zeroed
    graphs = mode == "reduce-overhead"
    for p in model.parameters() if graphs else ():
        p.grad = torch.zeros_like(p)
    net = wrap(model) if wrap else model
    net = torch.compile(net, backend=compile_backend, mode=mode) if compile_backend else net
    clock = lambda: (device.type != "cuda" or torch.cuda.synchronize(device), time.perf_counter())[1]  # noqa: E731
    # Tokens are drawn on the host from one seeded generator, then moved: every rank (and a 1-rank run of the same
    # global batch) sees the same rows, and throughput does not depend on token values.
    gen, times, losses = torch.Generator().manual_seed(seed), [], []
    for step in range(steps + warmup):
        xy = torch.randint(0, cfg.vocab_size, (rows, T + 1), generator=gen).view(accum, world, device_batch, T + 1)
        t0 = clock()
        for micro in range(accum):                               # gradient accumulation over micro-batches
            torch.compiler.cudagraph_mark_step_begin()           # CUDA graphs: a new forward, not a re-entry
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
                loss = net(xy[micro, rank, :, :-1].to(device), xy[micro, rank, :, 1:].to(device))   # (,) mean CE
            (loss / accum).backward()                            # optimizer.md §5: divided by the accum steps
            losses.append(loss.detach().float() / accum)
        t1 = clock()
        opt.step()
        opt.zero_grad(set_to_none=not graphs)
        times.append((clock() - t0, clock() - t1))
    per_step = torch.stack(losses).view(steps + warmup, accum).sum(1)    # (steps + warmup,) this rank's step losses
    if world > 1:                                                # global-batch mean (gloo has no AVG: sum / world)
        torch.distributed.all_reduce(per_step)
    step_s, opt_s = (sum(t[i] for t in times[warmup:]) / steps for i in (0, 1))   # the warm-up steps: not timed
    F = flops.flops_per_token(**flops.accounting_args(cfg))      # the run's F_train (truncated loops fwd-only)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    peak, key = train.peak_flops(name)
    return dict(device=name, scale=cfg.scale, d_model=cfg.d_model, n_loops=cfg.n_loops, n_loops_bwd=cfg.n_loops_bwd,
                device_batch=device_batch, accum=accum, world=world, precision="bf16" if bf16 else "fp32", attn=attn,
                compile=compile_backend or False, mode=mode, sdpa=sdpa and train.SDPA_BACKENDS[sdpa].name, steps=steps,
                first_step_s=times[0][0], step_s=step_s, optim_share=opt_s / step_s, tok_per_s=rows * T / step_s,
                flops_per_token=F, peak_key=key, mfu=F * rows * T / step_s / (world * peak) if peak else None,
                losses=(per_step / world).tolist(), **peak_memory(device)), model, opt


# -----------------------------------------------------------------------------
# The small-width levers (issue 25 item 4), applied where the step is built: no trainer flag needed

MODES = ("reduce-overhead", "max-autotune-no-cudagraphs")                 # torch.compile modes; default: None
# (the SDPA kernels by name are train.SDPA_BACKENDS, as train.py's --sdpa-backend takes them)


def lever(text) -> dict:
    """'rows64+cudnn+reduce-overhead' -> {rows, mode, sdpa}; 'base' is the step as given; a ValueError otherwise."""
    out = dict(rows=None, mode=None, sdpa=None)
    for part in text.split("+"):
        if part.startswith("rows") and part[4:].isdigit() and int(part[4:]) > 0:
            out["rows"] = int(part[4:])
        elif part in MODES or part in train.SDPA_BACKENDS:
            out["mode" if part in MODES else "sdpa"] = part
        elif part != "base":
            raise ValueError(f"unknown lever {part!r}: base, rowsN, {', '.join([*train.SDPA_BACKENDS, *MODES])}")
    return out


def main(argv=None) -> dict:
    """The CLI: flags checked (one-line errors, exit 2) before anything is built; one line per cell, --out written.
    --levers: one cell per lever, in order, each from a clean compile state, each written to --out (a folder) as
    OUT/sS_rR_LEVER.json as soon as it is measured; a cell that fails (out of memory, a kernel this device lacks)
    is recorded with its error and the next one runs."""
    p = common.Parser(prog="runs/bench_train.py", description="training tok/s, MFU and peak memory, synthetic tokens")
    train.add_dataclass_flags(p, ModelConfig, {})           # every architecture field; ModelConfig checks them
    for name, default in (("device-batch", 8), ("steps", 5), ("accum", 1)):
        p.add_argument("--" + name, type=common.number(int, "[1, inf)"), default=default)
    p.add_argument("--levers", nargs="+", help="cells: base, rowsN, an SDPA kernel, a compile mode, or a+b (above)")
    p.add_argument("--out", help="also write the figures here as JSON")
    p.add_argument("--overwrite", action="store_true", help="let --out replace a file this tool did not write")
    a = p.parse_args(argv)
    cuda = torch.cuda.is_available()                          # the run's defaults: bf16 + inductor on CUDA only
    device, batch = torch.device("cuda" if cuda else "cpu"), a.device_batch * a.accum    # rows per optimizer step
    # The request: every flag but where the output goes. A rerun of the same request may replace its own file.
    key = common.request_key("bench_train", {k: v for k, v in vars(a).items() if k not in ("out", "overwrite")})
    try:                                                       # every refusal before any work, in one line
        cfg = ModelConfig(**{f.name: getattr(a, f.name) for f in dataclasses.fields(ModelConfig)})
        cells = {name: lever(name) for name in a.levers or ["base"]}
        if any(c["rows"] and batch % c["rows"] for c in cells.values()):
            raise ValueError(f"a lever's rows must divide the {batch} rows of a step (--device-batch x --accum)")
        if a.out and a.levers:                                 # the folder is this tool's (common.claim)
            common.claim(a.out, "bench_train", None, a.overwrite)
        elif a.out:                                            # absent, or this request's own (common.check_new)
            common.check_new(a.out, a.overwrite, "--out", "runs/bench_train.py", key)
            os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    except (ValueError, OSError) as err:
        common.fail(p.prog, err)
    for name, c in cells.items():
        rows, tag = c["rows"] or a.device_batch, a.levers and name           # tag: None = the plain benchmark
        try:
            r = train_bench(cfg, device, rows, a.steps, batch // rows, cuda, "inductor" if cuda else None,
                            resolve_attention("auto", device, cuda)[0], mode=c["mode"] if cuda else None,
                            sdpa=c["sdpa"], warmup=2 if a.levers else 1)[0]
            r.update(lever=tag, compile_s=r["first_step_s"] - r["step_s"])
        # A lever's failure must not cost the next cells; the plain benchmark (no --levers) lets any error through
        except (Exception if a.levers else ()) as err:
            why = " ".join(f"{type(err).__name__}: {err}".split())          # one line; the reason is often last
            r = dict(scale=a.scale, n_loops=a.n_loops, lever=name, error=why[:300] + " ... " + why[-300:])
        print(line(r), flush=True)
        if a.out:                                              # --levers: one file per cell in the folder
            common.write_json(f"{a.out}/s{a.scale}_r{a.n_loops}_{name}.json" if tag else a.out, r, p.prog, key)
    return r


def line(r) -> str:
    """One line per cell; bench.sh keeps these in OUT/train_bench.txt. MFU n/a: no datasheet peak (the reason)."""
    if "error" in r:
        return f"bench | s {r['scale']} r {r['n_loops']} | lever {r['lever']}: failed: {r['error']}"
    mem = " | ".join(f"{k} {v / 2**20:,.0f} MiB" for k, v in r.items() if "max" in k or "rss" in k)
    mfu = r["peak_key"] if r["mfu"] is None else f"{100 * r['mfu']:.2f}% ({r['peak_key']})"
    return (f"bench | n_loops {r['n_loops']} | bptt {r['n_loops_bwd'] or 'full'} | d_model {r['d_model']} | tok/s "
            f"{r['tok_per_s']:,.0f} | mfu {mfu} | {mem} | optimizer {100 * r['optim_share']:.0f}% of the step | "
            f"{r['precision']} {r['attn']} compile {r['compile']} | mean of {r['steps']} steps after the first"
            + (r["lever"] and f" | lever {r['lever']}: {r['device_batch']} rows x {r['accum']}, mode "
               f"{r['mode'] or 'default'}, sdpa {r['sdpa'] or 'auto'}, compile {r['compile_s']:.0f} s" or ""))


if __name__ == "__main__":
    main()
