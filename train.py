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
       throughput   python train.py --bench-steps 10 --scale 2 --n-loops 4 --seq-len 256 --batch-tokens 4096 ...
       plan only    python train.py --flops-budget 1e18 --n-loops 4 --scale 10 --plan    (steps, tokens, LRs, cost)
       fine-tune    python train.py --init-from RUN_OR_RELEASE_DIR --tokens 1e9 --data DIR --out-dir out/ft
       GPU check    python train.py gpu-check [--cpu-smoke] [--out FILE]      (= bash runs/gpu_check.sh; see gpu_check)
Test:  pytest tests/test_train.py tests/test_runs.py
Read in this order: TrainConfig -> parse_args -> main (sections in the order they run) -> save_checkpoint.
Not here: FLOP/token accounting (flops.py), LR rules and MuonH (optim.py), loader/packing (data.py),
val_loss (eval.py), the model (model.py).

Decisions (project, stated once here and printed at start-up):
- Horizon: exactly one of --flops-budget C (steps = round(C / (F B)), the grid, App. E), --tokens D
  (steps = round(D / B)), --tokens-per-param rho (D = int(rho (N_once + r N_rec)), steps = D // B as the release
  floors it, the App. D LR sweep), --steps N (D = N B, the App. I pair). The HyperP data factor uses the unrounded
  D: int(C/F), D, int(rho N_eff) or N B.
- Vocabulary: if --vocab-size is left at ModelConfig's default (32,001, Llama-2 + 1), the model takes the data
  meta's vocab_size (the authors' prepack records its tokenizer's 32,001, so paper runs keep V_pad = 32,064); an
  explicit value must be >= the data's. seq_len must equal the data's (no silent re-packing).
- BPTT: full unless --n-loops-bwd k is given (never truncated silently; the release's CLI defaulted to k = 4).
- Resume: --resume continues from out_dir/ckpt.pt if it exists (else starts at step 0), bitwise on CPU. Without
  --resume an existing checkpoint is an error. A finished run (done.json) is returned as is.
- Run directory (README "Guarantees"): rank 0 holds out_dir/train.lock (an flock; "pid P host H") while it writes, so
  a second trainer refuses; what a kill leaves (a dead holder's lock, a temporary of an interrupted write, a torn last
  log line) is named and repaired on the next start. Every numeric flag is checked against LIMITS when parsed.
- DDP: plain DDP (grads sync only on the last micro-step) with MuonH sharded by whole matrices: each rank runs Polar
  Express on the matrices it owns from DDP's averaged grads and all-gathers them (optim.py, optimizer.md §4). DDP
  wraps first and torch.compile compiles the wrapped module (DDPOptimizer splits the graph at bucket boundaries, so
  the all-reduce overlaps the compiled backward); eval runs the uncompiled module (no recompile of the training graph).
- Precision: --precision bf16 (default on CUDA) = bf16 autocast, bf16 wte and its Adam state, bf16 Polar Express;
  fp32 (default on CPU) = none of them. bf16 on CPU runs the CUDA code path (CI covers the GPU numerics).
- Attention: --attn auto picks FA-3 on compute capability 9.x, FA-2 on >= 8.0, SDPA otherwise; a forced backend
  that cannot run is an error. Printed at start-up and recorded in done.json.
- Many ranks: rank 0's view of out_dir (done.json, ckpt.pt) decides finish/resume; every rank must see the same
  files (one shared filesystem) or all abort. The random state init draws one noise tensor per global batch row
  (seeded by seed and row index), so ranks differ and results do not depend on the world size.
- Fault hooks for tests (env NANOLOOP_FAULT, comma-separated): "nan@K" makes the loss of step K (1-based) NaN;
  "kill@K" SIGKILLs this process right after step K (and its checkpoint, if one is due). Never set them otherwise.
"""
import argparse
import dataclasses
import errno
import fcntl
import functools
import hashlib
import inspect
import json
import math
import os
import pathlib
import random
import re
import resource
import signal
import socket
import subprocess
import sys
import time
import typing
from contextlib import nullcontext
from dataclasses import asdict, dataclass
from typing import Optional

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import flops
from data import PackedLoader, atomic_write, init_dist, load_tokenizer, print0, read_meta, stale_temps
from eval import load_checkpoint, load_weights, read_checkpoint, val_loss
from model import ATTN_BACKENDS, LoopedGPT, ModelConfig, resolve_attention
from optim import build_optimizer, hyperp_lrs, lr_multiplier, reference_tokens, set_lr_multiplier

REPO_DIR = os.path.dirname(os.path.abspath(__file__))
CKPT_NAME = "ckpt.pt"      # out_dir/ckpt.pt: the latest good checkpoint, replaced atomically
DONE_NAME = "done.json"    # out_dir/done.json: the run's record, written last by rank 0
LOG_NAME = "log.jsonl"     # out_dir/log.jsonl: one JSON object per step / eval (machine-readable log)
LOCK_NAME = "train.lock"   # out_dir/train.lock: "pid P host H" of the one process writing this run (flock'd)

# Dense bf16 peak per accelerator for the MFU column (vendor datasheets); matched by substring of the device name.
# CPU: an assumed figure (~2 AVX2 cores, fp32), stated at start-up; pass --peak-flops for your machine.
# First match wins, so the PCIe H100 (756 TFLOP/s) comes before the SXM default.
PEAK_FLOPS = {"H100 PCIe": 756e12, "H100": 989e12, "H200": 989e12, "H800": 989e12, "A100": 312e12, "A800": 312e12,
              "L40S": 362e12, "cpu": 1e11}
PLAN_MFU = 0.4             # model FLOPs utilisation assumed for the device-hour estimate printed at start-up
# The four ways to give the horizon, and the fields a resume must not change (the trajectory depends on them).
HORIZONS = ("flops_budget", "tokens", "tokens_per_param", "steps")
RESUME_KEYS = HORIZONS + ("batch_tokens", "muonh_lr", "d_ref", "lr_batch_ref", "seed")
CKPT_KEYS = ("model", "optimizer", "loader", "rng", "step", "val_loss", "wall_time_s", "tokenizer_hash",
             "model_config", "train_config")     # what checkpoint() writes and a resume reads (eval.read_checkpoint)


# -----------------------------------------------------------------------------
# Config: everything that is not the architecture (ModelConfig lives in model.py). Defaults = the paper's grid runs.

@dataclass
class TrainConfig:
    # horizon: exactly one of the four (bench mode may give none)
    flops_budget: Optional[float] = None    # C in FLOPs; steps = round(C / (F B)) (App. E; architecture §8.3)
    tokens: Optional[int] = None            # D; steps = round(D / B) (matched-token runs)
    tokens_per_param: Optional[float] = None  # rho; D = int(rho (N_once + r N_rec)), steps = D // B (App. D.1: 10)
    steps: Optional[int] = None             # N optimizer steps; D = N B (App. I: 89,645 steps at B = 524,288)
    # batch
    batch_tokens: int = 262144              # B = 128 rows x 2048 per optimizer step (App. D.1: 256K is best)
    device_batch: int = 0                   # rows per rank per micro-step; 0 = release rule 32 / 16 (s>=18) / 8 (s>=30)
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
    resume: bool = False                    # continue from out_dir/ckpt.pt if present (sweeps always pass it)
    case: str = ""                          # label copied into done.json; fit.py groups case studies by it
    init_from: str = ""                     # start from these weights: a run dir / .pt, or an authors' release dir
                                            # (model_<step>.pt: the latest, or name the file); fresh optimizer
    # runtime
    seed: int = 0                           # init (same on every rank); random state init noise per global row
    compile: Optional[bool] = None          # torch.compile the model; None = on for CUDA, off for CPU (style B11)
    precision: Optional[str] = None         # fp32 | bf16 (autocast, bf16 wte, bf16 Polar Express); None = bf16 on CUDA
    attn: str = "auto"                      # auto | fa3 | fa2 | sdpa; auto: FA-3 on 9.x, FA-2 on >= 8.0, else SDPA
    peak_flops: Optional[float] = None      # per-device peak FLOP/s for MFU; None = PEAK_FLOPS by device name
    bench_steps: int = 0                    # >0: time this many steps on synthetic tokens, print tok/s, MFU, memory
    plan: bool = False                      # print every derived quantity (steps, tokens, LRs, cost) and stop

    def __post_init__(self):
        horizons = [n for n in HORIZONS if getattr(self, n) is not None]
        if len(horizons) > 1 or (not horizons and self.bench_steps <= 0):
            raise ValueError(f"give exactly one horizon: --flops-budget, --tokens, --tokens-per-param or --steps "
                             f"(got {['--' + n.replace('_', '-') for n in horizons] or 'none'})")
        for name in horizons + ["batch_tokens", "muonh_lr", "lr_batch_ref"] + (["d_ref"] if self.d_ref is not None else []):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
                raise ValueError(f"--{name.replace('_', '-')} must be a finite number > 0, got {v!r}")
        for name in ("device_batch", "eval_every", "ckpt_every", "bench_steps"):
            if getattr(self, name) < 0:
                raise ValueError(f"--{name.replace('_', '-')} must be >= 0, got {getattr(self, name)}")
        if self.eval_tokens == 0 or self.eval_tokens < -1:
            raise ValueError(f"--eval-tokens must be > 0 or -1 (the whole val split), got {self.eval_tokens}")
        if self.peak_flops is not None and not self.peak_flops > 0:
            raise ValueError(f"--peak-flops must be > 0, got {self.peak_flops}")
        if self.precision not in (None, "fp32", "bf16"):
            raise ValueError(f"--precision must be fp32, bf16 or auto, got {self.precision!r}")
        if self.attn not in ATTN_BACKENDS:
            raise ValueError(f"--attn must be one of {', '.join(ATTN_BACKENDS)}, got {self.attn!r}")


# -----------------------------------------------------------------------------
# Allowed values of every int / float field of ModelConfig and TrainConfig (rule 5: checked when the CLI parses the
# flag, and again in main() for configs built in Python). "[" / "]" include the bound, "(" / ")" exclude it; floats
# must also be finite, so nan / inf never reach a model (--norm-eps inf trains a model that learns nothing). Rules
# across fields (r divides 16, head_dim divides d, one horizon, ...) stay in the classes' __post_init__. A test checks
# that every numeric field of both classes has a row here.
LIMITS = {
    # ModelConfig (model.py)
    "scale": ("[1, inf)", "width multiplier s: d_model = aspect_ratio x s"),
    "aspect_ratio": ("[1, inf)", "d_model / s; 64 in the paper"),
    "n_loops": ("[1, 16]", "recurrences r; the grid uses 1, 2, 4, 8"),
    "n_layers_eff": ("[1, inf)", "effective depth l_eff; 20 in the paper"),
    "n_layers_prelude": ("[0, inf)", "prelude blocks"),
    "n_layers_coda": ("[0, inf)", "coda blocks"),
    "head_dim": ("[2, inf)", "attention head width; 128 in the paper"),
    "vocab_size": ("[2, inf)", "vocabulary; leave the default to take the data's"),
    "seq_len": ("[1, inf)", "context length T; must equal the data's"),
    "state_init_std": ("(0, 1000]", "sigma of the random initial state; 1 = a normalised state's RMS"),
    "hc_lanes": ("[2, inf)", "hyperconnection lanes K"),
    "n_loops_bwd": ("[1, 16]", "gradient window r_bwd; none = full BPTT"),
    "logit_softcap": ("(0, 10000]", "logit soft cap; Table 4: 15"),
    "rope_base": ("(1, 1e12]", "RoPE theta; Table 4: 10000"),
    "norm_eps": ("(0, 0.1]", "RMSNorm epsilon; Table 4: 1e-6"),
    # TrainConfig
    "flops_budget": ("(0, 1e30]", "compute budget C in FLOPs; the paper's grid spans 4.64e17 to 2.15e19"),
    "tokens": ("[1, inf)", "training tokens D"),
    "tokens_per_param": ("(0, 1e9]", "tokens per parameter rho; App. D: 10"),
    "steps": ("[1, inf)", "optimizer steps"),
    "batch_tokens": ("[1, inf)", "tokens per optimizer step B"),
    "device_batch": ("[0, inf)", "rows per rank per micro-step; 0 = automatic"),
    "muonh_lr": ("(0, 10]", "base MuonH LR; the paper's 0.014"),
    "d_ref": ("(0, inf)", "HyperP reference tokens D_ref; none = the family constant"),
    "lr_batch_ref": ("[1, inf)", "HyperP reference batch in tokens"),
    "eval_every": ("[0, inf)", "steps between val evals; 0 = the final step only"),
    "eval_tokens": ("[-1, inf)", "val tokens per eval; -1 = the whole val split"),
    "ckpt_every": ("[0, inf)", "steps between checkpoints; 0 = only at the end"),
    "seed": ("[0, 4294967295]", "random seed; numpy's range"),
    "peak_flops": ("(0, 1e20]", "per-device peak FLOP/s"),
    "bench_steps": ("[0, inf)", "timed steps of bench mode"),
}


def check_value(name: str, v) -> Optional[str]:
    """None if v is allowed for the field name (LIMITS; None passes, Optional fields use it), else why not."""
    if v is None or name not in LIMITS:
        return None
    interval, what = LIMITS[name]
    lo, hi = (float(b) for b in interval[1:-1].split(", "))
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return f"must be a number in {interval} ({what}), got {v!r}"
    if not math.isfinite(v):
        return f"must be a finite number in {interval} ({what}), got {v}"
    if v < lo or v > hi or (interval[0] == "(" and v == lo) or (interval[-1] == ")" and v == hi):
        return f"must be in {interval} ({what}), got {v:g}"
    return None


def check_config(obj) -> None:
    """Every numeric field of a ModelConfig / TrainConfig against LIMITS; ValueError naming the flag."""
    for f in dataclasses.fields(obj):
        why = check_value(f.name, getattr(obj, f.name))
        if why:
            raise ValueError(f"--{f.name.replace('_', '-')} {why}")


# -----------------------------------------------------------------------------
# CLI: one flat parser generated from ModelConfig + TrainConfig (style B5). argparse itself rejects a field name
# used in both classes (conflicting option string), and allow_abbrev=False makes every unknown flag an error.

def _parse_bool(v: str) -> bool:
    if v.lower() in ("1", "true", "yes", "on"):
        return True
    if v.lower() in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true/false, got {v!r}")


def _parse_int(v: str) -> int:
    """Integers, also written in float notation when exact: --tokens 47e9, --batch-tokens 2.62144e5."""
    try:
        return int(v)
    except ValueError:
        f = float(v)                        # raises ValueError -> argparse reports "invalid value"
        if not f.is_integer():
            raise argparse.ArgumentTypeError(f"expected an integer, got {v!r}")
        return int(f)


def _field_comments(cls) -> dict:
    """field name -> its trailing source comment, so --help shows every default with its provenance."""
    try:
        src = inspect.getsource(cls)
    except (OSError, TypeError):
        return {}
    out = {}
    for line in src.splitlines():
        m = re.match(r"\s+(\w+)\s*:[^=#]+=[^#]*#\s*(.+)$", line)
        if m:
            out[m.group(1)] = m.group(2).strip().replace("%", "%%")     # argparse formats help with %
    return out


class _Parser(argparse.ArgumentParser):
    def error(self, message):                # one line, no usage block (rule 5); --help prints the usage
        self.exit(2, f"{self.prog}: error: {message} (python train.py --help lists every flag)\n")


def _limited(conv, name):
    """conv, then the LIMITS check of field name: a bad value is an argparse error naming its flag."""
    def parse(v):
        x = conv(v)
        why = check_value(name, x)
        if why:
            raise argparse.ArgumentTypeError(why)
        return x
    parse.__name__ = conv.__name__          # argparse names the type in its "invalid value" errors
    return parse


@functools.lru_cache(maxsize=None)
def _parser() -> argparse.ArgumentParser:
    """The generated parser, built once (reading the field comments is the slow part, ~50 ms)."""
    p = _Parser(prog="train.py", description=__doc__, allow_abbrev=False,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    for cls in (ModelConfig, TrainConfig):
        hints, notes = typing.get_type_hints(cls), _field_comments(cls)
        group = p.add_argument_group(cls.__name__)
        for f in dataclasses.fields(cls):
            tp, optional = hints[f.name], False
            if typing.get_origin(tp) is typing.Union:              # Optional[X] = Union[X, None]
                tp, optional = next(a for a in typing.get_args(tp) if a is not type(None)), True
            conv = {bool: _parse_bool, int: _parse_int, float: float, str: str}[tp]
            if optional:                                           # "none" restores the None default
                conv = (lambda c: lambda v: None if v.lower() in ("none", "auto") else c(v))(conv)
                conv.__name__ = tp.__name__                        # argparse names the type in its errors
            if tp in (int, float):                                 # range and finiteness, at parse time
                conv = _limited(conv, f.name)
            kw = dict(type=conv, default=f.default, help=f"{notes.get(f.name, '')} (default: {f.default})")
            if tp is bool:                                         # bare --resume means true
                kw.update(nargs="?", const=True, metavar="BOOL")
            group.add_argument("--" + f.name.replace("_", "-"), dest=f.name, **kw)
    return p


def parse_args(argv=None) -> tuple:
    """argv (list of str, None = sys.argv[1:]) -> (ModelConfig, TrainConfig). Bad values exit with a message."""
    p = _parser()
    # argparse fills in a default only for a dest the namespace lacks: a model field still UNSET after parsing was
    # not on the command line (how --init-from tells "--n-loops 1" typed from n_loops left at its default 1)
    unset = object()
    ns = p.parse_args(argv, argparse.Namespace(**{f.name: unset for f in dataclasses.fields(ModelConfig)}))
    typed = {f.name for f in dataclasses.fields(ModelConfig) if getattr(ns, f.name) is not unset}
    args = {**{f.name: f.default for f in dataclasses.fields(ModelConfig)},
            **{k: v for k, v in vars(ns).items() if v is not unset}}
    try:
        pick = lambda cls: cls(**{f.name: args[f.name] for f in dataclasses.fields(cls)})
        model_cfg, train_cfg = pick(ModelConfig), pick(TrainConfig)
        if train_cfg.init_from:      # every model flag typed must be the checkpoint's, default-valued ones included
            ck_cfg = asdict(load_checkpoint(train_cfg.init_from)[0].cfg)
            clash = {k: (getattr(model_cfg, k), ck_cfg[k]) for k in sorted(typed - {"n_loops_bwd"})
                     if getattr(model_cfg, k) != ck_cfg[k]}
            if clash:
                raise ValueError(f"--init-from {train_cfg.init_from}: model flags differ from the checkpoint's "
                                 f"architecture (flag, checkpoint) = {clash}; drop them (the architecture comes "
                                 "from the checkpoint)")
        return model_cfg, train_cfg
    except ValueError as err:                                      # e.g. r does not divide 16, two horizons
        p.error(str(err))                                          # usage + message on stderr, exit status 2


# -----------------------------------------------------------------------------
# The run directory: checked before any work, one writer at a time (a lock), leftovers of a kill repaired

def check_out_dir(out_dir: str) -> None:
    """One-line errors for an out-dir that can never work, before anything is computed or written (rule 5)."""
    if not out_dir.strip():
        raise ValueError("--out-dir is empty: name the run's folder, e.g. --out-dir out/run")
    if os.path.exists(out_dir) and not os.path.isdir(out_dir):
        raise ValueError(f"--out-dir {out_dir!r} is a file, not a folder: pick another --out-dir")
    top = os.path.abspath(out_dir)              # the nearest existing ancestor must be a writable folder
    while not os.path.exists(top):
        top = os.path.dirname(top)
    if not os.path.isdir(top):
        raise ValueError(f"--out-dir {out_dir!r}: {top} is a file, so the folder cannot be created")
    if not os.access(top, os.W_OK | os.X_OK):
        raise ValueError(f"--out-dir {out_dir!r}: {top} is not writable; pick a folder you can write to")


def acquire_lock(out_dir: str) -> int:
    """Make out_dir and take its writer lock (rule 4: one trainer per run directory); return the lock's fd.

    The lock is an flock on out_dir/train.lock, which holds "pid P host H" of its holder: the kernel drops the flock
    when the holder dies, however it dies, so a lock left by a killed run is taken over (and said so), while a live
    holder makes this call fail with a message naming it. Creating the folder and the lock also probes that out_dir
    is writable (a read-only or full disk fails here, before any work)."""
    path = os.path.join(out_dir, LOCK_NAME)
    try:
        os.makedirs(out_dir, exist_ok=True)
        while True:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o666)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = os.read(fd, 256).decode(errors="replace").strip() or "a process that has not written its id"
                os.close(fd)
                raise ValueError(f"{out_dir} is being written by another trainer ({holder}; lock {path}): one writer "
                                 "per run directory. Wait for it, stop it, or pick another --out-dir") from None
            try:                             # the holder we waited on may have removed the file: lock the new one
                same = os.path.samestat(os.fstat(fd), os.stat(path))
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)
        previous = os.read(fd, 256).decode(errors="replace").strip()
        if previous and not re.fullmatch(r"pid \d+ host \S+", previous):
            os.close(fd)
            raise ValueError(f"{path} exists and was not written by train.py ({previous[:60]!r}); move it away")
        if previous:
            print0(f"{path}: taking over the lock of {previous}, which no longer runs (a killed run left it)")
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()} host {socket.gethostname()}\n".encode(), 0)
        os.fsync(fd)
    except OSError as err:
        raise OSError(f"--out-dir {out_dir!r} is not usable: {err.strerror or err} ({err.filename or path}); pick "
                      "a writable folder with free space") from None
    return fd


def release_lock(fd: int, out_dir: str) -> None:
    """Remove out_dir/train.lock, then drop the flock (closing the fd): the next trainer finds no holder."""
    try:
        os.remove(os.path.join(out_dir, LOCK_NAME))
    except OSError:
        pass
    os.close(fd)


def remove_stale_temps(out_dir: str) -> None:
    """Delete what a kill or a power loss mid-write left in out_dir: atomic_write temporaries (never complete
    files; the real names still hold the previous versions) and the ".tmp" files of older train.py versions."""
    legacy = [os.path.join(out_dir, n + ".tmp") for n in (CKPT_NAME, DONE_NAME, LOG_NAME)]
    for path in stale_temps(out_dir) + [p for p in legacy if os.path.isfile(p)]:
        os.remove(path)
        print0(f"removed {path}: a temporary file left by an interrupted write (the real file is untouched)")


def read_log(log_path: str, upto: int) -> list:
    """The lines of log.jsonl whose step is <= upto (the rest is about to be redone), repairing a torn tail.

    A kill (or a power loss) during an append can leave the last line cut short, or NUL bytes after the last
    newline: that tail is dropped with a message (rule 3). A bad line anywhere else means the file is not this run's
    log (edited, or another tool's): an error naming the file and line, and the file is left untouched."""
    if not os.path.exists(log_path):
        return []
    with open(log_path, "rb") as f:
        lines = f.read().split(b"\n")
    tail = lines.pop()                       # after the last newline: b"" when the file ends cleanly
    kept = []
    for i, ln in enumerate(lines, 1):
        try:
            rec = json.loads(ln)
            ok = isinstance(rec, dict) and isinstance(rec.get("step"), int)
        except ValueError:                   # JSONDecodeError, UnicodeDecodeError
            ok = False
        if not ok:
            if i == len(lines) and not tail:         # the last line is itself the torn one
                tail = ln
                break
            raise ValueError(f"{log_path} line {i} is not a train.py record ({ln[:60]!r}): this is not the run's "
                             "own log. Move it away and rerun (the run resumes from its checkpoint without it)")
        if rec["step"] <= upto:
            kept.append(ln.decode() + "\n")
    if tail:
        print0(f"{log_path}: dropped a torn last line ({len(tail)} bytes: {tail[:40]!r}), the trace of a kill "
               "mid-write; the log resumes from the checkpoint")
    return kept


def write_failure(err: BaseException, path: str) -> str:
    """A one-line reason for a failed write of path: the errno text (e.g. 'No space left on device') if any error in
    the chain carries one (torch.save wraps it in a RuntimeError), else the free space when the disk is nearly full."""
    e = err
    while e is not None:
        if isinstance(e, OSError) and e.errno:
            return os.strerror(e.errno)
        e = e.__cause__ or e.__context__
    first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    try:
        st = os.statvfs(os.path.dirname(path) or ".")
    except OSError:
        return first
    free = st.f_bavail * st.f_frsize
    return f"{os.strerror(errno.ENOSPC)} ({free:,} bytes free)" if free < 64 * 2**20 else f"{first} ({free:,} bytes free)"


# -----------------------------------------------------------------------------
# Small helpers: atomic writes, git provenance, RNG state, fault hooks

def save_checkpoint(path: str, state: dict) -> None:
    """torch.save through data.atomic_write (exclusive temp in the same folder, fsync, rename): the previous
    checkpoint survives a kill, or a full disk, during the write."""
    atomic_write(path, lambda tmp: torch.save(state, tmp))


def write_json(path: str, obj: dict) -> None:
    """Atomic JSON write (done.json, bench.json): readers such as fit.py never see half a record."""
    text = json.dumps(obj, indent=1) + "\n"
    atomic_write(path, lambda tmp: pathlib.Path(tmp).write_text(text))


def git_info() -> dict:
    """Commit, dirty flag and a hash of the uncommitted diff (style B9), or None where git is unavailable."""
    def git(*args):
        return subprocess.run(["git", "-C", REPO_DIR, *args], capture_output=True, text=True, timeout=30,
                              check=True).stdout
    try:
        commit = git("rev-parse", "HEAD").strip()
        dirty = bool(git("status", "--porcelain", "--untracked-files=no").strip())
        diff = hashlib.sha256(git("diff", "HEAD").encode()).hexdigest()[:16] if dirty else None
        return {"git_commit": commit, "git_dirty": dirty, "git_diff_sha256": diff}
    except (OSError, subprocess.SubprocessError):
        return {"git_commit": None, "git_dirty": None, "git_diff_sha256": None}


def rng_state() -> dict:
    """All RNGs a step can touch, as plain types and tensors so the checkpoint loads with weights_only=True."""
    # torch drives the random state init (state_init="random") and anything stochastic in the model; numpy and
    # python are saved too, so a future use of them cannot silently break bitwise resume.
    np_state = np.random.get_state()
    return {"torch": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state() if torch.cuda.is_available() else None,
            "numpy": [np_state[0], np_state[1].tolist(), *np_state[2:]],
            "python": [random.getstate()[0], list(random.getstate()[1]), random.getstate()[2]]}


def set_rng_state(s: dict) -> None:
    """Inverse of rng_state(): restore every generator to the checkpointed position."""
    torch.set_rng_state(s["torch"])
    if s["cuda"] is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state(s["cuda"])
    np.random.set_state((s["numpy"][0], np.array(s["numpy"][1], dtype=np.uint32), *s["numpy"][2:]))
    random.setstate((s["python"][0], tuple(s["python"][1]), s["python"][2]))


def fault_steps() -> dict:
    """NANOLOOP_FAULT="nan@K,kill@K" -> {"nan": K, "kill": K} (test hooks; see the module docstring)."""
    out = {}
    for item in filter(None, os.environ.get("NANOLOOP_FAULT", "").split(",")):
        kind, _, k = item.partition("@")
        if kind not in ("nan", "kill") or not k.isdigit():
            raise ValueError(f"NANOLOOP_FAULT item {item!r} must be nan@K or kill@K")
        out[kind] = int(k)
    return out


def default_device_batch(scale: int) -> int:
    """Rows per rank per micro-step when --device-batch is 0: the release's 32 / 16 (s >= 18) / 8 (s >= 30)."""
    return 32 if scale < 18 else 16 if scale < 30 else 8


def out_dir_view(out_dir: str) -> dict:
    """What this process sees of out_dir: {".", done.json, ckpt.pt} -> (inode, size), None where absent, or the
    name of the error that stat raised."""
    view = {}
    for name in (".", DONE_NAME, CKPT_NAME):
        try:
            st = os.stat(os.path.join(out_dir, name))
            view[name] = (st.st_ino, 0 if name == "." else st.st_size)
        except FileNotFoundError:
            view[name] = None
        except OSError as err:               # e.g. not a directory: recorded, so every rank reaches the collective
            view[name] = type(err).__name__
    return view


def agree_on_out_dir(out_dir: str, world: int) -> dict:
    """Rank 0's view of out_dir (finish / resume / fresh start is decided from it), once every rank has the same.

    A rank that saw other files (node-local disks, a stale copy) would skip a run the others train, or resume from
    another step, and the ranks would diverge or hang. So all views are gathered and compared (inode and size of
    out_dir, done.json and ckpt.pt: equal on one shared filesystem), and on any difference every rank raises the
    same error, naming the first rank and host that differ."""
    view = out_dir_view(out_dir)
    if world == 1:
        return view
    views = [None] * world
    dist.all_gather_object(views, (socket.gethostname(), view))       # one small collective, before any work
    host0, view0 = views[0]
    for k, (host, v) in enumerate(views):
        if v != view0:
            raise ValueError(f"rank {k} on {host} sees {out_dir} differently from rank 0 on {host0} (name -> "
                             f"(inode, size), None = absent; rank {k}: {v}, rank 0: {view0}); every rank must see "
                             "one shared filesystem: put --out-dir on storage that all nodes mount")
    return view0


def peak_memory(device) -> tuple:
    """(label, bytes): CUDA max allocated, else this process's peak RSS (Linux reports ru_maxrss in KiB)."""
    if device.type == "cuda":
        return "cuda_max_allocated", torch.cuda.max_memory_allocated(device)
    return "peak_rss", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024



# -----------------------------------------------------------------------------
# main: written top to bottom, in the order it runs (like nanochat's base_train)

def main(model_cfg: ModelConfig, train_cfg: TrainConfig) -> dict:
    """Train one run; return its record (the content of out_dir/done.json; the bench figures in bench mode).
    The run's writer lock (rule 4), taken by _main once the config is checked, is released however it ends."""
    held = []                                # [(fd, out_dir, created)] of the lock _main takes
    try:
        return _main(model_cfg, train_cfg, held)
    finally:
        for fd, folder, created in held:
            release_lock(fd, folder)
            if created and not os.listdir(folder):   # a start that failed leaves no empty folder behind
                os.rmdir(folder)


def _main(model_cfg: ModelConfig, train_cfg: TrainConfig, held: list) -> dict:
    """main's body, top to bottom in the order it runs."""
    t_start = time.time()
    tc = train_cfg
    # Every rank runs this same function; only rank 0 prints (print0) and writes files. The process group starts
    # first because the batch geometry below depends on the world size.
    rank, world, device = init_dist()       # torchrun env -> nccl (CUDA) / gloo (CPU); plain python -> (0, 1, dev)
    master = rank == 0
    bench = tc.bench_steps > 0              # bench mode: synthetic tokens, no data dir, no checkpoint, no done.json
    no_data = bench or tc.plan              # plan mode stops after printing the derived quantities
    faults = fault_steps()                  # test hooks (module docstring); empty in real runs

    # ---- 1. Validate everything before any work ------------------------------------------------------------------
    # A sweep relaunches every run with --resume: a finished run hands back its record, a preempted one continues.
    # Without --resume an existing run is never overwritten.
    check_config(model_cfg)                  # LIMITS: finiteness and range (the CLI checked them already)
    check_config(tc)
    out_dir = tc.out_dir
    if not tc.plan:
        check_out_dir(out_dir)
    ckpt_path, done_path, log_path = (os.path.join(out_dir, n) for n in (CKPT_NAME, DONE_NAME, LOG_NAME))
    seen = agree_on_out_dir(out_dir, world) if not no_data else {}   # rank 0 decides; all ranks must agree
    has_done, has_ckpt = seen.get(DONE_NAME) is not None, seen.get(CKPT_NAME) is not None

    def finished_record():
        """The record of a finished run, if it is the run asked for (rule 1: never hand back another run's)."""
        if not tc.resume:
            raise ValueError(f"{done_path} exists: this run is finished. Pick another --out-dir (or pass --resume "
                             "to get its record back)")
        try:
            with open(done_path) as f:
                rec = json.load(f)
            was_m, was_t = rec["config"]["model_config"], rec["config"]["train_config"]
        except (ValueError, KeyError, TypeError) as err:
            raise ValueError(f"{done_path} is not a train.py record ({type(err).__name__}: {err}); move it away to "
                             "train this run again") from None
        now = asdict(model_cfg)
        if now["vocab_size"] == vocab_default:           # the default means "the data's": any recorded value fits
            now["vocab_size"] = was_m.get("vocab_size")
        # a field newer than the record counts as recorded at its default (the record predates the field)
        defaults = {f.name: f.default for f in dataclasses.fields(ModelConfig)}
        diff = {k: (was_m.get(k, defaults[k]), v) for k, v in now.items() if was_m.get(k, defaults[k]) != v
                and not (tc.init_from and v == defaults[k])}   # --init-from: a default flag took the checkpoint's
        diff.update({k: (was_t.get(k), getattr(tc, k)) for k in RESUME_KEYS
                     if was_t.get(k) != getattr(tc, k)})
        if diff:
            raise ValueError(f"{done_path} is the record of a different run: (recorded, now) = {diff}; pick "
                             "another --out-dir for this one")
        print0(f"{done_path} exists: the run is finished; returning its record")
        return rec
    vocab_default = next(f.default for f in dataclasses.fields(ModelConfig) if f.name == "vocab_size")
    if not no_data and has_done:
        return finished_record()
    if not no_data and not tc.resume and has_ckpt:
        raise ValueError(f"{ckpt_path} exists: pass --resume to continue that run, or pick another --out-dir")

    # --init-from: start from another run's weights, a nanoloop run or an authors' release (eval.load_checkpoint
    # reads and checks either). What a fine-tuning researcher expects: the architecture is the checkpoint's. A model
    # flag typed on the command line must equal it (parse_args refuses it otherwise, even at its default value); here,
    # for a config built in code, a field at its default takes the checkpoint's value, any other must equal it. n_loops_bwd stays this run's (a training choice: full BPTT unless --n-loops-bwd). The optimizer,
    # LR schedule (HyperP LRs for this run's horizon) and step count start fresh; RoPE tables are nanoloop's.
    init_state, init_hash = None, None
    if tc.init_from:
        init_model, init_ck = load_checkpoint(tc.init_from)       # ValueError (one line) for anything unreadable
        defaults = {f.name: f.default for f in dataclasses.fields(ModelConfig)}
        clash = {k: (getattr(model_cfg, k), v) for k, v in asdict(init_model.cfg).items()
                 if k != "n_loops_bwd" and getattr(model_cfg, k) not in (defaults[k], v)}
        if clash:
            raise ValueError(f"--init-from {tc.init_from}: model flags differ from the checkpoint's architecture "
                             f"(flag, checkpoint) = {clash}; drop them (the architecture comes from the checkpoint)")
        model_cfg = dataclasses.replace(init_model.cfg, n_loops_bwd=model_cfg.n_loops_bwd)
        init_state, init_hash = init_model.state_dict(), init_ck.get("tokenizer_hash")
        del init_model
        c = model_cfg
        print0(f"init-from {tc.init_from}: weights and architecture from the checkpoint (d_model {c.d_model} = "
               f"{c.aspect_ratio} x {c.scale}, r {c.n_loops}, layout {'-'.join(map(str, c.partition))}, {c.injection}, "
               f"vocab {c.vocab_size}, seq_len {c.seq_len}); bptt "
               f"{'full' if c.n_loops_bwd is None else f'last {c.n_loops_bwd}'}; fresh optimizer, LRs and step 0")

    # The data: seq_len and tokenizer must match the config; the vocabulary may be taken from it (module docstring).
    meta, val_rows, vocab_rule, tok_hash = None, 0, "--vocab-size", None
    if not no_data:
        if not os.path.isdir(tc.data):
            raise ValueError(f"--data {tc.data!r} is not a directory; prepare one with `python data.py prepare "
                             "--source default --tokenizer TOK.model --out DIR --seq-len T` (see data.py)")
        meta, val_meta = read_meta(tc.data, "train"), read_meta(tc.data, "val")
        for name, m in (("train", meta), ("val", val_meta)):
            if m["seq_len"] != model_cfg.seq_len:
                raise ValueError(f"data {tc.data} ({name}) was packed with seq_len {m['seq_len']} but the model has "
                                 f"--seq-len {model_cfg.seq_len}; pass --seq-len {m['seq_len']} or re-pack")
        tok_hash = meta.get("tokenizer_hash")     # the authors' published metas carry no hash (data.md §2)
        if val_meta.get("tokenizer_hash") != tok_hash:
            raise ValueError(f"data {tc.data}: train and val splits were tokenised differently "
                             f"({tok_hash} vs {val_meta.get('tokenizer_hash')})")
        if tc.tokenizer:                     # an explicit tokenizer must be the one the data was packed with
            identity = load_tokenizer(tc.tokenizer).identity
            if tok_hash is None:
                raise ValueError(f"--tokenizer {tc.tokenizer!r} given, but {tc.data} records no tokenizer_hash to "
                                 "check it against; drop --tokenizer or re-pack with data.py")
            if identity != tok_hash:
                raise ValueError(f"--tokenizer {tc.tokenizer!r} (identity {identity}) does not match the tokenizer "
                                 f"data {tc.data} was packed with ({tok_hash})")
        if model_cfg.vocab_size == vocab_default and meta["vocab_size"] != vocab_default and not tc.init_from:
            model_cfg = dataclasses.replace(model_cfg, vocab_size=meta["vocab_size"])   # rule: see docstring
            vocab_rule = f"the data meta's (--vocab-size left at its default {vocab_default})"
        if meta["vocab_size"] > model_cfg.vocab_size:
            raise ValueError(f"data {tc.data} has vocab_size {meta['vocab_size']} > the model's --vocab-size "
                             f"{model_cfg.vocab_size}: token ids would index past the embedding")
        val_rows = val_meta["total_rows"]
    cfg = model_cfg
    d, r = cfg.d_model, cfg.n_loops

    # Batch geometry: B tokens = rows x seq_len; rows = device_batch x world x accum, exactly (style B8). Every
    # optimizer step consumes the next batch_rows rows of the one global stream (data.md §3), so 1 GPU and 8 GPUs
    # (or 4 nodes) train on the same tokens; device_batch only trades memory for accumulation steps.
    if tc.batch_tokens % cfg.seq_len:
        raise ValueError(f"--batch-tokens {tc.batch_tokens} is not a multiple of --seq-len {cfg.seq_len}")
    batch_rows = tc.batch_tokens // cfg.seq_len
    device_batch = tc.device_batch
    if device_batch == 0:                   # release rule (architecture §8.4), capped at one micro-step per rank
        device_batch = min(default_device_batch(cfg.scale), max(1, batch_rows // world))
    if batch_rows % (device_batch * world):
        raise ValueError(f"--batch-tokens {tc.batch_tokens} is not divisible by device_batch x seq_len x world = "
                         f"{device_batch} x {cfg.seq_len} x {world} = {device_batch * cfg.seq_len * world}")
    accum = batch_rows // (device_batch * world)

    # Accounting of THIS config (flops.py is the single source; the model's structural count must agree with it).
    # F depends on everything that changes executed FLOPs: width, layout, injection mode, hc lanes, the BPTT window
    # (detached loops are forward-only, Eq. 6), T (attention 12 d T per layer) and the padded vocabulary.
    layout = cfg.partition
    mode_kw = dict(n_layers_eff=cfg.n_layers_eff, n_layers_prelude=cfg.n_layers_prelude,
                   n_layers_coda=cfg.n_layers_coda, injection=cfg.injection, hc_lanes=cfg.hc_lanes)
    n_once, n_rec = flops.param_split(d, r, **mode_kw)
    F = flops.flops_per_token(d, r, **mode_kw, n_loops_bwd=cfg.n_loops_bwd, seq_len=cfg.seq_len,
                              vocab_size=cfg.vocab_size)

    # Horizon: total steps, tokens trained and the D that enters the HyperP data factor (optimizer §2.2). Tokens are
    # always whole optimizer steps; the data factor keeps the unrounded D, as the release does, so our peak LRs
    # match optimizer.md §3 to the printed digit (e.g. s=10 r=4 C=1e18: 3,642 steps, eta_MuonH 0.014281).
    B = tc.batch_tokens
    steps_given = tc.steps
    if bench and all(getattr(tc, n) is None for n in HORIZONS):
        steps_given = tc.bench_steps         # bench mode without a horizon: the schedule spans the timed steps
    try:
        if tc.flops_budget is not None:
            total_steps, tokens = flops.tokens_for_budget(tc.flops_budget, F, B)
            lr_tokens, horizon_rule = int(tc.flops_budget / F), "steps = round(C / (F B)); D_lr = int(C / F)"
        elif steps_given is not None:
            total_steps, tokens = steps_given, steps_given * B
            lr_tokens, horizon_rule = tokens, "D = steps x B = D_lr"
        else:
            if tc.tokens is not None:
                lr_tokens, horizon_rule = tc.tokens, "steps = round(D / B); D_lr = D"
                total_steps = round(lr_tokens / B)
            else:                            # reuse-weighted params = the release's effective_params (optimizer §2.3)
                lr_tokens = int(tc.tokens_per_param * (n_once + r * n_rec))
                horizon_rule = "D_lr = int(rho (N_once + r N_rec)); steps = D_lr // B"
                total_steps = lr_tokens // B     # floor, as the release's data:param horizon (base_train.py)
            if total_steps < 1:
                raise ValueError(f"{lr_tokens:,} tokens are " + ("less than half of" if tc.tokens is not None else
                                 "less than") + f" one optimizer step of {B:,} tokens")
            tokens = total_steps * B
    except ValueError as err:
        raise ValueError(f"horizon: {err} (one step of B = {B:,} tokens costs F B = {F * B:.4g} FLOPs)") from None
    if bench:                                # the LR schedule must cover every timed step
        total_steps = max(total_steps, tc.bench_steps)
    # Peak LRs: eta_base through HyperP's width / batch / data corrections (App. D.2). Computed once, here, from
    # (d, D, B, r); a resume restores the schedule position and never re-applies a factor (optimizer.md §6.7).
    # The reference model is s = 10 at the run's own aspect ratio and depth (the release builds it from the run's
    # aspect ratio): d_ref_width = 10 x aspect and D_ref = 10 x its effective params counted at THIS run's r. On the
    # paper's grid (aspect 64, l_eff 20): 640 and D_ref = 983,315,200 (r=1), 606,380,800 / 1,016,083,200 /
    # 1,835,488,000 (r = 2 / 4 / 8) (optimizer §2.3).
    d_model_ref = 10 * cfg.aspect_ratio
    d_model_ref_rounded = -(-d_model_ref // cfg.head_dim) * cfg.head_dim      # the release rounds the ref's width up
    d_ref = tc.d_ref if tc.d_ref is not None else reference_tokens(
        r, d_model=d_model_ref_rounded, n_layers_eff=cfg.n_layers_eff, n_layers_prelude=cfg.n_layers_prelude,
        n_layers_coda=cfg.n_layers_coda)     # counted at this run's r (optimizer §2.3)
    lrs = hyperp_lrs(d, r, tokens=lr_tokens, batch_tokens=B, base_lr=tc.muonh_lr, d_ref=d_ref,
                     d_model_ref=d_model_ref, batch_ref=tc.lr_batch_ref)

    # Validation size: the first eval_tokens // seq_len val rows, which must exist (no silent shrinking).
    eval_rows = val_rows if tc.eval_tokens == -1 else tc.eval_tokens // cfg.seq_len
    if not no_data:
        if eval_rows < 1 or eval_rows > val_rows:
            raise ValueError(f"--eval-tokens {tc.eval_tokens:,} needs {eval_rows} val rows of {cfg.seq_len} tokens "
                             f"but {tc.data} has {val_rows}; pass --eval-tokens <= {val_rows * cfg.seq_len:,} "
                             "(or -1 for the whole val split)")

    # From here on this process writes out_dir: take its lock (one writer per run directory), then repair what a
    # killed predecessor may have left: temporaries of an interrupted write (the torn log tail is handled below).
    if master and not no_data:
        created = not os.path.isdir(out_dir)
        held.append((acquire_lock(out_dir), out_dir, created))
        if os.path.exists(done_path) or (not tc.resume and os.path.exists(ckpt_path)):
            raise ValueError(f"another trainer wrote {out_dir} while this one was starting; rerun the same command "
                             "(with --resume) once it is done")
        remove_stale_temps(out_dir)

    # A checkpoint to resume must come from the same model, horizon, LRs, seed and tokenizer.
    ckpt = None
    if not no_data and tc.resume and has_ckpt:
        ckpt = read_checkpoint(ckpt_path, CKPT_KEYS)   # safe (weights_only), one-line errors for bad files
        now = asdict(cfg)
        diff = {k: (v, now.get(k)) for k, v in ckpt["model_config"].items() if now.get(k) != v}
        if diff:
            raise ValueError(f"{ckpt_path} was written by another model config: (checkpoint, now) = {diff}")
        saved = ckpt["train_config"] if isinstance(ckpt["train_config"], dict) else {}
        diff = {k: (saved.get(k), getattr(tc, k)) for k in RESUME_KEYS if saved.get(k) != getattr(tc, k)}
        if diff:
            raise ValueError(f"{ckpt_path}: resuming with a different horizon/LR/seed: (checkpoint, now) = {diff}")
        if ckpt["tokenizer_hash"] != tok_hash:
            raise ValueError(f"{ckpt_path} was trained on data tokenised with {ckpt['tokenizer_hash']}, but "
                             f"{tc.data} was tokenised with {tok_hash}")

    # MFU peak: stated, never silently guessed.
    dev_name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    peak = tc.peak_flops or next((v for k, v in PEAK_FLOPS.items() if k.lower() in dev_name.lower()), None)
    peak_rule = "--peak-flops" if tc.peak_flops else f"PEAK_FLOPS[{dev_name!r}]" if peak else "unknown device"
    if peak is None:
        peak, peak_rule = PEAK_FLOPS["H100"], f"unknown device {dev_name!r}: assuming H100 bf16 (pass --peak-flops)"
    use_compile = (device.type == "cuda") if tc.compile is None else tc.compile
    # bf16 = the paper's GPU numerics (autocast, bf16 wte + Adam state, bf16 Polar Express), also on CPU when asked
    use_bf16 = (device.type == "cuda") if tc.precision is None else tc.precision == "bf16"
    attn, attn_rule = resolve_attention(tc.attn, device, use_bf16)   # a forced backend that cannot run: error here

    # ---- 2. Print every derived quantity once, with its rule -----------------------------------------------------
    def show(name, value, rule=""):
        print0(f"  {name:<22} {str(value):<28} {('# ' + rule) if rule else ''}")
    mode = "bench" if bench else "plan" if tc.plan else "train"
    print0(f"nanoloop {mode} | world {world} | device {dev_name} | out_dir {out_dir}")
    show("vocab_size", cfg.vocab_size, vocab_rule)
    show("d_model", d, f"aspect_ratio x scale = {cfg.aspect_ratio} x {cfg.scale}  (§3.1)")
    show("n_head", cfg.n_head, f"d_model / head_dim = {d} / {cfg.head_dim}")
    show("layout p-recur-c", "-".join(map(str, layout)),
         f"l_eff = {layout[0]} + {r} x {layout[1]} + {layout[2]} = {cfg.n_layers_eff}  (§3.1, iso-depth)")
    show("injection", cfg.injection if r > 1 else "none (r = 1)", "Eq. 5 linear default; App. C.2 / G.1 variants")
    show("bptt", "full" if cfg.n_loops_bwd in (None, r) else f"truncated: last {cfg.n_loops_bwd} of {r} loops",
         "Eq. 6; truncation only when --n-loops-bwd is given")
    show("n_once / n_rec", f"{n_once:,} / {n_rec:,}", "flops.param_split, norm gains included (Table 6)")
    show("n_params", f"{n_once + n_rec:,}", "N = N_once + N_rec, non-embedding")
    show("flops_per_token", f"{F:,}", "F_train: 6 N_exec + attention 12 d T per layer + 6 d V_pad  (§3.2)")
    show("batch", f"{B:,} tok = {batch_rows} rows", f"{device_batch} rows x {world} ranks x {accum} accum steps")
    show("steps", f"{total_steps:,}", horizon_rule if not bench else "bench: --bench-steps")
    show("tokens", f"{tokens:,}", "steps x B (whole optimizer steps)")
    show("flops", f"{tokens * F:.4g}", f"tokens x F (budget {tc.flops_budget:.4g})" if tc.flops_budget else "tokens x F")
    show("lr data tokens D", f"{lr_tokens:,}", "enters (D / D_ref)^-0.32 on MuonH  (App. D.2)")
    show("D_ref", f"{d_ref:,.0f}", "--d-ref" if tc.d_ref is not None else
         f"10 x effective params of the s=10 reference (d={d_model_ref}, l_eff={cfg.n_layers_eff})  (optimizer §2.3)")
    for k, v in lrs.items():
        show(k, f"{v:.6g}", {"muonh_lr": f"{tc.muonh_lr} b (D/D_ref)^-0.32", "wte_lr": "0.3 b w",
                              "lm_head_lr": "0.004 b w", "norm_lr": "0.005 w", "hc_lr": "0.01 w"}[k]
             + f"; b = (B/{tc.lr_batch_ref})^0.558, w = (d/{d_model_ref})^-0.5  (optimizer §2)")
    show("schedule", "lrm = 0.1 + 0.9 (N - step) / N", "no warmup, decay to 10% (§4.1)")
    show("eval", f"{eval_rows * cfg.seq_len:,} val tokens", f"every {tc.eval_every} steps + final" if tc.eval_every
         else "final step only (data.md §4)")
    show("precision", "bf16 (autocast, wte, Polar Express)" if use_bf16 else "fp32",
         "--precision" if tc.precision else "default: bf16 on CUDA, fp32 on CPU")
    show("attention", attn, attn_rule)
    show("compile", use_compile, "default: on for CUDA, off for CPU" + ("; after DDP wraps" if world > 1 else ""))
    show("mfu peak", f"{peak:.4g} FLOP/s per device", peak_rule)
    gpu_hours = tokens * F / (PLAN_MFU * peak) / 3600
    show("est. device-hours", f"{gpu_hours:,.4g}", f"tokens x F / ({PLAN_MFU:.0%} MFU x peak); eval excluded")
    if tc.plan:                              # --plan: the numbers a launch would use, without building anything
        return {"n_loops": r, "scale": cfg.scale, "d_model": d, "layout": list(layout), "n_once": n_once,
                "n_rec": n_rec, "n_params": n_once + n_rec, "flops_budget": tc.flops_budget, "flops_per_token": F,
                "flops": tokens * F, "tokens": tokens, "steps": total_steps, "lr_tokens": lr_tokens, "lrs": lrs,
                "batch_tokens": B, "device_batch": device_batch, "accum": accum, "world": world,
                "device_hours": gpu_hours}

    # ---- 3. Model, optimizer, data -------------------------------------------------------------------------------
    # Seed everything before building: every rank then holds the same init, and DDP's start-up broadcast is a no-op.
    random.seed(tc.seed)
    np.random.seed(tc.seed)
    torch.manual_seed(tc.seed)               # same seed on every rank -> identical init (style B8)
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True       # TF32 for the fp32 master-weight matmuls (architecture §9)
        torch.backends.cudnn.allow_tf32 = True
    if init_hash is not None and not no_data and init_hash != tok_hash:
        raise ValueError(f"--init-from {tc.init_from} was trained on data tokenised with {init_hash}, but {tc.data} "
                         f"was tokenised with {tok_hash}")
    raw_model = LoopedGPT(cfg).to(device)
    if init_state is not None:               # --init-from weights (checked against cfg when read); a resume below
        raw_model.load_state_dict(init_state)  # replaces them with its checkpoint's
    raw_model.set_attention(attn)
    if use_bf16:
        raw_model.wte.to(dtype=torch.bfloat16)             # App. C.1: embeddings drawn in fp32, then cast to bf16
    if raw_model.param_split() != (n_once, n_rec):          # style B7: the module must be what flops.py counts
        raise RuntimeError(f"model.param_split() {raw_model.param_split()} != flops.param_split {(n_once, n_rec)}")
    # MuonH on the block matrices + W_inject, AdamW on wte / lm_head / norm gains / hc lanes (optimizer.md §0);
    # every rank steps AdamW on DDP's all-reduced gradients, and MuonH on the matrices it owns, then all-gathers
    # them (optim.py design note; optimizer.md §4). Its state_dict is world-size independent.
    optimizer = build_optimizer(raw_model.param_groups(), lrs, polar_bf16=use_bf16)
    if bench:
        gen = torch.Generator(device=device).manual_seed(tc.seed + rank)   # each rank its own synthetic rows

        def next_batch():                    # uniform random tokens: throughput does not depend on their values
            xy = torch.randint(0, cfg.vocab_size, (device_batch, cfg.seq_len + 1), generator=gen, device=device)
            return xy[:, :-1], xy[:, 1:]
    else:                                    # the train stream and the fixed validation rows (data.md §3-4)
        loader = PackedLoader(tc.data, "train", seq_len=cfg.seq_len, batch_rows=batch_rows, device_batch=device_batch,
                              rank=rank, world=world, device=device, tokenizer_hash=tok_hash)
        val_loader = PackedLoader(tc.data, "val", seq_len=cfg.seq_len, batch_rows=batch_rows,
                                  device_batch=device_batch, rank=rank, world=world, device=device,
                                  tokenizer_hash=tok_hash)
        next_batch = loader.next_batch

    # Resume: weights, optimizer (R, momenta, Adam moments), loader position, RNG, step, elapsed wall time. Together
    # with deterministic CPU kernels this makes a resumed run bitwise equal to an uninterrupted one (tests).
    start_step, wall_before, last_val = 0, 0.0, None
    if ckpt is not None:
        load_weights(raw_model, ckpt["model"], ckpt_path)   # names and shapes checked: a one-line error if not
        optimizer.load_state_dict(ckpt["optimizer"])
        loader.load_state_dict(ckpt["loader"])
        set_rng_state(ckpt["rng"])           # rank 0's state; every rank draws the same numbers (same seed, calls)
        start_step, wall_before, last_val = ckpt["step"], ckpt["wall_time_s"], ckpt["val_loss"]
        print0(f"resumed {ckpt_path} at step {start_step}/{total_steps}")
        del ckpt
    elif tc.resume and not bench:
        print0(f"--resume: no {ckpt_path} yet; starting at step 0")
    if master and not bench:
        # A checkpoint is written beside the previous one, then replaces it: if the disk cannot hold the writes to
        # come, say so now rather than at step 1000. A checkpoint is at most weights + two optimizer moments each
        # (AdamW; MuonH keeps one); with two or more writes ahead the disk must hold two checkpoints at once.
        ce = tc.ckpt_every
        writes = 0 if start_step >= total_steps else (
            (total_steps // ce - start_step // ce if ce else 0) + (0 if ce and total_steps % ce == 0 else 1))
        est = 3 * sum(p.numel() * p.element_size() for p in raw_model.parameters()) + 2**16
        old = os.path.getsize(ckpt_path) if os.path.exists(ckpt_path) else 0
        need = 0 if writes == 0 else est if writes == 1 else 2 * est - min(old, est)
        st = os.statvfs(out_dir)
        if st.f_bavail * st.f_frsize < need:
            raise ValueError(f"--out-dir {out_dir!r} has {st.f_bavail * st.f_frsize:,} bytes free, but its {writes} "
                             f"checkpoint write(s) need about {need:,}: free some space or pick another --out-dir")
        # Keep the log up to the checkpoint (later lines are about to be redone); a torn last line is dropped.
        records = read_log(log_path, start_step)
        atomic_write(log_path, lambda tmp: pathlib.Path(tmp).write_text("".join(records)))

    # Wrap, then compile: DDP all-reduces grads (mean over ranks); the optimizer shards MuonH (optimizer.md §4).
    # Compiling the DDP module lets DDPOptimizer split the graph at bucket boundaries so each bucket's all-reduce
    # overlaps the rest of the compiled backward; compiling first would hide the buckets inside one opaque graph.
    # gradient_as_bucket_view: .grad are views into the all-reduce buckets (one gradient-sized copy less).
    train_model = raw_model
    if world > 1:                            # RoPE tables are the only buffers and are constant: no re-broadcast
        train_model = DDP(raw_model, device_ids=[device.index] if device.type == "cuda" else None,
                          broadcast_buffers=False, gradient_as_bucket_view=True)
    if use_compile:
        train_model = torch.compile(train_model)
    autocast = (lambda: torch.autocast(device.type, dtype=torch.bfloat16)) if use_bf16 else nullcontext

    def state_noise(step, micro):
        """(device_batch, T, d) N(0, 1) for the random state init: one draw per global batch row, seeded by
        (seed, row), so every row of the global batch gets its own noise and the run does not depend on world."""
        if raw_model.state_init != "random":
            return None
        first = step * batch_rows + rank * (batch_rows // world) + micro * device_batch   # data.md §3 row order
        gen = torch.Generator(device=device)
        rows = []
        for g in range(first, first + device_batch):
            gen.manual_seed(int.from_bytes(hashlib.sha256(f"{tc.seed}:{g}".encode()).digest()[:8], "little"))
            rows.append(torch.randn(cfg.seq_len, d, generator=gen, device=device))   # (T, d)
        return torch.stack(rows)                                                     # (device_batch, T, d)

    def evaluate(step):
        """Val loss in nats over the first eval_rows val rows (eval.val_loss: exact, fp64 sums, all-reduced).
        Runs the uncompiled module (eval shapes and no_grad never touch the compiled training graph) under the
        run's precision."""
        with autocast():
            v = val_loss(raw_model, val_loader, eval_rows * cfg.seq_len)
        print0(f"eval step {step:05d} | val_loss {v:.4f} nats | n_loops {r}", flush=True)
        return v

    def checkpoint(step, val):
        """Rank 0 writes out_dir/ckpt.pt atomically; the other ranks wait, so nobody races ahead of a bad write."""
        optim_state = optimizer.state_dict()   # every rank: gathers the sharded MuonH state (full, any world size)
        if master:
            try:
                save_checkpoint(ckpt_path, {
                    "model": raw_model.state_dict(), "optimizer": optim_state,
                    "loader": loader.state_dict(), "rng": rng_state(), "step": step, "val_loss": val,
                    "wall_time_s": wall_before + time.time() - t_loop, "tokenizer_hash": tok_hash,
                    "model_config": asdict(cfg), "train_config": asdict(tc)})
            except (OSError, RuntimeError) as err:             # e.g. a full disk: torch wraps ENOSPC in RuntimeError
                kept = f"{ckpt_path} still holds the previous one" if os.path.exists(ckpt_path) else "none was kept"
                raise OSError(f"could not write the step-{step} checkpoint {ckpt_path}: {write_failure(err, ckpt_path)}"
                              f"; {kept}. Free space, then rerun with --resume") from None
        if world > 1:
            dist.barrier()

    def log(rec):
        """One record appended to log.jsonl (rank 0); a failed append (full disk) is one line naming the file."""
        if log_file:
            try:
                log_file.write(json.dumps(rec) + "\n")
                log_file.flush()
            except OSError as err:
                raise OSError(f"could not append to {log_path}: {write_failure(err, log_path)}. Free space, then "
                              "rerun with --resume (the run continues from its last checkpoint)") from None

    # ---- 4. Training loop ----------------------------------------------------------------------------------------
    # One optimizer step = accum micro-batches per rank; per step: LR multiplier, forward/backward with the gradient
    # all-reduce only on the last micro-batch, NaN guard, optimizer step, one log line, then eval / checkpoint if due.
    # No weight decay, no clipping, no warmup anywhere (§4.1): the loop has nothing else to do.
    n_steps = tc.bench_steps if bench else total_steps
    t_loop, dt_avg, bench_times, opt_times = time.time(), None, [], []
    log_file = open(log_path, "a") if master and not bench else None
    for step in range(start_step, n_steps):
        t0 = time.perf_counter()
        lr_mult = lr_multiplier(step, total_steps)             # 0.1 + 0.9 (N - step) / N  (§4.1)
        set_lr_multiplier(optimizer, lr_mult)
        loss_sum = torch.zeros((), device=device)              # sum of micro-batch mean losses
        for micro in range(accum):
            x, y = next_batch()                                 # (device_batch, seq_len) int64 each
            last = micro == accum - 1                           # grads all-reduce only on the last micro-step
            with (train_model.no_sync() if world > 1 and not last else nullcontext()):
                noise = state_noise(step, micro)                # None unless state_init="random"
                with autocast():
                    loss = train_model(x, y, state_noise=noise)     # mean cross entropy over this micro-batch
                if faults.get("nan") == step + 1:
                    loss = loss * float("nan")                  # test hook: a NaN loss at step K (1-based)
                (loss / accum).backward()                       # optimizer.md §5: loss divided by accum steps
            loss_sum += loss.detach()
        if world > 1:
            dist.all_reduce(loss_sum)                           # gloo has no AVG: sum over ranks, divide below
        loss_val = loss_sum.item() / (accum * world)            # global-batch mean loss; syncs the device
        if not math.isfinite(loss_val):                         # NaN guard: stop before the optimizer step
            if log_file:
                log_file.close()
            kept = f"{ckpt_path} is the last good checkpoint" if os.path.exists(ckpt_path) else "no checkpoint yet"
            if step == 0:                                       # no update has happened: the LR cannot be the cause
                cause = ("the loss is non-finite before any optimizer step, so the learning rate is not the cause: "
                         "check the model flags (--norm-eps, --logit-softcap, --rope-base, --state-init-std, "
                         "--vocab-size) and the data")
            else:
                cause = "after fixing the cause (a diverging run: e.g. a lower --muonh-lr), rerun with --resume"
            raise FloatingPointError(f"non-finite training loss {loss_val} at step {step + 1}/{total_steps}; "
                                     f"stopping without an optimizer step. {kept}; {cause}")
        t_opt = time.perf_counter()                             # loss_val.item() above synced the device
        optimizer.step()                                        # MuonH: momentum, Polar Express, rescale to R,
        optimizer.zero_grad(set_to_none=True)                   # step, retract; AdamW on the rest
        if bench and device.type == "cuda":
            torch.cuda.synchronize(device)                      # bench: time the optimizer step on its own
        dt_opt = time.perf_counter() - t_opt
        dt = time.perf_counter() - t0
        done = step + 1                                         # steps completed
        if step > start_step:                                   # the first step pays for allocation / compile
            dt_avg = dt if dt_avg is None else 0.9 * dt_avg + 0.1 * dt
            bench_times.append(dt)
            opt_times.append(dt_opt)
        # Throughput over the global batch; MFU counts the run's own F (the budget's FLOPs, backward included).
        tok_s = B / dt
        mfu = F * tok_s / (world * peak)                        # model FLOPs utilisation per device
        eta = (n_steps - done) * (dt_avg or dt)
        print0(f"step {done:05d}/{n_steps:05d} | loss {loss_val:.4f} | lr_mult {lr_mult:.3f} | dt {dt * 1e3:.0f}ms | "
               f"tok/s {tok_s:,.0f} | mfu {100 * mfu:.1f}% | flops {done * B * F:.3g}/{n_steps * B * F:.3g} | "
               f"eta {eta / 60:.1f}min", flush=True)
        if bench:
            continue
        log({"step": done, "loss": loss_val, "lr_mult": lr_mult, "dt": dt, "tok_per_s": tok_s, "mfu": mfu})
        if done == total_steps or (tc.eval_every and done % tc.eval_every == 0):
            last_val = evaluate(done)
            log({"step": done, "val_loss": last_val})
        # Eval before the checkpoint: a run killed after both resumes past this step and never re-evaluates it.
        if done == total_steps or (tc.ckpt_every and done % tc.ckpt_every == 0):
            checkpoint(done, last_val)
        if faults.get("kill") == done:                          # test hook: die like a preempted job (no cleanup)
            os.kill(os.getpid(), signal.SIGKILL)

    # ---- 5. Bench summary (bench mode) ---------------------------------------------------------------------------
    # Timing excludes the first step (allocation, compile). "executed-layer tok/s" = tok/s x l_eff compares r=1 with
    # looped models per executed block (the same 20 for every r). Memory: CUDA max allocated, or peak RSS on CPU
    # (whole process, so compare configs in fresh processes, one per config).
    mem_label, mem = peak_memory(device)
    if bench:
        dt_mean = sum(bench_times) / len(bench_times) if bench_times else dt
        tok_s = B / dt_mean
        rec = {"bench_steps": tc.bench_steps, "n_loops": r, "scale": cfg.scale, "d_model": d,
               "n_layers_eff": cfg.n_layers_eff, "n_loops_bwd": cfg.n_loops_bwd, "seq_len": cfg.seq_len,
               "batch_tokens": B, "device_batch": device_batch, "world": world, "device": dev_name,
               "compile": use_compile, "precision": "bf16" if use_bf16 else "fp32", "attn": attn,
               "optim_step_s": sum(opt_times) / len(opt_times) if opt_times else dt_opt,
               "flops_per_token": F, "tok_per_s": tok_s,
               "layer_tok_per_s": tok_s * cfg.n_layers_eff, "mfu": F * tok_s / (world * peak), "peak_flops": peak,
               mem_label: mem, "timed_steps": len(bench_times) or 1}
        bptt = "full" if cfg.n_loops_bwd in (None, r) else f"last {cfg.n_loops_bwd}"
        print0(f"bench | n_loops {r} | bptt {bptt} | d_model {d} | tok/s {tok_s:,.0f} | executed-layer tok/s "
               f"{rec['layer_tok_per_s']:,.0f} | mfu {100 * rec['mfu']:.2f}% of {peak:.3g} | "
               f"{mem_label} {mem / 2**20:,.0f} MiB | optimizer step {rec['optim_step_s'] * 1e3:,.1f} ms | "
               f"{rec['precision']} {attn} | mean over {rec['timed_steps']} steps after the first")
        if master:
            os.makedirs(out_dir, exist_ok=True)
            write_json(os.path.join(out_dir, "bench.json"), rec)
        return rec

    # ---- 6. The record: rank 0 writes done.json last, atomically -------------------------------------------------
    # done.json is the run's only machine-readable result: fit.py and runs/*.sh read it and never the log (B9). Its
    # existence means "finished", so it is written after everything else, and atomically.
    if log_file:
        log_file.close()
    if last_val is None:                                        # resumed from a final checkpoint without a val loss
        last_val = evaluate(total_steps)
    record = {"config": {"model_config": asdict(cfg), "train_config": asdict(tc)},
              "n_loops": r, "scale": cfg.scale, "d_model": d, "layout": list(layout), "injection": cfg.injection,
              "n_loops_bwd": cfg.n_loops_bwd, "n_once": n_once, "n_rec": n_rec, "n_params": n_once + n_rec,
              "flops_budget": tc.flops_budget, "flops_per_token": F, "flops": tokens * F, "tokens": tokens,
              "steps": total_steps, "lr_tokens": lr_tokens, "lrs": lrs, "batch_tokens": B, "world": world,
              "device_batch": device_batch, "val_loss": last_val, "eval_tokens": eval_rows * cfg.seq_len,
              "wall_time_s": wall_before + time.time() - t_loop, "total_time_s": time.time() - t_start,
              "tokenizer_hash": tok_hash, "data": tc.data, mem_label: mem, "attn": attn,
              "precision": "bf16" if use_bf16 else "fp32", "compile": use_compile, **git_info()}
    if tc.case:
        record["case"] = tc.case
    if master:
        try:
            write_json(done_path, record)
        except OSError as err:
            raise OSError(f"could not write {done_path}: {write_failure(err, done_path)}; the final checkpoint is "
                          "kept. Free space, then rerun with --resume to write the record") from None
        print0(f"done: val_loss {last_val:.4f} nats after {tokens:,} tokens -> {done_path}")
    if world > 1:
        dist.barrier()
    return record


# -----------------------------------------------------------------------------
# gpu-check: the one-shot check to run the first time a GPU is available (runs/gpu_check.sh, issue 13 §7)
# Every figure comes from the code paths a grid run uses: the bench rows are main() in bench mode with the printed
# train.py flags, so `--dry-run` lists them as launch lines. --cpu-smoke runs all of it with tiny sizes on CPU.

GPU_CHECK_RATE = [(10, 1), (10, 4), (20, 1), (20, 4)]    # (s, r): tok/s, MFU, optimizer step time at B = 262,144
GPU_CHECK_MEMORY = [(34, 1), (34, 8)]                    # (s, r): the largest grid cells, peak memory
SMOKE_MODEL = ["--aspect-ratio", "16", "--head-dim", "16", "--n-layers-eff", "10", "--n-layers-prelude", "1",
               "--n-layers-coda", "1", "--vocab-size", "256", "--seq-len", "64"]   # mini-study shapes (CPU)


def gpu_check_plan(smoke: bool) -> dict:
    """name -> train.py argv of every bench row. GPU: real seq 2048, B = 262,144 by accumulation at the default
    device batch; memory rows run one micro-step per step (accumulation adds no memory). Smoke: tiny, eager."""
    if smoke:                                  # 4 rows of 64 tokens, 2 steps: every code path, none of the size
        rate, memory, fixed = [(1, 1), (1, 4), (2, 1), (2, 4)], [(3, 1), (3, 8)], SMOKE_MODEL
        rows = lambda kind, s: (4, 4)          # (device batch, rows per step)
        steps = lambda kind: 2
    else:
        rate, memory, fixed = GPU_CHECK_RATE, GPU_CHECK_MEMORY, []
        rows = lambda kind, s: (default_device_batch(s), 128 if kind == "rate" else default_device_batch(s))
        steps = lambda kind: 4 if kind == "rate" else 3      # the first step (compile) is not timed
    seq = 64 if smoke else 2048
    plan = {}
    for kind, cells in (("rate", rate), ("memory", memory)):
        for s, r in cells:
            device_batch, batch_rows = rows(kind, s)
            plan[f"{kind}_s{s}_r{r}"] = [*fixed, "--scale", str(s), "--n-loops", str(r), "--device-batch",
                                         str(device_batch), "--batch-tokens", str(batch_rows * seq),
                                         "--bench-steps", str(steps(kind))]
    return plan


def _gpu_check_model(smoke, device, attn, use_bf16):
    """An s=10 r=4 model (smoke: d = 32, one block x 4) and one batch (B rows of seq_len tokens) for the forward checks."""
    small = [*SMOKE_MODEL, "--scale", "2", "--n-layers-eff", "4", "--n-layers-prelude", "0", "--n-layers-coda", "0"] \
        if smoke else ["--scale", "10"]
    cfg, _ = parse_args([*small, "--n-loops", "4", "--bench-steps", "1"])
    torch.manual_seed(0)
    model = LoopedGPT(cfg).to(device)
    model.set_attention(attn)
    if use_bf16:
        model.wte.to(dtype=torch.bfloat16)
    xy = torch.randint(0, cfg.vocab_size, (2 if smoke else 8, cfg.seq_len + 1), device=device)
    return model, xy[:, :-1], xy[:, 1:]


def gpu_check(argv=None) -> dict:
    """python train.py gpu-check [--cpu-smoke] [--dry-run] [--out FILE]: print every figure, then write FILE."""
    p = argparse.ArgumentParser(prog="train.py gpu-check", allow_abbrev=False,
                                description="one-shot GPU check (runs/gpu_check.sh; README 'Running on a cluster')")
    p.add_argument("--cpu-smoke", action="store_true", help="tiny sizes on CPU (CI): every step, none of the scale")
    p.add_argument("--dry-run", action="store_true", help="print the bench rows as train.py lines and stop")
    p.add_argument("--out", default="out/gpu_check.json", help="where the JSON goes (default: %(default)s)")
    a = p.parse_args(argv)
    plan = gpu_check_plan(a.cpu_smoke)
    if a.dry_run:
        for argv_row in plan.values():
            print("python train.py " + " ".join(argv_row))
        return {}
    device = torch.device("cpu") if a.cpu_smoke else torch.device("cuda")
    if not a.cpu_smoke and not torch.cuda.is_available():
        p.error("no CUDA device visible; run `bash runs/gpu_check.sh --cpu-smoke` for the CPU smoke test")
    if os.path.isdir(a.out):
        p.error(f"--out {a.out} is a folder; give a file path (e.g. out/gpu_check.json)")
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)    # out/ on a fresh clone
    t0 = time.time()
    out = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
           "torch": torch.__version__, "smoke": a.cpu_smoke, **git_info()}
    say = lambda msg: print(f"gpu-check [{time.time() - t0:5.0f}s] {msg}", flush=True)
    sync = lambda: torch.cuda.synchronize(device) if device.type == "cuda" else None
    amp = lambda: torch.autocast(device.type, dtype=torch.bfloat16)

    # 1. attention backend (what --attn auto picks here, and why)
    attn, why = resolve_attention("auto", device, True)
    out["attention"] = {"backend": attn, "reason": why}
    say(f"attention: {attn} ({why})")

    # 2. FlashAttention vs SDPA on one bf16 forward of an s=10 r=4 model (logits, fp32 softcapped); bf16 SDPA vs
    #    fp32 SDPA gives the scale of plain bf16 rounding to read it against.
    model, x, y = _gpu_check_model(a.cpu_smoke, device, "sdpa", True)
    with torch.no_grad():
        with amp():
            ref = model(x)                                          # (B, T, V) bf16 matmuls, SDPA
            model.set_attention(attn)
            fast = model(x)                                         # the same with the auto backend
        model.set_attention("sdpa")
        full = model(x)                                             # fp32 matmuls (wte stays bf16)
    out["fa_vs_sdpa"] = {"backend": attn, "max_abs_diff_logits": (fast - ref).abs().max().item(),
                         "bf16_vs_fp32_sdpa_max_abs_diff_logits": (ref - full).abs().max().item(),
                         "note": "no FlashAttention here: the backend compared with itself" if attn == "sdpa" else ""}
    say(f"FA vs SDPA (bf16 forward, logits): max |diff| {out['fa_vs_sdpa']['max_abs_diff_logits']:.3g} "
        f"({attn}); bf16 vs fp32 SDPA {out['fa_vs_sdpa']['bf16_vs_fp32_sdpa_max_abs_diff_logits']:.3g}")
    del ref, fast, full

    # 3. compiled vs eager loss (+ gradient) of the same model and batch, bf16 autocast as in training. Smoke:
    #    backend aot_eager (dynamo + AOTAutograd without inductor's C++ build, which takes minutes on CPU).
    model.set_attention(attn)
    backend = "aot_eager" if a.cpu_smoke else "inductor"
    losses, grads = [], []
    for m in (model, torch.compile(model, backend=backend)):
        model.zero_grad(set_to_none=True)
        t = time.time()
        with amp():
            loss = m(x, y)
        loss.backward()
        sync()
        losses.append(loss.item())
        grads.append(torch.cat([q.grad.float().flatten() for q in model.parameters()]))
        say(f"{'compiled (' + backend + ')' if m is not model else 'eager'} loss {loss.item():.6f} "
            f"(first call {time.time() - t:.1f}s)")
    out["compile_vs_eager"] = {"backend": backend, "loss_eager": losses[0], "loss_compiled": losses[1],
                               "abs_diff": abs(losses[0] - losses[1]),
                               "grad_max_abs_diff": (grads[0] - grads[1]).abs().max().item(),
                               "grad_max_abs": grads[0].abs().max().item()}
    del model, x, y, grads
    torch._dynamo.reset()

    # 4-6. bench rows: tok/s, MFU, optimizer (MuonH + AdamW) step time, peak memory; each in a clean state.
    runs_dir = os.path.join(os.path.dirname(os.path.abspath(a.out)), "gpu_check_runs")
    out["bench"] = {}
    for name, row in plan.items():
        if device.type == "cuda":
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(device)
        mcfg, tcfg = parse_args([*row, "--out-dir", os.path.join(runs_dir, name)]
                                + (["--compile", "false"] if a.cpu_smoke else []))   # smoke: fp32 eager (fast)
        t = time.time()
        rec = main(mcfg, tcfg)
        rec["wall_s"] = time.time() - t
        out["bench"][name] = rec
        torch._dynamo.reset()                                       # the next model compiles from scratch
        say(f"{name}: " + ("" if name.startswith("memory") else
                           f"{rec['tok_per_s']:,.0f} tok/s | MFU {100 * rec['mfu']:.1f}% | ")
            + f"optimizer step {1e3 * rec['optim_step_s']:,.1f} ms | "
            + " ".join(f"{k} {rec[k] / 2**30:.2f} GiB" for k in ("cuda_max_allocated", "peak_rss") if k in rec)
            + f" | {rec['wall_s']:.0f}s")
    rate = {k: v for k, v in out["bench"].items() if k.startswith("rate")}
    out["summary"] = {
        "attention": attn, "fa_vs_sdpa_max_abs_diff": out["fa_vs_sdpa"]["max_abs_diff_logits"],
        "compiled_minus_eager_loss": losses[1] - losses[0],
        "mfu": {k[5:]: v["mfu"] for k, v in rate.items()},
        "tok_per_s": {k[5:]: v["tok_per_s"] for k, v in rate.items()},
        "muonh_adamw_step_s": {k[5:]: v["optim_step_s"] for k, v in rate.items()},
        "peak_memory_gib": {k[7:]: v.get("cuda_max_allocated", v.get("peak_rss", 0)) / 2**30
                            for k, v in out["bench"].items() if k.startswith("memory")},
        "wall_s": time.time() - t0}
    print(json.dumps(out["summary"], indent=1))
    write_json(a.out, out)
    say(f"wrote {a.out}")
    return out


if __name__ == "__main__" and sys.argv[1:2] == ["gpu-check"]:
    gpu_check(sys.argv[2:])
elif __name__ == "__main__":
    mcfg, tcfg = parse_args()
    try:
        main(mcfg, tcfg)
    except (ValueError, FloatingPointError, OSError) as err:   # bad input, NaN, disk: one line + non-zero exit
        print(f"train.py: error: {err}", file=sys.stderr, flush=True)
        sys.exit(1)
    except torch.cuda.OutOfMemoryError:
        print("train.py: error: out of GPU memory: lower --device-batch (gradient accumulation keeps the global batch "
              "and the tokens per step identical), then rerun with --resume", file=sys.stderr, flush=True)
        sys.exit(1)
    except KeyboardInterrupt:
        print("train.py: interrupted; rerun the same command with --resume to continue from the last checkpoint",
              file=sys.stderr, flush=True)
        sys.exit(130)
    finally:
        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()
