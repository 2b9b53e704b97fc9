"""
Tests for flops.py: the paper's printed counts, reproduced from the formulas (issue 2, acceptance items 1-4).

Every number below is transcribed from the paper (Tables 5 and 6, §3.1, App. F.4, the earlier version's App. D) or
from the exact integers of the authors' counting; nothing is read from disk. stdlib + pytest only, no torch.
Test: pytest tests/test_flops.py
"""
import ast
import inspect
import json
import os
import statistics
import types

import pytest

import flops

# -----------------------------------------------------------------------------
# Table 6 (App. E), as printed: s -> N (M) for r = 1, 2, 4, 8

TABLE6_N = {
    6: (35.4, 21.5, 14.5, 10.9),
    8: (62.9, 38.3, 25.7, 19.4),
    10: (98.3, 59.8, 40.2, 30.3),
    12: (141.6, 86.1, 57.8, 43.7),
    14: (192.7, 117.2, 78.7, 59.4),
    16: (251.7, 153.1, 102.8, 77.6),
    18: (318.6, 193.8, 130.1, 98.2),
    20: (393.3, 239.2, 160.6, 121.3),
    24: (566.3, 344.5, 231.2, 174.6),
    28: (770.8, 468.9, 314.7, 237.7),
    34: (1136.5, 691.4, 464.1, 350.4),
}
# Table 6's token column (B tokens, r = 1): (s, budget) -> printed D
TABLE6_D_R1 = {
    (6, 4.64e17): 0.98, (8, 4.64e17): 0.64, (10, 4.64e17): 0.45, (12, 4.64e17): 0.34,
    (6, 1e18): 2.10, (8, 1e18): 1.36, (10, 1e18): 0.97, (12, 1e18): 0.72, (14, 1e18): 0.56,
    (8, 2.15e18): 2.95, (10, 2.15e18): 2.08, (12, 2.15e18): 1.55, (14, 2.15e18): 1.20, (16, 2.15e18): 0.96,
    (10, 4.64e18): 4.49, (12, 4.64e18): 3.34, (14, 4.64e18): 2.59, (16, 4.64e18): 2.07, (18, 4.64e18): 1.70,
    (20, 4.64e18): 1.42,
    (12, 1e19): 7.13, (16, 1e19): 4.43, (18, 1e19): 3.62, (20, 1e19): 3.05, (24, 1e19): 2.20,
    (18, 2.15e19): 7.78, (24, 2.15e19): 4.71, (28, 2.15e19): 3.58, (34, 2.15e19): 2.52,
}
LOOPS = (1, 2, 4, 8)


def n_params(d, r, **kw):
    n_once, n_rec = flops.param_split(d, r, **kw)
    return n_once + n_rec


# -----------------------------------------------------------------------------
# Acceptance 1: parameters

def test_table6_all_44_n_cells():
    # N includes every RMSNorm gain (2d per block + 3d model norms); matrices alone would miss 12 cells by 0.1M
    cells = 0
    for s, row in TABLE6_N.items():
        for r, want in zip(LOOPS, row):
            got = n_params(64 * s, r) / 1e6
            assert round(got, 1) == want, f"s={s} r={r}: {got:.3f}M, Table 6 prints {want}M"
            cells += 1
    assert cells == 44
    print(f"all {cells} N cells of Table 6 match to 0.1M")


def test_section31_example_exact_integers():
    # §3.1: at s=10, N in {98.3, 59.8, 40.2, 30.3}M; exact counts with gains (architecture §8.1)
    want = {1: 98_331_520, 2: 59_818_880, 4: 40_152_960, 8: 30_320_000}
    for r, n in want.items():
        got = n_params(640, r)
        assert got == n, (r, got)
        print(f"s=10 r={r}: N = {got:,} = {got / 1e6:.1f}M")
    assert [round(want[r] / 1e6, 1) for r in LOOPS] == [98.3, 59.8, 40.2, 30.3]


def test_closed_form_and_split():
    # N = k_r d^2 + m_r d with k = 240/146/98/74, m = 43/27/19/15 (architecture §8.1), for every grid width
    k, m = {1: 240, 2: 146, 4: 98, 8: 74}, {1: 43, 2: 27, 4: 19, 8: 15}
    for s in TABLE6_N:
        d = 64 * s
        for r in LOOPS:
            assert n_params(d, r) == k[r] * d * d + m[r] * d
    # the split at s=10, r=4: N_once = 4 blocks + 3 norms, N_rec = 4 blocks + W_inject (n_b = 12d^2, n_i = 2d^2)
    d = 640
    assert flops.n_b(d) == 12 * d * d and flops.n_i(d) == 2 * d * d
    assert flops.param_split(d, 4) == (4 * (12 * d * d + 2 * d) + 3 * d, 4 * (12 * d * d + 2 * d) + 2 * d * d)
    # parameter-free modes drop n_i; hyperconnections add r(K^2+2K) scalars (16/32/64 at K=2) to N_once
    for r in (2, 4, 8):
        base = n_params(d, r, injection="additive")
        assert base == n_params(d, r) - 2 * d * d == n_params(d, r, injection="passthrough")
        assert n_params(d, r, injection="hyper") - base == {2: 16, 4: 32, 8: 64}[r]
    # r=1 is the 0-20-0 baseline whatever prelude/coda/injection say
    assert flops.layout(1, 20, 5, 3) == (0, 20, 0)
    assert {n_params(d, 1, injection=m) for m in flops.INJECTIONS} == {98_331_520}
    assert flops.pad_vocab(32001) == 32064 and flops.pad_vocab(32000) == 32000


# Bad architectures are refused once, where a config enters the accounting (accounting_args: ModelConfig, a record
# fit.py reads, the CLI); the formulas themselves trust their arguments (issue 24 §3).
BAD = {
    "r=3 (16 % r != 0)": dict(n_loops=3),
    "r=32 (16 % r != 0)": dict(n_loops=32),
    "r=0": dict(n_loops=0),
    "r not an int": dict(n_loops=2.0),
    "17 looped layers, r=2": dict(n_loops=2, n_layers_coda=1),
    "no recurrent layer": dict(n_loops=2, n_layers_eff=4),
    "negative prelude": dict(n_loops=2, n_layers_prelude=-1),
    "unknown injection": dict(injection="gated"),
    "hc with one lane": dict(injection="hyper", hc_lanes=1),
    "d_model=0": dict(d_model=0),
    "n_loops_bwd > r": dict(n_loops_bwd=5),
    "n_loops_bwd=0": dict(n_loops_bwd=0),
    "hc truncated": dict(injection="hyper", n_loops_bwd=2),
    "a switch that is not a bool": dict(n_loops=1, n_layers_eff=True),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_architecture_refused_at_the_mapping(case):
    with pytest.raises(ValueError) as err:
        flops.accounting_args({"d_model": 640, "n_loops": 4, **BAD[case]})
    print(f"{case}: {err.value}")
    assert "\n" not in str(err.value)


def test_budget_below_one_step_raises():
    with pytest.raises(ValueError, match="below one step"):
        flops.tokens_for_budget(1e12, flops.flops_per_token(640, 4))


# -----------------------------------------------------------------------------
# Acceptance 2: FLOPs and tokens

def test_flops_s10_table_and_s34():
    # architecture §8.2: F_train per token at s=10 (d=640) for r = 1, 2, 4, 8
    d = 640
    rows = {
        "linear": [1_027_676_160, 1_037_506_560, 1_047_336_960, 1_066_997_760],
        "additive": [1_027_676_160] * 4,
        "passthrough": [1_027_676_160] * 4,
        "hyper": [1_027_676_160, 1_027_737_600, 1_027_799_040, 1_027_921_920],
    }
    for mode, want in rows.items():
        got = [flops.flops_per_token(d, r, injection=mode) for r in LOOPS]
        assert got == want, (mode, got)
        print(f"{mode:>11}: {got}")
    trunc = [flops.flops_per_token(d, r, n_loops_bwd=-(-r // 2)) for r in (2, 4, 8)]   # k = ceil(r/2)
    assert trunc == [793_016_320, 799_569_920, 812_677_120], trunc
    print(f"  truncated: {trunc}")
    # s=34 (d=2176), linear
    assert flops.flops_per_token(2176, 1) == 8_307_062_784
    assert flops.flops_per_token(2176, 4) == 8_534_341_632
    # closed form F = c_r d^2 + 684,144 d, c_r = 1440 + 12r (r > 1), for every width of the grid
    for s in TABLE6_N:
        d = 64 * s
        for r in LOOPS:
            c = 1440 if r == 1 else 1440 + 12 * r
            assert flops.flops_per_token(d, r) == c * d * d + 684_144 * d
    # Eq. 1: F_train = 3 F_fwd (forward 2x, backward 4x on every term), whatever the injection
    for mode, want in rows.items():
        assert [3 * flops.forward_flops_per_token(640, r, injection=mode) for r in LOOPS] == want
    # the injection overhead on the matmul term is exactly r/120 (Eq. 1, footnote 2)
    assert flops.f4_example(4)["flops"] == pytest.approx(1 + 4 / 120)


def test_table5_tokens():
    # Table 5 (s=10, r=4, C=1e18): linear 955M; additive, passthrough, hyperconnections 973M
    f_lin = flops.flops_per_token(640, 4)
    assert flops.tokens_for_budget(1e18, f_lin) == (3642, 954_728_448)
    for mode in ("additive", "passthrough", "hyper"):
        assert flops.tokens_for_budget(1e18, flops.flops_per_token(640, 4, injection=mode)) == (3712, 973_078_528)
    print("Table 5 tokens: linear 954,728,448 (955M); parameter-free / hc 973,078,528 (973M)")


def test_table6_r1_tokens_within_3pct():
    # Table 6's token column is not one architecture. Compared cell by cell with steps = round(C / (F B)) (the rule
    # that gives Table 5 exactly), 6 printed cells equal the r=4 count (e.g. s=34 @2.15e19: 2.52 = r=4's 2.519,
    # r=1 gives 2.588), 9 only the r=2 count, 3 an older 2-16-2 r=1 layout with inject, only 3 the r=1 count, and
    # 3 match nothing; no single change of V, T, rounding or norm counting fits all 29 (architecture §8.5). So we
    # keep the code's rule and check the printed column only to 3% (the worst cell is 2.6% off).
    worst = 0.0
    for (s, budget), printed in TABLE6_D_R1.items():
        _, tokens = flops.tokens_for_budget(budget, flops.flops_per_token(64 * s, 1))
        worst = max(worst, abs(tokens / 1e9 - printed) / printed)
    assert len(TABLE6_D_R1) == 29
    assert worst < 0.03, worst
    print(f"Table 6 r=1 tokens: worst deviation {worst:.2%}")


def test_grid_116_runs():
    runs = flops.grid_runs()
    assert len(runs) == 116
    assert {(x["scale"], x["flops_budget"]) for x in runs if x["n_loops"] == 1} == set(TABLE6_D_R1)
    for r in LOOPS:   # budget halves of App. F.3: 14 cells per r at C <= 2.15e18, 15 above
        assert sum(x["n_loops"] == r and x["flops_budget"] <= 2.15e18 for x in runs) == 14
        assert sum(x["n_loops"] == r and x["flops_budget"] > 2.15e18 for x in runs) == 15
    x = next(x for x in runs if (x["flops_budget"], x["n_loops"], x["scale"]) == (1e18, 4, 10))
    assert (x["tokens"], x["steps"], x["n_params"]) == (954_728_448, 3642, 40_152_960)
    # effective-depth variants (earlier version, App. G.4): 18 = 1 + 16 + 1 and 24 = 4 + 16 + 4, r·l_recur = 16
    assert [flops.layout(r, 18, 1, 1) for r in LOOPS] == [(0, 18, 0), (1, 8, 1), (1, 4, 1), (1, 2, 1)]
    assert [flops.layout(r, 24, 4, 4) for r in LOOPS] == [(0, 24, 0), (4, 8, 4), (4, 4, 4), (4, 2, 4)]
    for eff in (18, 24):
        v = flops.grid_runs(n_layers_eff=eff)
        assert len(v) == 116
        y = next(y for y in v if (y["flops_budget"], y["n_loops"], y["scale"]) == (1e18, 1, 10))
        assert y["n_params"] == eff * (12 * 640 ** 2 + 2 * 640) + 3 * 640


def test_truncation_token_ratio():
    # App. G.1: D_trunc / D_full median 1.315; detached loops counted forward-only, attention included
    ratios = {}
    for r in (2, 4, 8):
        full = flops.flops_per_token(640, r)
        trunc = flops.flops_per_token(640, r, n_loops_bwd=-(-r // 2))
        ratios[r] = full / trunc
    assert [round(ratios[r], 3) for r in (2, 4, 8)] == [1.308, 1.310, 1.313], ratios
    grid = []
    for budget, widths in flops.GRID.items():
        for r in (2, 4, 8):
            for s in widths:
                full = flops.tokens_for_budget(budget, flops.flops_per_token(64 * s, r))[1]
                trunc = flops.tokens_for_budget(budget, flops.flops_per_token(64 * s, r, n_loops_bwd=-(-r // 2)))[1]
                grid.append(trunc / full)
    med = statistics.median(grid)
    assert abs(med - 1.315) < 0.01, med
    print(f"D_trunc/D_full at s=10: {ratios}; median over the grid {med:.3f} (paper 1.315)")


# -----------------------------------------------------------------------------
# Acceptance 3: inference costs (earlier arXiv version, App. D) and 4: App. F.4

def test_inference_costs_s34():
    rows = {x["model"]: x for x in flops.inference_costs(34, 4096)}
    r1, r8, iso = rows["r=1"], rows["r=8"], rows["iso-param r=8"]
    assert round(r1["weight_bytes"] / 1e9, 2) == 2.55     # bf16, V = 32,000, embeddings included
    assert round(r8["weight_bytes"] / 1e9, 2) == 0.98
    assert r1["kv_bytes"] == r8["kv_bytes"] == 713_031_680   # 2 * 20 * 4096 * 2176 * 2 B, the same for every r
    assert r8["fwd_flops"] / r1["fwd_flops"] < 1.05           # "< 5%" at 4k context
    assert round(r8["fwd_flops_x"], 3) == 1.048
    assert iso["layers_exec"] == 132 and iso["layers_exec_x"] == pytest.approx(6.6)   # 4 + 8 * 16 layers
    assert iso["kv_bytes_x"] == pytest.approx(6.6)
    assert round(iso["fwd_flops_x"], 2) == 6.40
    assert abs(iso["n_params"] / r1["n_params"] - 1) < 0.01    # iso-parameter: 242 d^2 vs 240 d^2
    print(f"weights {r1['weight_bytes'] / 1e9:.3f} / {r8['weight_bytes'] / 1e9:.3f} GB; r=8 fwd "
          f"{r8['fwd_flops_x']:.4f}x; iso-param {iso['layers_exec_x']:.1f}x layers, {iso['fwd_flops_x']:.3f}x "
          f"FLOPs, {iso['kv_bytes_x']:.1f}x KV")


def test_f4_example():
    # App. F.4: r=4, phi=0.46: a ~410M looped model (per 1B non-looped) acts like a ~580M one.
    # 0.578 ("~580M") comes from N_rec = l_recur n_b WITHOUT n_i; with n_i in N_rec (the fit's definition) it is 0.594
    ex = flops.f4_example(n_loops=4, phi=0.46)
    assert round(ex["unique"], 3) == 0.408 and ex["unique_no_ni"] == pytest.approx(0.40)
    assert round(ex["n_eff_no_ni"], 3) == 0.578
    assert round(ex["n_eff"], 3) == 0.594
    assert flops.effective_params(10, 5, 4, 0.5) == 20.0 and flops.effective_params(10, 5, 8, 0.0) == 15
    print(f"F.4: unique {ex['unique']:.3f}, N_eff {ex['n_eff_no_ni']:.3f} (no n_i) / {ex['n_eff']:.3f} (with n_i)")


# -----------------------------------------------------------------------------
# CLI, called in-process

def test_cli(capsys):
    assert flops.main(["grid", "--json"]) == 0
    runs = json.loads(capsys.readouterr().out)
    keys = {"flops_budget", "n_loops", "scale", "d_model", "n_once", "n_rec", "n_params", "flops_per_token",
            "tokens", "steps"}
    assert len(runs) == 116 and all(set(x) == keys for x in runs)
    assert flops.main(["grid", "--mfu", "0.4", "--peak-flops", "989e12"]) == 0
    out = capsys.readouterr().out
    assert "98.3" in out and "1136.5" in out and "GPU-hours" in out
    assert flops.main(["costs", "--scale", "34", "--context", "4096", "--json"]) == 0
    costs = json.loads(capsys.readouterr().out)
    assert [x["layers_exec"] for x in costs] == [20, 20, 20, 20, 132]
    assert flops.main(["costs", "--scale", "34", "--context", "4096"]) == 0
    assert "2.55 GB" in capsys.readouterr().out
    for argv in (["grid", "--mfu", "2"], ["costs", "--scale", "0"], ["params", "--scale", "10"]):
        with pytest.raises(SystemExit) as err:
            flops.main(argv)
        assert err.value.code != 0


def test_accounting_args_is_the_one_map_from_a_config():
    # param_split, flops_per_token and forward_flops_per_token take the same arguments, and accounting_args builds
    # them from a ModelConfig-like object or a done.json model_config dict (d_model = aspect_ratio x scale)
    sig = [list(inspect.signature(f).parameters) for f in (flops.param_split, flops.flops_per_token)]
    assert sig[0] == sig[1] == list(flops.ACCOUNTING)
    cfg = dict(scale=10, aspect_ratio=64, n_loops=4, n_layers_eff=20, n_layers_prelude=2, n_layers_coda=2,
               injection="hyper", hc_lanes=3, n_loops_bwd=None, seq_len=1024, vocab_size=1000, head_dim=128)
    acc = flops.accounting_args(cfg)
    assert acc == dict(d_model=640, **{k: v for k, v in cfg.items() if k in flops.ACCOUNTING and v is not None})
    obj = types.SimpleNamespace(**cfg, d_model=640)                          # ModelConfig has d_model as a property
    assert flops.accounting_args(obj) == acc
    assert flops.param_split(**acc) == flops.param_split(640, 4, injection="hyper", hc_lanes=3)
    assert flops.flops_per_token(**acc) == flops.flops_per_token(640, 4, injection="hyper", hc_lanes=3,
                                                                 seq_len=1024, vocab_size=1000)
    assert flops.accounting_args({"injection": "linear"}) == {"injection": "linear"}     # the rest: defaults
    for bad, culprit in (({"n_layers_eff": 10 ** 400}, "n_layers_eff must be an integer"),
                         ({"hc_lanes": True}, "hc_lanes must be an integer"), ({"scale": 2.5}, "scale must be"),
                         ({"injection": "gated"}, "injection must be one of")):
        with pytest.raises(ValueError, match=culprit):
            flops.accounting_args(bad)
    # every kind of field a variant may add (issue 24 §7): a bool switch, a float scale, checked by type
    rules = dict(flops.ACCOUNTING, switch=bool, gain=float)
    ok, bad = dict(switch=False, gain=0.5, n_loops=2), [dict(switch=1), dict(gain=True), dict(gain=float("nan"))]
    import unittest.mock
    with unittest.mock.patch.dict(flops.ACCOUNTING, rules):
        assert flops.accounting_args(ok) == ok
        for b in bad:
            with pytest.raises(ValueError, match=f"{next(iter(b))} must be"):
                flops.accounting_args(b)


def test_every_model_config_field_is_counted_or_listed():
    # the variant recipe (README): a ModelConfig field either changes a count -- it is in flops.ACCOUNTING, or is
    # scale / aspect_ratio, which make d_model -- or is listed here as changing neither N nor F. A new field in
    # neither list fails. model.py is parsed, not imported, so this file stays free of torch.
    tree = ast.parse(open(os.path.join(os.path.dirname(flops.__file__), "model.py")).read())
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "ModelConfig")
    fields = {s.target.id for s in cls.body if isinstance(s, ast.AnnAssign)}
    not_counted = {"head_dim", "state_init", "state_init_std", "logit_softcap", "rope_base", "norm_eps"}
    assert fields - not_counted == (set(flops.ACCOUNTING) - {"d_model"}) | {"scale", "aspect_ratio"}


def test_stdlib_only():
    # fit.py and the CLI must work without torch: importing flops (and common.py, its plumbing) pulls in nothing
    # outside the standard library, and fit.py adds numpy and scipy but never torch
    import subprocess
    import sys
    for mod, banned in (("flops", "{'torch', 'numpy', 'scipy'}"), ("fit", "{'torch'}")):
        code = f"import sys, {mod}; bad = {banned} & set(sys.modules); assert not bad, bad"
        subprocess.run([sys.executable, "-c", code], cwd=flops.__file__.rsplit("/", 1)[0], check=True)
