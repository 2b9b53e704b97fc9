"""
runs/bench_fit.py -- the fit benchmark (issue 7, acceptance 4; runs/bench.sh section 4): the full fit.py protocol on
the 116-run synthetic grid, then one joint fit twice -- the batched screen + polish against one scipy L-BFGS-B per
start, at the same starts and tolerances -- and the naive full protocol extrapolated from it.
Run:  python runs/bench_fit.py [--seed 0 --restarts 500 --bootstrap 200]
Not here: the fits themselves (fit.py); this file only times them.
"""
import os, sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))   # the repository's flat files
import common, fit  # noqa: E402  (fit sets one BLAS thread before numpy loads)


def bench(seed=0, restarts=fit.RESTARTS, n_boot=fit.N_BOOT):
    """Time the full protocol on the 116-run synthetic grid, then one fit with one scipy L-BFGS-B per start. The
    times are fit.py's own "seconds" (perf_counter around the fits: the protocol's, and each fit_law's)."""
    runs = fit.synthetic_runs(0.46, 0.01, seed)          # the acceptance's workload: 116 runs, paper-like noise
    res = fit.run_protocol(runs, restarts, n_boot, seed, progress=True)
    print(f"full protocol: 4 per-arch + joint + phi=0 + phi=1 + 2 halves at {restarts} restarts, {n_boot} bootstrap "
          f"refits, frontier: {res['seconds']:.1f} s")
    # the same fit twice: batched screen + polish, then one scipy L-BFGS-B per start at the same tight tolerances
    # (looser ones are faster but stop early, fitting.md §4.2); same starts, so the best objectives must agree
    fast, naive = (fit.fit_law(fit.make_problem(runs), restarts, seed, engine=e) for e in ("batched", "scipy"))
    t_fast, t_naive, rel = fast["seconds"], naive["seconds"], abs(fast["huber"] - naive["huber"]) / naive["huber"]
    print(f"one joint fit ({restarts} starts): batched {t_fast:.2f} s, naive scipy {t_naive:.2f} s, speed-up "
          f"{t_naive / t_fast:.1f}x; best objective {fast['huber']:.10e} vs {naive['huber']:.10e} (rel {rel:.1e})")
    # the naive protocol repeats that fit 9 times and, without warm starts, 200 more times in the bootstrap
    print(f"naive full protocol (9 + {n_boot} fits x {restarts} starts) ~ {t_naive * (9 + n_boot) / 60:.0f} min; "
          f"speed-up ~{t_naive * (9 + n_boot) / res['seconds']:.0f}x")
    bs = res.get("bootstrap")
    print(f"phi = {res['joint']['phi']:.2f}" + (f" [{bs['phi_lo']:.2f}, {bs['phi_hi']:.2f}]" if bs else ""))
    return {"full_s": res["seconds"], "one_fit_batched_s": t_fast, "one_fit_naive_s": t_naive, "rel_diff": rel}


if __name__ == "__main__":
    # the defaults are the paper's protocol (App. F: 500 restarts, 200 resamples), as the acceptance figure uses;
    # runs/bench.sh calls it without flags
    p = common.Parser(prog="runs/bench_fit.py", description=__doc__.split("\n")[1])
    p.add_argument("--seed", type=common.number(int, "[0, 4294967295]"), default=0)
    p.add_argument("--restarts", type=common.number(int, "[1, 100000]"), default=fit.RESTARTS)
    p.add_argument("--bootstrap", type=common.number(int, "[0, 100000]"), default=fit.N_BOOT)
    a = p.parse_args()
    bench(a.seed, a.restarts, a.bootstrap)
