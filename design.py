"""
design.py -- phi for less: choose the runs that pin the recurrence exponent phi (or a case study's delta-phi) for the
fewest training FLOPs, and check that claim by simulation with fit.py's own protocol. numpy + scipy + fit + flops.

How (issue 20): the CI of phi comes from the Huber-on-log fit (Eq. 4). Linearised at a prior law theta, that fit is an
M-estimator, so Var(phi_hat) ~ [B^-1 M B^-1]_phi,phi with B = sum_i b_i J_i J_i', M = sum_i m_i J_i J_i', where J_i =
d ln L_hat_i / d theta (Eq. 3, through fit.predict) and b_i, m_i are the Huber slope and squared-score expectations
under N(0, sigma^2) noise in nats. That costs microseconds per candidate set, so a greedy + exchange search picks, run
by run, the largest drop in Var(phi) per FLOP (flops.py's exact costs) under a budget or until a target half-width.
The claim is judged by the real protocol: fit.fit_block (the App. F restarts) and the block bootstrap (App. F.2), or
run_case's paired delta-phi bootstrap, on noisy replicates of the prior law.
Run:
    python design.py plan --budget-gpu-hours 50 --out design.txt      # pool: the 116-run grid; prior: Table 2
    python design.py plan --scales 4,6,8,10,12,14,16,18,20,24,28,34 --target-halfwidth 0.045   # a wider pool
    python design.py plan --delta-phi 0.19 --budget-flops 6.8e19 --out case.txt   # a case study's looped runs
    python design.py plan --runs out/grid --next 8 --out next.txt     # sequential: the next 8 runs
    python design.py simulate --out out/design_sim                     # the validation: sim.json, sim.md, sim.png
    NPROC=8 bash runs/grid.sh --only design.txt                        # train a design (runs/case_*.sh too)
Test: python -m pytest -q tests/test_design.py
Assumes: the prior law is roughly right (the design is optimal for it) and run noise is independent per run.
Not here: the fits (fit.py), the accounting (flops.py), training (train.py, runs/*.sh).
"""
import os

# One BLAS thread, as in fit.py (tiny matrices; threads only add start-up cost). Before numpy is imported.
os.environ.update(dict.fromkeys(("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"), "1"))

import argparse, itertools, json, math, pathlib, sys, warnings

import numpy as np
from scipy.special import erf

import common, fit, flops

# Prior law: alpha, beta, E, phi of the paper's joint fit (Table 2: 0.199, 0.369, 1.57, 0.459). Table 2 omits A and B;
# they are fit.py's synthetic truth (SYNTH_TRUTH, chosen to give Fig. 2's losses). Noise: the joint fit's pooled
# residual RMSE, 0.010 nats (App. F.1). theta is in fit.PARAM_NAMES' order: ln A, ln B, ln E, alpha, beta, phi.
PAPER_THETA, PAPER_RMSE = (math.log(25.0), math.log(1000.0), math.log(1.57), 0.199, 0.369, 0.459), 0.010
TPP = (2.25, 190.0)    # tokens per parameter of Table 6's runs (2.28 ... 187): a widened pool stays inside it
RIDGE = 1e-9           # weak prior on theta, relative to the pool's information: an unidentified set has a huge Var
Z95 = 1.959964         # two-sided 95% normal quantile: half-width = Z95 * sd
MFU, PEAK = 0.4, 989e12    # flops.py grid's planning convention: 40% of an H100's dense bf16 peak
MAX_POOL = 1000            # candidate runs a search weighs (simulate's wider pool: 576); the swaps grow as its square

def refuse(message, kind=ValueError):
    """Raise the ValueError that the CLI prints as one error line (common.fail), or an argparse type's error (kind);
    usable inside an expression."""
    raise kind(message)

def gpu_hours(total_flops, mfu=MFU, peak=PEAK):
    """flops.py's GPU-hour convention (python flops.py grid --mfu): executed FLOPs / (MFU x peak) / 3600."""
    return total_flops / (mfu * peak) / 3600


# -----------------------------------------------------------------------------
# The candidate pool, the prior law, the linearised fit

def make_pool(cells=None, loops=flops.LOOPS, arch=None, aspect=flops.ASPECT_RATIO, batch=flops.BATCH_TOKENS,
              tpp=TPP, case=None):
    """Candidate runs {C: widths} x loops (default: Table 6, the 116-run grid) as a fit.py runs dict (built in code:
    fit.py's missing-key, duplicate and accounting checks apply, its range checks do not) plus "name" (the sweep
    scripts' run folder, e.g. C4.64e17_r2_s8) and "cost" (executed FLOPs as train.py runs it: steps = round(C / (F B))).
    A case's pool (a variant's candidates) holds its looped runs only. Runs outside tokens-per-parameter tpp are left
    out (the law is not trusted far along an iso-FLOP curve), and so are widths that cannot take one step at C."""
    # every (C, r, s) cell costed as train.py will run it; its name is the folder the sweep scripts give the run, so
    # a list of names is a list runs/grid.sh --only can train
    arch, rows = arch or {}, []
    for budget, widths in (flops.GRID if cells is None else cells).items():
        for r, s in itertools.product([r for r in loops if r > 1 or case is None], widths):
            (n_once, n_rec), f = flops.param_split(aspect * s, r, **arch), flops.flops_per_token(aspect * s, r, **arch)
            try:
                tokens = flops.tokens_for_budget(budget, f, batch)[1]
            except ValueError:                               # below one optimizer step at this budget
                continue
            # a widened pool stays inside Table 6's tokens-per-parameter range: the prior law was measured there
            if tpp[0] <= tokens / (n_once + n_rec) <= tpp[1]:
                rows.append(dict(flops_budget=budget, n_loops=r, d_model=aspect * s, n_once=n_once, n_rec=n_rec,
                                 tokens=tokens, arch=arch, aspect_ratio=aspect, val_loss=1.0, case=case,
                                 source=f"C{budget:g}_r{r}_s{s}".replace("e+", "e"), cost=float(tokens * f)))
    # the search weighs every swap of a chosen run for another one: the pool is bounded (--budgets, --scales,
    # --loops and --tpp make it)
    if not 1 <= len(rows) <= MAX_POOL:
        refuse(f"the candidate pool has {len(rows)} runs; it needs 1 to {MAX_POOL}")
    # through fit.py's own row checks: a pool the fit would refuse (an n_loops flops.py cannot count) stops here;
    # a run's name is its source
    runs = fit.runs_from_rows(rows)
    return dict(runs, name=list(runs["source"]), cost=np.array([row["cost"] for row in rows]))

def finished_runs(runs_dir):
    """The baseline runs (no case label) with a done.json under runs_dir, named by folder and costed by their
    record's executed FLOPs (train.py's "flops"; their budget C without one)."""
    # the main grid's runs only: a case study's runs follow another law (fit.select_runs without a case)
    recs = fit.load_records(runs_dir)
    runs, flop = fit.select_runs(fit.runs_from_rows(recs), None), {rec["source"]: rec.get("flops") for rec in recs}
    return dict(runs, name=[os.path.basename(os.path.dirname(src)) for src in runs["source"]],
                cost=np.array([float(flop[src] or c) for src, c in zip(runs["source"], runs["flops_budget"])]))

def load_prior(path):
    """(theta, rmse): the joint fit of a fit.py fit.json (--prior). Its numbers pass the limits of what could have
    written them: theta inside fit.py's App. F box, the rmse those of --noise."""
    # any fit.py fit.json: its joint block holds theta in PARAM_NAMES' order and the residual RMSE in nats
    joint = fit.read_json(path).get("joint")
    vals = [*joint["theta"], joint.get("rmse")] if isinstance(joint, dict) and type(joint.get("theta")) is list else []
    box = [f"[{lo}, {hi}]" for lo, hi in zip(fit.BOX_LO, fit.BOX_HI)] + ["(0, 1]"]       # theta's, then rmse's
    if len(vals) != 7 or any(v is None or common.check_number(v, iv) for v, iv in zip(vals, box)):
        refuse(f"{path}: no joint fit with a theta inside fit.py's App. F box and an rmse in (0, 1] nats")
    return np.array(vals[:6], dtype=float), float(vals[6])

def read_list(path):
    """argparse type of --reference: the run names of a list file (the first word of each line; blank lines and #
    comments skipped). Bytes that are no UTF-8 read as U+FFFD: such a name is one the pool lacks (plan refuses it)."""
    if not (os.path.isfile(path) and os.access(path, os.R_OK)):   # a FIFO would block open() forever
        refuse(f"{path}: not a readable file (a run list)", argparse.ArgumentTypeError)
    lines = pathlib.Path(path).read_text(encoding="utf-8", errors="replace").splitlines()
    return [ln.split()[0] for ln in lines if ln.strip() and not ln.lstrip().startswith("#")] or refuse(
        f"{path}: lists no runs", argparse.ArgumentTypeError)

def universe(groups, sigma):
    """The search's table of runs from groups [(runs, theta, kind)] with noise sigma nats per run; kind "cand" (may be
    chosen), "fixed" (finished runs, or a case study's baseline grid: always in, free) or "variant" (a case study's
    candidates).

    Per run: J = d ln L_hat / d theta (n, 6) by central differences of fit.predict (Eq. 3 lives there), the prior's
    loss, and the Huber weights of the log residual u ~ N(0, tau^2), tau = sigma / L (Eq. 4, delta = fit.DELTA):
    psi = clip(u, -delta, delta), so b = E[psi'] = P(|u| < delta) and m = E[psi^2] = E[min(u^2, delta^2)]."""
    parts = []
    for runs, theta, kind in groups:
        # J by central differences of fit.predict, step 1e-6 (relative error ~1e-9): Eq. 3 stays in one function
        lnl = lambda th, prob=fit._pack(runs): np.log(fit.predict(th, prob))
        J = np.stack([(lnl(theta + 1e-6 * e) - lnl(theta - 1e-6 * e)) / 2e-6 for e in np.eye(6)], axis=1)
        parts.append((J, fit.predict(theta, fit._pack(runs)), np.full(len(J), kind)))
    J, loss, kind = (np.concatenate(p) for p in zip(*parts))
    runs = {k: (np.concatenate([g[0][k] for g in groups]) if isinstance(v, np.ndarray)
                else sum((list(g[0][k]) for g in groups), [])) for k, v in groups[0][0].items()}
    # Huber weights. With tau >> delta (any real study: 0.01 nats / 2.5 nats = 4e-3 > 1e-3) the fit is close to a
    # median regression: b ~ delta sqrt(2 / pi) / tau, m ~ delta^2, i.e. pi / 2 times the least-squares variance
    c = fit.DELTA * loss / sigma                         # delta / tau
    b = erf(c / math.sqrt(2))
    m = (b - 2 * c * np.exp(-c * c / 2) / math.sqrt(2 * math.pi)) * (sigma / loss) ** 2 + fit.DELTA ** 2 * (1 - b)
    fixed, variant = kind == "fixed", kind == "variant"
    JJ = (J[:, :, None] * J[:, None, :]).reshape(-1, 36)                  # (n, 36) outer products J J'
    # the ridge is a pseudo-observation, lam I in B and lam kappa I in M (a flat prior on theta): a set that cannot
    # identify theta gets a huge but finite variance, and the search a gradient from its first run. own: the runs that
    # min_per_r counts, the variant's or (with none) all
    return dict(runs=runs, J=J, JJ=JJ, loss=loss, b=b, m=m, C=runs["flops_budget"], r=runs["n_loops"], fixed=fixed,
                variant=variant, cand=~fixed, cost=np.where(fixed, 0.0, runs["cost"]), kappa=float(np.median(m / b)),
                lam=RIDGE * float(np.trace((b @ JJ).reshape(6, 6))), own=variant if variant.any() else ~variant)

def variance(U, masks):
    """Predicted Var(phi_hat) of each selection (rows of masks, (k, n) bool), or Var(delta-phi_hat) when U holds a
    case's variant runs. Run i moves a fit's phi by g_i psi_i, g_i = (B^-1 e_phi)' J_i, so Var = sum_i m_i g_i^2
    (plus the ridge's pseudo-observation). For delta-phi the variant fit (its runs and the baseline's r = 1 runs at
    its budgets, as fit.run_case selects) and the baseline refitted on those budgets share their r = 1 runs, whose
    influences subtract: the paired comparison of fit.paired_delta_bootstrap."""
    fits = [masks := np.atleast_2d(masks)]
    if U["variant"].any():
        # the baseline refit keeps the budgets the variant uses; the variant fit borrows the baseline's r = 1 runs there
        base = masks & ~U["variant"] & np.stack([np.isin(U["C"], U["C"][row & U["variant"]]) for row in masks])
        fits = [(masks & U["variant"]) | (base & (U["r"] == 1)), base]
    # one batched (6, 6) solve per selection and fit: B^-1 e_phi is all that phi's variance needs
    g, ridge = 0.0, 0.0
    for sign, sel in zip((1.0, -1.0), fits):
        B = ((sel * U["b"]) @ U["JJ"]).reshape(-1, 6, 6) + U["lam"] * np.eye(6)                   # (k, 6, 6)
        w = np.linalg.solve(B, np.broadcast_to(np.eye(6)[5], (len(sel), 6))[..., None])[..., 0]   # (k, 6) B^-1 e_phi
        g, ridge = g + sign * (w @ U["J"].T) * sel, ridge + (w ** 2).sum(1)                       # g: (k, n)
    return (g ** 2 * U["m"]).sum(1) + U["lam"] * U["kappa"] * ridge

def choose(U, budget=math.inf, k=None, target=None, min_per_r=5):
    """The selection mask (fixed runs included), grown one run at a time by the largest gain per FLOP among the runs
    that fit the budget: while an r has fewer than min_per_r runs (fit.py fits each r alone, Eq. 2's 5 parameters)
    or phi is not yet pinned (sd > 0.05), the gain in ln det of the information (D-optimal: every parameter at
    once); then the drop in ln Var(phi). It stops at k new runs or Var <= target; in budget mode, when no addition
    helps, the best single swap within the budget follows, and more additions, until neither helps."""
    # fixed runs cost nothing (universe): the budget is the new runs'
    S, ar, rs = U["fixed"].copy(), np.arange(len(U["fixed"])), np.unique(U["r"][U["cand"]])
    # D-optimal first: until phi is pinned, Var(phi) is ridge-dominated and flat, and its gradient says nothing;
    # ln det of the information grows with every direction of theta a run identifies
    lndet = lambda M: np.linalg.slogdet(((M & U["own"]) * U["b"] @ U["JJ"]).reshape(-1, 6, 6) + np.eye(6) * U["lam"])[1]
    short = lambda T, r: max(0, min_per_r - int((T & U["own"] & (U["r"] == r)).sum()))   # runs r still lacks
    # FLOPs of the cheapest runs that would bring every r to min_per_r: kept in reserve while any r lacks runs
    fill = lambda T: sum(np.sort(U["cost"][U["cand"] & ~T & (U["r"] == r)])[:short(T, r)].sum() for r in rs)
    if fill(S) > budget * (1 + 1e-9):
        refuse(f"{budget:.3g} FLOPs cannot pay for {min_per_r} runs of every r ({fill(S):.3g} at the cheapest)")
    while True:
        cur, left, need = variance(U, S)[0], budget - float(U["cost"][S].sum()), [r for r in rs if short(S, r)]
        # while an r lacks runs: only runs of such an r, and only those that leave the reserve (fill) for the rest
        cand = np.array([j for j in np.flatnonzero(U["cand"] & ~S & (U["cost"] <= left)) if not need or (
            U["r"][j] in need and U["cost"][j] + fill(S | (ar == j)) <= left * (1 + 1e-9))], int)
        if not need and ((k is not None and (S & ~U["fixed"]).sum() >= k) or (target and cur <= target)):
            return S
        trial = S | (ar == cand[:, None])          # (candidates, n): S plus one candidate each
        # gain per FLOP: ln det while unpinned, then ln Var(phi)
        gain = (lndet(trial) - lndet(S[None]) if need or cur > 0.05 ** 2 else
                math.log(cur) - np.log(variance(U, trial))) / U["cost"][cand] if cand.size else [0]
        if np.max(gain) > 0:
            S[cand[np.argmax(gain)]] = True
            continue
        if k is not None or target is not None:
            return S
        # the greedy pass buys the runs with the most information per FLOP; once the budget is spent, 1-for-1 swaps
        # trade a run for a better one (an expensive low-leverage run for a cheap informative one, say)
        # exchange: every (drop i, add j) pair at once; a run of an r at its minimum is swapped within its r only
        inn, out = np.flatnonzero(S & U["cand"]), np.flatnonzero(U["cand"] & ~S)
        free = np.array([not U["own"][i] or short(S & (ar != i), U["r"][i]) == 0 for i in inn], bool)[:, None]
        ok = (U["cost"][out] - U["cost"][inn, None] <= left) & ((U["r"][inn, None] == U["r"][out]) | free)
        I, J = inn[np.nonzero(ok)[0]], out[np.nonzero(ok)[1]]                 # (pairs,) each, i outer
        swap = lambda c: (S | (ar == J[c:c + 2048, None])) & (ar != I[c:c + 2048, None])   # (<= 2048, n) masks
        v = np.concatenate([variance(U, swap(c)) for c in range(0, len(I), 2048)] or [[np.inf]])
        if v.min() >= cur * (1 - 1e-9):
            return S
        S = swap(int(v.argmin()))[0].copy()


# -----------------------------------------------------------------------------
# Plan: flags -> pool, prior, noise -> the chosen runs, written as a list that runs/grid.sh --only accepts

def plan(a):
    """The design the flags ask for: the run list's lines (a header, then one line per run to train)."""
    # one request, one target; every bad flag is refused here, before a pool is built
    targets = [x for x in (a.target_halfwidth, a.budget_flops, a.budget_gpu_hours) if x is not None]
    if len(targets) > 1 or not (targets or a.next or a.reference) or len(a.tpp) != 2:
        refuse("give one target (--target-halfwidth, --budget-flops or --budget-gpu-hours) or --next; --tpp LO,HI")
    if a.delta_phi is not None and a.runs:
        refuse("--delta-phi designs against Table 6's finished baseline grid; it takes no --runs")
    arch = {k: getattr(a, k) for k in ("n_layers_eff", "n_layers_prelude", "n_layers_coda", "seq_len", "vocab_size")}
    cells = {c: a.scales or flops.GRID.get(c) or refuse("--budgets outside Table 6 need --scales (the widths to sweep)")
             for c in a.budgets or flops.GRID}
    pool = lambda cells, tpp, case=None: make_pool(cells, a.loops, arch, a.aspect_ratio, a.batch_tokens, tpp, case)
    theta, rmse = load_prior(a.prior) if a.prior else (np.array(PAPER_THETA), PAPER_RMSE)
    if a.delta_phi is not None and not fit.BOX_LO[5] <= theta[5] + a.delta_phi <= fit.BOX_HI[5]:
        refuse(f"--delta-phi {a.delta_phi:g} puts the variant's phi {theta[5] + a.delta_phi:.3f} outside the fit's box")
    sigma, target = a.noise or rmse, (a.target_halfwidth / Z95) ** 2 if a.target_halfwidth else None
    if a.delta_phi is not None:       # §5: the variant's looped runs beside the baseline grid (Table 6), done already
        groups = [(pool(None, (0, math.inf)), theta, "fixed"),
                  (pool(cells, a.tpp, "design"), theta + np.eye(6)[5] * a.delta_phi, "variant")]
    else:                             # finished runs (--runs) are in for free; the pool loses their configurations
        key = lambda x: list(zip(x["flops_budget"], x["n_loops"], x["n_once"] + x["n_rec"], x["tokens"]))
        done, cand = finished_runs(a.runs) if a.runs else None, pool(cells, a.tpp)
        cand = fit.subset(cand, np.array([x not in set(key(done) if done else ()) for x in key(cand)]))
        groups = ([(done, theta, "fixed")] if done else []) + [(cand, theta, "cand")]
    U = universe(groups, sigma)
    # a name the pool lacks would silently shrink the reference
    if missing := sorted(set(a.reference or ()) - set(U["runs"]["name"])):
        refuse(f"--reference lists runs that are not in the pool: {', '.join(missing[:3])}")
    ref = np.isin(U["runs"]["name"], a.reference) if a.reference else U["cand"] | U["fixed"]
    if a.noise_phi and (sd := math.sqrt(variance(U, ref)[0])) < a.noise_phi:
        # run-to-run noise (data order, seeds) a study's residuals understate: raise sigma until the reference
        # design's sd(phi) is noise_phi (Var scales as sigma^2 once sigma / L >> delta, as in every real study)
        sigma *= a.noise_phi / sd
        U = universe(groups, sigma)
    # a budget in GPU-hours becomes executed FLOPs by flops.py's convention (hours x 3600 x MFU x peak); a reference
    # alone (no target, no --next) sets the budget to its total FLOPs, finished runs included
    budget = a.budget_flops or (a.budget_gpu_hours or 0) * 3600 * a.mfu * a.peak_flops or (float(U["runs"]["cost"][
        ref].sum() - U["runs"]["cost"][U["fixed"]].sum()) if a.reference and not (targets or a.next) else math.inf)
    # the search; with a target, choose stops at the first set that reaches it (greedy per FLOP, no swaps)
    S = choose(U, budget, a.next, target, a.min_per_r)
    new, runs, hw = np.flatnonzero(S & ~U["fixed"]), U["runs"], Z95 * math.sqrt(variance(U, S)[0])
    if target and variance(U, S)[0] > target:
        # (widen the pool with --budgets and --scales, or relax --target-halfwidth)
        refuse(f"the whole pool predicts a half-width of {hw:.4f}")
    cost = float(U["cost"][new].sum())
    return [f"# design.py plan: {len(new)} runs to train (+{int(U['fixed'].sum())} finished), {cost:.4g} FLOPs = "
            f"{gpu_hours(cost, a.mfu, a.peak_flops):.1f} GPU-hours at MFU {a.mfu:g} x {a.peak_flops:.3g} FLOP/s; "
            f"predicted 95% CI half-width of {'delta-phi' if a.delta_phi is not None else 'phi'}: {hw:.4f} "
            f"(noise {sigma:.4g} nats; prior {a.prior or 'the paper, Table 2'}: phi {theta[5]:.3f})"] + [
        f"{runs['name'][i]:<18} # C={runs['flops_budget'][i]:g} r={runs['n_loops'][i]} N="
        f"{runs['n_once'][i] + runs['n_rec'][i]:.0f} D={runs['tokens'][i]:.0f} FLOPs={U['cost'][i]:.4g}" for i in new]


# -----------------------------------------------------------------------------
# Simulate: the claim judged by fit.py's protocol on noisy replicates of the prior law

# Each replicate draws fresh noise on the prior's losses and refits exactly as a user's study would be fitted.
def measure(runs, a, seed):
    """fit.py's protocol on runs: (estimate, lo, hi) of phi (fit_block's restarts, bootstrap_phi), or of delta-phi
    when they hold a case (run_case's selection, paired_delta_bootstrap). (nan, -inf, inf) if the fit refuses them."""
    # The paper's protocol, as python fit.py runs it: fit_block's App. F restarts (batched screen, scipy polish),
    # then bootstrap_phi's resamples of the (budget, r) cells, each warm-started plus boot_restarts random starts
    try:
        if "design" not in runs["case"]:
            j = fit.fit_block(runs, None, a.restarts, seed)
            b = fit.bootstrap_phi(runs, j["theta"], a.bootstrap, seed, a.boot_restarts, progress=False)
            return j["phi"], b["phi_lo"], b["phi_hi"]
        var, base = fit.select_runs(runs, "design"), fit.select_runs(runs, None)
        base = fit.subset(base, np.isin(base["flops_budget"], var["flops_budget"]))
        vj, bj = (fit.fit_block(x, None, a.restarts, seed) for x in (var, base))
        d = fit.paired_delta_bootstrap(var, base, {"joint": vj}, bj, a.bootstrap, seed, a.boot_restarts, False)
        return vj["phi"] - bj["phi"], d["delta_phi_lo"], d["delta_phi_hi"]
    except ValueError:                      # too few runs, or one r: no estimate, no CI (a failed replicate)
        return math.nan, -math.inf, math.inf

def replicate(U, picks, truth, sigma, a, name):
    """a.reps noisy replicates of a design (a: simulate's flags): picks(rng) -> masks (one, or a sequential design's
    rounds), each replicate with its own seed for the N(0, sigma^2) noise on the prior's losses, the random design and
    the fit. Returns one result row per mask, and the (reps, masks) half-widths and costs."""
    # each replicate redraws the noise of every run of the universe; a design fits its own subset of them
    out, rows = [], []
    for rep in range(a.reps):
        rng = np.random.default_rng([a.seed, rep])
        runs = dict(U["runs"], val_loss=U["loss"] + sigma * rng.standard_normal(len(U["loss"])))
        out.append([(*measure(fit.subset(runs, S), a, a.seed + rep), U["cost"][S].sum()) for S in picks(rng)])
    # a refused fit is a failed replicate: it has no interval, so it never counts as covering the truth (an infinite
    # interval would "cover" and flatter a design that cannot be fitted); the table also says how many failed
    est, lo, hi, cost = np.moveaxis(np.array(out), 2, 0)            # each (reps, masks)
    for t, (e, l, h) in enumerate(zip(est.T, lo.T, hi.T)):
        rows.append({"design": name + (f", round {t}" if est.shape[1] > 1 else ""), "reps": a.reps,
                     "flops": float(np.median(cost[:, t])), "median_halfwidth": float(np.median(h - l) / 2),
                     "coverage": float(np.mean((l <= truth) & (truth <= h) & ~np.isnan(e))),
                     "failed": int(np.isnan(e).sum()), "excludes_0": float(np.mean((l > 0) | (h < 0))),
                     "median_abs_err": float(np.nanmedian(abs(e - truth)))})
        print(f"  {rows[-1]['design']:<46} {gpu_hours(rows[-1]['flops']):7.1f} GPU-h  median half-width "
              f"{rows[-1]['median_halfwidth']:.4f}  coverage {rows[-1]['coverage']:.2f}", file=sys.stderr, flush=True)
    return rows, (hi - lo) / 2, cost


# Baselines of the comparison are masks too: capped() fills a budget in a given order (random, cheapest first).
def capped(U, order, budget):
    """The runs of `order` taken in turn while they fit the budget (one that does not fit is skipped)."""
    S = U["fixed"].copy()
    for i in order:
        S[i] = U["cost"][S].sum() + U["cost"][i] <= budget or S[i]
    return S

def simulate(a):
    """Equal-cost comparisons per share of the grid's FLOPs (designed from a wider pool and from the grid, random
    subsets, cheapest first, the lowest budgets only), a delta-phi case against the paper's case study, and the
    sequential mode against random additions. Returns the result rows by section."""
    theta, sigma = np.array(PAPER_THETA), PAPER_RMSE
    wide = lambda budgets, case=None: make_pool({c: a.scales for c in budgets}, case=case)
    Ug, Uw = (universe([(p, theta, "cand")], sigma) for p in (make_pool(), wide(a.extra_budgets + list(flops.GRID))))
    res = {"grid_flops": float(Ug["cost"].sum()), "phi": [], "case": [], "sequential": []}
    res["phi"] += replicate(Ug, lambda rng: [Ug["cand"]], theta[5], sigma, a, "full grid (116 runs)")[0]
    # equal cost: at each share of the grid's FLOPs every design gets the same cap; random subsets are redrawn per
    # replicate, the lowest budgets take whole Table 6 columns (the paper's case studies: the four lower ones)
    for frac in a.fractions:
        cap = frac * res["grid_flops"]
        low = max([c for c in np.unique(Ug["C"]) if Ug["cost"][Ug["C"] <= c].sum() <= cap] or [0])
        for name, U, pick in (("designed, wider pool", Uw, lambda rng, S=choose(Uw, cap): [S]),
                              ("designed, grid", Ug, lambda rng, S=choose(Ug, cap): [S]),
                              ("random subsets", Ug, lambda rng: [capped(Ug, rng.permutation(len(Ug["C"])), cap)]),
                              ("cheapest first", Ug, lambda rng: [capped(Ug, np.argsort(Ug["cost"]), cap)]),
                              ("lowest budgets only", Ug, lambda rng: [Ug["C"] <= low])):
            row = replicate(U, pick, theta[5], sigma, a, f"{name} @ {frac:g} of the grid")[0][0]
            res["phi"].append(dict(row, name=name, predicted=None if "random" in name else Z95 * math.sqrt(
                variance(U, pick(None)[0])[0])))
    # §5 case: the baseline grid is done; the variant's looped runs shift phi by delta_phi (hc: +0.19, Table 3)
    # its candidates: the looped runs of the wider widths at Table 6's budgets, so the baseline exists at each of them
    Uc = universe([(make_pool(), theta, "fixed"),
                   (wide(flops.GRID, "design"), theta + np.eye(6)[5] * a.delta_phi, "variant")], sigma)
    paper = Uc["fixed"] | (Uc["variant"] & (Uc["C"] < 5e18) & np.isin(Uc["runs"]["name"], make_pool()["name"]))
    res["case_flops"] = float(Uc["cost"][paper].sum())
    for name, S in [("the paper's case study (60 runs, 4 lower budgets)", paper)] + [
            (f"designed @ {f:g} of its FLOPs", choose(Uc, f * res["case_flops"])) for f in a.case_fractions]:
        row = replicate(Uc, lambda rng, S=S: [S], a.delta_phi, sigma, a, name)[0][0]
        res["case"].append(dict(row, predicted=Z95 * math.sqrt(variance(Uc, S)[0])))
    # sequential: the 12 cheapest grid runs, then rounds of K; the designed rounds depend only on what is finished,
    # the random ones are drawn per replicate
    # (a team's pilot: the 12 cheapest runs of the grid; both strategies start there and pay for it)
    pilot = np.isin(np.arange(len(Ug["C"])), np.argsort(Ug["cost"])[:12])
    steps = list(itertools.accumulate(range(a.rounds), lambda done, _: choose(dict(
        Ug, fixed=done, cand=~done, cost=np.where(done, 0, Ug["cost"])), k=a.next), initial=pilot))
    grow = lambda S, rng: S | np.isin(np.arange(len(S)), rng.choice(np.flatnonzero(~S), a.next, replace=False))
    for name, pick in (("sequential, designed", lambda rng: steps), ("sequential, random", lambda rng: list(
            itertools.accumulate(range(a.rounds), lambda S, _: grow(S, rng), initial=steps[0])))):
        rows, hw, cost = replicate(Ug, pick, theta[5], sigma, a, name)
        hit = [c[h <= a.seq_target][0] if (h <= a.seq_target).any() else math.inf for h, c in zip(hw, cost)]
        rows[-1].update(reached=float(np.mean(np.isfinite(hit))), flops_to_target=float(np.median(hit)))
        res["sequential"] += rows
    return res

def sim_outputs(res, request):
    """{file: bytes}: sim.json (everything), sim.md (one table per section), sim.png (median CI half-width vs
    GPU-hours, one line per design, the full grid as a star)."""
    plt, f = fit._pyplot(), lambda x, fmt: "-" if x is None or not math.isfinite(x) else format(x, fmt)
    L = ["# design.py simulate", "", f"Protocol per replicate: {json.dumps(request['protocol'])}; truth: the paper's "
         f"law (Table 2) with independent N(0, {PAPER_RMSE}^2) nats per run.", ""]
    for sec, title in (("phi", "φ at equal cost"), ("case", f"Δφ = {request['delta_phi']:+g}, the grid done"),
                       ("sequential", f"Sequential: 12 cheapest grid runs, then rounds of K = {request['next']}")):
        L += fit._table(("design", "FLOPs (share of grid)", "GPU-hours", "predicted half-width", "median half-width",
                         "coverage", "excludes 0", "median abs error", "failed", "target reached (median FLOPs)"), [(
            r["design"], f"{r['flops']:.3g} ({r['flops'] / res['grid_flops']:.3f})", f"{gpu_hours(r['flops']):.1f}",
            f(r.get("predicted"), ".4f"), f"{r['median_halfwidth']:.4f}", f"{r['coverage']:.2f}",
            f"{r['excludes_0']:.2f}", f(r["median_abs_err"], ".4f"), r["failed"],
            f"{r['reached']:.2f} ({f(r['flops_to_target'], '.3g')})" if "reached" in r else "-") for r in res[sec]],
            f"## {title}") + [""]
    # the figure: median half-width against GPU-hours (log-log), one line per design, the full grid as a star and
    # the bar (1.2 x the full grid's half-width) dotted
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for name in dict.fromkeys(r["name"] for r in res["phi"][1:]):
        ax.plot(*zip(*[(gpu_hours(r["flops"]), r["median_halfwidth"]) for r in res["phi"] if r.get("name") == name]),
                "o-", label=name)
    ax.plot(gpu_hours((full := res["phi"][0])["flops"]), full["median_halfwidth"], "k*", ms=12, label="full grid")
    ax.axhline(1.2 * full["median_halfwidth"], color="grey", ls=":", lw=1, label="1.2 x full grid")
    ax.set(xscale="log", yscale="log", xlabel=f"GPU-hours (MFU {MFU:g} of {PEAK:.3g} FLOP/s)",
           ylabel="median 95% CI half-width of φ", title=f"{request['reps']} noisy replicates per point")
    ax.xaxis.set_minor_formatter(plt.NullFormatter())         # 2 x 10^1, 3 x 10^1, ... would overlap
    ax.legend(fontsize=7)
    # sim.json first: fit.write_set renames the first name last, so a folder with a sim.json holds the whole set
    return {"sim.json": json.dumps(fit._jsonable(dict(res, request=request)), indent=1).encode(),
            "sim.md": "\n".join(L).encode(), "sim.png": fit._png(fig)}


# -----------------------------------------------------------------------------
# CLI: one flag table per command, turned into argparse (bad values: one-line errors, exit 2, before any work)

def _list(kind, interval):
    """argparse type: comma-separated distinct numbers, each checked by common.number like every other flag (a repeated
    one would put one run in the pool twice)."""
    def parse(text):
        v = [common.number(kind, interval)(t) for t in text.split(",")]
        return v if len(set(v)) == len(v) else refuse(f"lists a value twice: {text}", argparse.ArgumentTypeError)
    return parse

_n = common.number


# The limits of the flags a run's own flag could set are train.py's LIMITS (tests/test_design.py checks they agree);
# the others bound every loop and count the search and the simulation make (a pool, the replicates, the rounds).
C, TRAIN = "(0, 1e30]", {"aspect-ratio": "[1, 1e9]", "n-layers-eff": "[1, 1e9]", "n-layers-prelude": "[0, 1e9]",
                         "n-layers-coda": "[0, 1e9]", "seq-len": "[1, 1e9]", "vocab-size": "[2, 1e9]"}
# --noise: nats per run, the limits of a prior's rmse too; --seed: fit.py's
# (flag, type, default, help) per command. plan: the pool (Table 6 unless --budgets / --scales widen it; the
# architecture flags make a mini study's pool), the prior and its noise, one target, finished runs, a case.
# simulate: the replicates and the protocol (the paper's by default), the pools, the case and sequential set-up.
# Each table's order is the order of sim.json's request (and of --help).
FLAGS = {"plan": [("--out", str, None, "write the run list here (runs/grid.sh --only FILE)"),
    ("--runs", str, None, "finished runs"), ("--budgets", _list(float, C), None, "pool budgets C (Table 6's)"),
    ("--loops", _list(int, "[1, 16]"), [1, 2, 4, 8], ""), ("--tpp", _list(float, "(0, inf)"), list(TPP), "LO,HI"),
    ("--scales", _list(int, "[1, 1e9]"), None, "pool widths s at every budget"),
    *[("--" + k, _n(int, i), d, "") for (k, i), d in zip(TRAIN.items(), (64, 20, 2, 2, flops.SEQ_LEN, flops.V_LLAMA))],
    ("--batch-tokens", _n(int, "[1, 1e12]"), flops.BATCH_TOKENS, ""), ("--min-per-r", _n(int, "[0, 1000]"), 5, ""),
    ("--prior", str, None, "a fit.py fit.json (default: the paper's joint fit, Table 2)"),
    ("--noise", _n(float, "(0, 1]"), None, "nats per run (default: the prior's RMSE)"),
    ("--noise-phi", _n(float, "(0, 6]"), None, "raise the noise until the --reference design's sd(phi) is this"),
    ("--reference", read_list, None, "a run list: --noise-phi's design; with no target, the total FLOPs to match"),
    ("--target-halfwidth", _n(float, "(0, 6]"), None, "the cheapest design with this predicted 95%% half-width"),
    ("--budget-flops", _n(float, C), None, ""), ("--budget-gpu-hours", _n(float, "(0, 1e12]"), None, "at --mfu"),
    ("--next", _n(int, "[1, 100000]"), None, "the next K runs beside --runs"),
    ("--delta-phi", _n(float, "[-6, 6]"), None, "a case study's shift (prior phi + shift inside the App. F box)"),
    ("--mfu", _n(float, "(0, 1]"), MFU, ""), ("--peak-flops", _n(float, "(0, 1e20]"), PEAK, "")],
    "simulate": [("--out", str, "out/design_sim", "folder for sim.json, sim.md, sim.png"),
    ("--seed", _n(int, "[0, 9.2e18]"), 0, ""), ("--reps", _n(int, "[1, 10000]"), 20, "noisy replicates per design"),
    ("--restarts", _n(int, "[1, 1e5]"), fit.RESTARTS, "App. F"), ("--bootstrap", _n(int, "[1, 1e5]"), fit.N_BOOT, ""),
    ("--boot-restarts", _n(int, "[0, 1000]"), fit.BOOT_RESTARTS, ""),
    ("--fractions", _list(float, "(0, 1]"), [0.05, 0.1, 0.25, 0.5], "design budgets as shares of the grid's FLOPs"),
    ("--scales", _list(int, "[1, 1e9]"), list(range(4, 40, 2)), "wider pool: widths"),
    ("--extra-budgets", _list(float, C), [1e17, 2.15e17], "wider pool: budgets besides Table 6's"),
    ("--delta-phi", _n(float, "[-3, 3]"), 0.19, ""), ("--case-fractions", _list(float, "(0, 1]"), [0.25, 0.5], ""),
    ("--next", _n(int, "[1, 104]"), 8, "per round"), ("--rounds", _n(int, "[1, 104]"), 5, ""),
    ("--seq-target", _n(float, "(0, 6]"), 0.06, "")]}

def main(argv=None):
    ap = common.Parser(prog="design.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    for cmd, table in FLAGS.items():
        p = sub.add_parser(cmd)
        for flag, kind, default, text in table:
            p.add_argument(flag, type=kind, default=default, help=text)
        p.add_argument("--overwrite", action="store_true", help="replace another request's output")
    a = ap.parse_args(argv)
    request = {k: v for k, v in vars(a).items() if k not in ("out", "overwrite")}
    try:
        if a.cmd == "plan":
            # the run list is one file: a link, folder or FIFO in its way is refused before any work; after it, the
            # file is replaced if it holds another plan only with --overwrite (fit.write_new: a rerun loses nothing)
            if a.out:
                common.check_new(a.out, True)
            print(text := "\n".join(plan(a)) + "\n", end="")
            if a.out:
                fit.write_new(a.out, text.encode(), a.overwrite)
                print(f"wrote {a.out} (train it: NPROC=8 bash runs/grid.sh --only {a.out})")
            return 0
        if 12 + a.rounds * a.next > 116:
            refuse(f"--rounds {a.rounds} x --next {a.next} after the 12-run pilot exceeds the grid's 116 runs")
        if a.bootstrap * (1 + a.boot_restarts) > 10 ** 6:     # fit.bootstrap_phi screens them all at once
            refuse("--bootstrap x (1 + --boot-restarts) must be at most 1e6 starts")
        request["protocol"] = {k: request[k] for k in ("reps", "restarts", "bootstrap", "boot_restarts", "seed")}
        # --out is design.py's own folder (common.claim): new, this same request's, or --overwrite; one writer
        # (a link, folder or FIFO at an output's name is refused before the simulation); fit_block's single-hit
        # notes on small sets are silenced: the tables say enough
        names = ("sim.json", "sim.md", "sim.png")
        with fit.claimed(a.out, "design", request, a.overwrite, names=names), warnings.catch_warnings(action="ignore"):
            fit.write_set(a.out, sim_outputs(simulate(a), request))
    except (ValueError, OSError) as err:    # bad input; an unreadable list or prior, a read-only folder
        common.fail("design.py", err)
    print(f"wrote {a.out}/sim.json, sim.md, sim.png")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
