"""
fit.py -- the paper's instrument: Huber-on-log scaling-law fits, phi with a block-bootstrap CI, the compute-optimal
frontier, case-study delta-phi, report tables and figures. numpy + scipy + matplotlib (Agg) + flops.py; never torch.
Implements (arXiv:2604.21106 v3):
    Eq. 2   L = E + A N^-alpha + B D^-beta                              per-architecture Chinchilla law (§4.2)
    Eq. 3   L = E + A (N_once + r^phi N_rec)^-alpha + B D^-beta         joint law, phi = recurrence exponent (§3.3)
    Eq. 4   Obj = sum_i w_i Huber_delta( LSE(a - alpha ln N_i, b - beta ln D_i, e) - ln L_i ),  delta = 1e-3,
            a = ln A, b = ln B, e = ln E
    App. F  box a,b in [-5,35], alpha,beta in [0,2.5], e in [-3,2], phi in [-3,3]; best of 500 uniform L-BFGS-B
            restarts, maxiter 10,000; F.1 residuals (Table 7), F.2 block bootstrap, F.3 budget halves, F.4 sizes
    §4.2, App. G.3  compute-optimal N*(C), D*(C) and the frontier L*_r(C);  §5, Table 3  case-study delta-phi
Run:
    python fit.py out/grid --out out/fit                     # a tree of done.json run records (runs/grid.sh)
    python fit.py --csv runs.csv --out out/fit               # columns flops_budget,n_loops,n_once,n_rec,tokens,val_loss
    python fit.py out/grid --case hc --out out/fit_hc        # case study: delta-phi against the refitted baseline
    python fit.py --cases out/mini                           # case table + figures of out/mini/case_*/ in report.md
    python fit.py --csv c.csv --law chinchilla --out out/c   # plain Eq. 2 fits on n_params,tokens,val_loss[,group]
    python fit.py --synthetic synth.csv --phi 0.46 --noise 0.01 --seed 0   # the 116-run grid drawn from Eq. 3
    add --overwrite to write into a folder that holds anything but this same request's fit (a rerun needs none)
Test: python -m pytest -q tests/test_fit.py tests/test_hostile_fit.py
Read in this order: objective -> _screen -> fit_law -> bootstrap_phi -> optimal_width -> run_protocol -> assess -> main.
Not here: parameter / FLOP / token accounting (flops.py), training (train.py).
What it promises (README "Guarantees"): bad input (out of LIMITS, malformed, an n_loops flops.py cannot count, runs on
different data) is one error line naming file and key, before any fit. A fit the data cannot support is flagged
(assess) on the phi line, in report.md and fit.json; where no fit is meaningful it is refused. fit.json records the
runs it fitted (--cases refuses a delta-phi against other runs). --out is fit.py's own folder, written as one set.
Speed: all 500 starts of a fit run at once in a vectorised projected BFGS (the "screen"), then scipy L-BFGS-B polishes
the best few; bootstrap refits are warm-started. Engine "scipy" (one L-BFGS-B per start) is the tests' reference.
"""
import os

# One BLAS thread: scipy's L-BFGS-B does tiny linear algebra every iteration, and multithreaded OpenBLAS makes it
# 6-18x slower on 2 cores (thread start-up per call). Must happen before numpy is first imported.
for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_var] = "1"

import argparse, contextlib, csv, io, json, math, pathlib, sys, time, warnings  # noqa: E401,E402 (after the BLAS pin)

import numpy as np
from scipy.optimize import minimize, minimize_scalar

import common
import flops

# -----------------------------------------------------------------------------
# Constants of the protocol

DELTA = 1e-3                      # Huber threshold on log-loss residuals (Eq. 4, after Hoffmann et al. 2022)
PARAM_NAMES = ("a", "b", "e", "alpha", "beta", "phi")   # theta order; a = ln A, b = ln B, e = ln E
BOX_LO = np.array([-5.0, -5.0, -3.0, 0.0, 0.0, -3.0])   # App. F: a,b in [-5,35], e in [-3,2],
BOX_HI = np.array([35.0, 35.0, 2.0, 2.5, 2.5, 3.0])     #         alpha,beta in [0,2.5], phi in [-3,3]
RESTARTS = 500                    # App. F: best of 500 uniform random starts
MAXITER = 10_000                  # App. F: per-restart iteration cap
N_BOOT = 200                      # App. F.2: block-bootstrap resamples
BOOT_RESTARTS = 4                 # project: random starts per resample on top of the warm start (fitting.md §4.3)
SCREEN_ITERS = 500                # project: iteration cap of the batched screen (capped screens changed no estimate)
N_POLISH = 8                      # project: distinct screened optima polished with scipy
CHUNK_ELEMS = 6_000               # project: largest (K x n) block per objective evaluation (see objective)
HIT_RTOL = 1e-6                   # fitting.md §3: a restart "hits" the optimum within 1e-6 relative
# Tight scipy tolerances on Obj/delta (fitting.md §4.2): the default ftol (an absolute 2.2e-9 on a ~1e-2 objective)
# stops restarts in flat valleys and makes warm-started bootstrap CIs too narrow.
POLISH_OPTS = {"maxiter": MAXITER, "maxfun": 4 * MAXITER, "ftol": 1e-15, "gtol": 1e-10}

REQUIRED = ("flops_budget", "n_loops", "n_once", "n_rec", "tokens", "val_loss")   # joint-law inputs per run
CHIN_REQUIRED = ("n_params", "tokens", "val_loss")                                # --law chinchilla inputs
# The allowed values of every number a run record or CSV row carries (common.py's interval notation), for done.json
# (common.read_json), CSV cells and --loops alike. Far beyond any training run (frontier runs: ~1e26 FLOPs, ~3e13
# tokens, ~2e12 parameters, a few nats), yet they catch a wrong unit or a typo (tokens = 1e300) before a logarithm.
# flops_budget and n_loops are train.py's LIMITS (a test checks); N_once may be 0 (r = 1, or fully looped models).
LIMITS = {"flops_budget": ("(0, 1e30]", "FLOPs"), "n_loops": ("[1, 16]", "recurrences r"),
          "n_once": ("[0, 1e15]", "parameters: a count, not millions"),
          **dict.fromkeys(("n_rec", "n_params"), ("[1, 1e15]", "parameters: a count, not millions")),
          "tokens": ("[1, 1e16]", "training tokens: a count, not billions"), "val_loss": ("(0, 100]", "nats"),
          **dict.fromkeys(("d_model", "scale", "aspect_ratio"), ("[1, 1e9]", "width")),
          "flops": ("(0, 1e30]", "executed FLOPs")}
INTEGERS = ("n_loops", "d_model", "scale", "aspect_ratio")                 # whole numbers, besides their LIMITS
DONE_SCHEMA = {**{k: (int if k in INTEGERS else (int, float), iv) for k, (iv, _) in LIMITS.items()},
               "case": (str, None), "config": (dict, None), "identity": (dict, None)}
# When a fit is flagged (rule 6 of issue 12): the flags go next to phi on stdout, in report.md and in fit.json
R2_LOW = 0.9                      # R^2 (raw nats) below this: the law explains too little (paper: 0.97-0.99)
NEAR_BOUND = 1e-3                 # a parameter within this fraction of its box width of a bound counts as on it
RUNS_PER_PARAM = 2                # fewer runs than 2 per fitted parameter: the optimum is barely determined
MIN_CI_RESAMPLES = 100            # a 95% interval from fewer resamples rests on its 2-3 most extreme draws
# A run folder with one of these but no done.json never finished: train.py's checkpoint and log, and the train.log
# a sweep (runs/launch.bash) leaves when a cell fails at start-up
UNFINISHED = ("ckpt.pt", "log.jsonl", "train.log")
# Every file a fit writes into --out (a new figure is added here): a refit removes those of them the previous fit.json
# lists and this fit does not write, nothing else
OUTPUTS = ("fit.json", "report.md", "iso_flops.png", "pred_vs_actual.png", "frontier.png", "phi.png", "loop_sweep.png")

BASELINE = (None, "", "baseline")    # the case labels of the main grid: records without one, or "baseline"
# Synthetic truth (fitting.md §7-8): alpha, beta, E and phi are the paper's joint fit (Table 2); A and B are not
# printed there, so they are chosen (derived) to put the grid's losses at 2.29-2.98 nats like Fig. 2, with the r=1
# compute optimum inside the widths trained at each budget (s* = 7.2 at 4.64e17 ... 24.8 at 2.15e19).
SYNTH_TRUTH = {"E": 1.57, "A": 25.0, "B": 1000.0, "alpha": 0.199, "beta": 0.369, "phi": 0.46}

class FitWarning(UserWarning):
    """A fitter warning that is also a flag (fit_outputs files it under flag = (name in FLAG_TEXT, the item naming
    the fit or run it concerns)); its message is the flag's: the item, then what the flag means."""
    def __init__(self, name, item):
        super().__init__(f"{item}: {FLAG_TEXT[name]}")
        self.flag = (name, item)

def _box(p):
    """(lo, hi) of the App. F box for a p-parameter law (p = 5: phi fixed or Chinchilla; p = 6: free phi)."""
    return BOX_LO[:p], BOX_HI[:p]


# -----------------------------------------------------------------------------
# Inputs: done.json trees or CSV, validated before any fit

def _folders(runs_dir):
    """[(folder, names in it)] of runs_dir's tree, sorted (the same run order on every filesystem). A linked folder
    is followed (a study may link runs in from elsewhere), a link loop and an unreadable folder are refused by name:
    os.walk would skip the latter silently, and a run hidden that way would vanish from the fit."""
    def refuse(err):
        raise ValueError(f"{err.filename}: cannot read ({err.strerror})")
    out = {}                        # real path -> (folder, names): a followed link loop reaches one folder twice
    for root, dirs, files in os.walk(runs_dir, onerror=refuse, followlinks=True):
        if out.setdefault(os.path.realpath(root), (root, set(dirs) | set(files)))[0] != root:
            raise ValueError(f"{root} is read already (a link loop or a duplicate); remove the link")
    return sorted(out.values(), key=lambda x: x[0])

# refuses a FIFO, a device or a folder by name, never opens it (it would wait, or read forever); design.py uses it
read_json = common.read_json

def _read_sweep(path):
    """The test-time loop sweep eval.py --n-loops-sweep wrote beside a run ([{n_loops, val_loss}, ...]), or None
    when there is no eval.json or it holds no sweep. One that is there is checked (_sweep_ok): a torn or
    hand-edited sweep names its file rather than vanish from the report."""
    curve = read_json(path).get("n_loops_sweep") if os.path.lexists(path) else None
    if curve and not _sweep_ok(curve):
        raise ValueError(f"{path}: n_loops_sweep must be a list of {{n_loops, val_loss}} as eval.py writes it")
    return curve or None

def _sweep_ok(curve):
    """A loop-sweep curve as eval.py writes it: [{n_loops: an int r' in [1, 1024], val_loss: in LIMITS}, ...]."""
    return isinstance(curve, list) and all(
        isinstance(p, dict) and type(p.get("n_loops")) is int and 1 <= p["n_loops"] <= 1024 and "val_loss" in p
        and common.check_number(p["val_loss"], LIMITS["val_loss"][0]) is None for p in curve)

def load_records(runs_dir):
    """Every done.json under runs_dir (recursively), with "source" (the file, named in every error about the run),
    "run_dir" (its folder under runs_dir), "arch" (flops.py accounting arguments beyond d_model and n_loops),
    "aspect_ratio" and "n_loops_sweep". Each is checked as it is read (DONE_SCHEMA, its config, its data against
    the others'). ValueError if none is found."""
    if not os.path.isdir(runs_dir):
        raise ValueError(f"runs directory {runs_dir!r} does not exist as a folder")
    recs, seen = [], {}              # seen: "data" / "tokenizer" -> (its value, the first record that names it)
    for root in [root for root, names in _folders(runs_dir) if "done.json" in names]:
        rec = read_json(path := os.path.join(root, "done.json"), DONE_SCHEMA)
        # train.py nests the config ({"model_config": {...}, "train_config": {...}}); a hand-made one may be flat
        cfg = rec.get("config") or {}
        mcfg, tcfg = (c if isinstance(c := cfg.get(k, cfg), dict) else {} for k in ("model_config", "train_config"))
        try:         # the architecture the run trained (the N check and the frontier never assume the paper's)
            acc = flops.accounting_args(mcfg)
        except ValueError as err:
            raise ValueError(f"{path}: config {err}") from None
        rec.setdefault("d_model", acc.get("d_model"))       # the width N_once + N_rec is checked at (runs_from_rows)
        # the fields the fit reads agree with the config the run trained, or an edited budget or r would be fitted
        # silently at the wrong place (issue 18 §3). No case key = the main grid ("").
        for key, conf in (("n_loops", mcfg), ("d_model", acc), ("flops_budget", tcfg), ("case", tcfg)):
            if (mine := rec.get(key) or "") != (theirs := conf.get(key, rec.get(key)) or ""):
                raise ValueError(f"{path}: key {key!r} is {mine!r:.40} but the record's config says {theirs!r:.40}")
        rec.update(source=path, run_dir=os.path.relpath(root, runs_dir), n_loops_sweep=_read_sweep(
            os.path.join(root, "eval.json")), arch={k: v for k, v in acc.items() if k not in ("d_model", "n_loops")},
            aspect_ratio=mcfg.get("aspect_ratio", flops.ASPECT_RATIO))
        # one study, one data set: runs trained on other data or another tokenizer follow another law, and a fit (or
        # a delta-phi) across them would be silently wrong. A record that predates a field matches any value of it
        for k, v in (("data", (rec.get("identity") or {}).get("data")), ("tokenizer", rec.get("tokenizer_hash"))):
            if v is not None and (first := seen.setdefault(k, (v, path)))[0] != v:
                raise ValueError(f"{path} and {first[1]} were trained on different data ({k}: {first[0]!r} vs {v!r})")
        recs.append(rec)
    if not recs:
        left = unfinished_runs(runs_dir)
        raise ValueError(f"no done.json found under {runs_dir!r}"
                         + (f" ({len(left)} unfinished run folders, e.g. {left[0]})" if left else ""))
    return recs

def unfinished_runs(runs_dir):
    """Run folders under runs_dir that hold a checkpoint or a log (UNFINISHED) but no done.json: killed, failed at
    start-up or still training. fit.py reads only done.json, so these are absent from the fit unless named."""
    return [os.path.relpath(root, runs_dir) for root, names in _folders(runs_dir)
            if "done.json" not in names and names & set(UNFINISHED)]

def load_csv(path):
    """Rows of a CSV file as dicts with a "source" key naming file and line and the paper's architecture (arch {}:
    flops.py defaults); each LIMITS cell is checked here (_value), a blank one is left out. ValueError if the file
    is missing, not text, malformed (a row with more or fewer fields than the header) or empty."""
    if not os.path.isfile(path):                    # a folder or a FIFO is never opened (open() would wait)
        raise ValueError(f"CSV file {path!r} {'is not a file' if os.path.exists(path) else 'does not exist'}")
    rows = []
    try:
        # utf-8-sig: a spreadsheet's byte-order mark would otherwise glue itself to the first column's name
        with open(path, newline="", encoding="utf-8-sig") as fh:
            reader = csv.reader(fh, strict=True)   # a stray quote is an error, not a silently merged field
            header = [h.strip() for h in next(reader, None) or []]
            if not any(header) or (dup := sorted({h for h in header if h and header.count(h) > 1})):
                raise ValueError(f"{path}:1: " + (f"column {dup[0]!r} appears twice" if any(header) else
                                                  "no header row"))
            for fields in reader:
                if not any(f.strip() for f in fields):
                    continue                                # blank lines carry no run
                src = f"{path}:{reader.line_num}"           # the physical line (quoted fields may span lines)
                if len(fields) != len(header):
                    raise ValueError(f"{src}: {len(fields)} fields, but the header has {len(header)}")
                # columns by name, any order; extras ignored
                rows.append({h: _value(f.strip(), h, src) if h in LIMITS else f.strip() for h, f in zip(header, fields)
                             if f.strip()} | {"source": src, "arch": {}})
    except csv.Error as err:
        raise ValueError(f"{path}:{reader.line_num}: malformed CSV ({err})") from None
    except (UnicodeDecodeError, OSError) as err:
        raise ValueError(f"{path}: {'cannot read' if isinstance(err, OSError) else 'not UTF-8 text'} ({err})") from None
    if not rows:
        raise ValueError(f"{path}: no data rows")
    return rows

def _value(text, key, src):
    """A CSV cell as a number in LIMITS[key] (an int where INTEGERS says so), parsed and checked as a flag is
    (common.number), else a ValueError naming file, line and key."""
    try:
        return common.number(int if key in INTEGERS else float, *LIMITS[key])(text)
    except argparse.ArgumentTypeError as err:
        raise ValueError(f"{src}: {key}={text!r:.40} {err}") from None

def runs_from_rows(rows, law="joint"):
    """The runs dict the fitters use, from run rows (done.json records or CSV rows, each with its "source" and
    "arch", their numbers checked as they were read: DONE_SCHEMA, _value). What a row cannot show alone is checked
    here: missing keys, duplicates, and an n_loops or N_once + N_rec that flops.py's accounting disagrees with.
    runs = {"flops_budget", "n_loops", "n_once", "n_rec", "tokens", "val_loss": (n,) arrays, "case": list,
            "group", "source", "dir", "identity", "arch" (flops kwargs), "aspect" (aspect ratio), "sweep": per-run
            lists}. Joint law: every REQUIRED key. --law chinchilla: n_params,tokens,val_loss (+ optional group), or
    the joint keys (then N = n_once + n_rec and the group is the architecture r)."""
    # --law chinchilla takes n_params,tokens,val_loss; it falls back to the joint columns only when n_params is absent
    chin_cols = law == "chinchilla" and ("n_params" in rows[0] or any(k not in rows[0] for k in REQUIRED))
    need, n = CHIN_REQUIRED if chin_cols else REQUIRED, len(rows)
    for row in rows:
        if missing := [k for k in need if row.get(k) is None]:
            raise ValueError(f"{row['source']}: missing {', '.join(missing)} (need {', '.join(need)})")
    out = {k: np.array([float(row[k]) for row in rows]) for k in need}     # (n,) each
    if chin_cols:
        # Eq. 2 on plain (N, D, L): store N as n_rec with n_once = 0 and r = 1, so N_eff = N for any phi
        out.update(n_once=np.zeros(n), n_rec=out.pop("n_params"), n_loops=np.ones(n, dtype=int),
                   flops_budget=np.full(n, np.nan), group=[str(row.get("group") or "all") for row in rows])
    else:
        out.update(n_loops=out["n_loops"].astype(int), group=[f"r={int(x)}" for x in out["n_loops"]])
    # which run each row is (issue 18 §1: its folder, else the CSV line, and train.py's identity, for runs_record);
    # the architecture and aspect ratio the frontier inverts (CSV rows: the paper's, flops.py defaults)
    out.update(case=[row.get("case") or None for row in rows], source=[row["source"] for row in rows],
               dir=[row.get("run_dir", row["source"]) for row in rows], arch=[row["arch"] for row in rows],
               identity=[row.get("identity") for row in rows], sweep=[row.get("n_loops_sweep") for row in rows],
               aspect=[row.get("aspect_ratio") or flops.ASPECT_RATIO for row in rows])
    # Duplicates double-weight one configuration in the sum of Eq. 4: warn, keep both. A case study may repeat the
    # baseline's configurations (same N and D, a different recipe), so the case label is part of the key
    named, seen = [k for k in need if k != "val_loss"], {}
    for i, k in enumerate(zip(*[out["n_rec" if k == "n_params" else k] for k in named], out["group"],
                              map(str, out["case"]))):
        if seen.setdefault(k, i) != i:
            item = f"{out['source'][i]} repeats {out['source'][seen[k]]} (same {', '.join(named)}); both are kept"
            warnings.warn(FitWarning("duplicate_runs", item))
    # An (n_loops, architecture) flops.py cannot count (r = 3 does not divide 16), or an N_once + N_rec other than
    # flops.param_split's at the run's width (d_model, else aspect x scale; 0: neither, so the layout alone), stops
    # here: the fit trusts the recorded split and the frontier inverts the accounting, so they must agree
    for i, row in enumerate([] if chin_cols else rows):
        r, kw = int(out["n_loops"][i]), row["arch"]
        d = int(row.get("d_model") or 0) or out["aspect"][i] * int(row.get("scale") or 0)
        try:
            want = sum(flops.param_split(d or 64, r, **kw))
        except (ValueError, TypeError) as err:
            raise ValueError(f"{row['source']}: n_loops={r} is not an architecture flops.py can count ({err})") from err
        if d and (n := out["n_once"][i] + out["n_rec"][i]) != want:
            raise ValueError(f"{row['source']}: n_once + n_rec = {n:.0f} but flops.param_split(d_model={d}, "
                             f"n_loops={r}) gives {want}: record and accounting disagree")
    return out

def arch_map(runs):
    """({r: flops kwargs}, {r: aspect ratio}) of the selected runs. Every run of one r must share its architecture,
    else that r's frontier is ill-defined (a case-study variant and the baseline differ: select one with --case)."""
    arch, aspect = {}, {}
    # None values are flops.py defaults (full BPTT): dropped, so a record that spells them out matches one that doesn't
    for a, asp, r, src in zip(runs["arch"], runs["aspect"], runs["n_loops"], runs["source"]):
        r, a = int(r), {k: v for k, v in a.items() if v is not None}
        if arch.setdefault(r, a) != a:
            raise ValueError(f"{src}: architecture {a} differs from another r={r} run ({arch[r]}); use --case")
        aspect[r] = int(asp)
    return arch, aspect

def subset(runs, mask):
    """The runs selected by a boolean mask, or reordered by an index array (arrays and per-run lists alike)."""
    idx = np.flatnonzero(mask) if np.asarray(mask).dtype == bool else mask
    # arrays are fancy-indexed, per-run lists (case, source, arch, ...) picked element by element
    return {k: (v[idx] if isinstance(v, np.ndarray) else [v[i] for i in idx]) for k, v in runs.items()}


# -----------------------------------------------------------------------------
# The objective (Eq. 4) and its analytic gradient, vectorised over K parameter vectors

def make_problem(runs, phi=None):
    """Pack runs for the objective (logs taken once: it needs only ln D, ln L and ln r). phi=None: free phi (p = 6,
    Eq. 3); a float: phi fixed (p = 5; phi = 0 makes N_eff = N_once + N_rec = N, i.e. plain Eq. 2). Each row of theta
    is (a, b, e, alpha, beta[, phi]). Refuses runs that determine no fit (fewer runs than parameters, equal losses)."""
    prob = _pack(runs, phi)
    n, p = len(prob["ln_l"]), prob["p"]
    # fewer runs than parameters: the optimum is a manifold, not a point. Equal losses: every law with A = B = 0 fits
    # exactly, so no parameter is determined. Any number reported would be an artefact of the start points
    if n < p:
        raise ValueError(f"{n} runs cannot determine {p} parameters; need at least {p} runs")
    if np.ptp(prob["ln_l"]) == 0:
        raise ValueError(f"all {n} runs have the same val_loss ({prob['val_loss'][0]:g}); no law fits a constant")
    if max(np.ptp(prob["n_once"] + prob["n_rec"]), np.ptp(prob["ln_d"]), np.ptp(prob["ln_r"])) == 0:
        raise ValueError(f"all {n} runs have the same N, D and n_loops; nothing varies for a law to fit")
    return prob

def _pack(runs, phi=None):
    """make_problem without its checks: predict() on any runs (a figure may show fewer runs than a fit needs)."""
    r_u, r_idx = np.unique(runs["n_loops"], return_inverse=True)       # the distinct r, and each run's index there
    prob = {"ln_d": np.log(runs["tokens"]), "ln_l": np.log(runs["val_loss"]), "n_once": runs["n_once"].astype(float),
            "n_rec": runs["n_rec"].astype(float), "ln_r": np.log(runs["n_loops"].astype(float)),
            "n_loops": runs["n_loops"], "phi_fixed": phi, "ln_r_u": np.log(r_u.astype(float)), "r_idx": r_idx,
            "val_loss": runs["val_loss"], "p": 6 if phi is None else 5}
    if phi is not None:
        # N_eff = N_once + r^phi N_rec is data once phi is fixed (Eq. 3)
        prob["ln_n"] = np.log(prob["n_once"] + np.exp(phi * prob["ln_r"]) * prob["n_rec"])
    return prob

def objective(theta, prob, weights=None, grad=True):
    """Eq. 4: Obj(theta) = sum_i w_i Huber_delta(rho_i), rho_i = LSE(t1, t2, t3) - ln L_i, and dObj/dtheta.
    theta: (p,) or (K, p); weights: None (w = 1), (n,), or (K, n) (one bootstrap resample per row).
    Returns f (K,) and g (K, p) (or f, g for a single theta). fitting.md §1 derives the gradient."""
    th = np.atleast_2d(np.asarray(theta, dtype=float))           # (K, p)
    rows = max(1, CHUNK_ELEMS // len(prob["ln_l"]))             # rows per chunk of (K, n) temporaries
    if len(th) > rows:
        # row chunks of <= CHUNK_ELEMS elements (48 KB per temporary): larger ones are mmapped or trimmed back to the
        # OS when freed, and every call page-faults fresh memory (on 500 x 116: as much time in the kernel as in the
        # arithmetic). Small blocks stay on the heap, and in cache.
        parts = [objective(th[i:i + rows], prob, weights if np.ndim(weights) < 2 else weights[i:i + rows], grad)
                 for i in range(0, len(th), rows)]
        return tuple(map(np.concatenate, zip(*parts))) if grad else np.concatenate(parts)
    a, b, e, alpha, beta = (th[:, j:j + 1] for j in range(5))    # each (K, 1)
    free = prob["phi_fixed"] is None
    if free:
        # r^phi has one value per distinct r: exponentiate (K, n_r) and gather, instead of (K, n)
        amp = np.exp(th[:, 5:6] * prob["ln_r_u"])[:, prob["r_idx"]]    # (K, n)  r^phi
        n_eff = prob["n_once"] + amp * prob["n_rec"]             # (K, n)  N_eff = N_once + r^phi N_rec (Eq. 3)
        ln_n = np.log(n_eff)
    else:
        ln_n = prob["ln_n"]                                      # (n,)
    t1 = a - alpha * ln_n                                        # ln(A N^-alpha)   (K, n)
    t2 = b - beta * prob["ln_d"]                                 # ln(B D^-beta)    (K, n)
    # LSE(t1, t2, e) = ln(e^t1 + e^t2 + e^e). No max shift is needed: inside the App. F box, with N, D >= 1
    # (runs_from_rows enforces it), t1 <= a <= 35 and t2 <= b <= 35 cannot overflow, and e^e >= e^-3 keeps the sum
    # away from 0; skipping the shift saves a third of the exponentials, the dominant cost of a fit
    x1, x2, x3 = np.exp(t1), np.exp(t2), np.exp(e)               # A N^-alpha, B D^-beta (K, n); E (K, 1)
    s = x1 + x2 + x3                                             # L_hat
    rho = np.log(s) - prob["ln_l"]                               # (K, n)  ln L_hat - ln L
    w = 1.0 if weights is None else weights
    # Huber_delta(rho) = c (rho - c/2) with c = clip(rho, -delta, delta): 0.5 rho^2 inside, delta(|rho| - delta/2)
    # outside; c is also Huber'(rho), reused by the gradient
    c = np.clip(rho, -DELTA, DELTA)
    f = (w * c * (rho - 0.5 * c)).sum(axis=1)                    # (K,)  a SUM over runs, as in Eq. 4
    if not grad:
        return f if np.ndim(theta) == 2 else f[0]
    psi = w * c / s                                              # Huber'(rho) / L_hat; times x_k = psi_i pi_k,i
    p1, p2 = psi * x1, psi * x2                                  # (K, n)
    cols = [p1.sum(1), p2.sum(1), x3[:, 0] * psi.sum(1),         # d/da, d/db, d/de
            -((p1 * ln_n).sum(1) if free else p1 @ ln_n),        # d/dalpha
            -(p2 @ prob["ln_d"])]                                # d/dbeta
    if free:
        # d ln N_eff / d phi = r^phi ln r N_rec / N_eff
        cols.append(-th[:, 3] * (p1 * (amp * prob["ln_r"] * prob["n_rec"] / n_eff)).sum(1))
    g = np.stack(cols, axis=1)                                   # (K, p)
    return (f, g) if np.ndim(theta) == 2 else (f[0], g[0])

def predict(theta, prob):
    """L_hat in nats for every run of prob, at one theta."""
    th = np.asarray(theta, dtype=float)
    ln_n = prob["ln_n"] if "ln_n" in prob else np.log(prob["n_once"] + np.exp(th[5] * prob["ln_r"]) * prob["n_rec"])
    return np.exp(th[0] - th[3] * ln_n) + np.exp(th[1] - th[4] * prob["ln_d"]) + np.exp(th[2])


# -----------------------------------------------------------------------------
# Optimisers: a batched projected BFGS screen (all starts at once) and scipy L-BFGS-B (reference and polish)

def _screen(prob, x0, weights=None, maxiter=SCREEN_ITERS, gtol=1e-9, ftol=1e-13):
    """Projected BFGS on Obj/delta for K problems at once (fitting.md §4.3, engine B). x0: (K, p) starts; weights:
    None or (K, n). Each iteration: direction -H g with H the inverse-Hessian estimate, zeroed on bound-active
    coordinates; Armijo backtracking along the projected path; BFGS update skipped when s'y <= 0; converged problems
    leave the active set. Returns x (K, p), f (K,) unscaled, converged (K,) bool."""
    K, p = x0.shape
    lo, hi = _box(p)
    def fg(idx, x, grad=True):
        # objective scaled by 1/delta: the argmin is unchanged, the stopping tests see O(1) numbers
        out = objective(x, prob, None if weights is None else weights[idx], grad=grad)
        return (out[0] / DELTA, out[1] / DELTA) if grad else out / DELTA

    # state per problem: x (K, p), f (K,), g (K, p), inverse Hessian H (K, p, p); the loop works on active rows only
    x = np.clip(x0, lo, hi)
    f, g = fg(np.arange(K), x)
    # first step: identity scaled so the largest coordinate moves by at most 1 (then Shanno-Phua rescaling)
    H = np.eye(p)[None] / np.maximum(np.abs(g).max(1), 1e-12)[:, None, None]     # (K, p, p)
    fresh = np.ones(K, dtype=bool)                 # H not yet rescaled by a first curvature pair
    done = np.zeros(K, dtype=bool)                 # left the active set (converged or stalled) before the cap
    for _ in range(maxiter):
        act = np.flatnonzero(~done)
        if act.size == 0:
            break
        xa, fa, ga, Ha = x[act], f[act], g[act], H[act]
        # coordinates pinned on a bound with the gradient pushing outward stay fixed (projected method)
        free = ~(((xa <= lo) & (ga > 0)) | ((xa >= hi) & (ga < 0)))
        gf = np.where(free, ga, 0.0)
        d = -np.einsum("kij,kj->ki", Ha, gf) * free                                # (k, p)
        # not a descent direction: restart from scaled steepest descent (every update below is a no-op on an
        # empty selection, so no branch is needed when all rows are fine)
        bad = (ga * d).sum(1) >= 0
        scale = 1.0 / np.maximum(np.abs(gf[bad]).max(1), 1e-12)
        d[bad] = -gf[bad] * scale[:, None]
        Ha[bad] = np.eye(p)[None] * scale[:, None, None]
        fresh[act[bad]] = True
        # Armijo backtracking along the projected path: f(P(x + t d)) <= f + 1e-4 g'(P(x + t d) - x); a failed
        # trial shrinks t to the minimiser of the quadratic through f, the slope and f(t), kept in [0.1 t, 0.5 t]
        t, x_new, ok_all, pend = np.ones(act.size), xa.copy(), np.zeros(act.size, dtype=bool), np.arange(act.size)
        for _ in range(30):
            xt = np.clip(xa[pend] + t[pend, None] * d[pend], lo, hi)
            ft = fg(act[pend], xt, grad=False)
            slope = (ga[pend] * (xt - xa[pend])).sum(1)             # g'(step actually taken) < 0
            ok = ft <= fa[pend] + 1e-4 * slope
            x_new[pend[ok]], ok_all[pend[ok]] = xt[ok], True
            pend, slope, ft = pend[~ok], slope[~ok], ft[~ok]
            if pend.size == 0:
                break
            curv = ft - fa[pend] - slope                            # f(t) - f - slope, > 0 on a failed trial
            shrink = np.where(curv > 0, -slope / (2 * np.maximum(curv, 1e-300)), 0.1)
            t[pend] = t[pend] * np.clip(shrink, 0.1, 0.5)
        done[act[~ok_all]] = True                    # a failed line search: no progress left at screen precision
        move = np.flatnonzero(ok_all)
        am = act[move]                                                              # global rows that stepped
        fn, gn = fg(am, x_new[move])
        s, y, Hm = x_new[move] - xa[move], gn - ga[move], Ha[move]                  # (m, p), (m, p), (m, p, p)
        sy = (s * y).sum(1)
        upd = sy > 1e-12 * np.linalg.norm(s, axis=1) * np.linalg.norm(y, axis=1)
        # Shanno-Phua: before the first update, rescale H0 = (s'y / y'y) I
        first = upd & fresh[am]
        Hm[first] = np.eye(p)[None] * (sy[first] / (y[first] * y[first]).sum(1))[:, None, None]
        fresh[am[first]] = False
        # inverse BFGS: H+ = H - rho (s Hy' + Hy s') + (rho^2 y'Hy + rho) s s'
        su, yu, Hu, rho = s[upd], y[upd], Hm[upd], 1.0 / sy[upd]
        Hy = np.einsum("kij,kj->ki", Hu, yu)
        yHy = (yu * Hy).sum(1)
        Hm[upd] = (Hu - rho[:, None, None] * (su[:, :, None] * Hy[:, None, :] + Hy[:, :, None] * su[:, None, :])
                   + ((rho * rho * yHy + rho)[:, None, None]) * su[:, :, None] * su[:, None, :])
        H[am], x[am], f[am], g[am] = Hm, x_new[move], fn, gn          # rows that did not move are done
        # stop: projected gradient small, or the relative decrease negligible
        pg = np.abs(np.clip(x[am] - g[am], lo, hi) - x[am]).max(1)
        stop = (pg <= gtol) | ((fa[move] - fn) <= ftol * np.maximum(np.abs(fn), 1e-300))
        done[am[stop]] = True
    return x, f * DELTA, done

def _polish(prob, x, weights=None):
    """scipy L-BFGS-B from x on Obj/delta inside the box at tight tolerances (fitting.md §4.2). Returns (x, Obj)."""
    lo, hi = _box(prob["p"])
    fun = lambda th: tuple(v / DELTA for v in objective(th, prob, weights))    # scaled like the screen's; Obj unscaled
    res = minimize(fun, np.clip(x, lo, hi), jac=True, method="L-BFGS-B", bounds=list(zip(lo, hi)),
                   options=POLISH_OPTS)
    return res.x, float(objective(res.x, prob, weights, grad=False))

def fit_law(prob, restarts=RESTARTS, seed=0, engine="batched"):
    """Best of `restarts` uniform starts on Eq. 4 (App. F). engine "batched": screen + polish; "scipy": one
    L-BFGS-B per start, serially (the unbatched reference). Returns a dict: theta, huber, hits, converged, ...
    (hits: restarts within HIT_RTOL of the best objective; distinct_optima: clusters of converged restarts)."""
    p, (lo, hi) = prob["p"], _box(prob["p"])
    # the App. F uniform starts in the box (restarts, p), from a fresh generator per fit: every fit of a protocol
    # (and both engines) sees the same starts for a given seed, whatever ran before it
    x0 = np.random.default_rng(seed).uniform(lo, hi, size=(restarts, p))
    t0 = time.perf_counter()
    if engine == "batched":
        # engine B: every start at once, capped at SCREEN_ITERS iterations (fitting.md §4.2 pitfall 3: degenerate
        # starts wander for thousands of iterations; the cap only matters for them)
        xs, fs, conv = _screen(prob, x0)
        # polish the best few *distinct* screened optima with scipy (maxiter 10,000): a start the cap stopped short in
        # the global basin still gets its chance, and the answer carries scipy's convergence guarantees
        order = np.argsort(fs)
        first = {}                                   # rounded theta -> its best screened start, best first
        for i in order:
            first.setdefault(tuple(np.round(xs[i], 3)), i)
        polished = [_polish(prob, xs[i]) for i in list(first.values())[:N_POLISH]]
        best_x, best_f = min([(xs[order[0]], fs[order[0]])] + polished, key=lambda xf: xf[1])   # first of equals
    else:
        assert engine == "scipy", engine
        xs, fs = (np.array(v) for v in zip(*[_polish(prob, x) for x in x0]))
        conv = np.ones(restarts, dtype=bool)
        best_x, best_f = xs[np.argmin(fs)], float(fs.min())
    # restarts (as screened) within HIT_RTOL of the best; the polished best counts as one when none is
    hits = int(np.sum(fs <= best_f + (HIT_RTOL * abs(best_f) + 1e-15)))
    # distinct optima among converged restarts: clusters of the objective (relative 1e-6) and of theta (to 1e-3)
    cf = np.sort(fs[conv])
    n_obj = int(1 + np.sum(np.diff(cf) > HIT_RTOL * np.maximum(np.abs(cf[1:]), 1e-15))) if cf.size else 0
    n_theta = len({tuple(np.round(x, 3)) for x in xs[conv]})
    # a parameter on the App. F box (E -> e^-3, alpha -> 0, ...) flags a degenerate or poorly identified fit
    on_bounds = [PARAM_NAMES[j] for j in range(p) if min(best_x[j] - lo[j], hi[j] - best_x[j]) <= 1e-6 * (hi - lo)[j]]
    return {"theta": best_x, "huber": float(best_f), "hits": max(hits, 1), "restarts": restarts,
            "n_converged": int(conv.sum()), "distinct_optima": n_obj, "distinct_theta": n_theta,
            "on_bounds": on_bounds, "seed": seed, "engine": engine, "seconds": time.perf_counter() - t0}

def fit_block(runs, phi=None, restarts=RESTARTS, seed=0, engine="batched", name="joint"):
    """make_problem (phi as there) + fit_law, and the report block of the fit: E, A, B, alpha, beta, phi, R^2 on raw
    nats, RMSE, max|res|, per-r residuals and fit_law's diagnostics. name says which fit this is (joint, r=2, low
    half, ...) in its warnings, so a flag points at the right fit."""
    prob = make_problem(runs, phi)
    res = fit_law(prob, restarts, seed, engine)
    th, L = res["theta"], prob["val_loss"]
    resid = L - predict(th, prob)                        # (n,) actual - predicted, in nats (Table 7 sign)
    # R^2 on raw nats (Table 1 caption), not on the log scale the objective uses
    ss_tot = float(np.sum((L - L.mean()) ** 2))
    # Table 7: per-architecture n, mean residual, max |residual| and RMSE (m: this architecture's runs)
    per_r = {str(int(r)): {"n": int(m.sum()), "mean": float(resid[m].mean()), "max_abs": float(np.abs(resid[m]).max()),
                           "rmse": float(np.sqrt(np.mean(resid[m] ** 2)))}
             for r, m in ((r, prob["n_loops"] == r) for r in np.unique(prob["n_loops"]))}
    block = {"E": math.exp(th[2]), "A": math.exp(th[0]), "B": math.exp(th[1]), "alpha": float(th[3]),
             "beta": float(th[4]), "phi": float(th[5]) if prob["phi_fixed"] is None else prob["phi_fixed"],
             "theta": th.tolist(), "r2": 1.0 - float(np.sum(resid ** 2)) / ss_tot if ss_tot > 0 else np.nan,
             "rmse": float(np.sqrt(np.mean(resid ** 2))), "max_abs_resid": float(np.abs(resid).max()),
             "n": int(len(L)), "per_r": per_r}
    block.update({k: v for k, v in res.items() if k != "theta"})    # huber, hits, on_bounds, seed, timing
    # fitting.md §3: one hit out of hundreds means the optimum was found once and may not be found again
    if block["hits"] == 1:
        warnings.warn(FitWarning("single_hit", f"fit over {block['n']} runs ({name})"))
    return block


# -----------------------------------------------------------------------------
# Block bootstrap over (budget, r) cells (App. F.2)

def bootstrap_phi(runs, theta_hat, n_boot=N_BOOT, seed=0, boot_restarts=BOOT_RESTARTS, progress=True, cells=None):
    """Refit free phi on n_boot resamples of the (budget, r) cells drawn with replacement. A run's weight is the
    number of times its cell was drawn (the objective is a sum: as duplicating rows). Each resample starts from the
    full-data optimum theta_hat plus boot_restarts uniform starts, screened in one batch; the best is polished with
    scipy at tight tolerances. Returns phi_lo/phi_hi (2.5/97.5 pct), median, n_le0, n_ge1 and the phi values.
    cells: the (budget, r) keys to resample (default: the runs' own). Two calls with the same seed and cells draw
    identical resamples: that pairs a case study with its baseline."""
    prob = make_problem(runs)
    rng = np.random.default_rng([seed, 1])      # its own stream: the point fits' starts stay unchanged
    # a cell groups every width trained at one (budget, r): resampling cells respects the experiment's block
    # structure instead of treating the widths of one sweep as independent draws (App. F.2)
    own = [(float(c), int(r)) for c, r in zip(runs["flops_budget"], runs["n_loops"])]
    cells = sorted(set(own)) if cells is None else [(float(c), int(r)) for c, r in cells]
    cell_id = np.array([cells.index(c) for c in own])     # ValueError if a run's cell is not in the given list
    draws = rng.integers(0, len(cells), size=(n_boot, len(cells)))            # (B, n_cells) cell indices
    W = np.stack([np.bincount(row, minlength=len(cells)) for row in draws])[:, cell_id].astype(float)  # (B, n)
    # one batched problem: row i*B + j is start i (0 = warm start) of resample j, with resample j's weights
    k = 1 + boot_restarts
    x0 = np.concatenate([np.repeat(np.asarray(theta_hat)[None], n_boot, 0),
                         rng.uniform(*_box(6), size=(n_boot * boot_restarts, 6))])   # (k B, 6) warm starts first
    t0 = time.perf_counter()
    xs, fs, _ = _screen(prob, x0, np.concatenate([W] * k))                    # weights (k B, n)
    xs, fs, phis, wins = xs.reshape(k, n_boot, 6), fs.reshape(k, n_boot), np.empty(n_boot), 0
    for i in range(n_boot):
        # tight-tolerance polish: a warm start that stops early barely moves and would make the CI too narrow
        xw, fw = _polish(prob, xs[0, i], W[i])
        j = 1 + int(np.argmin(fs[1:, i])) if boot_restarts else 0
        if boot_restarts and fs[j, i] < fw:
            # a random start screened lower than the polished warm start: polish it too, keep the better one
            xr, fr = _polish(prob, xs[j, i], W[i])
            if fr < fw * (1 - 1e-9):
                xw, fw, wins = xr, fr, wins + 1
        phis[i] = xw[5]
        if progress and ((i + 1) % 10 == 0 or i + 1 == n_boot):      # one progress line, rewritten in place
            print(f"\rbootstrap {i + 1:4d}/{n_boot} | median phi {np.median(phis[:i + 1]):.3f} | "
                  f"{time.perf_counter() - t0:5.1f}s", end="\n" if i + 1 == n_boot else "", file=sys.stderr, flush=True)
    return {"phi_lo": float(np.percentile(phis, 2.5)), "phi_hi": float(np.percentile(phis, 97.5)),
            "phi_median": float(np.median(phis)), "n_le0": int(np.sum(phis <= 0)), "n_ge1": int(np.sum(phis >= 1)),
            "n_resamples": n_boot, "n_cells": len(cells), "boot_restarts": boot_restarts,
            "random_start_wins": wins, "phi": phis.tolist()}


# -----------------------------------------------------------------------------
# Compute-optimal allocation and the frontier (§4.2, App. G.3, App. F.4)

def arch_polys(r, arch=None):
    """Exact coefficients of N_once(d), N_rec(d) and F(d) as quadratics in the width d (flops.py accounting):
    {"once", "rec", "flops": (3,) np.polyval coefficients}. Every count in flops.py is c2 d^2 + c1 d + c0 (blocks,
    gains, embeddings, attention at fixed T), so three integer widths determine it and a fourth checks it."""
    # flops.py takes integer widths, but the compute optimum d* is continuous (s* = d*/64 is not a grid width):
    # recover the polynomials once and evaluate them anywhere. The widths need not be trainable.
    arch = arch or {}                                            # flops.accounting_args beyond d_model, n_loops
    ds = np.array([256.0, 512.0, 768.0, 1024.0])
    vals = np.array([[*flops.param_split(int(d), r, **arch), flops.flops_per_token(int(d), r, **arch)] for d in ds])
    coef = np.linalg.solve(np.vander(ds[:3], 3), vals[:3])                     # (3, 3): columns once, rec, flops
    assert np.allclose((np.vander(ds[3:], 3) @ coef)[0], vals[3], rtol=1e-9, atol=0.5), f"r={r} {arch}: not quadratic"
    return {"once": coef[:, 0], "rec": coef[:, 1], "flops": coef[:, 2]}

def optimal_width(E, A, B, alpha, beta, n_of_d, f_of_d, C):
    """d* = argmin_d E + A N(d)^-alpha + B (F(d)/C)^beta, i.e. minimise L(N, D = C/F(N)) (§4.2, fitting.md §6).
    n_of_d, f_of_d: vectorised callables of the width. dL/dlnd has one root (a falling and a rising term), so a log
    grid locates the basin and a bounded Brent search refines it. Returns (d*, N*, D*, L*)."""
    def loss(u):
        # L_C(d) = E + A N(d)^-alpha + B D(d)^-beta with D(d) = C / F(d): the FLOPs the width costs come out of tokens
        d = np.exp(u)
        return E + A * n_of_d(d) ** -alpha + B * (f_of_d(d) / C) ** beta
    grid = np.linspace(math.log(1.0), math.log(1e7), 701)                     # d from 1 to 1e7, 2.3% steps
    j = int(np.argmin(loss(grid)))
    if j in (0, len(grid) - 1):
        # alpha or beta at 0 (a degenerate fit): L is monotone in d and has no interior optimum
        warnings.warn(FitWarning("frontier_edge", f"C={C:.3g} (alpha={alpha:.3g}, beta={beta:.3g})"))
    lo, hi = grid[max(j - 1, 0)], grid[min(j + 1, len(grid) - 1)]
    u = minimize_scalar(loss, bounds=(lo, hi), method="bounded", options={"xatol": 1e-10}).x
    return math.exp(u), float(n_of_d(math.exp(u))), float(C / f_of_d(math.exp(u))), float(loss(u))

def _frontier_rows(blocks, arch, aspect, budgets, joint=False):
    """Compute-optimal rows (budget, r, d*, s*, N*, N_eff*, D*, L*) for each r, from per-arch or joint laws."""
    rows = []
    for r in [r for r in sorted(arch) if joint or str(r) in blocks]:
        blk, poly = blocks if joint else blocks[str(r)], arch_polys(r, arch[r])   # this r's own N(d), F(d)
        # per-arch law: N = N_once + N_rec (Eq. 2). Joint law at fixed r (App. G.3): N_eff = N_once + r^phi N_rec,
        # so a higher phi shrinks the optimal width (A_eff = A g_r^-alpha falls as g_r = N_eff / N rises)
        g = r ** blk["phi"] if joint else 1.0
        n_eff = lambda d, poly=poly, g=g: np.polyval(poly["once"], d) + g * np.polyval(poly["rec"], d)
        f_of_d = lambda d, poly=poly: np.polyval(poly["flops"], d)
        for C in budgets:
            d, neff, D, L = optimal_width(blk["E"], blk["A"], blk["B"], blk["alpha"], blk["beta"], n_eff, f_of_d, C)
            N = float(np.polyval(poly["once"], d) + np.polyval(poly["rec"], d))
            rows.append({"flops_budget": float(C), "n_loops": int(r), "d_model": d, "scale": d / aspect[r],
                         "n_params": N, "n_eff": neff, "tokens": D, "loss": L})
    # gaps to the non-looped baseline at the same budget (§4.2: [0.03,0.06], [0.05,0.08], [0.09,0.12] nats)
    base = {row["flops_budget"]: row["loss"] for row in rows if row["n_loops"] == 1}
    for row in rows:
        row["gap"] = row["loss"] - base[row["flops_budget"]] if row["flops_budget"] in base else None
    return rows

def frontier(per_arch, joint, runs):
    """The frontier block: per-arch compute optima and gaps (§4.2, Fig. 3), power-law exponents of N* and D* in C,
    the joint law's optima at fixed r (App. G.3) and the App. F.4 equivalent sizes. The widths, N(d) and F(d) come
    from the runs' own architecture (arch_map), so a mini study with small vocab and seq_len is solved correctly."""
    arch, aspect = arch_map(runs)
    budgets = sorted(set(float(c) for c in runs["flops_budget"]))
    rows = _frontier_rows(per_arch, arch, aspect, budgets)
    out = {"rows": rows, "exponents": {}, "gaps": {},
           "joint_rows": _frontier_rows(joint, arch, aspect, budgets, joint=True)}
    for r in sorted({row["n_loops"] for row in rows}):
        rr = [row for row in rows if row["n_loops"] == r]
        lc = np.log([row["flops_budget"] for row in rr])
        if len(rr) >= 2:
            # least-squares slopes of ln N*, ln D* against ln C (Fig. 3 legends)
            out["exponents"][str(r)] = {"n_star": float(np.polyfit(lc, np.log([x["n_params"] for x in rr]), 1)[0]),
                                        "d_star": float(np.polyfit(lc, np.log([x["tokens"] for x in rr]), 1)[0])}
        gaps = [row["gap"] for row in rr if row["gap"] is not None]
        if r != 1 and gaps:
            out["gaps"][str(r)] = [float(min(gaps)), float(max(gaps))]
    out["equivalence"] = equivalence(joint["phi"], arch)
    return out

def equivalence(phi, arch, n_ref=1e9):
    """App. F.4: at the width where the non-looped model has N = n_ref, the looped model's unique N, its
    N_eff = N_once + r^phi N_rec (the non-looped size it matches at equal D) and its training-FLOPs ratio.
    N_rec includes the injection layer n_i as §3.2 defines it; the paper's "410M ~ 580M" drops n_i (0.578 vs 0.594
    at phi = 0.46, architecture.md §8.7)."""
    out = {}
    for r in [r for r in sorted(arch) if r != 1]:
        # compared at equal width and l_eff (F.4): both share d, so solve N_1(d) = n_ref (p1: the r = 1 model's)
        p1, pr = arch_polys(1, {k: v for k, v in arch[r].items() if k != "n_loops_bwd"}), arch_polys(r, arch[r])
        c = p1["once"] + p1["rec"]
        d = max(np.roots(c - np.array([0.0, 0.0, n_ref])).real)             # N_1(d) = n_ref, the positive root
        n1, nr_once, nr_rec = (float(np.polyval(q, d)) for q in (c, pr["once"], pr["rec"]))
        neff = flops.effective_params(nr_once, nr_rec, r, phi)                # Eq. 3, flops.py owns it
        # flops_ratio: the per-token training cost relative to the r = 1 model (Eq. 1: 1 + r/120 on the matmuls)
        out[str(r)] = {"d_model": float(d), "n_nonlooped": n1, "n_unique": nr_once + nr_rec, "n_eff": neff,
                       "unique_ratio": (nr_once + nr_rec) / n1, "eff_ratio": neff / n1, "amplification": r ** phi,
                       "flops_ratio": float(np.polyval(pr["flops"], d) / np.polyval(p1["flops"], d))}
    return out


# -----------------------------------------------------------------------------
# The protocol: per-arch, joint, restricted, halves, bootstrap, frontier (§4.2-4.3, App. F)

def run_protocol(runs, restarts=RESTARTS, n_boot=N_BOOT, seed=0, boot_restarts=BOOT_RESTARTS, progress=True):
    """Every fit of the paper on one set of runs; returns the fit.json dict. Bad input raises ValueError before any
    fit starts. Every fit block holds E, A, B, alpha, beta, phi, theta (a, b, e, alpha, beta[, phi]), r2 (raw
    nats), rmse, max_abs_resid, huber (Eq. 4 at the optimum, unscaled sum), n, per_r {r: n, mean, max_abs, rmse},
    and the restart diagnostics hits, n_converged, distinct_optima, distinct_theta, on_bounds, restarts, seed, seconds.
        per_arch    {r: Eq. 2 fit on N = N_once + N_rec}                              Table 1
        joint       free-phi Eq. 3 fit on every run                                   Table 2, Table 7 (its per_r)
        phi0, phi1  the restricted fits, phi fixed at 0 and 1                         Table 2
        halves      {low, high}: free-phi refits on each half of the budgets         App. F.3
        bootstrap   phi_lo, phi_hi (2.5 / 97.5 %), phi_median, n_le0, n_ge1, phi     App. F.2
        frontier    rows (per-arch d*, s*, N*, D*, L*, gap to r=1), exponents,        §4.2, Fig. 3
                    gaps, joint_rows (the joint law at fixed r), equivalence          App. G.3, App. F.4"""
    # checked before any fit: phi needs two r (with one, r^phi N_rec is A), each r's Eq. 2 fit 5 runs, each r one arch
    loops, counts = np.unique(runs["n_loops"], return_counts=True)
    if len(loops) < 2:
        raise ValueError(f"the joint law needs at least two architectures (n_loops values); got only r={loops}")
    if counts.min() < 5:
        raise ValueError(f"r={loops[counts.argmin()]} has {counts.min()} runs; its Eq. 2 fit needs at least 5")
    arch_map(runs)
    t0 = time.perf_counter()
    out = {"n_runs": int(len(runs["val_loss"])), "loops": loops.tolist(), "seed": seed, "restarts": restarts,
           "n_convention": "N_once + N_rec as recorded (Table 6 convention: non-embedding, norm gains included)"}
    # Table 1: per-architecture Chinchilla fits (Eq. 2 on N = N_once + N_rec)
    out["per_arch"] = _eq2_fits(runs, runs["n_loops"], restarts, seed, "r={}")
    # Table 2: joint law with free phi, and the restricted fits phi = 0 (pure sharing) and phi = 1 (non-looped).
    # All three use the same seeded starts; the restricted ones simply drop the phi column (5 parameters)
    for key, phi in (("joint", None), ("phi0", 0.0), ("phi1", 1.0)):
        out[key] = fit_block(runs, phi, restarts, seed, name="joint" if phi is None else f"phi={phi:g}")
    # App. F.3: lower and upper half of the sorted budgets (the paper's C <= 2.15e18, n=56 / C >= 4.64e18, n=60 on
    # its grid, and any other grid's); a half that cannot identify phi is skipped, not fitted
    budgets = sorted(set(runs["flops_budget"]))
    out["halves"] = {}
    for name, sel in (("low", budgets[:len(budgets) // 2]), ("high", budgets[len(budgets) // 2:])):
        sub = subset(runs, np.isin(runs["flops_budget"], sel))
        try:
            if len(budgets) < 2 or len(set(sub["n_loops"])) < 2 or len(sub["val_loss"]) < 6:
                raise ValueError(f"needs >= 2 budgets in all, and >= 2 architectures and >= 6 runs per half "
                                 f"(budgets {sel})")
            out["halves"][name] = dict(fit_block(sub, None, restarts, seed, name=f"{name} half, App. F.3"),
                                       budgets=[float(c) for c in sel])
        except ValueError as err:          # a half can be degenerate (equal losses) where the whole is not
            out["halves"][name] = {"skipped": str(err)}
    # App. F.2: block bootstrap of the free-phi fit (the restricted variants are not bootstrapped, as in the paper)
    if n_boot > 0:
        out["bootstrap"] = bootstrap_phi(runs, out["joint"]["theta"], n_boot, seed, boot_restarts, progress)
    # §4.2 / App. G.3 / F.4: compute-optimal allocation from the records' own architecture
    out["frontier"] = frontier(out["per_arch"], out["joint"], runs)
    sweeps = loop_sweeps(runs)
    out.update({"loop_sweep": sweeps} if sweeps else {}, seconds=time.perf_counter() - t0)
    out["flags"] = assess(out, runs)
    return out

def loop_sweeps(runs):
    """Test-time loop extrapolation (App. A): the runs that carry an eval.py --n-loops-sweep curve, as
    [{n_loops (trained r), flops_budget, n_params, val_loss (at r), curve: [{n_loops: r', val_loss}], gain}], where
    gain = L(largest r') - L(r' = r) in nats (negative: more loops at test time help)."""
    out = []
    for i, curve in [(i, c) for i, c in enumerate(runs["sweep"]) if c]:
        r, at = int(runs["n_loops"][i]), {int(p["n_loops"]): float(p["val_loss"]) for p in curve}
        out.append({"n_loops": r, "flops_budget": float(runs["flops_budget"][i]), "source": runs["source"][i],
                    "n_params": float(runs["n_once"][i] + runs["n_rec"][i]), "val_loss": float(runs["val_loss"][i]),
                    "curve": [{"n_loops": k, "val_loss": at[k]} for k in sorted(at)],
                    "gain": at[max(at)] - at[r] if (r in at and max(at) > r) else None})
    return sorted(out, key=lambda e: (e["flops_budget"], e["n_loops"], e["n_params"]))

def select_runs(runs, case=None, loops=None):
    """The runs one analysis uses (a runs folder may hold the main grid and case studies side by side: one fit over
    them would mix architectures). No case: the main grid (runs without a case label). A case (§5): the variant's
    runs plus the unchanged baseline r=1 runs at its budgets when it has none. loops: keep only these n_loops
    (Table 3's "without r=2" refit)."""
    base = np.array([c in BASELINE for c in runs["case"]])
    sel = base if case is None else np.array([c == case for c in runs["case"]])
    if not sel.any():
        labels = ", ".join(sorted({str(c) for c in runs["case"] if c not in BASELINE})) or "none"
        raise ValueError(f"no run has case {case!r}; cases present: {labels}" if case else
                         f"every run carries a case label ({labels}); choose one with --case")
    if case is not None and not np.any(sel & (runs["n_loops"] == 1)):
        sel = sel | (base & np.isin(runs["flops_budget"], runs["flops_budget"][sel]) & (runs["n_loops"] == 1))
    if loops is not None:
        sel &= np.isin(runs["n_loops"], list(loops))
    if not sel.any():
        raise ValueError("no runs left after selecting case/loops")
    return subset(runs, sel)

def _canonical_order(runs):
    """The runs sorted by (budget, r, N, D): a fit then does not depend on the order the folders were walked in, and
    a variant whose runs equal the baseline's gives the baseline's fit and bootstrap bit for bit (delta-phi = 0)."""
    return subset(runs, np.lexsort((runs["tokens"], runs["n_once"] + runs["n_rec"], runs["n_loops"],
                                    runs["flops_budget"])))

def run_case(runs, case, loops=None, restarts=RESTARTS, n_boot=N_BOOT, seed=0, boot_restarts=BOOT_RESTARTS,
             progress=True):
    """§5 / Table 3: the full protocol on the variant's runs, the baseline refitted on the same budgets (and the same
    n_loops), and delta_phi = phi_variant - phi_baseline."""
    variant = _canonical_order(select_runs(runs, case, loops))
    budgets = sorted(set(float(c) for c in variant["flops_budget"]))
    # Table 3's baseline is refitted on the case's budgets only: phi drifts little with budget (App. F.3), but a
    # delta-phi between different budget windows would still mix that drift into the comparison
    base = select_runs(runs, None, loops)
    base = _canonical_order(subset(base, np.isin(base["flops_budget"], budgets)))
    if len(set(base["n_loops"])) < 2:
        raise ValueError(f"case {case!r}: the baseline has fewer than two architectures at budgets {budgets}")
    out = run_protocol(variant, restarts, n_boot, seed, boot_restarts, progress)
    bblk = fit_block(base, None, restarts, seed, name="case baseline")
    # a baseline lacking some of the case's budgets is refitted on fewer and says so (_budgets_said, budget_mismatch);
    # baseline_runs lets --cases check that the baseline study fitted these same runs
    out["case"] = {"name": case, "budgets": budgets, "baseline_budgets": sorted(set(map(float, base["flops_budget"]))),
                   "baseline": bblk, "variant": out["joint"], "delta_phi": out["joint"]["phi"] - bblk["phi"],
                   "n_variant": out["n_runs"], "n_baseline": bblk["n"], "baseline_runs": runs_record(base)}
    if n_boot > 0:
        out["case"].update(paired_delta_bootstrap(variant, base, out, bblk, n_boot, seed, boot_restarts, progress))
    out["flags"] = assess(out, variant)   # again, now with the refitted baseline that delta-phi depends on
    return out

def _budgets_said(c):
    """What the case's baseline was refitted on, truly: "the same budgets", or the case's budgets it has runs at."""
    lack = [x for x in c["budgets"] if x not in c["baseline_budgets"]]
    return (f"{len(c['budgets']) - len(lack)} of the case's {len(c['budgets'])} budgets (no baseline runs at C = "
            f"{', '.join(f'{x:.3g}' for x in lack)})") if lack else "the same budgets"

def paired_delta_bootstrap(variant, base, vres, bblk, n_boot, seed, boot_restarts, progress=True):
    """The CI of delta-phi: one block bootstrap over the (budget, r) cells, the SAME resamples for the variant and
    the baseline (a drawn cell brings its variant runs and its baseline runs; the shared r = 1 cells are identical),
    so the budget-to-budget noise both fits share cancels in phi_variant - phi_baseline (paper §5 compares the two
    on the same budgets). Returns delta_phi_lo/hi/median and the baseline's own bootstrap CI."""
    key = lambda runs: {(float(c), int(r)) for c, r in zip(runs["flops_budget"], runs["n_loops"])}
    cells = sorted(key(variant) | key(base))
    boot = vres.get("bootstrap")
    if boot is None or key(variant) != set(cells):          # run_protocol's bootstrap drew over other cells
        boot = bootstrap_phi(variant, vres["joint"]["theta"], n_boot, seed, boot_restarts, progress, cells)
    bboot = bootstrap_phi(base, bblk["theta"], n_boot, seed, boot_restarts, progress, cells)
    delta = np.array(boot["phi"]) - np.array(bboot["phi"])                  # (n_boot,) paired differences
    return {"delta_phi_lo": float(np.percentile(delta, 2.5)), "delta_phi_hi": float(np.percentile(delta, 97.5)),
            "delta_phi_median": float(np.median(delta)), "n_delta_le0": int(np.sum(delta <= 0)),
            "paired_cells": len(cells), "baseline_phi_lo": bboot["phi_lo"], "baseline_phi_hi": bboot["phi_hi"],
            "delta_phi_boot": delta.tolist()}


# -----------------------------------------------------------------------------
# Flags: when the numbers must not be read at face value (issue 12, rule 6)

# what each flag means; its message is this text followed by the fits (or runs) it concerns
FLAG_TEXT = {
    "on_bound": "parameters sit on their App. F box bound, so the data do not pin them inside the box",
    "low_r2": f"R² on raw nats is below {R2_LOW}: the law explains little of the variance of these losses",
    "single_budget": "one compute budget (one D): N and D are not varied independently, so the N and D terms "
                     "(A, alpha against B, beta, E) are not separately identified",
    "budget_mismatch": "the baseline lacks some of the case's budgets, so it was refitted on fewer and delta-phi "
                       "compares fits over different budget windows",
    "few_runs": f"fewer than {RUNS_PER_PARAM} runs per fitted parameter",
    "few_resamples": f"the 95% CI rests on fewer than {MIN_CI_RESAMPLES} bootstrap resamples (App. F.2 uses 200)",
    "unfinished_runs": "run folders with a checkpoint or log but no done.json (killed, failed or still training) "
                       "are not in this fit",
    "single_hit": "only one restart reached the best objective, so the optimum may not be reproducible",
    "duplicate_runs": "runs repeat a configuration and count twice in Eq. 4",
    "frontier_edge": "a compute optimum sits on the edge of the width range (the law has no interior optimum)",
    "fit_warning": "the fitter warned",
}

def _add_flag(flags, name, item):
    """One flag per condition; a second finding of the same kind adds an item to its message."""
    if (flag := next((f for f in flags if f["name"] == name), None)) is None:
        flags.append(flag := {"name": name, "items": []})
    if item not in flag["items"]:
        flag["items"].append(item)
    flag["message"] = f"{FLAG_TEXT[name]}: {'; '.join(flag['items'])}"

def assess(res, runs):
    """The flags of a result: [{"name", "message"}], empty when nothing is amiss (fit.json stores them, report.md
    lists them first, the CLI names them on the phi line): FLAG_TEXT's first six, one flag each (>2.5% of the
    bootstrap's phi on the box is on_bound too). The CLI adds unfinished_runs and the fitter's own warnings."""
    found, flags, bs, c = [], [], res.get("bootstrap"), res.get("case")    # found: (flag, condition, item)
    def one_budget(m):      # "C = x" when every run of mask m is at budget x (chinchilla mode: D), else None
        C, D = runs["flops_budget"][m], runs["tokens"][m]
        x, fmt = (C, "C = {:.3g}") if np.all(np.isfinite(C)) else (D, "D = {:.3g} tokens")
        return fmt.format(x[0]) if len(set(x)) == 1 else None
    # each fit block with its one budget if it has only one; the joint fit's one budget is every r's (said once)
    if "chinchilla" in res:
        blocks = {("fit" if g == "all" else f"group {g}"): (b, one_budget(np.array([x == g for x in runs["group"]])))
                  for g, b in _chin_groups(res).items()}
    else:
        blocks = {"joint": (res["joint"], one := one_budget(np.ones(len(runs["val_loss"]), dtype=bool)))}
        blocks.update({f"r={r}": (b, None if one else one_budget(runs["n_loops"] == int(r)))
                       for r, b in res["per_arch"].items()})
        if c:       # the case baseline's budgets: those of the case it has runs at (run_case)
            bb = c["baseline_budgets"]
            blocks["case baseline"] = (c["baseline"], None if one or len(bb) > 1 else f"C = {bb[0]:.3g}")
    for name, (b, at) in blocks.items():
        # fit_law's on_bounds is exact (1e-6 of the box); a polish stopped in a flat valley a hair inside the
        # bound (phi = 2.9997) is the same finding, so 1e-3 of the box counts here
        (lo, hi), th = _box(len(b["theta"])), b["theta"]
        names = [k for j, k in enumerate(PARAM_NAMES[:len(th)])
                 if k in b["on_bounds"] or min(th[j] - lo[j], hi[j] - th[j]) <= NEAR_BOUND * (hi[j] - lo[j])]
        found += [("on_bound", names, f"{name} fit: {', '.join(names)}"),          # NaN R^2 counts as low
                  ("low_r2", not b["r2"] >= R2_LOW, f"{name} fit R² = {b['r2']:.3f}"),
                  ("few_runs", b["n"] < RUNS_PER_PARAM * len(th), f"{name} fit: {b['n']} runs for {len(th)} "
                   "parameters"),
                  ("single_budget", at, f"{name} fit: every run at {at}")]
    if bs:
        phis, n = np.abs(np.asarray(bs["phi"])), bs["n_resamples"]
        at = int(np.sum(np.abs(phis - BOX_HI[5]) <= NEAR_BOUND * (BOX_HI[5] - BOX_LO[5])))
        found += [("on_bound", at > 0.025 * n, f"bootstrap: {at} of {n} resamples at phi = ±{BOX_HI[5]:g}, the CI "
                   "is cut by the box"), ("few_resamples", n < MIN_CI_RESAMPLES, f"{n} resamples")]
    if c:
        lack = [f"{x:.3g}" for x in c["budgets"] if x not in c["baseline_budgets"]]
        found.append(("budget_mismatch", lack, f"no baseline runs at C = {', '.join(lack)}"))
    for flag, bad, item in found:
        if bad:
            _add_flag(flags, flag, item)
    # the blocks find the flags out of order: list them in FLAG_TEXT's order (its first six are assess's)
    return sorted(flags, key=lambda f: list(FLAG_TEXT).index(f["name"]))


# -----------------------------------------------------------------------------
# Synthetic data: the paper's 116-run grid with losses drawn from the joint law (fitting.md §8)

SYNTH_COLUMNS = ("flops_budget", "n_loops", "scale", "d_model", "n_once", "n_rec", "tokens", "val_loss")

def synthetic_rows(phi=0.46, noise=0.01, seed=0, truth=None):
    """The flops.grid_runs() grid (Table 6: 29 cells x r in {1,2,4,8}) with val_loss = Eq. 3 at SYNTH_TRUTH
    (phi replaced, any key overridden by truth) plus N(0, noise^2) nats. Returns CSV-style row dicts."""
    t = dict(SYNTH_TRUTH, phi=phi, **(truth or {}))
    rng = np.random.default_rng(seed)
    rows = []
    # N_once, N_rec and D (tokens after the steps rounding) exactly as a real run of the grid would record them,
    # so the synthetic CSV passes the same checks as real records
    for i, run in enumerate(flops.grid_runs()):
        n_eff = run["n_once"] + run["n_loops"] ** t["phi"] * run["n_rec"]             # Eq. 3
        loss = t["E"] + t["A"] * n_eff ** -t["alpha"] + t["B"] * run["tokens"] ** -t["beta"]
        rows.append(dict({k: run[k] for k in SYNTH_COLUMNS[:-1]}, val_loss=loss + noise * rng.standard_normal(),
                         source=f"synthetic:{i}", arch={}))
    return rows

def synthetic_runs(phi=0.46, noise=0.01, seed=0, truth=None):
    """synthetic_rows, validated into the runs dict the fitters take."""
    return runs_from_rows(synthetic_rows(phi, noise, seed, truth))


# -----------------------------------------------------------------------------
# Report (tables laid out like the paper's Tables 1, 2, 3 and 7) and fit.json

def _table(head, rows, title=None):
    """Markdown lines: the title and a blank line (if given), the header, the separator, a line per row of cells."""
    return ([title, ""] if title else []) + [f"| {' | '.join(head)} |", "|---" * len(head) + "|"] + \
        [f"| {' | '.join(map(str, row))} |" for row in rows]

def _fmt(x, fmt):
    """A table cell: format(x, fmt), "sig2" (2 significant figures: Table 1's A, B), "e5" (Huber, ×1e5); None: -"""
    return "-" if x is None else f"{float(f'{x:.2g}'):g}" if fmt == "sig2" else f"{x / 1e-5:.2f}" if fmt == "e5" \
        else format(x, fmt)

def _cells(d, spec):
    """The values of d (a fit block, a frontier row, ...) as table cells, by spec "key:fmt key:fmt ..." (_fmt)."""
    return [_fmt(d[k], f) for k, f in (s.split(":") for s in spec.split())]

def _eq2_blocks(res):
    """The Eq. 2 fits by name: per architecture ("r=4"), or per chinchilla group."""
    return _chin_groups(res) if "chinchilla" in res else {f"r={r}": b for r, b in res["per_arch"].items()}

def _flag_names(res):
    """The flag names as the phi line and the tables show them, e.g. " -- WARNING: low_r2, on_bound"."""
    return f" -- WARNING: {', '.join(f['name'] for f in res['flags'])}" if res.get("flags") else ""

def _ci(x, key, fmt):
    """" [lo, hi]" of x's key_lo and key_hi (a 95% CI), or "" where there is none."""
    return "" if x.get(f"{key}_lo") is None else f" [{x[f'{key}_lo']:{fmt}}, {x[f'{key}_hi']:{fmt}}]"

def report_text(res):
    """report.md: the flags first, then Table 1 (per-arch), Table 2 (joint + restricted), Table 7 (per-r
    residuals), halves, Table 3 (case study), loop sweeps, frontier and F.4 equivalence; or the chinchilla table."""
    L = ["# fit.py report", "", f"runs: {res.get('n_runs')} | seed {res.get('seed')} | restarts {res.get('restarts')}"
         f" | {res.get('seconds', 0):.1f} s", ""]
    # rule 6 of issue 12: what limits these numbers comes before the numbers
    if res.get("flags"):
        L += ["## Warnings: read the numbers below with these in mind", "",
              *(f"- **{f['name']}**: {f['message']}" for f in res["flags"]), ""]
    # Table 1: these exponents are not comparable across r (N differs under sharing, §4.2): compare the frontier
    chin = "chinchilla" in res
    L += _table(("Arch.", "A", "α", "B", "β", "E", "Huber (×10⁻⁵)", "R²", "n", "hits", "on bounds"), [
        [k, *_cells(b, "A:sig2 alpha:.3f B:sig2 beta:.3f E:.2f huber:e5 r2:.4f n: hits:"), ", ".join(b["on_bounds"])
         or "-"] for k, b in _eq2_blocks(res).items()], "## Chinchilla fits (Eq. 2; layout of Table 1)" if chin else
        "## Table 1: per-architecture Chinchilla fits (Eq. 2)")
    if chin:
        return "\n".join(L) + "\n"
    # Table 2: free phi with its bootstrap CI; A and B omitted as in the paper (loose under iso-compute designs)
    j, bs = res["joint"], res.get("bootstrap") or {}
    L += [""] + _table(("Form", "α", "β", "E", "φ", "R²", "Huber (×10⁻⁵)", "hits"), [
        [name, *_cells(b, "alpha:.3f beta:.3f E:.2f"), phi, *_cells(b, "r2:.4f huber:e5 hits:")] for name, b, phi in (
            ("Joint, φ free", j, f"{j['phi']:.3f}{_ci(bs, 'phi', '.2f')}{_flag_names(res)}"),
            ("Restricted (φ = 0, pure sharing cost)", res["phi0"], "0.00"),
            ("Restricted (φ = 1, non-looped equivalence)", res["phi1"], "1.00"))], "## Table 2: joint law (Eq. 3)")
    if bs:
        L += ["", f"Block bootstrap ({bs['n_resamples']} resamples of {bs['n_cells']} (budget, r) cells): median φ "
              f"{bs['phi_median']:.3f}, 95% CI{_ci(bs, 'phi', '.3f')}, {bs['n_le0']} resamples at φ ≤ 0 and "
              f"{bs['n_ge1']} at φ ≥ 1; a random start beat the warm start in {bs['random_start_wins']}."]
    # Table 7: a shared phi should leave no architecture with a disproportionate share of the residual mass
    L += [""] + _table(("Architecture", "n", "mean resid", "max \\|resid\\|", "RMSE"), [
        [f"r={r}", *_cells(st, "n: mean:+.3f max_abs:.3f rmse:.3f")] for r, st in j["per_r"].items()],
        "## Table 7: joint-law residuals by architecture (actual − predicted, nats)")
    L.append(f"| pooled | {j['n']} | | {j['max_abs_resid']:.3f} | {j['rmse']:.3f} |")
    # App. F.3: phi should not drift with scale inside the compute window
    L += ["", "## Budget halves (App. F.3)", ""] + [
        f"- {name}: skipped ({b['skipped']})" if "skipped" in b else f"- {name} (C ∈ [{min(b['budgets']):.3g}, "
        f"{max(b['budgets']):.3g}], n = {b['n']}): φ = {b['phi']:.3f}, R² = {b['r2']:.4f}"
        for name, b in res["halves"].items()]
    if c := res.get("case"):
        # Table 3: baseline refitted on the case's budgets, then the variant; delta-phi is the paper's summary number
        L += [""] + _table(("Variant", "α", "β", "E", "φ", "R²", "n"), [
            [name, *_cells(b, "alpha:.3f beta:.3f E:.2f phi:.3f r2:.4f n:")] for name, b in (
                (f"Baseline (refitted on {_budgets_said(c)})", c["baseline"]), (c["name"], c["variant"]))],
            f"## Table 3: case study `{c['name']}` (budgets {', '.join(f'{x:.3g}' for x in c['budgets'])})")
        L += ["", f"Δφ = {c['delta_phi']:+.3f}{_ci(c, 'delta_phi', '+.3f')}" + (
            f" (paired block bootstrap, {len(c['delta_phi_boot'])} resamples of {c['paired_cells']} cells; "
            f"{c['n_delta_le0']} at Δφ ≤ 0)" if "delta_phi_lo" in c else "")]
    if sw := res.get("loop_sweep"):
        # App. A: r' != r loops at test time; Huginn-style random state init should extrapolate, the paper's does not
        rps = sorted({p["n_loops"] for e in sw for p in e["curve"]})
        L += [""] + _table(("trained r", "C", "N", *(f"r'={k}" for k in rps), "L(r'max) − L(r)"), [
            [e["n_loops"], *_cells(e, "flops_budget:.3g n_params:.3g"), *(_fmt(a.get(k), ".3f") for k in rps),
             _fmt(e["gain"], "+.3f")] for e in sw for a in [{p["n_loops"]: p["val_loss"] for p in e["curve"]}]],
            "## Test-time loop extrapolation (App. A; eval.py --n-loops-sweep, figure loop_sweep.png)")
    # §4.2: the frontier L*_r(C) is comparable across r (gap = L*_r - L*_1 at one budget); its exponents; F.4 sizes
    fr, jr = res["frontier"], res["frontier"]["joint_rows"]
    L += [""] + _table(("C", "r", "s*", "N*", "D*", "L*", "gap to r=1"), [
        _cells(row, "flops_budget:.3g n_loops: scale:.1f n_params:.3g tokens:.3g loss:.3f gap:+.3f")
        for row in fr["rows"]], "## Compute-optimal frontier (per-architecture laws; §4.2, Fig. 3)")
    L += [""] + _table(("r", "N* ∝ C^a", "D* ∝ C^b", "gap range (nats)"), [
        [r, *_cells(ex, "n_star:.2f d_star:.2f"), "-" if r not in fr["gaps"] else
         f"[{fr['gaps'][r][0]:.3f}, {fr['gaps'][r][1]:.3f}]"] for r, ex in fr["exponents"].items()])
    # App. G.3: the joint law at fixed r; a case's phi shift moves it (truncated BPTT widens, hyperconnections narrow)
    L += ["", "Compute-optimal scale s* from the joint law at fixed r (App. G.3):", ""] + _table(
        ("C", *(f"r={r}" for r in sorted({x["n_loops"] for x in jr}))),
        [(f"{C:.3g}", *(f"{x['scale']:.1f}" for x in jr if x["flops_budget"] == C))
         for C in sorted({x["flops_budget"] for x in jr})])
    L += [""] + _table(("r", "N (r=1)", "N unique", "N_eff", "unique ratio", "N_eff ratio", "r^φ", "FLOPs ratio"), [
        [r, *_cells(e, "n_nonlooped:.3g n_unique:.3g n_eff:.3g unique_ratio:.3f eff_ratio:.3f amplification:.2f "
                    "flops_ratio:.3f")] for r, e in fr["equivalence"].items()],
        f"## Equivalent sizes (App. F.4, φ = {j['phi']:.3f}, N_rec includes the injection layer)")
    return "\n".join(L) + "\n"

def _jsonable(x):
    """numpy scalars/arrays -> plain JSON types (NaN and inf -> null, which strict JSON readers accept)."""
    return json.loads(json.dumps(x, default=lambda v: v.tolist()), parse_constant=lambda name: None)


# -----------------------------------------------------------------------------
# Figures (matplotlib, Agg: renders without a display), rendered in memory and written as one set with the report

def _pyplot():
    """pyplot on Agg (no display needed), imported on first use: the fits need no plotting, and it costs ~1 s."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt

def _png(fig):
    """A figure as PNG bytes (then closed): nothing is written here, so a failing figure leaves no file behind."""
    buf = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")              # tight_layout's "not compatible" notes on odd axes
        fig.tight_layout()
        fig.savefig(buf, format="png", dpi=110)
    _pyplot().close(fig)
    return buf.getvalue()

def _lim(values):
    """[lo, hi] of the finite values (a diagonal or an axis range); padded when they are all equal, [0, 1] when none
    is finite -- degenerate data must still draw (issue 12, rule 6)."""
    v = np.asarray(values, dtype=float)
    v = v[np.isfinite(v)]
    if v.size == 0:
        return [0.0, 1.0]
    pad = 0.05 * (float(np.ptp(v)) or max(abs(float(v[0])), 1.0))
    return [float(v.min()) - pad, float(v.max()) + pad]

def _sweep_figure(plt, lines):
    """Val loss vs test-time r' (App. A): a panel per trained r (dotted), a line per (sweep entry, colour, label)."""
    rs = sorted({e["n_loops"] for e, _, _ in lines})
    fig, axes = plt.subplots(1, len(rs), figsize=(4 * len(rs), 3.6), squeeze=False)
    for ax, r in zip(axes[0], rs):
        for e, color, label in [line for line in lines if line[0]["n_loops"] == r]:
            ax.plot([p["n_loops"] for p in e["curve"]], [p["val_loss"] for p in e["curve"]], "o-", ms=3, color=color,
                    label=label)
        ax.axvline(r, color="grey", ls=":", lw=0.8)
        ax.set_xscale("log", base=2)
        ax.set(title=f"trained r = {r}", xlabel="test-time loops r'")
        ax.legend(fontsize=7)
    axes[0][0].set_ylabel("validation loss (nats)")
    return _png(fig)

def make_figures(res, runs):
    """{name: PNG bytes}: pred_vs_actual, iso_flops, frontier, phi, loop_sweep (if swept); chinchilla: the first."""
    plt, chin, rs = _pyplot(), "chinchilla" in res, sorted(set(int(r) for r in runs["n_loops"]))
    # predicted vs actual (Fig. 8, 10): Eq. 2 per architecture (20 parameters; or per group) next to the joint law (6)
    fig, axes = plt.subplots(1, 1 + (not chin), figsize=(5, 5) if chin else (9, 4.4), sharey=True, squeeze=False)
    keys, lim = runs["group"] if chin else [f"r={r}" for r in runs["n_loops"]], _lim(runs["val_loss"])
    titles = ["Chinchilla fits (Eq. 2)"] if chin else ["per-architecture (Eq. 2)", f"joint (Eq. 3), φ = "
                                                       f"{res['joint']['phi']:.3f}, RMSE {res['joint']['rmse']:.3f}"]
    for j, (ax, title) in enumerate(zip(axes[0], titles)):
        for i, (k, b) in enumerate(_eq2_blocks(res).items()):
            m = np.array([x == k for x in keys])
            th, phi = (res["joint"]["theta"], None) if j else (b["theta"], 0.0)     # the joint law, or this Eq. 2 fit
            ax.scatter(runs["val_loss"][m], predict(th, _pack(subset(runs, m), phi)), s=14, color=f"C{i}", label=k)
        ax.plot(lim, lim, "k--", lw=0.8)    # y = x, framed by the actual losses (a wild prediction is clipped)
        ax.set(xlabel="actual loss (nats)", ylabel=("predicted loss (nats)", "")[j], xlim=lim, ylim=lim, title=title)
    axes[0][0].legend(fontsize=7)
    figs = {"pred_vs_actual.png": _png(fig)}
    if chin:             # chinchilla mode has no FLOPs model and no phi: only the predicted-vs-actual scatter applies
        return figs
    # iso-FLOP profiles (Fig. 2): loss vs N per budget, the per-arch law along the width, the optima (N*, L*) as stars
    budgets = sorted(set(float(c) for c in runs["flops_budget"]))
    bcol = {c: plt.cm.viridis(i / max(len(budgets) - 1, 1)) for i, c in enumerate(budgets)}
    arch, _ = arch_map(runs)
    fig, axes = plt.subplots(1, len(rs), figsize=(4 * len(rs), 3.6), sharey=True, squeeze=False)
    for ax, r in zip(axes[0], rs):
        b, poly = res["per_arch"][str(r)], arch_polys(r, arch[r])
        for C in sorted(set(runs["flops_budget"][runs["n_loops"] == r])):
            m = (runs["n_loops"] == r) & (runs["flops_budget"] == C)
            N = runs["n_once"][m] + runs["n_rec"][m]
            ax.scatter(N, runs["val_loss"][m], s=16, color=bcol[C], label=f"{C:.3g}")
            # the fitted curve along the width, just past the trained range: N(d) and D = C / F(d) both move with d
            d = np.geomspace(1.0, 1e6, 4000)
            Nd = np.polyval(poly["once"], d) + np.polyval(poly["rec"], d)
            keep = (Nd > N.min() / 1.6) & (Nd < N.max() * 1.6)
            Nk, Dk = Nd[keep], C / np.polyval(poly["flops"], d[keep])
            ax.plot(Nk, b["E"] + b["A"] * Nk ** -b["alpha"] + b["B"] * Dk ** -b["beta"], color=bcol[C], lw=1)
        for row in [row for row in res["frontier"]["rows"] if row["n_loops"] == r]:
            ax.plot(row["n_params"], row["loss"], "*", color=bcol[row["flops_budget"]], ms=10, mec="k", mew=0.5)
        ax.set(xscale="log", title=f"r = {r}", xlabel="unique parameters N")
        ax.xaxis.set_minor_formatter(plt.NullFormatter())     # a narrow N range would label every minor tick
    axes[0][0].set_ylabel("validation loss (nats)")
    axes[0][0].legend(title="C (FLOPs)", fontsize=7)
    figs["iso_flops.png"] = _png(fig)
    # frontier (Fig. 3): L*_r(C), N*(C), D*(C); looped optima sit wider in d yet lower in N, and train on fewer tokens
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.8))
    for ax, key, lab in zip(axes, ("loss", "n_params", "tokens"), ("L*(C) (nats)", "N*(C)", "D*(C) (tokens)")):
        for i, r in enumerate(rs):                  # tab10: an architecture's colour in every figure
            rows = [row for row in res["frontier"]["rows"] if row["n_loops"] == r]
            ax.plot([row["flops_budget"] for row in rows], [row[key] for row in rows], "o-", color=f"C{i}",
                    label=f"r={r}", ms=4)
        ax.set(xscale="log", xlabel="compute C (FLOPs)", ylabel=lab, yscale="linear" if key == "loss" else "log")
    axes[0].legend(fontsize=7)
    figs["frontier.png"] = _png(fig)
    # phi: restricted fits (Fig. 1 right: R^2 drops at phi = 0 and 1); bootstrap histogram, 95% CI dashed, phi solid
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.6))
    # undefined R^2 draws as an empty bar
    r2 = [v if v is not None and math.isfinite(v) else 0.0 for v in (res[k]["r2"] for k in ("joint", "phi0", "phi1"))]
    axes[0].bar([f"φ free ({res['joint']['phi']:.2f})", "φ = 0", "φ = 1"], r2, color=["C0", "C1", "C2"])
    axes[0].set_ylim(min(r2) - 0.2 * (max(r2) - min(r2) + 1e-4), 1.0)    # R^2 near 1: zoom on the differences
    axes[0].set(ylabel="R² (raw nats)", title="joint law: free vs restricted φ" + " (flagged)" * bool(res.get("flags")))
    if bs := res.get("bootstrap"):
        phis = np.asarray(bs["phi"], dtype=float)
        axes[1].hist(phis[np.isfinite(phis)], bins=30, range=tuple(_lim(phis)), color="C0", alpha=0.8)
        for v, ls in ((bs["phi_lo"], "--"), (bs["phi_hi"], "--"), (res["joint"]["phi"], "-")):
            axes[1].axvline(v, color="k", ls=ls, lw=1)
        axes[1].set(xlabel="φ", ylabel="resamples", title=f"block bootstrap: [{bs['phi_lo']:.2f}, {bs['phi_hi']:.2f}]")
    figs["phi.png"] = _png(fig)
    if res.get("loop_sweep"):          # App. A: each swept model, in the panel of its trained r
        figs["loop_sweep.png"] = _sweep_figure(plt, [(e, None, f"C={e['flops_budget']:.3g}, N={e['n_params']:.3g}")
                                                     for e in res["loop_sweep"]])
    assert set(figs) <= set(OUTPUTS), "add a new figure to OUTPUTS so --overwrite can manage it"
    return figs



# -----------------------------------------------------------------------------
# Case-study summary (--cases DIR): one table and two figures over the baseline fit and every case fit beside it

CASES_MARK = "<!-- case studies: written by fit.py --cases; everything below is regenerated -->"

def case_summary(out_dir):
    """OUT/fit.json (the baseline) and OUT/case_*/fit.json as {"rows": the numbers, flags and sweep of each, "request":
    OUT/fit.json's, "unfitted": case folders without a fit.json}. A case fitted on other runs is refused."""
    names = sorted(n for n in (os.listdir(out_dir) if os.path.isdir(out_dir) else []) if n.startswith("case_"))
    found = [(n[len("case_"):] or "baseline", os.path.join(out_dir, n, "fit.json")) for n in ["", *names]]
    rows, base, request = [], None, None
    # the baseline first (each case is checked against it); a fit.json that is no file is named by read_json
    for name, path in [(n, p) for n, p in found if os.path.lexists(p)]:
        res = read_json(path)
        request = res.get("request") if name == "baseline" else request
        if "joint" not in res:
            continue                                  # a chinchilla fit: no phi to compare
        base = res if name == "baseline" else base
        try:        # a hand-edited fit.json: every number the table and figures show is checked, or the file named
            j, bs, c, sw = res["joint"], res.get("bootstrap") or {}, res.get("case") or {}, res.get("loop_sweep") or []
            gains = [e["gain"] for e in sw if e.get("gain") is not None]
            # the r=8 frontier gap L*_8 - L*_1 at the largest budget (§4.2)
            fr = [x for x in (res.get("frontier") or {}).get("rows", []) if x["n_loops"] == 8 and x["gap"] is not None]
            rows.append({"name": name, **{k: d.get(k) for d, ks in ((j, ("phi", "r2", "n")), (bs, ("phi_lo", "phi_hi")),
                         (c, ("delta_phi", "delta_phi_lo", "delta_phi_hi"))) for k in ks},
                         "baseline_phi": (c.get("baseline") or {}).get("phi"),
                         "gap8": max(fr, key=lambda x: x["flops_budget"])["gap"] if fr else None,
                         "extrapolation_gain": float(np.mean(gains)) if gains else None,
                         # with the fits they concern: single_hit on a budget half is not about the table's phi
                         "flags": [(fl["name"], "; ".join(fl.get("items") or [])) for fl in res.get("flags") or []],
                         "sweep": sw})
            bad = [k for k, v in rows[-1].items() if k not in ("name", "flags", "sweep") and (common.check_number(
                v, "[-1e6, 1e6]") or (v is None and k in ("phi", "r2", "n")))]
            if bad or not all(type(e["n_loops"]) is int and _sweep_ok(e["curve"]) for e in sw):
                raise ValueError(f"no numeric phi, r2 and n in range, or a bad {', '.join(bad) or 'loop_sweep'}")
        except (KeyError, TypeError, AttributeError, ValueError) as err:
            raise ValueError(f"{path}: not a fit.py result ({err})") from None
        if base is not None and base is not res:
            # delta-phi is taken against the baseline refitted in the case's fit, shown next to OUT's phi: every run of
            # that refit must be in OUT/fit.json with the same key (runs_record; none before issue 18: refused)
            try:
                want, have = (dict(zip(rec["dirs"], rec["keys"])) for rec in (c["baseline_runs"], base["runs"]))
            except (KeyError, TypeError):
                raise ValueError(f"{path} or {found[0][1]} records no runs (an older fit.py wrote it); refit") from None
            if diff := [d for d in want if have.get(d) != want[d]]:
                raise ValueError(f"{path}: its baseline was refitted on other runs than {found[0][1]} ({diff[0]})")
    if not rows:
        raise ValueError(f"no fit.json with a joint fit in {out_dir!r} or its case_*/ folders")
    return {"rows": rows, "request": request,
            "unfitted": [os.path.dirname(p) for n, p in found[1:] if not os.path.lexists(p)]}

def write_case_summary(summary, out_dir, overwrite=False):
    """(Re)write OUT/report.md's case section, cases.png and cases_loops.png as one set; the paths, report.md first."""
    plt, rows, files = _pyplot(), summary["rows"], {}
    color = {row["name"]: "k" if row["name"] == "baseline" else f"C{i}" for i, row in enumerate(rows)}  # both figures
    fig, ax = plt.subplots(figsize=(1.2 * len(rows) + 2.5, 3.6))
    for i, row in enumerate(rows):
        lo, hi = (row["phi"] - row["phi_lo"], row["phi_hi"] - row["phi"]) if row["phi_lo"] is not None else (0, 0)
        ax.errorbar(i, row["phi"], yerr=[[max(lo, 0)], [max(hi, 0)]], fmt="o", capsize=4, color=color[row["name"]])
    for v in (0, 1):                                 # the paper's two reference values of phi
        ax.axhline(v, color="grey", ls=":", lw=0.8)
    ax.set_xticks(range(len(rows)), [r["name"] for r in rows])
    ax.set(ylabel="φ (95% block-bootstrap CI)", title="recurrence exponent per case (§5)")
    files["cases.png"] = _png(fig)
    if lines := [(e, color[row["name"]], row["name"]) for row in rows for e in row["sweep"]]:
        files["cases_loops.png"] = _sweep_figure(plt, lines)
    L = [CASES_MARK, "", "## Case studies (§5, Table 3; runs/mini.sh --case NAME)", "",
         "Δφ = φ(case) − baseline φ, the baseline refitted on the case's budgets inside the case's fit (from runs of "
         "the baseline study above: checked); its CI is a paired block bootstrap over the (budget, r) cells. Gap: "
         "L*(r=8) − L*(r=1) of the compute-optimal frontier at the top budget (nats). Extrapolation: mean over the "
         "swept models of L(largest r') − L(trained r), nats (negative: more test-time loops help).", ""]
    L += _table(("case", "φ [95% CI]", "baseline φ", "Δφ [95% CI]", "R²", "n", "r=8 gap", "extrapolation", "flags"), [
        [row["name"], f"{row['phi']:.3f}{_ci(row, 'phi', '.2f')}", *_cells(row, "baseline_phi:.3f"),
         f"{_fmt(row['delta_phi'], '+.3f')}{_ci(row, 'delta_phi', '+.2f')}",
         *_cells(row, "r2:.4f n: gap8:+.3f extrapolation_gain:+.3f"), ", ".join(n for n, _ in row["flags"]) or "-"]
        for row in rows])
    # the table names the flags; here, which fits each one concerns
    flagged = [f"- {row['name']}: " + " | ".join(f"{name}: {items}" for name, items in row["flags"])
               for row in rows if row["flags"]]
    L += ["", "Flags, and the fits they concern:", *flagged] if flagged else []
    L += ["", "Figures: cases.png (φ and its CI per case), cases_loops.png (val loss vs test-time r' per case)."]
    # OUT is the baseline fit's folder: --cases claims it as that fit's own request (OUT/fit.json records it, OUT's
    # marker names it), so the table needs no --overwrite and a copied study stays usable
    with claimed(out_dir, "fit", summary["request"] or "cases", overwrite, "--cases",
                 ("report.md", "cases.png", "cases_loops.png")):
        report = pathlib.Path(out_dir, "report.md")     # the fit's own report, without the section written before
        head = report.read_text("utf-8", "replace").split(CASES_MARK)[0].rstrip("\n") + "\n\n" if report.is_file() \
            else ""
        files["report.md"] = (head + "\n".join(L) + "\n").encode()
        write_set(out_dir, files)
    return [os.path.join(out_dir, n) for n in sorted(files, key=lambda n: n != "report.md")]


# -----------------------------------------------------------------------------
# Chinchilla mode (--law chinchilla)

def run_chinchilla(runs, restarts=RESTARTS, seed=0):
    """Eq. 2 per group (the CSV's group column, or r for looped records); a single fit when there is one group."""
    t0 = time.perf_counter()
    # each group is fitted on its own, with the same seeded starts; no group column: the block is the one fit
    fits = _eq2_fits(runs, runs["group"], restarts, seed, "group {}")
    out = {"n_runs": int(len(runs["val_loss"])), "seed": seed, "restarts": restarts,
           "chinchilla": fits["all"] if list(fits) == ["all"] else fits, "seconds": time.perf_counter() - t0}
    out["flags"] = assess(out, runs)
    return out

def _eq2_fits(runs, labels, restarts, seed, name):
    """Eq. 2 on each group of runs (labels: the (n,) group of every run), in sorted group order: {str(group): fit
    block}. name.format(group) names the fit in its warnings and errors. Eq. 2 is fitted as Eq. 3 with phi fixed at
    0 -- N_eff = N_once + r^0 N_rec = N, one term -- and has no phi: the block says None."""
    out = {}
    for g in sorted(set(labels)):
        try:
            sub = subset(runs, np.array([x == g for x in labels]))
            out[str(g)] = dict(fit_block(sub, 0.0, restarts, seed, name=name.format(g)), phi=None)
        except ValueError as err:
            raise ValueError(f"{name.format(g)} fit: {err}") from None
    return out

def _chin_groups(res):
    """The chinchilla block as {group: fit}, whether it was grouped or a single fit."""
    return {"all": res["chinchilla"]} if "huber" in res["chinchilla"] else res["chinchilla"]


# -----------------------------------------------------------------------------
# Output files: checked before the fit, written as one set after it (issues 12 and 18, through common.py)

def runs_record(runs):
    """Which runs a fit used (issue 18 §1): n, folders (or CSV lines), keys (a digest of train.py's identity, the case
    and the numbers fitted; not the folder: a copy is the same runs) and the digest of the sorted keys."""
    keys = [common.request_key("run", [ident, case] + [float(runs[k][i]) for k in REQUIRED])
            for i, (ident, case) in enumerate(zip(runs["identity"], runs["case"]))]
    return {"n": len(keys), "digest": common.request_key("runs", sorted(keys)), "dirs": list(runs["dir"]), "keys": keys}

class Partial(ValueError):
    """A write_set that failed after its first rename: a refusal that cannot change nothing (see claimed)."""

@contextlib.contextmanager
def claimed(folder, tool, request, overwrite=False, flag="--out", names=()):
    """common.claim(folder) for the body of the with (fit.py's or design.py's folder, one writer at a time). A refusal
    in the body gives the folder back as it was (marker text, no folder we made); a Partial keeps it ours. names: the
    outputs the body writes, refused first where a link, folder or FIFO stands at one (never written through)."""
    mark, made = os.path.join(folder, f".nanoloop-{tool}"), not os.path.lexists(folder)
    # the marker's text, read before claim rewrites it (a FIFO or device is never opened: claim refuses it by name)
    old = pathlib.Path(mark).read_bytes()[:200] if os.path.isfile(mark) else None
    common.claim(folder, tool, request, overwrite, flag)
    try:
        for name in names:
            common.check_new(os.path.join(folder, name), True, flag)
        yield
    except BaseException as err:    # a refusal (or Ctrl-C) before any rename: the folder as it was. After a rename
        if not isinstance(err, Partial):        # (Partial) it stays ours, so the rerun needs no --overwrite
            with contextlib.suppress(OSError):
                if old is not None:
                    pathlib.Path(mark).write_bytes(old)     # the file we hold the lock on: rewritten in place
                else:
                    os.remove(mark)
                    if made:
                        os.rmdir(folder)
        raise
    finally:
        common.release(folder)                  # the next command (in this process too) claims it anew

def write_set(folder, files, remove=()):
    """Write {name: bytes} into folder as nested common.atomic_write calls: every temporary is fsync'd before the first
    rename, so a full disk changes nothing. Then the names in remove go (an earlier fit's) and the files are renamed
    in, the first name last (fit.json: a folder with a fit.json holds that fit's complete set)."""
    names, renaming = list(files), []          # renaming: from then on an error leaves a partial set, and says so
    def nest(i, tmp=None):
        if tmp is not None:                    # common.atomic_write hands us its fresh temporary; fill it, go deeper
            pathlib.Path(tmp).write_bytes(files[names[i - 1]])
        if i < len(names):
            return common.atomic_write(os.path.join(folder, names[i]), lambda t: nest(i + 1, t))
        renaming.append(True)                  # every temporary is on disk: clear the way, rename out
        for name in remove:
            pathlib.Path(folder, name).unlink(missing_ok=True)
    try:
        nest(0)
    except OSError as err:
        why = f"{folder}: cannot write ({err.strerror or err}); "
        raise (Partial(why + "the set is incomplete: rerun") if renaming else ValueError(why + "nothing was changed")) \
            from None

def write_new(path, data, overwrite=False, flag="--out"):
    """Write one output file (a CSV, a run list) atomically: a new path, one already holding exactly these bytes (the
    same request again: nothing to lose), or overwrite. Of two writers of a new path exactly one succeeds."""
    same = os.path.isfile(path) and pathlib.Path(path).read_bytes() == data
    common.check_new(path, overwrite or same, flag)       # a link, folder or FIFO in the way: refused even so
    try:
        common.atomic_write(path, data, replace=os.path.lexists(path))
    except OSError as err:                  # FileExistsError: another process created the path since the check
        raise ValueError(f"{flag} {path}: cannot write ({err.strerror})") from None


# -----------------------------------------------------------------------------
# The CLI: one parser (every flag checked as it is parsed), three modes (fit, --cases, --synthetic)

def parse_args(argv=None):
    # defaults are the paper's protocol (App. F: 500 restarts, 200 resamples); tests pass smaller numbers
    p = common.Parser(prog="fit.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("runs_dir", nargs="?", help="folder tree of done.json run records")
    p.add_argument("--csv", help="CSV of runs instead of a runs folder")
    p.add_argument("--law", choices=("joint", "chinchilla"), default="joint", help="joint law (Eq. 3) or Eq. 2 only")
    p.add_argument("--case", help="fit the runs with this case label (§5) and report delta-phi vs the baseline")
    p.add_argument("--loops", type=lambda text: [common.number(int, *LIMITS["n_loops"])(x) for x in text.split(",")],
                   help="keep only these n_loops, e.g. 1,4,8 (Table 3's refit without r=2)")
    p.add_argument("--out", help="output folder for fit.json, report.md and the figures")
    p.add_argument("--overwrite", action="store_true", help="write into another request's --out / --cases folder")
    # every number is checked as it is parsed (common.number), in the interval notation of LIMITS
    for flag, kind, interval, default, what in (
            ("seed", int, "[0, 9.2e18]", 0, "seed of the restarts and the bootstrap"),
            ("restarts", int, "[1, 100000]", RESTARTS, "uniform starts per fit (App. F: 500)"),
            ("bootstrap", int, "[0, 100000]", N_BOOT, "block-bootstrap resamples (App. F.2: 200)"),
            ("boot-restarts", int, "[0, 1000]", BOOT_RESTARTS, "random starts per resample besides the warm start"),
            ("phi", float, f"[{BOX_LO[5]}, {BOX_HI[5]}]", SYNTH_TRUTH["phi"], "--synthetic: true phi"),
            ("noise", float, "[0, 1]", 0.01, "--synthetic: Gaussian noise in nats")):
        p.add_argument("--" + flag, type=common.number(kind, interval), default=default, help=f"{what}; in {interval}")
    p.add_argument("--cases", metavar="DIR", help="summarise DIR/fit.json and DIR/case_*/fit.json into DIR/report.md")
    p.add_argument("--synthetic", metavar="OUT.csv", help="write the synthetic 116-run grid and exit")
    a = p.parse_args(argv)
    # mode rules argparse cannot express: one error line each, exit status 2 (common.Parser)
    if (a.synthetic or a.cases) and (a.runs_dir or a.csv or a.out or (a.synthetic and a.cases)):
        p.error("--synthetic and --cases take no RUNS_DIR, --csv, --out or each other")
    if not (a.synthetic or a.cases) and ((a.runs_dir is None) == (a.csv is None) or not a.out):
        p.error("give one input (RUNS_DIR or --csv FILE) and --out DIR")
    if a.case in BASELINE[1:]:
        p.error(f"--case {a.case!r} names the main grid (runs without a case label); leave --case out")
    # the bootstrap screens every start of every resample at once: bound its memory (paper: 200 x 5)
    if a.bootstrap * (1 + a.boot_restarts) > 10 ** 6:
        p.error("--bootstrap x (1 + --boot-restarts) must be at most 1e6 starts")
    return a

def fit_outputs(args):
    """The fit the CLI asks for, written into --out as one set at the end (a problem before: --out unchanged)."""
    # what this invocation asks for: the same request may rewrite its own outputs without --overwrite
    request = {"input": os.path.abspath(args.csv or args.runs_dir), "csv": bool(args.csv), "law": args.law,
               **{k: getattr(args, k) for k in ("case", "loops", "seed", "restarts", "bootstrap", "boot_restarts")}}
    _pyplot()                  # the figures need matplotlib: an ImportError now (one line, main), not after the fit
    with claimed(args.out, "fit", request, args.overwrite, names=OUTPUTS), warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always", UserWarning)     # the fitter's own warnings become flags (below)
        runs = runs_from_rows(load_csv(args.csv) if args.csv else load_records(args.runs_dir), args.law)
        sel = select_runs(runs, args.case, args.loops)     # what the fit (and the figures) use: a case's variant
        proto = (args.restarts, args.bootstrap, args.seed, args.boot_restarts)
        res = run_chinchilla(sel, args.restarts, args.seed) if args.law == "chinchilla" else \
            run_case(runs, args.case, args.loops, *proto) if args.case else run_protocol(sel, *proto)
        # flags that only the CLI can see: run folders without a record, and the fitter's own warnings
        if unfinished := [] if args.csv else unfinished_runs(args.runs_dir):
            _add_flag(res["flags"], "unfinished_runs", f"{len(unfinished)} under {args.runs_dir} "
                      f"({', '.join(unfinished[:5])}{', ...' if len(unfinished) > 5 else ''})")
        for w in [w for w in seen if issubclass(w.category, UserWarning)]:
            # a FitWarning names its flag and item; any other warning (numpy, scipy) is a fit_warning with its text
            _add_flag(res["flags"], *getattr(w.message, "flag", ("fit_warning", str(w.message))))
        res.update(input=args.csv or args.runs_dir, request=request, request_key=common.request_key("fit", request),
                   runs=runs_record(sel))
        try:
            files = make_figures(res, sel)
        except Exception as err:         # a plotting bug must not cost the fit a traceback or a half-written folder
            raise ValueError(f"drawing the figures failed ({type(err).__name__}: {err}); nothing was written") from None
        files["report.md"] = report_text(res).encode()
        # fit.json lists its set: a partial folder shows, and the next fit removes only those it does not rewrite
        res["outputs"] = sorted(files) + ["fit.json"]
        old = []
        with contextlib.suppress(ValueError, TypeError):     # no fit.json there, or not ours: nothing to remove
            old = [n for n in OUTPUTS if n in read_json(os.path.join(args.out, "fit.json")).get("outputs")]
        files = {"fit.json": json.dumps(_jsonable(res), indent=1).encode(), **files}      # fit.json first: renamed last
        write_set(args.out, files, remove=["fit.json"] + [n for n in old if n not in files])
    # printed: the Eq. 2 fits, restricted fits, case, flags, and last (where a user looks) the phi and delta-phi lines
    chin, c = "chinchilla" in res, res.get("case")
    L = [f"{name}: " + " ".join(f"{k}={v}" for k, v in zip(("A", "alpha", "B", "beta", "E", "R2"), _cells(
        b, "A:sig2 alpha:.3f B:sig2 beta:.3f E:.2f r2:.4f"))) for name, b in _eq2_blocks(res).items()]
    L += [f"{k}: R2={res[k]['r2']:.4f} (free phi: {res['joint']['r2']:.4f})" for k in ("phi0", "phi1") if not chin]
    L += [f"case {c['name']}: phi {c['variant']['phi']:.3f} vs baseline phi {c['baseline']['phi']:.3f} refitted on "
          f"{_budgets_said(c)}; delta phi = {c['delta_phi']:+.3f}"] if c else []
    L += [f"WARNING [{f['name']}]: {f['message']}" for f in res["flags"]] + [
        f"wrote {args.out}/fit.json, report.md and figures"]
    if not chin:
        # the one line a user reads: point estimate and 95% block-bootstrap CI (Table 2 style), and its flags
        ci = _ci(res.get("bootstrap") or {}, "phi", ".2f") or " (no bootstrap CI)"
        L.append(f"phi = {res['joint']['phi']:.2f}{ci}{_flag_names(res)}")
    # the case study's one line (runs/mini.sh --case greps it)
    L += [f"delta_phi({c['name']}) = {c['delta_phi']:+.3f}{_ci(c, 'delta_phi', '+.3f')}{_flag_names(res)}"] if c else []
    return res, L

def main(argv=None):
    args = parse_args(argv)
    # three modes; every user error in any of them is one line and exit status 2 (common.fail), before any work
    try:
        if args.synthetic:              # the grid as a CSV that --csv reads back
            res, rows, buf = None, synthetic_rows(args.phi, args.noise, args.seed), io.StringIO(newline="")
            csv.writer(buf).writerows([SYNTH_COLUMNS] + [[repr(row[k]) if isinstance(row[k], float) else row[k]
                                                           for k in SYNTH_COLUMNS] for row in rows])
            write_new(args.synthetic, buf.getvalue().encode(), args.overwrite, "--synthetic")
            lines = [f"wrote {len(rows)} synthetic runs (phi={args.phi}, noise={args.noise}, seed={args.seed}) to "
                     f"{args.synthetic}"]
        elif args.cases:
            res = case_summary(args.cases)
            paths = write_case_summary(res, args.cases, args.overwrite)
            lines = [f"{name}: no fit.json (not fitted yet), not in the table" for name in res["unfitted"]] + [
                f"{row['name']:>10}: phi {row['phi']:.3f}" + ("" if row["delta_phi"] is None else
                f" | delta_phi {row['delta_phi']:+.3f} vs baseline phi {row['baseline_phi']:.3f} refitted in the "
                "case's fit") for row in res["rows"]] + [f"wrote {', '.join(paths)}"]
        else:
            res, lines = fit_outputs(args)
    except (ValueError, ImportError) as err:       # ImportError: no matplotlib (pip install -r requirements.txt)
        common.fail("fit.py", err)
    print("\n".join(lines))
    return res


if __name__ == "__main__":
    main()
