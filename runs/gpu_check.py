"""
runs/gpu_check.py -- the staged device check (issue 19 §5): run it once the first time a GPU is available.

Six stages in priority order, each in its own process with a timeout; the JSON (--out, default out/gpu_check.json) is
rewritten atomically after every stage, so a check killed at any point keeps every stage it finished:
    1 environment   versions, device, GPUs, NCCL, the MFU peak key, the attention backend and its start-up line
    2 attention     fwd + bwd of FA vs SDPA vs fp32 on s = 10 shapes; full forward vs KV-cached chunked decoding
    3 memory        peak allocated / reserved at the release's device batch of the worst cells (s16 r8, s28 r8,
                    s34 r1; halved on OOM), an eval forward and a checkpoint save (eager: compiled runs save less)
    4 throughput    tok/s, MFU and the optimizer's share of the step at r = 4, s = 10 and s = 6 (B = 262,144);
                    --all-cells: r = 1, 4, 8 at both widths (~6.5 min more)
    5 ddp           2 ranks (on one GPU if only one is visible) vs 1 rank, compiled, sharded MuonH: same losses
    6 compile       graph breaks (torch._dynamo.explain) of four variants, recompiles and compile seconds
--budget SECONDS (default 480: all six stages on one H100/H200) runs each stage, in order, whose estimate fits what
is left, and drops the others: the plan is printed and stored at the start. The estimates are the times measured on
one H200 (2026-12-04: compiling one cell takes 50-63 s, stage 4's six cells took 369 s); each stage's entry records
wall_s beside estimate_s. Inductor's on-disk cache makes the repeats cheap: stages 5 and 6 compile stage 4's s = 10,
r = 4 graph again (the warm compile took 5 s). --stages 1,3,5 runs only those. --cpu-smoke runs every stage on CPU
with tiny sizes (CI), compiling with the aot_eager backend (stages 5 and 6; the others run eager there).
Run:   bash runs/gpu_check.sh [--budget S] [--all-cells] [--stages LIST] [--out F] [--overwrite]
       bash runs/gpu_check.sh --cpu-smoke --out F

The JSON: {"request", "plan": {"estimates_s", "dropped"}, "stages": {"1": {name, estimate_s,
status: ok | failed | timed out | dropped, wall_s, result | error | reason}, ...}}. Figures are bytes, seconds and
tokens per second; "mfu" is null where the device has no datasheet peak (the stage-1 "peak" entry says why).
What the figures answer, and what they do not:
  - stage 2: FA's max |diff| to fp32 should be the size of bf16 SDPA's; the chunked-decoding diff is ~0 in fp32.
  - stage 3 is eager: a cell that fits here fits compiled (inductor saves no more); an OOM entry gives the rows
    that failed, the cell's "device_batch" the rows that fit.
  - stage 4 is the trainer's step (bf16, compiled, accumulation to B = 262,144) on random tokens: no data loading.
  - stage 5 on one GPU puts both ranks on it: NCCL >= 2.30 allows it (NCCL_MULTI_RANK_GPU_ENABLE); an older NCCL
    refuses ("Duplicate GPU detected") and the ranks fall back to gloo on the same CUDA tensors ("backend" and
    "fallback" say which ran and why). It checks correctness (losses, weights in sync), not scaling: the 1-rank
    reference runs beside the 2 ranks (their compiles overlap). With two GPUs visible the ranks take cuda:0 and 1.
    --cpu-smoke takes the fallback path for real: NCCL cannot serve CPU tensors, so gloo runs after it refuses.
  - stage 6 counts dynamo graphs: 1 per variant means no graph break; more after the training steps, a recompile.
Each stage process gets a scratch folder beside --out, removed after it: its entry (written atomically; a stage
that dies writes none), the stage-3 checkpoints, the 2-rank rendezvous and rank 0's figures.
"""
import argparse, contextlib, ctypes, datetime, json, os, signal, subprocess, sys, tempfile, time

import torch
import torch.distributed as dist
from torch._dynamo.utils import counters                       # dynamo's graph counts (stages 5 and 6)

from bench_train import peak_memory, train_bench              # first: it puts the repo root on sys.path
import common                                                  # noqa: E402, I100
from train import git_info, peak_flops, release_device_batch
from model import LoopedGPT, ModelConfig, attend, attention_summary, resolve_attention

# stage -> (name, estimated seconds on one H200, on a 2-core CPU with --cpu-smoke). Measured on 2026-12-04 (stage 1:
# 5 s, 2: 12 s, 3: 72 s for two of its three cells, 4: 369 s for six cells); 5 and 6 are two compiles each, side by
# side or warm from stage 4. Stage 4 is 10 s + CELL_S per cell.
STAGES = {1: ("environment", 10, 5), 2: ("attention", 20, 5), 3: ("memory", 100, 6), 4: ("throughput", None, 6),
          5: ("ddp", 100, 15), 6: ("compile", 40, 10)}
CELL_S, DEFAULT_CELLS, ALL_CELLS = 65, ((10, 4), (6, 4)), tuple((s, r) for s in (10, 6) for r in (1, 4, 8))   # (s, r)
# main sets these: stage 4's cells (--all-cells), and in a stage or rank process its scratch folder
CELLS, SCRATCH = DEFAULT_CELLS, None
SMOKE = dict(aspect_ratio=16, head_dim=16, n_layers_prelude=0, n_layers_coda=0, vocab_size=256, seq_len=64)


def cfg_for(smoke, s, r, **kw) -> ModelConfig:
    """The grid's architecture at width s with r loops (T = 2048, the paper's vocabulary). Smoke: every code path,
    none of the size: d = 16 (s // 8), and one block run r times (0-1-0), since compile time grows with the layers."""
    small = dict(SMOKE, scale=max(1, s // 8), n_layers_eff=r) if smoke else dict(scale=s)
    return ModelConfig(n_loops=r, **small, **kw)


def release_rows(s, smoke) -> int:
    """Rows per device by the release's rule (train.release_device_batch, --plan's fallback), 32, or 16 at s >= 18,
    or 8 at s >= 30, of the 128 rows of B = 262,144 at T = 2048; smoke: an eighth of it."""
    return release_device_batch(s, 128) // (8 if smoke else 1)


def setup(smoke) -> tuple:
    """(device, bf16, compile backend, attention backend) of a run here. The device is the one a stage measures: cuda
    (the current device) with bf16 + inductor on a GPU, cpu with fp32 + aot_eager under --cpu-smoke. The attention
    backend is --attn auto's for a bf16 run (FlashAttention needs CUDA: sdpa on CPU either way)."""
    device = torch.device("cpu" if smoke else "cuda")
    return device, not smoke, "aot_eager" if smoke else "inductor", resolve_attention("auto", device, not smoke)[0]


def stage_environment(smoke, device, cuda, compiler, attn) -> dict:
    """What the figures below depend on, and what a run's start-up line will say about attention and MFU."""
    # The attention backend as --attn auto resolves it for a bf16 run; the line is what train.py prints at start-up
    name, (backend, why) = torch.cuda.get_device_name() if cuda else "cpu", resolve_attention("auto", device, True)
    return dict(python=sys.version.split()[0], torch=torch.__version__, cuda=torch.version.cuda, device=name,
                gpus=torch.cuda.device_count(), capability=torch.cuda.get_device_capability() if cuda else None,
                memory_gib=torch.cuda.get_device_properties(0).total_memory / 2**30 if cuda else None,
                nccl=torch.cuda.nccl.version() if cuda else None, peak=peak_flops(name), attention=backend,
                attention_reason=why, attention_line=attention_summary(backend, device, True),
                git=git_info()["git_commit"])


def stage_attention(smoke, device, bf16, compiler, backend) -> dict:
    """bf16 FA and SDPA against fp32 SDPA: max |diff| over the output and dq, dk, dv (loss sum(out^2)), beside the
    reference's own size; then one model's logits: full forward vs KV-cached decoding in three chunks (prefill, a
    chunk, one token), per backend, and FA vs SDPA vs fp32 on the full forward."""
    # s = 10 shapes (B = 4 rows of T = 2048, 5 heads of 128); fp32 masters, each backend casts its own copy
    base = [torch.randn((2, 64, 2, 16) if smoke else (4, 2048, 5, 128), device=device) for _ in range(3)]  # B T H D

    def fwd_bwd(kind, dtype):
        qkv = [t.to(dtype).clone().requires_grad_() for t in base]      # fresh leaves of this backend's graph
        out = attend(*qkv, backend=kind)
        return [out.float()] + [g.float() for g in torch.autograd.grad(out.float().square().sum(), qkv)]
    diff = lambda a, b: max((x - y).abs().max().item() for x, y in zip(a, b))   # noqa: E731
    ref, sdpa, fast = fwd_bwd("sdpa", torch.float32), fwd_bwd("sdpa", torch.bfloat16), fwd_bwd(backend, torch.bfloat16)
    res = dict(backend=backend, ref_max_abs=diff(ref, [0 * t for t in ref]), sdpa_bf16_vs_fp32=diff(sdpa, ref),
               fa_bf16_vs_fp32=diff(fast, ref), fa_vs_sdpa_bf16=diff(fast, sdpa))
    # The decode case of eval.py: a prefill, then a chunk of Tq > 1 tokens after a cache (FlashAttention's bottom-right
    # causal alignment, SDPA's explicit mask), then one token; logits must match the full forward's.
    model, n, logits = LoopedGPT(cfg_for(smoke, 10, 4)).to(device), 48 if smoke else 480, []
    idx = torch.randint(0, model.cfg.vocab_size, (2, n), device=device)
    for kind, half in ((backend, True), ("sdpa", True), ("sdpa", False)):
        model.set_attention(kind)
        with torch.no_grad(), torch.autocast(device.type, dtype=torch.bfloat16, enabled=half):
            full, cache = model(idx), model.new_kv_cache(n)
            chunks = [model(idx[:, a:b], kv_cache=cache) for a, b in ((0, n // 2), (n // 2, n - 1), (n - 1, n))]
        res[f"kv_chunked_vs_full_{kind}_{'bf16' if half else 'fp32'}"] = diff([torch.cat(chunks, 1)], [full])
        logits.append([full])
    return dict(res, logits_fa_vs_sdpa_bf16=diff(*logits[:2]), logits_bf16_vs_fp32=diff(*logits[1:]))


def stage_memory(smoke, device, bf16, compiler, attn) -> dict:
    """Per cell: one warm-up + one timed step (the optimizer state exists from the first), an eval forward of the
    same rows, then a checkpoint save in the scratch folder (each cell's replaces the last; the folder is removed
    after the stage). An OOM is recorded and the rows halved."""
    res = {"rule": "release: 32 rows, 16 at s >= 18, 8 at s >= 30", "mode": "eager" + ", bf16" * bf16}
    # The cells most likely not to fit 80 GB: r = 8 at s = 16 and 28 under full BPTT (8 x the recurrent activations),
    # and the widest model, s = 34 at r = 1 (most weights and optimizer state).
    for s, r in ((16, 8), (28, 8), (34, 1)):
        cfg, rows, cell = cfg_for(smoke, s, r), release_rows(s, smoke), res.setdefault(f"s{s}_r{r}", {})
        while rows >= 1 and "save" not in cell:
            try:
                rec, model, opt = train_bench(cfg, device, rows, 1, bf16=bf16, attn=attn)
                cell.update(device_batch=rows, train={k: v for k, v in rec.items() if "max" in k or "rss" in k})
                with torch.no_grad(), torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
                    model(torch.randint(0, cfg.vocab_size, (rows, cfg.seq_len), device=device))
                cell["eval"], t, path = peak_memory(device), time.time(), os.path.join(SCRATCH, "ckpt.pt")
                torch.save({"model": model.state_dict(), "optimizer": opt.state_dict()}, path)
                cell.update(save=peak_memory(device), save_s=time.time() - t, ckpt_bytes=os.path.getsize(path))
            except torch.cuda.OutOfMemoryError as err:     # record it, then try half the rows
                # (gradient accumulation keeps the global batch, so the largest rows that fit is what a run needs)
                cell.setdefault("oom", []).append({"device_batch": rows, "error": str(err).splitlines()[0]})
                rows //= 2
            model = opt = None
    return res


def stage_throughput(smoke, device, bf16, compiler, attn) -> dict:
    """The trainer's path (compiled, bf16) at B = 262,144 tokens by accumulation; 3 timed steps after the first, per
    cell of CELLS (s = 10, the App. C.2 reference; s = 6, the grid's smallest width). Compile seconds: first_step_s
    - step_s."""
    res = {}
    for s, r in CELLS:
        rows = release_rows(s, smoke)                        # 128 rows of 2048 = B; accumulation makes up the rest
        # The optimizer steps once per 128 / rows micro-batches, so its share here is the one a grid run pays
        rec = train_bench(cfg_for(smoke, s, r), device, rows, 3, (4 if smoke else 128) // rows, bf16,
                          None if smoke else compiler, attn)[0]           # smoke: eager (5 and 6 compile)
        res[f"s{s}_r{r}"] = {k: v for k, v in rec.items() if k not in ("losses", "device", "steps")}
    return res


def ddp_rank(rank, smoke) -> None:
    """One of stage 5's 2 ranks (this script --ddp-rank k): both on cuda:0 when one GPU is visible; CPU in smoke.
    They rendezvous through files in the stage's scratch folder; rank 0 writes its figures there."""
    device = torch.device("cpu") if smoke else torch.device("cuda", rank % torch.cuda.device_count())
    if not smoke:
        torch.cuda.set_device(device)
    # The group starts on the first backend that works: NCCL, else gloo on the same (CUDA) tensors. A backend "works"
    # once its init and one all-reduce pass: NCCL builds its communicator at the first collective, and that is where
    # NCCL < 2.30 refuses two ranks on one GPU. refusals: why each backend before the one that ran failed.
    refusals = []
    for backend in ("nccl", "gloo"):
        try:                                         # one store file per try: a failed try leaves keys behind
            dist.init_process_group(backend, init_method=f"file://{SCRATCH}/{backend}", rank=rank, world_size=2,
                                    timeout=datetime.timedelta(seconds=120))
            dist.all_reduce(torch.ones(1, device=device))
            break
        except Exception as err:                     # any refusal: both ranks see it, both try the next backend
            refusals.append(f"{backend}: {' '.join(str(err).split())[:400]}")   # NCCL's reason is its last line
            if dist.is_initialized():
                dist.destroy_process_group()
    else:
        raise RuntimeError(f"no backend could join 2 ranks: {refusals}")
    _, bf16, compiler, attn = setup(smoke)
    ddp = lambda m: torch.nn.parallel.DistributedDataParallel(   # noqa: E731  train.py's wrapping
        m, device_ids=None if smoke else [device.index], broadcast_buffers=False, gradient_as_bucket_view=True)
    rec, model, opt = train_bench(cfg_for(smoke, 10, 2 if smoke else 4), device, 2 if smoke else 8, 3, 1, bf16,
                                  compiler, attn, 2, rank, wrap=ddp)
    # Each rank orthogonalises only its own matrices and all-gathers the rest: a wrong gather shows as weights that
    # differ between ranks, so compare a checksum of every parameter (fp64 sums; the MAX of (sum, -sum) over the
    # ranks is (the largest, minus the smallest): their total is 0 only if all agree)
    total = torch.stack([p.detach().double().sum() for p in model.parameters()]).sum()
    spread = torch.stack([total, -total])
    dist.all_reduce(spread, dist.ReduceOp.MAX)
    if rank == 0:
        # DDPOptimizer splits the compiled graph at bucket boundaries; each piece is one AOT-autograd compile
        common.atomic_write(os.path.join(SCRATCH, "ddp.json"), json.dumps(dict(rec, backend=backend, fallback=refusals,
            muonh_shards=opt.world, placement=str(device), ranks_weight_sum_spread=spread.sum().item(),
            dynamo_graphs=counters["stats"]["unique_graphs"], ddp_subgraphs=counters["aot_autograd"]["total"])))
    dist.destroy_process_group()


def stage_ddp(smoke, device, bf16, compiler, attn) -> dict:
    """2 ranks (2 processes) vs 1 rank taking the same rows as 2 micro-batches: losses, weights in sync."""
    # The ranks rendezvous through files in the scratch folder (no port to find). The 1-rank reference runs here
    # meanwhile: the three compiles overlap (tok/s is therefore not a scaling figure).
    ranks = [subprocess.Popen([sys.executable, __file__, "--ddp-rank", str(k), "--scratch", SCRATCH] + ["--cpu-smoke"]
                              * smoke, env=dict(os.environ, NCCL_MULTI_RANK_GPU_ENABLE="1"),
                              preexec_fn=die_with_parent) for k in (0, 1)]
    one = train_bench(cfg_for(smoke, 10, 2 if smoke else 4), device, 2 if smoke else 8, 3, 2, bf16,
                      None if smoke else compiler, attn)[0]        # smoke: eager here, compiled on the 2 ranks
    codes = [p.wait() for p in ranks]                    # the stage's own timeout bounds this wait
    if codes != [0, 0]:
        raise RuntimeError(f"the 2-rank run exited {codes} (NCCL {None if smoke else torch.cuda.nccl.version()})")
    two = common.read_json(os.path.join(SCRATCH, "ddp.json"))
    pick = lambda rec, *more: {k: rec[k] for k in ("tok_per_s", "step_s", "first_step_s", "optim_share", *more)}  # noqa
    return dict(one_rank=pick(one), two_ranks=pick(two, "backend", "fallback", "muonh_shards", "placement",
                                                    "ranks_weight_sum_spread", "dynamo_graphs", "ddp_subgraphs"),
                max_abs_loss_diff=max(abs(x - y) for x, y in zip(one["losses"], two["losses"])))


def stage_compile(smoke, device, bf16, compiler, attn) -> dict:
    """Graph breaks of one forward + loss per variant (dynamo only: no codegen), then the trainer's compiled step:
    dynamo graphs after 4 steps (1 = no break, no recompile) and compile seconds (first step - a later one)."""
    res = {}
    # The grid's baseline, a truncated-BPTT cell (grad mode switches inside the loop), hyperconnections (per-iteration
    # scalars indexed in the loop) and the plain r = 1 stack, each with the run's attention kernel (a FlashAttention
    # build that dynamo cannot trace shows up here as a graph break)
    for label, r, kw in (("r4", 4, {}), ("r8_bptt4", 8, dict(n_loops_bwd=4)), ("r4_hyper", 4, dict(injection="hyper")),
                         ("r1", 1, {})):
        model = LoopedGPT(cfg_for(smoke, 10, r, **kw)).to(device)
        model.set_attention(attn)
        x = torch.randint(0, model.cfg.vocab_size, (1, model.cfg.seq_len), device=device)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
            e = torch._dynamo.explain(model)(x, x)
        res[label] = dict(graphs=e.graph_count, breaks=e.graph_break_count,
                          why=[str(b.reason)[:200] for b in e.break_reasons[:3]])
        torch._dynamo.reset()
    counters.clear()                                     # count only the training graphs from here
    rec = train_bench(cfg_for(smoke, 10, 4), device, release_rows(10, smoke), 3, 1, bf16, compiler, attn)[0]
    graphs = counters["stats"]["unique_graphs"]
    return dict(res, train=dict(dynamo_graphs=graphs, recompiles=graphs - res["r4"]["graphs"], backend=compiler,
                                compile_s=rec["first_step_s"] - rec["step_s"], first_step_s=rec["first_step_s"]))


def die_with_parent() -> None:
    """preexec_fn: a stage (or a DDP rank) is SIGKILLed when its parent dies, even by SIGKILL (Linux prctl)."""
    with contextlib.suppress(AttributeError, OSError):
        ctypes.CDLL(None).prctl(1, signal.SIGKILL)           # PR_SET_PDEATHSIG = 1


def run_child(n, argv, folder, timeout) -> dict:
    """Stage n in its own process (this script --stage n), killed after `timeout` s -> its status, result, wall_s."""
    # The stage writes its entry into its scratch folder (atomically): a stage that dies writes none, and its exit
    # status says why; a kill of this process leaves the JSON as it was after the previous stage.
    t = time.monotonic()
    # (a rank killed with its stage may still hold files there: a cleanup error must not stop the next stages)
    with tempfile.TemporaryDirectory(prefix=f".gpu_check_stage{n}_", dir=folder, ignore_cleanup_errors=True) as scratch:
        path = os.path.join(scratch, "entry.json")
        try:
            code = subprocess.run([sys.executable, __file__, *argv, "--stage", str(n), "--scratch", scratch],
                                  timeout=timeout, preexec_fn=die_with_parent).returncode
            out = common.read_json(path) if os.path.exists(path) else dict(status="failed", error=f"exit status {code}")
        except subprocess.TimeoutExpired:
            out = {"status": "timed out", "error": f"killed after its {timeout:.0f} s timeout"}
    return dict(out, wall_s=round(time.monotonic() - t, 1))


def main(argv=None) -> int:
    """The CLI, and the entry of the stage and rank processes (hidden flags). The parent checks every flag, prints
    the plan, checks --out, then runs the stages in order; exit 1 if one failed or timed out."""
    global CELLS, SCRATCH
    p = common.Parser(prog="runs/gpu_check.py", description="staged device check (issue 19 §5)")
    p.add_argument("--cpu-smoke", action="store_true", help="every stage on CPU with tiny sizes (CI)")
    p.add_argument("--budget", type=common.number(float, "(0, 1e6)"), default=480.0, help="seconds for all stages")
    p.add_argument("--all-cells", action="store_true", help="stage 4 measures r = 1, 4, 8 at s = 10 and 6")
    p.add_argument("--stages", type=stage_list, default=list(STAGES), help="which stages, e.g. 1,3,5 (default all)")
    p.add_argument("--out", default="out/gpu_check.json", help="the JSON (default %(default)s)")
    p.add_argument("--overwrite", action="store_true", help="replace an --out this tool did not write")
    p.add_argument("--dry-run", action="store_true", help="print the plan (stages, estimates, drops) and stop")
    # Internal, set only by this script: one stage's process, one stage-5 rank, and their scratch folder
    for flag, kind in (("--stage", int), ("--ddp-rank", int), ("--scratch", str)):
        p.add_argument(flag, type=kind, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    CELLS, SCRATCH = ALL_CELLS if a.all_cells else DEFAULT_CELLS, a.scratch
    if a.ddp_rank is not None:
        return ddp_rank(a.ddp_rank, a.cpu_smoke)
    if a.stage:                                            # a stage's process: any failure is recorded, not raised
        try:
            stage = globals()["stage_" + STAGES[a.stage][0]]          # stage n is the function stage_<its name>
            out = {"status": "ok", "result": stage(a.cpu_smoke, *setup(a.cpu_smoke))}
        except Exception as err:                           # one stage's failure must not cost the next stages
            out = {"status": "failed", "error": f"{type(err).__name__}: {err}"[:2000]}
        return common.atomic_write(os.path.join(SCRATCH, "entry.json"), json.dumps(out))
    if not (a.cpu_smoke or a.dry_run or torch.cuda.is_available()):
        p.error("no CUDA device visible; `bash runs/gpu_check.sh --cpu-smoke` runs the stages on CPU")
    request = {"cpu_smoke": a.cpu_smoke, "budget": a.budget, "all_cells": a.all_cells, "stages": a.stages}
    # The plan: each stage asked for, in order, whose estimate fits the budget left by the ones planned before it
    est = {n: v[2] if a.cpu_smoke else v[1] or 10 + CELL_S * len(CELLS) for n, v in STAGES.items()}
    keep = []
    for n in a.stages:                                     # greedy, in order: a stage that does not fit is skipped
        if est[n] <= a.budget - sum(est[k] for k in keep):
            keep.append(n)
    dropped = [n for n in STAGES if n not in keep]
    rec, t0 = {"request": request, "plan": {"estimates_s": est, "dropped": dropped}, "stages": {}}, time.monotonic()
    print(f"gpu-check: {len(STAGES)} stages, ~{sum(est[n] for n in keep)} s estimated, --budget {a.budget:g} s; "
          "dropped: " + (", ".join(f"{n} {STAGES[n][0]} (~{est[n]} s)" for n in dropped) or "none"), flush=True)
    if a.dry_run:                                          # a dry run writes nothing: no --out to check
        return 0
    # Ownership: the JSON is absent, or this tool's for this same request (its written_by says so), or --overwrite
    key, folder = common.request_key("gpu_check", request), os.path.dirname(os.path.abspath(a.out))
    try:
        common.check_new(a.out, a.overwrite, "--out", p.prog, key)
        os.makedirs(folder, exist_ok=True)
    except (ValueError, OSError) as err:
        common.fail(p.prog, err)
    if a.cpu_smoke:                                        # tiny models: one thread each is faster on a shared CPU
        os.environ.setdefault("OMP_NUM_THREADS", "1")
    child = ["--cpu-smoke"] * a.cpu_smoke + ["--all-cells"] * a.all_cells     # what a stage process needs
    for n, (name, *_) in STAGES.items():
        left = a.budget - (time.monotonic() - t0)
        entry = rec["stages"][str(n)] = {"name": name, "estimate_s": est[n]}
        if n in dropped or est[n] > left:                  # not asked, not planned, or earlier stages overran
            why = "not in --stages" if n not in a.stages else f"--budget {a.budget:g} s: {left:.0f} s left"
            entry.update(status="dropped", reason=f"{why}, ~{est[n]} s needed")
        else:
            # a stage may overrun its estimate (3x + 60 s) but never the budget: the timeout is what is left at most
            entry.update(run_child(n, child, folder, timeout=min(left, 3 * est[n] + 60)))
        common.write_json(a.out, rec, p.prog, key)           # after every stage: a kill keeps what is done
        print(f"gpu-check [{time.monotonic() - t0:5.0f}s] stage {n} {name}: {entry['status']} "
              f"{json.dumps(entry.get('result', entry.get('reason', entry.get('error'))))[:600]}", flush=True)
    print(f"gpu-check: wrote {a.out}", flush=True)
    return 0 if all(e["status"] in ("ok", "dropped") for e in rec["stages"].values()) else 1


def stage_list(text) -> list:
    """--stages: stage numbers, comma-separated (argparse makes the refusal a one-line error)."""
    if not set(text.split(",")) <= {str(n) for n in STAGES}:
        raise argparse.ArgumentTypeError(f"expected stage numbers 1-6, comma-separated, got {text!r}")
    return sorted({int(x) for x in text.split(",")})


if __name__ == "__main__":
    sys.exit(main())
