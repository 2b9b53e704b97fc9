r"""
train.py -- pretrain one looped (or r=1 baseline) model on a FLOP budget, under torchrun, with exact resume.

Implements paper §4.1 (recipe), App. D (HyperP LR transfer), App. E (iso-FLOP horizon), App. G.1 (case studies) and
App. I (matched-token extrapolation): horizon from flops.py, peak LRs from optim.py, one record per run (done.json).
Run:   single GPU   python train.py --flops-budget 1e18 --n-loops 4 --scale 10 --data DIR --out-dir out/s10_r4
       one node     torchrun --standalone --nproc_per_node=8 train.py --flops-budget 1e18 --n-loops 4 --scale 10 ...
       many nodes   sbatch --nodes=4 runs/slurm.sh --flops-budget 1e19 --n-loops 4 --scale 20 --out-dir ...
       CPU (tiny)   python train.py --scale 1 --head-dim 32 --n-layers-eff 4 --n-layers-prelude 1 --n-layers-coda 1 \
                        --n-loops 2 --seq-len 64 --batch-tokens 1024 --device-batch 8 --steps 200 \
                        --eval-tokens 8192 --data DIR --out-dir out/cpu
       plan only    python train.py --flops-budget 1e18 --n-loops 4 --scale 10 --plan   (every derived quantity; with
                        a prepared --data also the out-dir's status: finished / resume / fresh)
       fine-tune    python train.py --init-from RUN_OR_RELEASE_DIR --tokens 1e9 --data DIR --out-dir out/ft
Read in this order: TrainConfig -> main (banner sections, in the order they run) -> the helpers it calls.
Not here: FLOP accounting (flops.py), LR rules and MuonH (optim.py), loader (data.py), val_loss (eval.py), the
model (model.py), checkpoints and the run folder (checkpoint.py), parser / atomic writes / claim (common.py).

Decisions (each printed with its rule at start-up):
- Horizon: exactly one of --flops-budget C (steps = round(C / (F B)), App. E), --tokens D (round(D / B)),
  --tokens-per-param rho (D = int(rho (N_once + r N_rec)), steps = D // B, App. D), --steps N (App. I).
- Vocabulary: --vocab-size left at its default takes the data's; seq_len must equal the data's (no re-packing).
  BPTT: full unless --n-loops-bwd is given (the release's CLI defaulted to 4; never truncated silently).
- Run identity (README "Guarantees", rule 1): every config field but IDENTITY_EXCLUDED, the data's content hash, the
  --init-from weights' hash, the resolved precision / attention / compile; --resume continues or hands back only an
  equal one. Run folder (checkpoint.out_dir_state): rank 0 decides fresh / resume / finished and claims --out-dir
  (one writer); files are written atomically. Every rank must see the same folder (README "Multi-node").
- Device batch: auto = the largest divisor of the rows per rank that fits (measured); accumulation keeps B.
- Precision: bf16 (CUDA default) = autocast, bf16 wte and its Adam state, bf16 Polar Express; fp32 (CPU) none.
- DDP wraps, then torch.compile compiles the wrapped module; eval runs the uncompiled module in the run's precision.
  Speed switches (issue 25; never the run's identity): --compile-mode, --sdpa-backend; inductor's on-disk cache
  in ~/.cache/nanoloop/inductor (TORCHINDUCTOR_CACHE_DIR moves it), so a cell shape compiles once per machine.
- Test hooks: NANOLOOP_FAULT="nan@K" (lm_head NaN before step K) / "kill@K" (SIGKILL after step K);
  NANOLOOP_MEMORY_CAP=BYTES caps the memory the checks assume. Never set them otherwise.
"""
import argparse, dataclasses, hashlib, inspect, json, math, os, re, resource, signal, subprocess, sys, time, typing
from contextlib import nullcontext
from dataclasses import asdict, replace
from types import SimpleNamespace
from typing import Optional

import torch
import torch.distributed as dist
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.parallel import DistributedDataParallel as DDP

import common
import flops
from common import print0
from checkpoint import (CKPT_NAME, DONE_NAME, LOG_NAME, device_memory, load_checkpoint, model_bytes, need,
                        out_dir_state, save, trim_log)
from data import PackedLoader, data_identity, load_tokenizer, read_meta
from eval import val_loss
from model import ATTN_BACKENDS, LoopedGPT, ModelConfig, attention_summary, resolve_attention
from optim import build_optimizer, hyperp_lrs, lr_multiplier, reference, set_lr_multiplier

# Dense bf16 peak FLOP/s per accelerator for the MFU column (vendor datasheets, "with sparsity" figures halved),
# matched as whole words of the device name, longest key first ("H100 NVL" before "H100"; "GH200" is no "H200").
PEAK_FLOPS = {"H100 PCIe": 756e12, "H100 NVL": 835e12, "H100": 989e12, "H200 NVL": 835e12, "H200": 989e12,
              "GH200": 989e12, "H800 PCIe": 756e12, "H800": 989e12, "H20": 148e12, "B200": 2.25e15, "GB200": 2.5e15,
              "B100": 1.75e15, "A100": 312e12, "A800": 312e12, "L40S": 362e12, "L4": 121e12}
PLAN_MFU = 0.4             # model FLOPs utilisation assumed for the device-hour estimate printed at start-up
# Fields that cannot change a run's result stay out of its identity: where and how often it writes, how it starts,
# how B is split into micro-steps, the MFU denominator, a check (--tokenizer: the data identity holds it) and the
# speed switches (compile mode, SDPA kernel). A test fails for a field in neither the identity nor this list.
IDENTITY_EXCLUDED = ("out_dir", "resume", "plan", "ckpt_every", "eval_every", "log_every", "device_batch",
                     "peak_flops", "tokenizer", "overwrite", "compile_mode", "sdpa_backend")
SDPA_BACKENDS = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION,
                 "efficient": SDPBackend.EFFICIENT_ATTENTION, "math": SDPBackend.MATH}
# The string fields' allowed values (None = auto), checked by parse_args. No CUDA-graph compile modes
# (reduce-overhead, max-autotune): measured on an H200 (torch 2.11), the model compiles to several graphs whose
# CUDA-graph replays overwrite outputs the backward still needs, even with cudagraph_mark_step_begin().
CHOICES = {"precision": (None, "fp32", "bf16"), "attn": ATTN_BACKENDS, "sdpa_backend": ("auto", *SDPA_BACKENDS),
           "compile_mode": ("default", "max-autotune-no-cudagraphs")}

# -----------------------------------------------------------------------------
# Config: everything that is not the architecture (ModelConfig lives in model.py). Defaults = the paper's grid runs.
@dataclasses.dataclass
class TrainConfig:
    """Flat (style B5): one field per flag, its trailing comment the --help text. Every field is part of the run's
    identity unless IDENTITY_EXCLUDED names it; every int / float field has a LIMITS row. parse_args checks every
    value once (LIMITS, CHOICES, one horizon); main trusts a config built in code."""
    # horizon: exactly one of the four
    flops_budget: Optional[float] = None    # C in FLOPs; steps = round(C / (F B)) (App. E; architecture §8.3)
    tokens: Optional[int] = None            # D; steps = round(D / B) (matched-token runs)
    tokens_per_param: Optional[float] = None  # rho; D = int(rho (N_once + r N_rec)), steps = D // B (App. D.1: 10)
    steps: Optional[int] = None             # N optimizer steps; D = N B (App. I: 89,645 steps at B = 524,288)
    # batch
    batch_tokens: int = 262144              # B = 128 rows x 2048 per optimizer step (App. D.1: 256K is best)
    device_batch: Optional[int] = None      # rows per rank per micro-step; auto = the largest that fits (measured)
    # learning rates (optimizer.md §2)
    muonh_lr: float = 0.014                 # eta_base fed to HyperP (§4.1, App. D.1); the LR-sweep knob
    d_ref: Optional[float] = None           # HyperP D_ref override; None = the family constant (optimizer §2.3)
    lr_batch_ref: int = 262144              # B_ref of the batch rule b = (B/B_ref)^0.558 (App. D.1); small-batch
                                            # studies (runs/mini.sh) re-anchor here instead of extrapolating 100x
    # data (data.md §2-4)
    data: str = "data_cache/fineweb-edu-llama2"   # prepared dir: {train,val}-*.parquet + meta (python data.py prepare)
    tokenizer: str = ""                     # optional tokenizer spec whose identity must equal the data's hash
    # evaluation (data.md §4)
    eval_every: int = 0                     # steps between val evals; 0 = final step only (the release)
    eval_tokens: int = 70778880             # 34,560 val rows x 2048 = "70.8M" (release); -1 = the whole val split
    # output and resume
    out_dir: str = "out/run"                # ckpt.pt, log.jsonl, done.json go here
    ckpt_every: int = 1000                  # steps between checkpoints (plus one at the end); 0 = only at the end
    log_every: int = 1                      # steps between loss reads (the only host syncs) and log lines
    resume: bool = False                    # continue from out_dir/ckpt.pt if present (sweeps always pass it)
    overwrite: bool = False                 # use an out-dir holding files train.py did not make (none is deleted)
    case: str = ""                          # label copied into done.json; fit.py groups case studies by it
    init_from: str = ""                     # start from these weights: a run dir / .pt, or an authors' release dir
                                            # (model_<step>.pt: the latest, or name the file); fresh optimizer
    # runtime
    seed: int = 0                           # init (same on every rank); random state init noise per global row
    compile: Optional[bool] = None          # torch.compile the model; None = on for CUDA, off for CPU (style B11)
    compile_mode: str = "default"           # default | max-autotune-no-cudagraphs: torch.compile's mode
    precision: Optional[str] = None         # fp32 | bf16 (autocast, bf16 wte, bf16 Polar Express); None = bf16 on CUDA
    attn: str = "auto"                      # auto | fa3 | fa2 | sdpa; auto: FA-3 on 9.x, FA-2 on >= 8.0, else SDPA
    sdpa_backend: str = "auto"              # auto | cudnn | flash | efficient | math: SDPA's kernel; auto: torch's
    peak_flops: Optional[float] = None      # per-device peak FLOP/s for MFU; None = PEAK_FLOPS by device name
    plan: bool = False                      # print every derived quantity (steps, tokens, LRs, cost) and stop

# A field an older record lacks reads as its default (common.identity_diff): a new default-off field changes no identity
IDENTITY_DEFAULTS = {f.name: f.default for cls in (ModelConfig, TrainConfig) for f in dataclasses.fields(cls)}

# Allowed values of every int / float field of ModelConfig and TrainConfig, in common.py's interval notation,
# checked once, when the CLI parses the flag (common.number). Counts stop at flops.py's MAX_COUNT (1e9); seed at
# numpy's range; eval_tokens -1 = the whole val split (0 is refused by check_data); device_batch 0 = auto. Rules
# across fields stay in ModelConfig.__post_init__ and parse_args. A test checks every numeric field has a row.
LIMITS = {k: (v,) for k, v in dict(
    scale="[1, 1e9]", aspect_ratio="[1, 1e9]", n_loops="[1, 16]", n_layers_eff="[1, 1e9]", n_layers_prelude="[0, 1e9]",
    n_layers_coda="[0, 1e9]", head_dim="[2, 1e9]", vocab_size="[2, 1e9]", seq_len="[1, 1e9]", hc_lanes="[2, 1e9]",
    state_init_std="(0, 1000]", n_loops_bwd="[1, 16]", logit_softcap="(0, 10000]", rope_base="(1, 1e12]",
    norm_eps="(0, 0.1]", flops_budget="(0, 1e30]", tokens="[1, inf)", tokens_per_param="(0, 1e9]", steps="[1, inf)",
    batch_tokens="[1, inf)", device_batch="[0, inf)", muonh_lr="(0, 10]", d_ref="(0, inf)", lr_batch_ref="[1, inf)",
    eval_every="[0, inf)", eval_tokens="[-1, inf)", ckpt_every="[0, inf)", log_every="[1, inf)",
    seed="[0, 4294967295]", peak_flops="(0, 1e20]").items()}

# -----------------------------------------------------------------------------
# main: the recipe, top to bottom, in the order it runs (like nanochat's base_train)
def main(model_cfg: ModelConfig, train_cfg: TrainConfig) -> dict:
    """Train one run; return its record (the content of out_dir/done.json), or with --plan the derived quantities
    and the out-dir's status. Every rank runs this; only rank 0 prints (print0) and writes files."""
    # ---- 1. Setup: ranks, every refusal (preflight), the derived quantities printed with their rules ------------
    t_start = time.time()
    rank, world, device = common.init_dist()   # torchrun env -> nccl (CUDA) / gloo (CPU); plain python -> (0, 1, dev)
    run = preflight(model_cfg, train_cfg, rank, world, device)   # rank 0 has claimed out_dir if it will write there
    cfg, tc, g, master = run.cfg, run.tc, run.g, rank == 0
    ckpt_path, done_path, log_path = (os.path.join(tc.out_dir, n) for n in (CKPT_NAME, DONE_NAME, LOG_NAME))
    if run.status == "finished" and not tc.plan:            # a sweep relaunches every run with --resume
        print0(f"{done_path} exists: the run is finished (same run identity); returning its record")
        return run.held
    # One optimizer step = B tokens = batch_rows rows of the one global stream (data.md §3), per_rank rows on each
    # rank in accum micro-steps; total_steps from the horizon rule (App. E); the peak LRs of HyperP (App. D.2).
    B, F, total_steps, r = g.B, g.F, g.steps, cfg.n_loops
    autocast = (lambda: torch.autocast(device.type, dtype=torch.bfloat16)) if run.use_bf16 else nullcontext
    sdpa = (lambda: sdpa_kernel(SDPA_BACKENDS[tc.sdpa_backend])) if tc.sdpa_backend != "auto" else nullcontext
    # Every derived quantity, printed once with its rule (the device batch, unless given or --plan, once measured)
    (p, rec, c), f = cfg.partition, run.facts
    peak, peak_rule = peak_flops(run.dev_name, tc.peak_flops)
    db = tc.device_batch or (release_device_batch(cfg.scale, g.per_rank) if tc.plan else None)   # else: measured
    hours = g.tokens * F / (PLAN_MFU * (peak or PEAK_FLOPS["H100"])) / 3600       # the H100's peak if none known
    lr = dict(muonh_lr=f"{tc.muonh_lr} b (D/D_ref)^-0.32", wte_lr="0.3 b w", lm_head_lr="0.004 b w", norm_lr="0.005 w",
              hc_lr="0.01 w")
    rows = [("vocab_size", cfg.vocab_size, f.vocab_rule if f else "--vocab-size"),
            ("d_model, n_head", f"{cfg.d_model}, {cfg.n_head}", f"{cfg.aspect_ratio} x s (§3.1), / head_dim"),
            ("layout p-recur-c", f"{p}-{rec}-{c}", f"l_eff = {p} + {r} x {rec} + {c} = {cfg.n_layers_eff} (§3.1)"),
            ("injection", cfg.injection if r > 1 else "none (r = 1)", "Eq. 5 linear default; App. C.2 / G.1"),
            ("bptt window", f"{cfg.n_loops_bwd or r} of {r} loops", "Eq. 6; truncated only by --n-loops-bwd"),
            ("n_once + n_rec", f"{g.n_once:,} + {g.n_rec:,}", "N, non-embedding, norm gains included (Table 6)"),
            ("flops_per_token", f"{F:,}", "F_train: 6 N_exec + attention 12 d T per layer + 6 d V_pad (§3.2)"),
            ("batch", f"{B:,} tok = {g.batch_rows} rows", f"{g.per_rank} rows per rank x {world} ranks"),
            ("device batch", db or "auto", "--device-batch" if tc.device_batch else "release rule" if db else "below"),
            ("steps, tokens", f"{total_steps:,}, {g.tokens:,}", f"{g.horizon_rule}; tokens = steps x B"),
            ("flops", f"{g.tokens * F:.4g}", f"tokens x F (budget {tc.flops_budget})"),
            ("lr data tokens D", f"{g.lr_tokens:,}", f"(D / D_ref)^-0.32 on MuonH (App. D.2), D_ref {g.d_ref:,.0f}"),
            *((k, f"{v:.6g}", f"{lr[k]}; b = (B/{tc.lr_batch_ref})^0.558, w = (d/{g.width_ref})^-0.5; decay to 10% "
               "(§4.1)") for k, v in g.lrs.items()),
            ("eval", f"{f.eval_rows * cfg.seq_len if f else tc.eval_tokens:,} val tokens", "data.md §4; every "
             f"{tc.eval_every} steps (0: none) + the final one"),
            ("precision", "bf16 (autocast, wte, Polar Express)" if run.use_bf16 else "fp32", "default: bf16 on CUDA"),
            ("attention", f"{run.attn}, sdpa kernel {tc.sdpa_backend}", attention_summary(run.attn, device,
             run.use_bf16) + ("; forced by --attn" if tc.attn != "auto" else "")),
            ("compile", run.use_compile and tc.compile_mode, "default: on for CUDA; --compile-mode: torch's mode"),
            *((("inductor cache", "on", inductor_cache(tc.sdpa_backend)),) if run.use_compile else ()),
            ("mfu peak", f"{peak:.4g} FLOP/s per device" if peak else "n/a", peak_rule),
            ("est. device-hours", f"{hours:,.4g}", f"tokens x F / ({PLAN_MFU:.0%} MFU x peak); eval excluded")]
    print0(f"nanoloop {'plan' if tc.plan else 'train'} | world {world} | device {run.dev_name} | out_dir {tc.out_dir}")
    for name, value, rule in rows:
        print0(f"  {name:<22} {str(value):<28} # {rule}")
    # the part of the record (and of --plan's result) that the config and the horizon fix; the configs as given
    config = {"model_config": asdict(cfg), "train_config": asdict(tc)}
    base = {"n_loops": r, "scale": cfg.scale, "d_model": cfg.d_model, "layout": list(cfg.partition), "batch_tokens": B,
            "injection": cfg.injection, "n_loops_bwd": cfg.n_loops_bwd, "n_once": g.n_once, "n_rec": g.n_rec,
            "n_params": g.n_once + g.n_rec, "flops_budget": tc.flops_budget, "flops_per_token": F, "lrs": g.lrs,
            "flops": g.tokens * F, "tokens": g.tokens, "steps": total_steps, "lr_tokens": g.lr_tokens}
    if tc.plan:                              # --plan: the numbers a launch would use, without building anything
        print0(f"status: {run.status}" + (f" at step {run.held['step']}" if run.status == "resume" else ""))
        return {**base, "device_batch": db, "accum": g.per_rank // db, "world": world,
                "device_hours": hours, "status": run.status, "identity": run.identity}
    # ---- 2. Model: same seed on every rank, so every rank holds the same init (DDP's broadcast is a no-op) --------
    torch.manual_seed(tc.seed)
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = device.type == "cuda"  # arch. §9
    raw_model = LoopedGPT(cfg).to(device)
    if run.init_state is not None:           # --init-from weights; a resume below replaces them with its checkpoint's
        raw_model.load_state_dict(run.init_state)
    raw_model.set_attention(run.attn)
    if run.use_bf16:
        raw_model.wte.to(dtype=torch.bfloat16)             # App. C.1: embeddings drawn in fp32, then cast to bf16
    assert raw_model.param_split() == (g.n_once, g.n_rec), "the module must be what flops.py counts (style B7)"
    # The device batch is measured on the built model (issue 19 §2); accumulation keeps B (fp32: same run to rounding)
    device_batch, db_rule = pick_device_batch(raw_model, tc, g, world, autocast, run.state_bytes)
    accum = g.per_rank // device_batch
    print0(f"  {'device batch':<22} {f'{device_batch} rows x {accum} accum steps':<28} # {db_rule}")
    # ---- 3. Optimizer and data -----------------------------------------------------------------------------------
    # MuonH on the block matrices + W_inject, AdamW on the rest (optimizer.md §0); MuonH sharded by whole matrices
    # across ranks, all-gathered after each step (optimizer.md §4); its state_dict does not depend on the world size.
    optimizer = build_optimizer(raw_model.param_groups(), g.lrs, polar_bf16=run.use_bf16)
    loader, val_loader = (PackedLoader(tc.data, split, seq_len=cfg.seq_len, batch_rows=g.batch_rows,
                                       device_batch=device_batch, rank=rank, world=world, device=device,
                                       tokenizer_hash=run.facts.tok_hash) for split in ("train", "val"))
    # Resume: weights, optimizer (R, momenta, Adam moments), loader position, RNG, step, wall time (preflight checked
    # identity and weights); with deterministic CPU kernels it is bitwise an uninterrupted run (tests)
    start_step, wall_before, last_val = 0, 0.0, None
    if run.status == "resume":
        ck, run.held = run.held, None
        for part, key in ((raw_model, "model"), (optimizer, "optimizer"), (loader, "loader")):
            part.load_state_dict(ck[key])
        torch.set_rng_state(ck["rng"]["torch"])               # rank 0's; every rank draws the same numbers
        if ck["rng"]["cuda"] is not None and torch.cuda.is_available():
            torch.cuda.set_rng_state(ck["rng"]["cuda"])
        start_step, wall_before, last_val = ck["step"], ck["wall_time_s"], ck["val_loss"]
        print0(f"resumed {ckpt_path} at step {start_step}/{total_steps}")
    if master:                               # the log up to the checkpoint (later lines are redone), torn tail dropped
        trim_log(log_path, start_step)
    # Wrap, then compile: compiling the DDP module lets DDPOptimizer split the graph at bucket boundaries, so each
    # all-reduce overlaps the compiled backward; gradient_as_bucket_view: .grad are views into the buckets.
    train_model = DDP(raw_model, device_ids=[device.index] if device.type == "cuda" else None, broadcast_buffers=False,
                      gradient_as_bucket_view=True) if world > 1 else raw_model
    if run.use_compile:
        train_model = torch.compile(train_model, mode=None if tc.compile_mode == "default" else tc.compile_mode)
    # rank 0 appends one JSON record per line (line-buffered: each reaches the file as written); a full disk
    # surfaces at the next append or checkpoint as one line, and loses nothing: the last checkpoint is intact
    log_file = open(log_path, "a", buffering=1) if master else None
    log = lambda rec: log_file and log_file.write(json.dumps(rec) + "\n")
    # ---- 4. The loop ---------------------------------------------------------------------------------------------
    # One optimizer step = accum micro-batches per rank: LR multiplier, forward/backward (grads all-reduce only on
    # the last micro-batch), optimizer step; at logging steps one loss read, one log line; eval / checkpoint if due.
    # No weight decay, no clipping, no warmup anywhere (§4.1): the loop has nothing else to do.
    t_loop = t_log = time.time()
    last_log = start_step
    for step in range(start_step, total_steps):
        if run.faults.get("nan") == step + 1:               # test fault: a diverged run, every logit NaN
            raw_model.lm_head.weight.data.fill_(float("nan"))
        if run.faults.get("kill") == step:                  # test fault: step K and its checkpoint are done, then
            os.kill(os.getpid(), signal.SIGKILL)            # die like a preempted job
        lr_mult = lr_multiplier(step, total_steps)          # 0.1 + 0.9 (N - step) / N  (§4.1)
        set_lr_multiplier(optimizer, lr_mult)
        loss_sum = torch.zeros((), device=device)           # sum of micro-batch mean losses, on the device
        for micro in range(accum):
            x, y = loader.next_batch()                      # (device_batch, seq_len) int64 each
            noise = state_noise(raw_model, tc.seed, step * g.batch_rows + rank * g.per_rank + micro * device_batch,
                                device_batch, device)       # (device_batch, T, d) or None; data.md §3 row order
            with (train_model.no_sync() if world > 1 and micro < accum - 1 else nullcontext()), sdpa():
                with autocast():
                    loss = train_model(x, y, state_noise=noise)   # mean CE over this micro-batch
                (loss / accum).backward()                   # optimizer.md §5: loss divided by accum steps
            loss_sum += loss.detach()
        optimizer.step()                                    # MuonH: momentum, Polar Express, rescale to R,
        optimizer.zero_grad(set_to_none=True)               # step, retract; AdamW on the rest
        done = step + 1
        due_eval = done == total_steps or (tc.eval_every and done % tc.eval_every == 0)
        due_ckpt = done == total_steps or (tc.ckpt_every and done % tc.ckpt_every == 0)
        if done % tc.log_every and not (due_eval or due_ckpt):
            continue                                        # no host sync between logging steps
        if world > 1:                                       # the loop's one host sync: all-reduce, then .item()
            dist.all_reduce(loss_sum)                       # (gloo has no AVG: sum over ranks, divide below)
        loss_val = loss_sum.item() / (accum * world)        # the global-batch mean loss
        if not math.isfinite(loss_val):                     # the NaN guard: stop before anything of it is saved
            fix = "fix it, then --resume (a lower --muonh-lr?)" if step else ("the learning rate is not the cause: "
                   "check --norm-eps, --logit-softcap, --rope-base, --state-init-std, --vocab-size and the data")
            raise FloatingPointError(f"non-finite training loss {loss_val} at step {done}/{total_steps}, not saved; "
                                     f"{ckpt_path}, if present, is the last good checkpoint: {fix}")
        now = time.time()
        dt, t_log, last_log = (now - t_log) / (done - last_log), now, done   # mean step time since the last read
        mfu = F * B / dt / (world * peak) if peak else None  # model FLOPs utilisation per device
        print0(f"step {done:05d}/{total_steps:05d} | loss {loss_val:.4f} | lr_mult {lr_mult:.3f} | dt "
               f"{dt * 1e3:.0f}ms | tok/s {B / dt:,.0f} | mfu {f'{100 * mfu:.1f}%' if peak else 'n/a'} | flops "
               f"{done * B * F:.3g}/{total_steps * B * F:.3g} | eta {(total_steps - done) * dt / 60:.1f}min")
        log({"step": done, "loss": loss_val, "lr_mult": lr_mult, "dt": dt, "tok_per_s": B / dt, "mfu": mfu})
        # Eval before the checkpoint (a run killed after both resumes past this step, and the final checkpoint
        # always holds the val loss): eval.val_loss over the first eval_rows val rows (exact, fp64 sums,
        # all-reduced), of the uncompiled module (no recompile of the training graph), in the run's precision.
        if due_eval:
            last_val = val_loss(raw_model, val_loader, run.facts.eval_rows * cfg.seq_len, bf16=run.use_bf16)
            print0(f"eval step {done:05d} | val_loss {last_val:.4f} nats | n_loops {r}")
            log({"step": done, "val_loss": last_val})
        # ---- 5. Checkpoint: every rank gathers the sharded optimizer state, rank 0 writes, the others wait -------
        if due_ckpt:
            # torch's RNG states (CPU and CUDA) as tensors, so the file loads with weights_only=True; nothing in a
            # step draws from numpy or Python (the loader and the state noise are seeded by row)
            state = {"model": raw_model.state_dict(), "optimizer": optimizer.state_dict(),
                     "loader": loader.state_dict(), "step": done, "val_loss": last_val, "identity": run.identity,
                     "rng": {"torch": torch.get_rng_state(),
                             "cuda": torch.cuda.get_rng_state() if torch.cuda.is_available() else None},
                     "wall_time_s": wall_before + time.time() - t_loop, "tokenizer_hash": run.facts.tok_hash, **config}
            if master:
                save(ckpt_path, lambda tmp: torch.save(state, tmp))
            if world > 1:
                dist.barrier()
    # ---- 6. The record: done.json, written last by rank 0, atomically, with the run identity --------------------
    # done.json is the run's only machine-readable result: fit.py and runs/*.sh read it and never the log (B9).
    if log_file:
        log_file.close()
    # Peak memory: CUDA's max allocated, else this process's peak RSS (ru_maxrss: KiB on Linux; a sweep's largest run)
    mem = ({"cuda_max_allocated": torch.cuda.max_memory_allocated(device)} if device.type == "cuda" else
           {"peak_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024})
    record = {"config": config, "identity": run.identity,
              **base, "world": world, "device_batch": device_batch, "val_loss": last_val,
              "eval_tokens": run.facts.eval_rows * cfg.seq_len, "wall_time_s": wall_before + time.time() - t_loop,
              "total_time_s": time.time() - t_start, "tokenizer_hash": run.facts.tok_hash, "data": tc.data,
              **mem, "attn": run.attn, "precision": "bf16" if run.use_bf16 else "fp32",
              "compile": run.use_compile, **git_info(), **({"case": tc.case} if tc.case else {})}
    if master:
        save(done_path, json.dumps(record, indent=1) + "\n")
        print0(f"done: val_loss {last_val:.4f} nats after {g.tokens:,} tokens -> {done_path}")
        common.release(tc.out_dir)                          # the process's exit would drop the claim anyway
    if world > 1:
        dist.barrier()
    return record

# -----------------------------------------------------------------------------
# preflight: every refusal, before any model is built (README "Guarantees", rule 5); derive: the derived quantities
def preflight(model_cfg, tc, rank: int, world: int, device) -> SimpleNamespace:
    """Check what a run can be refused for beyond its values (parse_args checked those): the --init-from
    checkpoint, the data, the backends, the geometry and horizon (derive), the memory, and what out_dir holds
    (checkpoint.out_dir_state, which then claims it). Returns the resolved run; --plan without a prepared --data
    checks what needs none."""
    cfg, init_state, init_tok, init_id, facts = model_cfg, None, None, None, None
    if tc.init_from:                         # its identity: a hash of the weights' names, dtypes, shapes and bytes
        cfg, init_state, init_tok = init_architecture(model_cfg, tc.init_from)
        h = hashlib.sha256()
        for name, t in sorted(init_state.items()):      # CPU tensors, detached (a state_dict of load_checkpoint's)
            h.update(f"{name}:{t.dtype}:{tuple(t.shape)}".encode() + t.reshape(-1).view(torch.uint8).numpy().tobytes())
        init_id = h.hexdigest()[:16]
        print0(f"init-from {tc.init_from}: weights and architecture from the checkpoint; fresh optimizer, step 0")
    # --plan needs no data; with data, it also reports the out-dir's status
    cfg, facts = check_data(cfg, tc, init_tok) if not tc.plan or os.path.isdir(tc.data) else (cfg, None)
    # precision, attention and compile, resolved once (a forced backend that cannot run is an error here)
    use_bf16 = (device.type == "cuda") if tc.precision is None else tc.precision == "bf16"
    attn = resolve_attention(tc.attn, device, use_bf16)[0]
    need(tc.sdpa_backend in ("auto", "math") or (attn == "sdpa" and device.type == "cuda"), f"--sdpa-backend "
         f"{tc.sdpa_backend} needs SDPA attention on CUDA (here: {attn} on {device.type}); leave it at auto")
    use_compile = (device.type == "cuda") if tc.compile is None else tc.compile
    g = derive(cfg, tc, world)
    # fp32 weights, gradients and two optimizer moments = 4 x the weights (checkpoint.model_bytes), before any
    # allocation: --vocab-size 1e9 is a one-line refusal naming its size, never the allocator's error
    state, (have, what) = 4 * model_bytes(cfg)[1], device_memory(device)
    need(state <= have or tc.plan, f"the model does not fit: its weights, gradients and optimizer state need "
         f"{state / 2**30:,.1f} GiB, more than the {have / 2**30:,.1f} GiB of {what}")
    identity = facts and run_identity(cfg, tc, facts.identity, init_id, "bf16" if use_bf16 else "fp32", attn,
                                      use_compile)
    status, held = out_dir_state(tc, cfg, identity, IDENTITY_DEFAULTS, rank, world) if facts else ("no --data", None)
    faults = (i.partition("@") for i in os.environ.get("NANOLOOP_FAULT", "").split(",") if i)   # tests only
    return SimpleNamespace(cfg=cfg, tc=tc, g=g, facts=facts, identity=identity, status=status, held=held,
                           init_state=init_state, use_bf16=use_bf16, attn=attn, use_compile=use_compile,
                           faults={k: int(v) for k, _, v in faults}, state_bytes=state, device=device,
                           dev_name=torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu")

def check_data(cfg, tc, init_tok_hash) -> tuple:
    """The prepared data against the model: equal seq_len (no silent re-packing), one tokenizer for both splits (and
    --tokenizer's and the --init-from checkpoint's, when given), the vocabulary (the default --vocab-size takes the
    data's), enough val rows for --eval-tokens. Returns (cfg with its vocabulary, the data's facts)."""
    meta, val_meta = read_meta(tc.data, "train"), read_meta(tc.data, "val")   # one line if not a prepared dir
    for m in (meta, val_meta):
        need(m["seq_len"] == cfg.seq_len, f"data {tc.data} was packed with seq_len {m['seq_len']} but the model has "
             f"--seq-len {cfg.seq_len}; pass that --seq-len or re-pack")
    tok = meta.get("tokenizer_hash")                # the authors' published metas carry no hash (data.md §2)
    need(val_meta.get("tokenizer_hash") == tok, f"data {tc.data}: train and val splits were tokenised differently")
    need(not tc.tokenizer or (tok is not None and load_tokenizer(tc.tokenizer).identity == tok), f"--tokenizer "
         f"{tc.tokenizer!r} is not the one {tc.data} was packed with ({tok or 'it records none'}); drop --tokenizer")
    need(init_tok_hash in (None, tok), f"--init-from {tc.init_from} was trained on data tokenised with {init_tok_hash}")
    vocab_rule, default = "--vocab-size", IDENTITY_DEFAULTS["vocab_size"]
    if cfg.vocab_size == default and meta["vocab_size"] != default and not tc.init_from:
        cfg = dataclasses.replace(cfg, vocab_size=meta["vocab_size"])
        vocab_rule = f"the data meta's (--vocab-size left at its default {default})"
    # a larger data vocabulary would index past the embedding
    need(meta["vocab_size"] <= cfg.vocab_size, f"data {tc.data} has vocab_size {meta['vocab_size']} > the model's "
         f"--vocab-size {cfg.vocab_size}")
    val_rows = val_meta.get("total_rows") or 0      # an int >= 0 if present (read_meta checked it)
    # no silent shrinking; 0 (or less than one row) is refused here too, the one check of --eval-tokens beyond LIMITS
    eval_rows = val_rows if tc.eval_tokens == -1 else tc.eval_tokens // cfg.seq_len
    need(1 <= eval_rows <= val_rows, f"--eval-tokens {tc.eval_tokens:,} needs {eval_rows} val rows of {cfg.seq_len} "
         f"tokens but {tc.data} has {val_rows}; pass {cfg.seq_len} to {val_rows * cfg.seq_len:,} (or -1: all)")
    return cfg, SimpleNamespace(tok_hash=tok, eval_rows=eval_rows, vocab_rule=vocab_rule,
                                identity=data_identity(tc.data))

def init_architecture(model_cfg, init_from: str, typed=None) -> tuple:
    """--init-from: (the checkpoint's ModelConfig with this run's n_loops_bwd, its state dict, its tokenizer hash).
    The architecture is the checkpoint's: a model flag typed on the command line (typed: their names) must equal it,
    even at its default; for a config built in code (typed None) a field at its default takes the checkpoint's
    value. n_loops_bwd stays this run's (a training choice); optimizer, schedule and step count start fresh."""
    model, ck = load_checkpoint(init_from)          # a nanoloop run or an authors' release; one-line ValueErrors
    theirs = asdict(model.cfg)
    names = typed if typed is not None else {k for k in theirs if getattr(model_cfg, k) != IDENTITY_DEFAULTS[k]}
    clash = {k: (getattr(model_cfg, k), theirs[k]) for k in sorted(set(names) - {"n_loops_bwd"})
             if getattr(model_cfg, k) != theirs[k]}
    # the architecture comes from the checkpoint: such flags are to be dropped
    need(not clash, f"--init-from {init_from}: model flags differ from the checkpoint's: (flag, checkpoint) = {clash}")
    return replace(model.cfg, n_loops_bwd=model_cfg.n_loops_bwd), model.state_dict(), ck.get("tokenizer_hash")

def run_identity(model_cfg, train_cfg, data_id, init_id, precision, attn, compile) -> dict:
    """Rule 1, what a record or checkpoint must match to be handed back or continued: every ModelConfig field (as
    trained: the vocabulary taken from the data, the architecture from --init-from) and every TrainConfig field not
    in IDENTITY_EXCLUDED, with data = the data's content identity, init_from = the initial weights' identity, and
    precision / attn / compile as resolved."""
    ident = {k: v for k, v in {**asdict(model_cfg), **asdict(train_cfg)}.items() if k not in IDENTITY_EXCLUDED}
    return dict(ident, data=data_id, init_from=init_id, precision=precision, attn=attn, compile=compile)

def derive(cfg, tc, world: int) -> SimpleNamespace:
    """Batch geometry (B = rows x T; rows = device_batch x world x accum, style B8), the accounting, the horizon
    (steps, tokens, and the D of the HyperP data factor, unrounded as the release keeps it) and the peak LRs."""
    # Every optimizer step takes the next B // T rows of the one global stream (data.md §3) on any world size; an
    # auto device_batch is picked later among the divisors of the rows per rank (here: the world size divides them)
    B, T, r, db = tc.batch_tokens, cfg.seq_len, cfg.n_loops, tc.device_batch or 1
    need(B % (db * T * world) == 0, f"--batch-tokens {B} is not divisible by device_batch x seq_len x world = "
         f"{db} x {T} x {world} = {db * T * world}")
    # Accounting of THIS config from flops.py, the single source (the built model must agree): F depends on width,
    # layout, injection, hc lanes, the BPTT window (Eq. 6), T and the padded vocabulary.
    arch = flops.accounting_args(cfg)
    (n_once, n_rec), F = flops.param_split(**arch), flops.flops_per_token(**arch)
    # Every horizon gives whole steps of B tokens; the LR rule's D stays unrounded. rho uses the reuse-weighted
    # params, the release's effective_params (optimizer §2.3); its steps = D // B, floored as the release does.
    C, D, rho, N = tc.flops_budget, tc.tokens, tc.tokens_per_param, tc.steps
    lr_tokens = int(C / F) if C else N * B if N else D or int(rho * (n_once + r * n_rec))
    # a budget that buys no step is flops.py's one-line ValueError
    steps = flops.tokens_for_budget(C, F, B)[0] if C else N or (round(D / B) if D else lr_tokens // B)
    need(steps >= 1, f"horizon: {lr_tokens:,} tokens are less than {'half of ' if D else ''}one optimizer step")
    rule = ("steps = round(C / (F B)); D_lr = int(C / F)" if C else "D = steps x B = D_lr" if N else
            "steps = round(D / B); D_lr = D" if D else "D_lr = int(rho (N_once + r N_rec)); steps = D_lr // B")
    # Peak LRs: eta_base through HyperP's width / batch / data corrections (App. D.2), computed once from (d, D, B, r);
    # a resume restores the schedule position and never re-applies a factor (optimizer.md §6.7). The reference (the
    # s = 10 model at the run's aspect ratio and depth, counted at THIS r) is optim.py's.
    width_ref, d_ref = reference(r, cfg.aspect_ratio, cfg.head_dim, cfg.n_layers_eff, cfg.n_layers_prelude,
                                 cfg.n_layers_coda)
    d_ref = d_ref if tc.d_ref is None else tc.d_ref
    lrs = hyperp_lrs(cfg.d_model, r, tokens=lr_tokens, batch_tokens=B, base_lr=tc.muonh_lr, d_ref=d_ref,
                     d_model_ref=width_ref, batch_ref=tc.lr_batch_ref)
    return SimpleNamespace(B=B, batch_rows=B // T, per_rank=B // T // world, n_once=n_once, n_rec=n_rec, F=F,
                           steps=steps, tokens=steps * B, lr_tokens=lr_tokens, horizon_rule=rule,
                           width_ref=width_ref, d_ref=d_ref, lrs=lrs)

# -----------------------------------------------------------------------------
# The micro-step: its state noise, and its rows (the device batch, issue 19 §2: the largest that fits, measured)
def state_noise(model, seed: int, first: int, rows: int, device):
    """(rows, T, d) N(0, 1) for the random state init: one draw per global batch row, seeded by (seed, row), so
    every row gets its own noise and the run does not depend on the world size. None for the prelude init."""
    if model.state_init != "random":
        return None
    gen, out = torch.Generator(device=device), []
    for row in range(first, first + rows):
        gen.manual_seed(int.from_bytes(hashlib.sha256(f"{seed}:{row}".encode()).digest()[:8], "little"))
        out.append(torch.randn(model.cfg.seq_len, model.cfg.d_model, generator=gen, device=device))   # (T, d)
    return torch.stack(out)                                                                          # (rows, T, d)

def release_device_batch(scale: int, per_rank: int) -> int:
    """The release's rows per micro-step, 32 / 16 (s >= 18) / 8 (s >= 30), as the largest divisor of the rows per
    rank not above it: the fallback where nothing can be measured (--plan builds no model)."""
    rule = 32 if scale < 18 else 16 if scale < 30 else 8
    return max(k for k in range(1, min(rule, per_rank) + 1) if per_rank % k == 0)

def probe(model, rows: int, autocast, budget=None):
    """One micro-step of `rows` rows of zeros. budget None: the bytes autograd saves for the backward (the
    activations a micro-step holds), counted once per storage by saved-tensor hooks, the parameters excluded; no
    backward runs. budget given (CUDA): forward + backward for real, True if its peak reserved memory stayed within
    budget -- out of memory is False, not an error."""
    cfg, device = model.cfg, next(model.parameters()).device
    x = torch.zeros(rows, cfg.seq_len, dtype=torch.long, device=device)                 # (rows, T)
    noise = torch.zeros(rows, cfg.seq_len, cfg.d_model, device=device) if model.state_init == "random" else None
    if budget is None:
        params, seen = {p.untyped_storage().data_ptr() for p in model.parameters()}, {}
        def pack(t):                         # called for every tensor the graph saves for the backward
            seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
            return t
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), autocast():
            model(x, x, state_noise=noise)   # the graph (and what it saved) is freed on return
        return sum(v for k, v in seen.items() if k not in params)
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats(device)
    try:
        with autocast():
            model(x, x, state_noise=noise).backward()
        return torch.cuda.max_memory_reserved(device) <= budget
    except torch.cuda.OutOfMemoryError:
        return False
    finally:
        model.zero_grad(set_to_none=True)
        torch.cuda.empty_cache()

def pick_device_batch(model, tc, g, world: int, autocast, static: int) -> tuple:
    """(rows per micro-step, rule). Auto: the largest divisor k of the rows per rank whose micro-step fits; every
    divisor is a candidate (no power-of-two cap: at s = 6, B = 128 rows of 2048, an H200 tries 128, then 64, ...).
    mem(k) = static (weights, grads, optimizer state) + 1.2 (a + k b), a + k b the saved activations measured at 1
    and 2 rows (1.2: the backward's transients), decides on CPU; on CUDA it bounds the candidates, each then tried
    for real (eager, so at most what the compiled step needs), largest first. Every rank takes the smallest pick."""
    if tc.device_batch:
        return tc.device_batch, "--device-batch"
    device = next(model.parameters()).device
    (have, what), one, two = device_memory(device), probe(model, 1, autocast), probe(model, 2, autocast)
    mem = lambda k: static + 1.2 * (max(2 * one - two, 0) + k * max(two - one, 1))
    # CUDA: the model only bounds the trials (2x: it may overestimate), each then run beside the optimizer's two
    # moments (not allocated yet); CPU: the model decides
    budget = have - 2 * model_bytes(model.cfg)[1] if device.type == "cuda" else None
    fits = lambda k: mem(k) <= have if budget is None else mem(k) <= 2 * have and probe(model, k, autocast, budget)
    rows = next((k for k in range(g.per_rank, 0, -1) if g.per_rank % k == 0 and fits(k)), 0)
    if world > 1:
        t = torch.tensor([rows], device=device)
        dist.all_reduce(t, op=dist.ReduceOp.MIN)
        rows = int(t.item())
    need(rows, f"one row of {model.cfg.seq_len} tokens does not fit in {have / 2**30:,.1f} GiB ({what}) beside the "
         "weights and optimizer state: shorten --seq-len, truncate BPTT (--n-loops-bwd) or use a smaller model")
    how = "memory model" if budget is None else "trial micro-step"
    return rows, f"largest divisor of {g.per_rank} rows per rank whose {how} fits {have / 2**30:,.2f} GiB ({what})"

# -----------------------------------------------------------------------------
# What is printed and recorded: every derived quantity with its rule, the MFU peak, git provenance
def peak_flops(dev_name: str, override: Optional[float] = None) -> tuple:
    """(peak FLOP/s per device or None, rule): --peak-flops, else PEAK_FLOPS by the longest key found as whole words
    in the device name; None (MFU n/a) for a device not in the table, never another device's figure."""
    if override:
        return override, "--peak-flops"
    word = lambda k: re.search(rf"(?<![A-Za-z0-9]){re.escape(k)}(?![A-Za-z0-9])", dev_name, re.IGNORECASE)
    key = next((k for k in sorted(PEAK_FLOPS, key=len, reverse=True) if word(k)), None)
    return (PEAK_FLOPS[key], f"PEAK_FLOPS[{key!r}]: dense bf16 datasheet figure for {dev_name!r}") if key else (
        None, f"n/a: {dev_name!r} is not in PEAK_FLOPS (datasheet figures); pass --peak-flops for an MFU figure")

def inductor_cache(sdpa_backend: str) -> str:
    """Inductor's on-disk caches (FX graphs, kernels) in one stable folder per user, unless TORCHINDUCTOR_CACHE_DIR
    is set: the second process compiling the same cell shape loads them (issue 25 §5; measured on an H200 at s = 6:
    the first step 40-46 s cold, 4-5 s warm). One folder per --sdpa-backend: the cache key ignores the SDPA kernel
    choice, so a graph cached under one backend was reused under another (measured). Returns the rule. (The FX graph
    cache itself is on by default: torch._inductor.config.fx_graph_cache.)"""
    path = f"{os.environ.get('XDG_CACHE_HOME') or os.path.expanduser('~/.cache')}/nanoloop/inductor/sdpa-{sdpa_backend}"
    rule = "set by you" if os.environ.get("TORCHINDUCTOR_CACHE_DIR") else "default; TORCHINDUCTOR_CACHE_DIR moves it"
    return f"{os.environ.setdefault('TORCHINDUCTOR_CACHE_DIR', path)} ({rule})"

def git_info() -> dict:
    """Commit, dirty flag and a hash of the uncommitted diff (style B9), or None where git is unavailable."""
    git = lambda *a: subprocess.run(["git", "-C", os.path.dirname(os.path.abspath(__file__)), *a], check=True,
                                    capture_output=True, text=True, timeout=30).stdout      # this checkout's git
    try:                                                        # dirty: a tracked file differs from HEAD
        diff = git("diff", "HEAD")
        return {"git_commit": git("rev-parse", "HEAD").strip(), "git_dirty": bool(diff),
                "git_diff_sha256": hashlib.sha256(diff.encode()).hexdigest()[:16] if diff else None}
    except (OSError, subprocess.SubprocessError):               # not a checkout, or no git: provenance unknown
        return dict.fromkeys(("git_commit", "git_dirty", "git_diff_sha256"))

# -----------------------------------------------------------------------------
# CLI: one flat parser generated from ModelConfig + TrainConfig by add_dataclass_flags (style B5)
def parse_bool(text: str) -> bool:
    """A boolean flag's value: 1/true/yes/on or 0/false/no/off (argparse's own bool() would take "false" as true)."""
    if text.lower() not in ("1", "true", "yes", "on", "0", "false", "no", "off"):
        raise argparse.ArgumentTypeError(f"expected true/false, got {text!r}")
    return text.lower() in ("1", "true", "yes", "on")

def add_dataclass_flags(parser: argparse.ArgumentParser, cls, limits: dict) -> None:
    """One --flag per field of the flat dataclass cls (style B5), with its default and its source comment as help.
    Optional fields take "none"/"auto" for None; a bare boolean flag means true."""
    hints = typing.get_type_hints(cls)
    # "    name: type = default   # comment" -> the comment; % doubled because argparse %-formats help texts
    lines = (re.match(r"\s+(\w+)\s*:[^=#]+=[^#]*#\s*(.+)$", ln) for ln in inspect.getsource(cls).splitlines())
    notes = {m.group(1): m.group(2).strip().replace("%", "%%") for m in lines if m}
    group = parser.add_argument_group(cls.__name__)
    for f in dataclasses.fields(cls):
        # an Optional[X] (= Union[X, None]) field is one whose default is None (a test checks both dataclasses)
        tp = typing.get_args(hints[f.name])[0] if f.default is None else hints[f.name]
        conv = common.number(tp, *limits.get(f.name, ())) if tp in (int, float) else {bool: parse_bool, str: str}[tp]
        if f.default is None:
            conv = (lambda c: lambda v: None if v.lower() in ("none", "auto") else c(v))(conv)
        bare = dict(nargs="?", const=True, metavar="BOOL") if tp is bool else {}    # --flag alone means true
        group.add_argument("--" + f.name.replace("_", "-"), dest=f.name, type=conv, default=f.default,
                           help=f"{notes.get(f.name, '')} (default: {f.default})", **bare)

def parse_args(argv=None) -> tuple:
    """argv (list of str, None = sys.argv[1:]) -> (ModelConfig, TrainConfig). Every value is checked here, once:
    its LIMITS row as the flag is parsed, then the choices, the one horizon and --init-from's architecture. A bad
    one exits 2 with one line."""
    p = common.Parser(prog="train.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    for cls in (ModelConfig, TrainConfig):
        add_dataclass_flags(p, cls, LIMITS)
    # argparse fills in a default only for a dest the namespace lacks: a model field still UNSET after parsing was
    # not on the command line (how --init-from tells "--n-loops 1" typed from n_loops left at its default 1)
    unset, names = object(), [f.name for f in dataclasses.fields(ModelConfig)]
    ns = p.parse_args(argv, argparse.Namespace(**dict.fromkeys(names, unset)))
    typed = {k for k in names if getattr(ns, k) is not unset}
    try:
        for name, allowed in CHOICES.items():
            need(getattr(ns, name) in allowed, f"--{name.replace('_', '-')} must be one of "
                 f"{', '.join(str(a or 'auto') for a in allowed)}, got {getattr(ns, name)!r}")
        need([ns.flops_budget, ns.tokens, ns.tokens_per_param, ns.steps].count(None) == 3, "give exactly one horizon: "
             "--flops-budget, --tokens, --tokens-per-param or --steps")
        model_cfg = ModelConfig(**{k: getattr(ns, k) for k in typed})   # a model field not typed: its default
        train_cfg = TrainConfig(**{f.name: getattr(ns, f.name) for f in dataclasses.fields(TrainConfig)})
        if train_cfg.init_from:              # every model flag typed must be the checkpoint's, default-valued ones too
            init_architecture(model_cfg, train_cfg.init_from, typed)
        return model_cfg, train_cfg
    except ValueError as err:                # e.g. r does not divide 16, two horizons, a flag --init-from contradicts
        p.error(str(err))

# A refusal (bad input, another run's files, a model that cannot fit) is one line and exit status 2, before any
# work; a failure while running (a NaN loss, a full disk, out of memory) one line and 1; Ctrl-C 130. The details a
# developer needs are in tracebacks of in-process callers (runs/mini.sh logs them).
if __name__ == "__main__":
    try:
        main(*parse_args())
    except ValueError as err:
        common.fail("train.py", err)
    except (FloatingPointError, OSError, torch.cuda.OutOfMemoryError, KeyboardInterrupt) as err:
        stop, oom = isinstance(err, KeyboardInterrupt), isinstance(err, torch.cuda.OutOfMemoryError)
        print("train.py: " + ("interrupted; rerun the same command with --resume to continue from the last checkpoint"
              if stop else f"error: {common.first_line(err)}" + (" (pass a smaller --device-batch, then rerun with "
                                                                 "--resume)" if oom else "")), file=sys.stderr)
        sys.exit(130 if stop else 1)         # 130: the shell's status for SIGINT
    finally:
        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()
