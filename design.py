"""
design.py -- phi for less: choose the runs that pin the recurrence exponent phi (or a case study's delta-phi) for the
fewest training FLOPs, and check that claim by simulation with fit.py's own protocol. numpy + scipy + fit + flops.

How (issue 20): the CI of phi comes from the Huber-on-log fit (Eq. 4). Linearised at a prior law theta, that fit is an
M-estimator, so Var(phi_hat) ~ [B^-1 M B^-1]_phi,phi with B = sum_i b_i J_i J_i', M = sum_i m_i J_i J_i', where J_i =
d ln L_hat_i / d theta (Eq. 3 through fit.predict) and b_i, m_i are the Huber slope and squared-score expectations
under N(0, sigma^2) noise in nats. That costs microseconds per candidate set, so a greedy + exchange search can pick,
run by run, the largest drop in Var(phi) per FLOP (flops.py's exact costs) under a budget or until a target
half-width. The claim is then judged by the real protocol: fit.fit_block (the App. F restarts) and the block
bootstrap (App. F.2) on noisy replicates drawn from the prior law.
Run:
    python design.py plan --budget-gpu-hours 50 --out design.txt           # the 116-run grid as pool, paper's law
    python design.py plan --scales 4,6,8,10,12,14,16,18,20,22,24,28,34 --target-halfwidth 0.045 --out d.txt
    python design.py plan --delta-phi 0.19 --budget-flops 6.8e19 --out case.txt    # a case study's looped runs
    python design.py plan --runs out/grid --next 8 --out next.txt          # sequential: the next 8 runs
    python design.py simulate --out out/design_sim                          # sim.json, sim.md, sim.png
    NPROC=8 bash runs/grid.sh --only design.txt                             # train a design (case_*.sh too)
Test: python -m pytest -q tests/test_design.py
Assumes: the prior law is roughly right (the design is optimal for it) and run noise is independent per run.
Not here: the fits themselves (fit.py), the accounting (flops.py), training (runs/*.sh, train.py).
"""
import os

# One BLAS thread, as in fit.py (tiny matrices; threads only add start-up cost). Before numpy is imported.
for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_var] = "1"

import argparse
import json
import math
import sys

import numpy as np
from scipy.special import erf

import fit
import flops

# Prior law: alpha, beta, E, phi of the paper's joint fit (Table 2: 0.199, 0.369, 1.57, 0.459). Table 2 omits A and B,
# so they are fit.py's synthetic truth (SYNTH_TRUTH: chosen to give Fig. 2's losses). Noise: the joint fit's pooled
# residual RMSE, 0.010 nats (App. F.1).
PAPER_LAW = {"A": 25.0, "B": 1000.0, "E": 1.57, "alpha": 0.199, "beta": 0.369, "phi": 0.459}
PAPER_RMSE = 0.010
TPP = (2.25, 190.0)    # tokens per parameter of Table 6's runs (2.28 ... 187): a widened pool stays inside it
RIDGE = 1e-9           # weak prior on theta, relative to the pool's information: an unidentified set has a huge Var
Z95 = 1.959964         # two-sided 95% normal quantile: half-width = Z95 * sd
MFU, PEAK = 0.4, 989e12    # flops.py grid's planning convention: 40% of an H100's dense bf16 peak


def gpu_hours(total_flops, mfu=MFU, peak=PEAK):
    """flops.py's GPU-hour convention (python flops.py grid --mfu): executed FLOPs / (MFU x peak) / 3600."""
    return total_flops / (mfu * peak) / 3600


def run_name(budget, r, s):
    """The sweep scripts' run folder name, e.g. C4.64e17_r2_s8 (runs/grid.sh, runs/case_*.sh, runs/mini.sh)."""
    return f"C{budget:g}_r{r}_s{s}".replace("e+", "e")


# -----------------------------------------------------------------------------
# The candidate pool and the prior law

def make_pool(cells=None, loops=flops.LOOPS, arch=None, aspect=flops.ASPECT_RATIO, batch=flops.BATCH_TOKENS,
              tpp=TPP):
    """Candidate runs {C: widths} x loops (default: Table 6, the 116-run grid), each costed by flops.py exactly as
    train.py will run it (steps = round(C / (F B))); runs outside tokens-per-parameter tpp are left out (the law is
    not trusted far along an iso-FLOP curve) and so are widths that cannot take one step at C."""
    arch = arch or {}
    pkw = {k: v for k, v in arch.items() if k in fit.ARCH_KEYS}
    rows = []
    for budget, widths in (flops.GRID if cells is None else cells).items():
        for r in loops:
            for s in widths:
                d = aspect * s
                n_once, n_rec = flops.param_split(d, r, **pkw)
                f = flops.flops_per_token(d, r, **arch)
                try:
                    _, tokens = flops.tokens_for_budget(budget, f, batch)
                except ValueError:                       # below one optimizer step at this budget
                    continue
                if tpp[0] <= tokens / (n_once + n_rec) <= tpp[1]:
                    rows.append(dict(name=run_name(budget, r, s), flops_budget=budget, n_loops=r, scale=s, d_model=d,
                                     n_once=n_once, n_rec=n_rec, tokens=tokens, cost=float(tokens * f), arch=arch,
                                     aspect_ratio=aspect, val_loss=1.0, source=run_name(budget, r, s)))
    if not rows:
        raise ValueError("the candidate pool is empty (check --budgets, --scales and --tpp)")
    return rows


def law_theta(law):
    """theta = (ln A, ln B, ln E, alpha, beta, phi), fit.py's parameter order (fit.PARAM_NAMES)."""
    return np.array([math.log(law["A"]), math.log(law["B"]), math.log(law["E"]), law["alpha"], law["beta"],
                     law["phi"]])


def load_prior(path):
    """(theta, rmse) of a fit.py fit.json's joint fit, or the paper's law when path is None."""
    if path is None:
        return law_theta(PAPER_LAW), PAPER_RMSE
    joint = fit._read_json_object(path).get("joint")
    th = joint.get("theta") if isinstance(joint, dict) else None
    ok = isinstance(th, list) and len(th) == 6 and all(isinstance(v, (int, float)) and math.isfinite(v) for v in th)
    rmse = joint.get("rmse") if ok else None
    if not (ok and isinstance(rmse, (int, float)) and 0 < rmse < 10):
        raise ValueError(f"{path}: no joint fit with a 6-number theta and an rmse in it (is it a fit.py fit.json?)")
    return np.array(th, dtype=float), float(rmse)


# -----------------------------------------------------------------------------
# The linearised fit: the information each run carries about phi

def linearise(runs, theta, sigma):
    """Per run: J = d ln L_hat / d theta (n, 6) by central differences of fit.predict (Eq. 3 lives there), the
    prior's loss, and the Huber weights b = E[psi'] and m = E[psi^2] of the log residual u ~ N(0, (sigma/L)^2)
    (Eq. 4, delta = fit.DELTA): psi = clip(u, -delta, delta), so b = P(|u| < delta) and m = E[min(u^2, delta^2)]."""
    prob = fit._pack(runs)
    lnl = lambda th: np.log(fit.predict(th, prob))
    J = np.stack([(lnl(theta + 1e-6 * e) - lnl(theta - 1e-6 * e)) / 2e-6 for e in np.eye(6)], axis=1)
    loss = fit.predict(theta, prob)
    tau = sigma / loss                                     # (n,) noise sd on the log scale the objective sees
    c = fit.DELTA / tau
    b = erf(c / math.sqrt(2))
    m = tau ** 2 * (b - 2 * c * np.exp(-c * c / 2) / math.sqrt(2 * math.pi)) + fit.DELTA ** 2 * (1 - b)
    return J, loss, b, m


def universe(groups):
    """One table of runs for the search. groups: [(runs, theta, sigma, kind)], kind "cand" (may be chosen), "fixed"
    (finished runs, or a case study's baseline grid: always in, free) or "variant" (a case study's candidates)."""
    parts = [(runs, kind) + linearise(runs, th, sig) for runs, th, sig, kind in groups if len(runs["val_loss"])]
    runs = {k: (np.concatenate([p[0][k] for p in parts]) if isinstance(parts[0][0][k], np.ndarray)
                else sum((list(p[0][k]) for p in parts), [])) for k in parts[0][0]}
    kind = np.concatenate([[p[1]] * len(p[0]["val_loss"]) for p in parts])
    U = {"runs": runs, "J": np.concatenate([p[2] for p in parts]), "loss": np.concatenate([p[3] for p in parts]),
         "b": np.concatenate([p[4] for p in parts]), "m": np.concatenate([p[5] for p in parts]),
         "fixed": kind == "fixed", "variant": kind == "variant", "cand": kind != "fixed",
         "C": runs["flops_budget"], "r": runs["n_loops"], "cost": np.where(kind == "fixed", 0.0, runs["cost"])}
    U["JJ"] = (U["J"][:, :, None] * U["J"][:, None, :]).reshape(-1, 36)       # (n, 36) outer products J J'
    U["lam"] = RIDGE * float(np.trace((U["b"] @ U["JJ"]).reshape(6, 6)))
    U["kappa"] = float(np.median(U["m"] / U["b"]))          # the ridge's pseudo-observation gets a typical m / b
    U["own"] = U["variant"] if U["variant"].any() else np.ones(len(kind), bool)   # the runs min_per_r counts
    return U


def variance(U, masks):
    """Predicted Var(phi_hat) of each selection (rows of masks, (k, n) bool), or Var(delta-phi_hat) when U holds a
    case's variant runs. The influence of run i on a fit's phi is g_i psi_i with g = (B^-1 e_phi)' J_i, so the
    sandwich variance is sum_i m_i g_i^2; for delta-phi the variant fit (its runs + the baseline's r = 1 runs at its
    budgets, as fit.run_case selects) and the baseline refit on those budgets share their r = 1 runs, whose
    influences subtract (the paired comparison of fit.paired_delta_bootstrap)."""
    masks = np.atleast_2d(masks)
    fits = [masks]
    if U["variant"].any():
        at = np.stack([np.isin(U["C"], U["C"][row & U["variant"]]) for row in masks])
        base = masks & ~U["variant"] & at
        fits = [(masks & U["variant"]) | (base & (U["r"] == 1)), base]
    g_sum, ridge = 0.0, 0.0
    for sign, sel in zip((1.0, -1.0), fits):
        B = ((sel * U["b"]) @ U["JJ"]).reshape(-1, 6, 6) + U["lam"] * np.eye(6)
        w = np.linalg.solve(B, np.broadcast_to(np.eye(6)[5], (len(sel), 6))[..., None])[..., 0]   # (k, 6) B^-1 e_phi
        g_sum = g_sum + sign * (w @ U["J"].T) * sel                                               # (k, n)
        ridge = ridge + (w ** 2).sum(1)
    return (g_sum ** 2 * U["m"]).sum(1) + U["lam"] * U["kappa"] * ridge


def choose(U, budget=math.inf, k=None, min_per_r=5):
    """The selection mask (fixed runs included): min_per_r cheapest runs of every r first (fit.py fits each r alone
    with Eq. 2's 5 parameters), then greedy additions of the largest drop in ln Var per FLOP that fit the budget
    (at most k new runs), then -- without k -- the best single swap within the budget, repeated until nothing helps."""
    S = U["fixed"].copy()
    for r in np.unique(U["r"][U["cand"]]):
        free = np.flatnonzero(U["cand"] & ~S & (U["r"] == r))
        need = min_per_r - int((S & U["own"] & (U["r"] == r)).sum())
        if need > 0:
            S[free[np.argsort(U["cost"][free], kind="stable")[:need]]] = True
    if U["cost"][S].sum() > budget * (1 + 1e-9):
        raise ValueError(f"the budget ({budget:.3g} FLOPs) cannot pay for {min_per_r} runs of every r "
                         f"({U['cost'][S].sum():.3g} FLOPs at the cheapest); raise it or lower --min-per-r")
    for _ in range(1000):
        changed = False
        while k is None or int((S & ~U["fixed"]).sum()) < k:
            cand = np.flatnonzero(U["cand"] & ~S & (U["cost"] <= budget - U["cost"][S].sum()))
            if not cand.size:
                break
            trial = np.repeat(S[None], cand.size, 0)
            trial[np.arange(cand.size), cand] = True
            gain = (math.log(variance(U, S)[0]) - np.log(variance(U, trial))) / np.maximum(U["cost"][cand], 1.0)
            if gain.max() <= 0:
                break
            S[cand[gain.argmax()]] = True
            changed = True
        if k is None:
            # exchange: every (drop i, add j) pair at once; a run of an r at its minimum is swapped within its r only
            pairs = [(i, j) for i in np.flatnonzero(S & U["cand"]) for j in np.flatnonzero(U["cand"] & ~S)
                     if U["cost"][j] - U["cost"][i] <= budget - U["cost"][S].sum() and (U["r"][i] == U["r"][j] or
                     int((S & U["own"] & (U["r"] == U["r"][i])).sum()) > min_per_r or not U["own"][i])]
            if pairs:
                trial = np.repeat(S[None], len(pairs), 0)
                ii, jj = np.array(pairs).T
                trial[np.arange(len(pairs)), ii] = False
                trial[np.arange(len(pairs)), jj] = True
                v = variance(U, trial)
                if v.min() < variance(U, S)[0] * (1 - 1e-9):
                    S = trial[v.argmin()].copy()
                    changed = True
        if not changed:
            return S
    return S


def cheapest_for(U, target_var, min_per_r=5):
    """The design that reaches Var <= target_var for the least budget: bisection on the budget of choose() (the
    greedy variance falls as the budget grows). ValueError when the whole pool cannot reach it."""
    full = choose(U, min_per_r=min_per_r)
    if variance(U, full)[0] > target_var:
        raise ValueError(f"even the whole pool predicts a half-width of {Z95 * math.sqrt(variance(U, full)[0]):.4f};"
                         f" widen the pool (--budgets, --scales) or relax the target")
    lo, hi, best = 0.0, float(U["cost"][full].sum()), full
    for _ in range(14):                                  # 2^-14 of the pool's cost: a fraction of one run
        mid = 0.5 * (lo + hi)
        try:
            S = choose(U, mid, min_per_r=min_per_r)
        except ValueError:                               # below the min_per_r floor
            lo = mid
            continue
        if variance(U, S)[0] <= target_var:
            hi, best = mid, S
        else:
            lo = mid
    return best


# -----------------------------------------------------------------------------
# Plan: build the universe from the flags, choose, write the run list

def pool_runs(rows, case=None):
    """fit.runs_from_rows on pool rows (every record check applies), with their names and costs attached."""
    runs = fit.runs_from_rows([dict(row, case=case) for row in rows])
    runs["name"], runs["cost"] = [row["name"] for row in rows], np.array([row["cost"] for row in rows])
    return runs


def finished_runs(runs_dir):
    """The baseline runs (no case label) that have a done.json under runs_dir: named by folder, costed by their
    record's executed FLOPs (train.py's "flops") or, without it, their budget C."""
    recs = fit.load_records(runs_dir)
    runs = fit.select_runs(fit.runs_from_rows(recs), None)
    by_src = {rec["source"]: rec for rec in recs}
    runs["name"] = [os.path.basename(os.path.dirname(src)) for src in runs["source"]]
    runs["cost"] = np.array([float(by_src[src].get("flops") or c) for src, c in zip(runs["source"],
                                                                                    runs["flops_budget"])])
    return runs


def _key(runs):
    """(C, r, N, D) per run: a finished run and a pool run with the same key are the same configuration."""
    return list(zip(runs["flops_budget"], runs["n_loops"], runs["n_once"] + runs["n_rec"], runs["tokens"]))


def read_list(path):
    """Run names of a list file (first word per line; blank lines and # comments skipped)."""
    try:
        with open(path, encoding="utf-8") as fh:
            names = [ln.split()[0] for ln in fh if ln.strip() and not ln.lstrip().startswith("#")]
    except (OSError, UnicodeDecodeError) as err:
        raise ValueError(f"{path}: cannot read a run list ({err})") from None
    if not names:
        raise ValueError(f"{path}: lists no runs")
    return names


def build(a):
    """(universe, sigma, prior text) for the plan flags: the pool (or a case's variant pool beside its baseline
    grid), the finished runs of --runs, and the noise (--noise, else the prior's RMSE, raised for --noise-phi)."""
    arch = {"n_layers_eff": a.n_layers_eff, "n_layers_prelude": a.n_layers_prelude, "n_layers_coda": a.n_layers_coda,
            "seq_len": a.seq_len, "vocab_size": a.vocab_size}
    budgets = a.budgets or list(flops.GRID)
    if a.scales is None and any(c not in flops.GRID for c in budgets):
        raise ValueError("--budgets outside Table 6 need --scales (the widths to sweep at them)")
    cells = {c: (a.scales or flops.GRID[c]) for c in budgets}
    pool = make_pool(cells, a.loops, arch, a.aspect_ratio, a.batch_tokens, a.tpp)
    theta, rmse = load_prior(a.prior)
    sigma = a.noise or rmse
    if a.delta_phi is not None:           # §5: the variant's looped runs; the baseline grid (Table 6) is done already
        base = pool_runs(make_pool(None, a.loops, arch, a.aspect_ratio, a.batch_tokens, (0, math.inf)))
        var = pool_runs([row for row in pool if row["n_loops"] > 1], case="design")
        groups = [(base, theta, sigma, "fixed"), (var, theta + np.eye(6)[5] * a.delta_phi, sigma, "variant")]
    else:
        done = finished_runs(a.runs) if a.runs else None
        keys = set(_key(done)) if done else set()
        cand = pool_runs(pool)
        cand = fit.subset(cand, np.array([k not in keys for k in _key(cand)]))
        groups = ([(done, theta, sigma, "fixed")] if done else []) + [(cand, theta, sigma, "cand")]
    U = universe(groups)
    if a.noise_phi:                     # run-to-run noise (data order, seeds) the prior's residuals understate
        ref = (np.isin(U["runs"]["name"], read_list(a.reference)) if a.reference else np.ones(len(U["r"]), bool))
        for _ in range(4):              # sd(phi) ~ sigma; the Huber weights make it slightly nonlinear
            sd = math.sqrt(variance(U, ref)[0])
            if sd >= a.noise_phi * 0.999:
                break
            sigma *= a.noise_phi / sd
            U = universe([(runs, th, sigma, kind) for runs, th, _, kind in groups])
    return U, sigma, theta


def plan(a):
    """The design for the flags: chosen mask, predicted half-width and the lines of its run list."""
    U, sigma, theta = build(a)
    budget = a.budget_flops or (a.budget_gpu_hours and a.budget_gpu_hours * 3600 * a.mfu * a.peak_flops)
    if a.reference and not (budget or a.target_halfwidth or a.next):    # same total FLOPs as the reference design
        ref = np.isin(U["runs"]["name"], read_list(a.reference))
        budget = float(U["runs"]["cost"][ref].sum() - U["runs"]["cost"][U["fixed"]].sum())
    if a.target_halfwidth:
        S = cheapest_for(U, (a.target_halfwidth / Z95) ** 2, a.min_per_r)
    else:
        S = choose(U, budget or math.inf, a.next, a.min_per_r)
    new = np.flatnonzero(S & ~U["fixed"])
    cost = float(U["cost"][new].sum())
    hw = Z95 * math.sqrt(variance(U, S)[0])
    what = "delta-phi" if a.delta_phi is not None else "phi"
    head = (f"# design.py plan: {len(new)} runs to train ({int(U['fixed'].sum())} finished), {cost:.4g} FLOPs = "
            f"{gpu_hours(cost, a.mfu, a.peak_flops):.1f} GPU-hours at MFU {a.mfu:g} x {a.peak_flops:.3g} FLOP/s; "
            f"predicted 95% CI half-width of {what}: {hw:.4f} (noise {sigma:.4g} nats, prior "
            f"{a.prior or 'paper Table 2'}: phi {theta[5]:.3f})")
    runs = U["runs"]
    lines = [f"{runs['name'][i]:<18} # C={runs['flops_budget'][i]:g} r={runs['n_loops'][i]} "
             f"N={runs['n_once'][i] + runs['n_rec'][i]:.0f} D={runs['tokens'][i]:.0f} FLOPs={U['cost'][i]:.4g}"
             for i in new]
    return head, lines, {"n_runs": len(new), "flops": cost, "halfwidth": hw, "sigma": sigma,
                         "names": [runs["name"][i] for i in new]}


def write_owned(path, text, request, overwrite):
    """Write text to path atomically, line 2 carrying the request; refuse a file holding anything else (not written
    by design.py for this same request) unless overwrite."""
    tag = "# request: " + json.dumps(request, sort_keys=True)
    if os.path.isdir(path):
        raise ValueError(f"--out {path!r} is a folder, not a file name")
    if os.path.lexists(path) and not overwrite:
        with open(path, encoding="utf-8", errors="replace") as fh:
            if fh.read().split("\n")[1:2] != [tag]:
                raise ValueError(f"--out {path!r} exists and was not written by design.py for this request; pass "
                                 f"--overwrite to replace it")
    head, _, rest = text.partition("\n")
    fit._atomic_write(path, f"{head}\n{tag}\n{rest}".encode())


# -----------------------------------------------------------------------------
# Simulate: the claim judged by fit.py's protocol on noisy replicates of the prior law

def measure(runs, mask, kw, seed):
    """fit.py's protocol on the selected runs: (estimate, lo, hi) of phi -- fit_block's restarts, then
    bootstrap_phi -- or, when they hold a case, of delta-phi (run_case's selection, paired bootstrap)."""
    sel = fit.subset(runs, mask)
    try:
        if not any(c == "design" for c in sel["case"]):
            j = fit.fit_block(sel, None, kw["restarts"], seed)
            b = fit.bootstrap_phi(sel, j["theta"], kw["n_boot"], seed, kw["boot_restarts"], progress=False)
            return j["phi"], b["phi_lo"], b["phi_hi"]
        var, base = fit.select_runs(sel, "design"), fit.select_runs(sel, None)
        base = fit.subset(base, np.isin(base["flops_budget"], var["flops_budget"]))
        vj, bj = (fit.fit_block(x, None, kw["restarts"], seed) for x in (var, base))
        d = fit.paired_delta_bootstrap(var, base, {"joint": vj}, bj, kw["n_boot"], seed, kw["boot_restarts"], False)
        return vj["phi"] - bj["phi"], d["delta_phi_lo"], d["delta_phi_hi"]
    except ValueError:                      # a set the fit refuses (too few runs, one r): no estimate, no CI
        return math.nan, -math.inf, math.inf


def replicate(U, pick, truth, sigma, kw, name):
    """kw["reps"] replicates of a design: pick(rng) -> mask (a fixed design ignores rng). Each replicate draws
    N(0, sigma^2) nats on the prior's losses, with its own seed for the noise, the random design and the fit."""
    rows = []
    for rep in range(kw["reps"]):
        rng = np.random.default_rng([kw["seed"], rep])
        runs = dict(U["runs"], val_loss=U["loss"] + sigma * rng.standard_normal(len(U["loss"])))
        mask = pick(rng)
        rows.append((*measure(runs, mask, kw, kw["seed"] + rep), float(U["runs"]["cost"][mask & ~U["fixed"]].sum())))
    est, lo, hi, cost = (np.array(x) for x in zip(*rows))
    out = {"design": name, "flops": float(np.median(cost)), "gpu_hours": gpu_hours(float(np.median(cost))),
           "median_abs_err": float(np.nanmedian(np.abs(est - truth))) if np.isfinite(est).any() else None,
           "median_halfwidth": float(np.median((hi - lo) / 2)), "coverage": float(np.mean((lo <= truth) & (truth <= hi))),
           "excludes_0": float(np.mean((lo > 0) | (hi < 0))), "failed": int(np.isnan(est).sum()), "reps": kw["reps"]}
    print(f"  {name:<34} {out['gpu_hours']:8.1f} GPU-h  half-width {out['median_halfwidth']:.4f}  coverage "
          f"{out['coverage']:.2f}  |err| {out['median_abs_err'] or math.nan:.4f}", file=sys.stderr, flush=True)
    return out


def capped(U, order, budget):
    """The runs of `order` taken in turn while they fit the budget (a run that does not fit is skipped)."""
    S, spent = U["fixed"].copy(), 0.0
    for i in order:
        if spent + U["cost"][i] <= budget:
            S[i], spent = True, spent + U["cost"][i]
    return S


def simulate(a):
    """The four designs at equal cost (designed from the grid and from a widened pool, random subsets, cheapest
    first, the lowest budgets only) per fraction of the grid's FLOPs; a delta-phi case; the sequential mode."""
    kw = dict(reps=a.reps, restarts=a.restarts, n_boot=a.bootstrap, boot_restarts=a.boot_restarts, seed=a.seed)
    theta, sigma = law_theta(PAPER_LAW), PAPER_RMSE
    grid = pool_runs(make_pool())
    wide = pool_runs(make_pool({c: a.scales for c in flops.GRID}))
    Ug, Uw = universe([(grid, theta, sigma, "cand")]), universe([(wide, theta, sigma, "cand")])
    total = float(grid["cost"].sum())
    full = replicate(Ug, lambda rng: Ug["cand"], theta[5], sigma, kw, "full grid (116 runs)")
    res = {"full": full, "designs": [], "case": [], "sequential": {}}
    for frac in a.fractions:
        cap = frac * total
        Sg, Sw = choose(Ug, cap), choose(Uw, cap)
        for name, U, pick in (("designed, wider pool", Uw, lambda rng: Sw), ("designed, grid pool", Ug, lambda rng: Sg),
                              ("random subsets", Ug, lambda rng: capped(Ug, rng.permutation(len(Ug["C"])), cap)),
                              ("cheapest first", Ug, lambda rng: capped(Ug, np.argsort(Ug["cost"]), cap)),
                              ("lowest budgets only", Ug, lambda rng: Ug["cand"] & (Ug["C"] <= max(
                                  [c for c in np.unique(Ug["C"]) if Ug["cost"][Ug["C"] <= c].sum() <= cap] or [0]))),
                              ):
            row = replicate(U, pick, theta[5], sigma, kw, f"{name} @ {frac:g}")
            row.update(fraction=frac, name=name, predicted=Z95 * math.sqrt(variance(U, pick(np.random.default_rng(0)))[0]))
            res["designs"].append(row)
    # §5 case: the baseline grid is done; the variant's looped runs shift phi by delta_phi (hc: +0.19, Table 3)
    var = pool_runs([row for row in make_pool({c: a.scales for c in flops.GRID}) if row["n_loops"] > 1], "design")
    Uc = universe([(grid, theta, sigma, "fixed"), (var, theta + np.eye(6)[5] * a.delta_phi, sigma, "variant")])
    paper = Uc["fixed"] | (Uc["variant"] & (Uc["C"] < 5e18) & np.isin(Uc["runs"]["name"], grid["name"]))
    case_cost = float(Uc["cost"][paper].sum())
    for name, S in (("paper's case study (60 runs, 4 lower budgets)", paper),
                    *((f"designed @ {f:g} of its cost", choose(Uc, f * case_cost)) for f in a.case_fractions)):
        row = replicate(Uc, lambda rng, S=S: S, a.delta_phi, sigma, kw, name)
        row.update(fraction=float(Uc["cost"][S].sum()) / case_cost, predicted=Z95 * math.sqrt(variance(Uc, S)[0]))
        res["case"].append(row)
    res["sequential"] = sequential(Ug, theta, sigma, kw, a)
    res["grid_flops"], res["case_flops"] = total, case_cost
    return res


def sequential(Ug, theta, sigma, kw, a):
    """Sequential mode from the 12 cheapest grid runs: a.rounds rounds of a.next new runs, designed (choose with k,
    given what is finished) or random; per replicate, the FLOPs at which the measured half-width first reaches
    a.seq_target. The designed rounds depend only on what is finished, so they are chosen once for all replicates."""
    steps = [capped(Ug, np.argsort(Ug["cost"])[:12], math.inf)]
    for _ in range(a.rounds):
        done = steps[-1]
        steps.append(choose(dict(Ug, fixed=done, cand=~done, cost=np.where(done, 0.0, Ug["cost"])), k=a.next))
    out = {"target": a.seq_target, "start_runs": 12, "k": a.next, "rounds": a.rounds}
    for name in ("designed", "random"):
        hws, costs, hits = [], [], []
        for rep in range(kw["reps"]):
            rng = np.random.default_rng([kw["seed"], rep, 1])
            runs = dict(Ug["runs"], val_loss=Ug["loss"] + sigma * rng.standard_normal(len(Ug["loss"])))
            S, hw, cost = steps[0].copy(), [], []
            for t in range(a.rounds + 1):
                if t and name == "designed":
                    S = steps[t]
                elif t:
                    S = S.copy()
                    S[rng.choice(np.flatnonzero(~S), a.next, replace=False)] = True
                _, lo, hi = measure(runs, S, kw, kw["seed"] + rep)
                hw.append((hi - lo) / 2)
                cost.append(float(Ug["cost"][S].sum()))
            hits.append(next((c for h, c in zip(hw, cost) if h <= a.seq_target), math.inf))
            hws.append(hw)
            costs.append(cost)
        out[name] = {"median_halfwidth": np.median(hws, 0).tolist(), "median_flops": np.median(costs, 0).tolist(),
                     "reached": float(np.mean(np.isfinite(hits))), "median_flops_to_target": float(np.median(hits))}
        print(f"  sequential {name}: half-width by round {np.round(np.median(hws, 0), 4).tolist()}, reached "
              f"{out[name]['reached']:.2f}, median FLOPs to target {np.median(hits):.3g}", file=sys.stderr)
    return out


def sim_outputs(res, request):
    """sim.json, sim.md (the tables) and sim.png (median CI half-width vs GPU-hours, one line per design)."""
    import io
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    f = lambda x, fmt: "-" if x is None or not math.isfinite(x) else format(x, fmt)
    head = "| design | FLOPs (share of grid) | GPU-hours | predicted half-width | median half-width | coverage | median abs error |"
    L = ["# design.py simulate", "", f"protocol: {json.dumps(request['protocol'])}", "", "## phi", "", head,
         "|---|---|---|---|---|---|---|"]
    for row in [res["full"]] + res["designs"]:
        L.append(f"| {row['design']} | {row['flops']:.3g} ({row['flops'] / res['grid_flops']:.3f}) | "
                 f"{row['gpu_hours']:.1f} | {f(row.get('predicted'), '.4f')} | {row['median_halfwidth']:.4f} | "
                 f"{row['coverage']:.2f} | {f(row['median_abs_err'], '.4f')} |")
    L += ["", f"## delta-phi = {request['delta_phi']:+g} (paper case cost {res['case_flops']:.3g} FLOPs)", "",
          "| design | share of case cost | GPU-hours | predicted half-width | median half-width | excludes 0 | coverage |",
          "|---|---|---|---|---|---|---|"]
    L += [f"| {row['design']} | {row['fraction']:.2f} | {row['gpu_hours']:.1f} | {row['predicted']:.4f} | "
          f"{row['median_halfwidth']:.4f} | {row['excludes_0']:.2f} | {row['coverage']:.2f} |" for row in res["case"]]
    sq = res["sequential"]
    L += ["", f"## sequential: 12 cheapest runs, then {sq['rounds']} rounds of K = {sq['k']}, target {sq['target']}",
          "", "| strategy | median half-width by round | reached | median FLOPs to target |", "|---|---|---|---|"]
    L += [f"| {k} | {', '.join(f'{h:.3f}' for h in sq[k]['median_halfwidth'])} | {sq[k]['reached']:.2f} | "
          f"{f(sq[k]['median_flops_to_target'], '.3g')} |" for k in ("designed", "random")]
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for name in dict.fromkeys(row["name"] for row in res["designs"]):
        rows = [row for row in res["designs"] if row["name"] == name]
        ax.plot([r["gpu_hours"] for r in rows], [r["median_halfwidth"] for r in rows], "o-", label=name)
    ax.plot(res["full"]["gpu_hours"], res["full"]["median_halfwidth"], "k*", ms=12, label="full grid")
    ax.axhline(1.2 * res["full"]["median_halfwidth"], color="grey", ls=":", lw=1, label="1.2 x full grid")
    ax.set(xscale="log", yscale="log", xlabel=f"GPU-hours (MFU {MFU:g}, {PEAK:.3g} FLOP/s)",
           ylabel="median 95% CI half-width of phi", title=f"{request['protocol']['reps']} replicates per design")
    ax.legend(fontsize=7)
    buf = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    return {"sim.md": ("\n".join(L) + "\n").encode(), "sim.png": buf.getvalue(),
            "sim.json": json.dumps(fit._jsonable(dict(res, request=request)), indent=1).encode()}


# -----------------------------------------------------------------------------
# CLI: one flag table per command

def _list(kind, lo):
    """argparse type: comma-separated numbers, each checked like flops.py's flags."""
    return lambda text: [flops._number(kind, lo, lo_open=kind is float)(t) for t in text.split(",")]


POS_F, POS_I = flops._number(float, 0, lo_open=True), flops._number(int, 1)
FLAGS = {
    "plan": [("--out", str, None, "write the run list (runs/grid.sh --only FILE) here"),
             ("--budgets", _list(float, 0), None, "pool budgets C (default: Table 6's six)"),
             ("--scales", _list(int, 1), None, "pool widths s at every budget (default: Table 6's per budget)"),
             ("--loops", _list(int, 1), list(flops.LOOPS), "pool n_loops"),
             ("--tpp", _list(float, 0), list(TPP), "LO,HI tokens per parameter kept in the pool"),
             ("--aspect-ratio", POS_I, flops.ASPECT_RATIO, "d = aspect x s"),
             ("--n-layers-eff", POS_I, 20, ""), ("--n-layers-prelude", flops._number(int, 0), 2, ""),
             ("--n-layers-coda", flops._number(int, 0), 2, ""), ("--seq-len", POS_I, flops.SEQ_LEN, ""),
             ("--vocab-size", POS_I, flops.V_LLAMA, ""), ("--batch-tokens", POS_I, flops.BATCH_TOKENS, ""),
             ("--prior", str, None, "a fit.py fit.json (default: the paper's joint fit, Table 2)"),
             ("--noise", POS_F, None, "per-run noise in nats (default: the prior's residual RMSE)"),
             ("--noise-phi", POS_F, None, "raise the noise until the --reference design has this sd of phi"),
             ("--reference", str, None, "a run list: --noise-phi's design, and (without a target) the total cost"),
             ("--target-halfwidth", POS_F, None, "the cheapest design with this predicted 95%% half-width"),
             ("--budget-flops", POS_F, None, "the best design within these training FLOPs"),
             ("--budget-gpu-hours", POS_F, None, "... within these GPU-hours at --mfu, --peak-flops"),
             ("--next", POS_I, None, "sequential: the next K runs after --runs"),
             ("--delta-phi", flops._number(float, -3, 3), None, "design a case study's looped runs for this shift"),
             ("--runs", str, None, "finished runs (a fit.py runs folder)"),
             ("--min-per-r", flops._number(int, 0), 5, "runs of every r at least (fit.py fits each r alone)"),
             ("--mfu", flops._number(float, 0, 1, lo_open=True), MFU, ""), ("--peak-flops", POS_F, PEAK, "")],
    "simulate": [("--out", str, "out/design_sim", "folder for sim.json, sim.md, sim.png"),
                 ("--reps", POS_I, 20, "noisy replicates per design"),
                 ("--restarts", POS_I, fit.RESTARTS, "fit_block restarts (App. F: 500)"),
                 ("--bootstrap", POS_I, fit.N_BOOT, "block-bootstrap resamples (App. F.2: 200)"),
                 ("--boot-restarts", flops._number(int, 0), fit.BOOT_RESTARTS, "random starts per resample"),
                 ("--fractions", _list(float, 0), [0.05, 0.1, 0.25, 0.5], "budgets as shares of the grid's FLOPs"),
                 ("--scales", _list(int, 1), list(range(4, 40, 2)), "the wider pool's widths (Table 6 budgets)"),
                 ("--delta-phi", flops._number(float, -3, 3), 0.19, "the case study's shift (hc, Table 3)"),
                 ("--case-fractions", _list(float, 0), [0.25, 0.5], "case designs as shares of the paper's cost"),
                 ("--next", POS_I, 8, "sequential: runs per round"), ("--rounds", POS_I, 5, "sequential rounds"),
                 ("--seq-target", POS_F, 0.06, "sequential: target half-width (the paper's CI: 0.06)"),
                 ("--seed", flops._number(int, 0), 0, "")],
}


def main(argv=None):
    ap = flops._Parser(prog="design.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    for cmd, table in FLAGS.items():
        p = sub.add_parser(cmd)
        for flag, kind, default, text in table:
            p.add_argument(flag, type=kind, default=default, help=text)
        p.add_argument("--overwrite", action="store_true", help="replace an output this request did not write")
    a = ap.parse_args(argv)
    request = {k: v for k, v in vars(a).items() if k not in ("out", "overwrite")}
    try:
        if a.cmd == "plan":
            if sum(x is not None for x in (a.target_halfwidth, a.budget_flops, a.budget_gpu_hours)) > 1:
                raise ValueError("give one of --target-halfwidth, --budget-flops, --budget-gpu-hours")
            if not (a.target_halfwidth or a.budget_flops or a.budget_gpu_hours or a.next or a.reference):
                raise ValueError("give a target: --target-halfwidth, --budget-flops, --budget-gpu-hours or --next")
            if a.delta_phi is not None and a.runs:
                raise ValueError("--delta-phi designs against the Table 6 baseline; it takes no --runs")
            if len(a.tpp) != 2:
                raise ValueError("--tpp takes LO,HI")
            if a.out and os.path.isdir(a.out):
                raise ValueError(f"--out {a.out!r} is a folder, not a file name")
            head, lines, _ = plan(a)
            print(head)
            print("\n".join(lines))
            if a.out:
                write_owned(a.out, "\n".join([head] + lines) + "\n", request, a.overwrite)
                print(f"wrote {a.out}: NPROC=8 bash runs/grid.sh --only {a.out}")
            return 0
        out = os.path.abspath(a.out)
        fit._check_target_dir(out, "--out")
        request["protocol"] = {k: request[k] for k in ("reps", "restarts", "bootstrap", "boot_restarts", "seed")}
        prev = os.path.join(out, "sim.json")
        if os.path.lexists(prev) and not a.overwrite and fit._read_json_object(prev).get("request") != \
                fit._jsonable(request):
            raise ValueError(f"--out {a.out!r} holds another simulation; pass --overwrite to replace it")
        import warnings
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")     # single-hit notes of tiny fits: the tables carry what matters
            files = sim_outputs(simulate(a), request)
    except ValueError as err:
        raise SystemExit(f"design.py: error: {err}") from None
    os.makedirs(out, exist_ok=True)
    for name in sorted(files, key=lambda n: n == "sim.json"):      # sim.json last: it marks a complete set
        fit._atomic_write(os.path.join(out, name), files[name])
    print(f"wrote {out}/sim.json, sim.md, sim.png")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
