"""
flops.py -- the exact parameter / FLOP / token accounting of the iso-depth looped transformer (stdlib only).

Implements paper §3.2 (n_b, n_i, N_once, N_rec, Eq. 1), App. E (Table 6 grid), App. G.1 (Eq. 6 truncated BPTT,
Eq. 7 hyperconnections), App. F.4 (N_eff example), Eq. 3's N_eff, and the inference-cost comparison of the earlier
arXiv version (its App. D). Counting follows the authors' code: N includes every RMSNorm gain, the vocabulary is
padded to a multiple of 64, attention costs 12·d·T per executed layer at the full T.
Run:   python flops.py grid [--json] [--mfu 0.4 --peak-flops 989e12]
       python flops.py costs --scale 34 --context 4096 [--json]
       one config's N_once, N_rec, F and tokens: python train.py --plan --scale 10 --n-loops 4 --flops-budget 1e18
       (its CLI is generated from ModelConfig, so a forked field is counted there with no flag added here)
Test:  pytest tests/test_flops.py
Not here: the model (model.py builds what these formulas count), learning rates (optim.py), fits (fit.py).
"""
import argparse
import json
import math

from common import Parser, number

V_LLAMA = 32001            # Llama-2's 32,000 pieces + <|assistant_end|> (architecture §1); padded to 32,064
SEQ_LEN = 2048             # T, Table 4
BATCH_TOKENS = 262144      # B = 128 rows x 2048 tokens per optimizer step (App. D)
ASPECT_RATIO = 64          # d_model = 64 s (§3.1)
# The injection modes (App. C.2 / G.1 / A (Parcae)), defined here once: model.py and train.py import this tuple.
# "random" state init is not a mode; it counts as its injection.
INJECTIONS = ("linear", "additive", "passthrough", "hyper", "diagonal")
MAX_COUNT = 10 ** 9        # any count above this (a hand-edited 1e400 layers) is a typo, not an architecture

# Table 6 (App. E): compute budget C (FLOPs) -> widths s swept at that budget. 29 cells x 4 values of r = 116 runs.
GRID = {4.64e17: (6, 8, 10, 12), 1e18: (6, 8, 10, 12, 14), 2.15e18: (8, 10, 12, 14, 16),
        4.64e18: (10, 12, 14, 16, 18, 20), 1e19: (12, 16, 18, 20, 24), 2.15e19: (18, 24, 28, 34)}
LOOPS = (1, 2, 4, 8)
# Effective-depth variants (earlier arXiv version, App. G.4): l_eff -> (l_prelude, l_coda), keeping r·l_recur = 16.
DEPTH_VARIANTS = {18: (1, 1), 20: (2, 2), 24: (4, 4)}


# -----------------------------------------------------------------------------
# One map from a model configuration to the accounting (issue 18, issue 24 §7). Every count below is a function of
# these fields and nothing else. A ModelConfig field that changes N_once, N_rec or F joins ACCOUNTING with the values
# it may take, and param_split / flops_per_token as a keyword of the same name: train.py, eval.py, fit.py and the
# tests pick it up from here. Allowed values: an int field's smallest value (counts stop at MAX_COUNT), a str
# field's choices, or the type bool / float (a default-off switch, a finite scale).
ACCOUNTING = {"d_model": 1, "n_loops": 1, "n_layers_eff": 1, "n_layers_prelude": 0, "n_layers_coda": 0,
              "injection": INJECTIONS, "hc_lanes": 1, "n_loops_bwd": 1, "seq_len": 1, "vocab_size": 1}


def _why_not(rule, v):
    """None if v is allowed by an ACCOUNTING rule, else what it must be."""
    if rule is bool:
        return None if isinstance(v, bool) else "true or false"
    if rule is float:               # bool is an int in Python: a JSON true is not a number
        ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
        return None if ok else "a finite number"
    if isinstance(rule, tuple):
        return None if v in rule else f"one of {rule}"
    ok = isinstance(v, int) and not isinstance(v, bool) and rule <= v <= MAX_COUNT
    return None if ok else f"an integer in [{rule}, {MAX_COUNT:.0e}]"


def accounting_args(cfg) -> dict:
    """The kwargs param_split and flops_per_token take, from a ModelConfig (or any object with its fields) or a dict
    of its fields (done.json's model_config). d_model is aspect_ratio x scale (else cfg's d_model). Fields cfg lacks
    (or sets to None: n_loops_bwd = None is full BPTT) are left out, so the paper's defaults apply.

    THE check of an architecture's counted fields, wherever it enters (ModelConfig.__post_init__, a record fit.py
    reads): each value against ACCOUNTING, then the rules across fields (a layout that exists, the
    BPTT window). A bad value is a ValueError naming the field; the formulas below trust their arguments."""
    get = cfg.get if isinstance(cfg, dict) else vars(cfg).get       # vars: fields, not ModelConfig's properties
    out = {k: get(k) for k in ("scale", "aspect_ratio", *ACCOUNTING) if get(k) is not None}
    for k, v in out.items():
        why = _why_not(ACCOUNTING.get(k, 1), v)                     # scale and aspect_ratio: integers >= 1
        if why:
            raise ValueError(f"{k} must be {why}, got {v!r:.40}")
    scale, aspect = out.pop("scale", None), out.pop("aspect_ratio", ASPECT_RATIO)
    if scale is not None:
        out["d_model"] = aspect * scale
    r, k, mode = out.get("n_loops"), out.get("n_loops_bwd"), out.get("injection")
    if r is not None:               # the layout must exist (r | 16, whole recurrent blocks): layout says why not
        layout(r, out.get("n_layers_eff", 20), out.get("n_layers_prelude", 2), out.get("n_layers_coda", 2))
        if k is not None and k > r:
            raise ValueError(f"n_loops_bwd={k} must be None (full BPTT) or in [1, n_loops={r}]")
        if r > 1 and mode == "hyper" and out.get("hc_lanes", 2) < 2:
            raise ValueError("hc_lanes must be >= 2 with hyperconnections (K = 1 is a plain residual; App. G.1)")
        if r > 1 and mode == "hyper" and k not in (None, r):
            raise ValueError("hyperconnections use full BPTT (App. G.1); n_loops_bwd must be None or n_loops")
    return out


# -----------------------------------------------------------------------------
# Layout and parameters (§3.1, §3.2)

def pad_vocab(vocab_size: int) -> int:
    """Rows of wte / lm_head: vocab rounded up to a multiple of 64 (32,001 -> 32,064; Table 4)."""
    return -(-vocab_size // 64) * 64


def layout(n_loops, n_layers_eff=20, n_layers_prelude=2, n_layers_coda=2):
    """(prelude, recur, coda) block counts with l_eff = l_p + r·l_recur + l_c (§3.1, iso-depth); ValueError for a
    layout that does not exist (counts r >= 1, l_eff, l_p, l_c >= 0 checked by the caller: accounting_args)."""
    if 16 % n_loops != 0:       # r must divide 16 (r_max = 16, §6): r in {1, 2, 4, 8, 16}
        raise ValueError(f"n_loops={n_loops} must divide 16")
    if n_loops == 1:            # the baseline: one plain stack of l_eff blocks, no prelude / coda / injection
        return 0, n_layers_eff, 0
    looped = n_layers_eff - n_layers_prelude - n_layers_coda
    if looped <= 0 or looped % n_loops != 0:
        raise ValueError(f"n_layers_eff - prelude - coda = {looped} must be a positive multiple of n_loops={n_loops}")
    return n_layers_prelude, looped // n_loops, n_layers_coda


def n_b(d_model):
    """§3.2: one block's matrices, 4 d x d attention projections + d -> 4d -> d MLP = 12 d^2."""
    return 12 * d_model * d_model


def n_i(d_model):
    """§3.2 / Eq. 5: the d x 2d linear injection W_inject = 2 d^2."""
    return 2 * d_model * d_model


def n_inject(d_model, injection):
    """Parameters of the state injection, all recurrent (used every iteration): W_inject 2 d^2 (Eq. 5, linear);
    diagonal (Parcae, App. A: u = exp(-Delta A) h + Delta (B e)): B d^2 + A_log d + dt_bias d; the other modes 0
    (hc's per-iteration scalars are counted once, in N_once). The one place a new injection adds its count."""
    return {"linear": n_i(d_model), "diagonal": d_model * d_model + 2 * d_model}.get(injection, 0)


def _counts(d_model, n_loops, n_layers_eff, n_layers_prelude, n_layers_coda, injection, hc_lanes):
    """The counts param_split and flops_per_token share: (mode, (prelude, recur, coda) blocks, one block's
    parameters, the recurrent parameters N_rec run every iteration, the hc scalars)."""
    mode = "passthrough" if n_loops == 1 else injection             # r = 1 never has an injection
    p, rec, c = layout(n_loops, n_layers_eff, n_layers_prelude, n_layers_coda)
    block = n_b(d_model) + 2 * d_model                               # matrices + 2 RMSNorm gains
    n_rec = rec * block + n_inject(d_model, mode)                    # W_inject / diagonal, used every iteration
    n_hc = n_loops * (hc_lanes ** 2 + 2 * hc_lanes) if mode == "hyper" else 0   # alpha_i, M_i, beta_i (Eq. 7)
    return mode, (p, rec, c), block, n_rec, n_hc


def param_split(d_model, n_loops, n_layers_eff=20, n_layers_prelude=2, n_layers_coda=2, injection="linear",
                hc_lanes=2, n_loops_bwd=None, seq_len=SEQ_LEN, vocab_size=V_LLAMA):
    """(N_once, N_rec), non-embedding, norm gains included. Takes flops_per_token's arguments (accounting_args);
    the BPTT window, T and V change FLOPs, not the non-embedding parameters.

    Convention (Table 6 / the authors' parameter count = all parameters - wte - lm_head): each block is n_b plus its
    two RMSNorm gains (2d); the 3 model-level norms (after wte, end of every loop, before lm_head) add 3d. With this
    N = N_once + N_rec reproduces all 44 N cells of Table 6; the §3.2 matrices alone miss 12 of them by 0.1M.
    Split for Eq. 3 (architecture §8.1): N_once = prelude + coda blocks + 3 model norms + the r(K^2+2K) hc scalars
    (each used once); N_rec = recur blocks + the injection (n_inject: W_inject, or diagonal B, A_log, dt_bias).
    For r = 1 the split is irrelevant (r^phi = 1); the same rule gives N_once = 3d, N_rec = 20 blocks.
    """
    _, (p, _, c), block, n_rec, n_hc = _counts(d_model, n_loops, n_layers_eff, n_layers_prelude, n_layers_coda,
                                               injection, hc_lanes)
    return (p + c) * block + 3 * d_model + n_hc, n_rec               # N_once: + 3 model norms + hc scalars


def effective_params(n_once, n_rec, n_loops, phi):
    """Eq. 3: N_eff = N_once + r^phi · N_rec, the non-looped size a looped model matches at equal D."""
    return n_once + n_loops ** phi * n_rec


# -----------------------------------------------------------------------------
# FLOPs per token and tokens per budget (Eq. 1, 6, 7; App. C.2)

def flops_per_token(d_model, n_loops, n_layers_eff=20, n_layers_prelude=2, n_layers_coda=2, injection="linear",
                    hc_lanes=2, n_loops_bwd=None, seq_len=SEQ_LEN, vocab_size=V_LLAMA):
    """F_train per token, counted as the authors' code does (forward-only: forward_flops_per_token).

    Eq. 1 (6 N_exec) + the terms §3.2 leaves out of the equation but includes in every reported FLOP count:
      6·(prelude + coda blocks) + [2(r-k) + 6k]·(recur blocks + injection)      Eq. 1; Eq. 6 when k < r
      + 12·d·T·(l_p + l_c) + [4(r-k) + 12k]·d·T·l_recur                         attention, full T (no causal /2)
      + 6·d·V_pad                                                               unembedding, V padded to 64
      + 6·r·(K^2 + 2K)·d                                                        hyperconnection mixing (Eq. 7)
    Block gains count like weights (r times in the loop); wte and the 3 model norms are not counted. Detached loops
    (k = n_loops_bwd < r, truncated BPTT) cost forward only, attention included: that gives D_trunc/D_full ~ 1.31.
    """
    mode, (p, rec, c), block, p_rec, n_hc = _counts(d_model, n_loops, n_layers_eff, n_layers_prelude, n_layers_coda,
                                                    injection, hc_lanes)       # p_rec = N_rec: recur + injection
    k = n_loops if n_loops_bwd is None else n_loops_bwd             # gradient window (App. G.1); None = full BPTT
    d, T = d_model, seq_len
    # The injection is charged in every iteration (footnote 2), its loop-invariant half included: W_e e of the linear
    # injection and B e of the diagonal one could be hoisted out of the loop (computed once: 6 d^2 instead of
    # 6 r d^2 per token for B e), but the paper charges W_inject r times and model.py computes both per iteration,
    # so one convention covers every mode. The diagonal's elementwise decay / scale count like gains (6x per use).
    mult = 2 * (n_loops - k) + 6 * k                                  # Eq. 6: fwd-only 2x, fwd+bwd 6x
    flops = 6 * (p + c) * block + mult * p_rec
    flops += 12 * d * T * (p + c) + (4 * (n_loops - k) + 12 * k) * d * T * rec
    return flops + 6 * d * pad_vocab(vocab_size) + 6 * n_hc * d      # unembedding; hyperconnection mixing (Eq. 7)


def forward_flops_per_token(d_model, n_loops, **arch):
    """F_fwd per token (Eq. 1): every term of the full-BPTT F_train is forward 2x + backward 4x, so F_train = 3 F_fwd.
    arch: flops_per_token's other arguments (accounting_args). At inference seq_len is the context the new token
    attends over (full-T convention, as in training); the gradient window n_loops_bwd has no effect on a forward."""
    return flops_per_token(d_model, n_loops, **{**arch, "n_loops_bwd": None}) // 3


def tokens_for_budget(flops_budget, flops_per_token, batch_tokens=BATCH_TOKENS):
    """The authors' horizon rule: steps = round(C / (F·B)), D = steps·B (gives Table 5 exactly); ValueError when the
    budget buys no step."""
    steps = round(flops_budget / (flops_per_token * batch_tokens))
    if steps < 1:
        raise ValueError(f"budget {flops_budget:.3g} is below one step ({flops_per_token * batch_tokens:.3g} FLOPs)")
    return steps, steps * batch_tokens


# -----------------------------------------------------------------------------
# The grid (Table 6) and the F.4 example

def grid_runs(loops=LOOPS, n_layers_eff=20, injection="linear", batch_tokens=BATCH_TOKENS, aspect_ratio=ASPECT_RATIO):
    """One dict per (budget, r, s) run of Table 6 (116 for the default loops). n_layers_eff 18 / 24 gives the
    effective-depth variants with (prelude, coda) from DEPTH_VARIANTS."""
    p, c = DEPTH_VARIANTS[n_layers_eff]
    runs = []
    for budget, widths in GRID.items():
        for r in loops:
            for s in widths:
                d, kw = aspect_ratio * s, (n_layers_eff, p, c, injection)
                (n_once, n_rec), f = param_split(d, r, *kw), flops_per_token(d, r, *kw)
                steps, tokens = tokens_for_budget(budget, f, batch_tokens)
                runs.append(dict(flops_budget=budget, n_loops=r, scale=s, d_model=d, n_once=n_once, n_rec=n_rec,
                                 n_params=n_once + n_rec, flops_per_token=f, tokens=tokens, steps=steps))
    return runs


def f4_example(n_loops=4, phi=0.46):
    """App. F.4 in units of n_b (width-free ratios against the non-looped l_eff = 20 model).

    unique: N(r)/N(1) with n_i (98/240 = 0.408, "~410M" per 1B). n_eff_no_ni: (4 + r^phi l_recur)/20 = 0.578, the
    paper's "~580M": it drops n_i from N_rec. n_eff: the same with n_i in N_rec, as the joint fit defines it = 0.594.
    """
    eff = 20                                                           # the r=1 model: 20 n_b
    p, rec, c = layout(n_loops, eff)
    ni = n_i(1) / n_b(1)                                               # n_i = n_b / 6
    return dict(unique=(p + rec + c + ni) / eff, unique_no_ni=(p + rec + c) / eff,
                n_eff_no_ni=effective_params(p + c, rec, n_loops, phi) / eff,
                n_eff=effective_params(p + c, rec + ni, n_loops, phi) / eff,
                flops=(p + c + n_loops * (rec + ni)) / eff)             # Eq. 1 ratio: 1 + r/120


# -----------------------------------------------------------------------------
# Inference costs: iso-depth vs iso-parameter (earlier arXiv version, App. D)

def inference_costs(scale, context=4096, loops=LOOPS, vocab_size=32000, aspect_ratio=ASPECT_RATIO):
    """Per-architecture bf16 weight bytes (embeddings included), KV-cache bytes per sequence, forward FLOPs per
    token at `context`; plus the iso-parameter model of the largest r (l_recur = 16, r x the layers, same N).
    vocab_size defaults to the earlier version's 32,000 (a multiple of 64, so no padding); loops must hold r = 1,
    the baseline of the ratios."""
    d, v = aspect_ratio * scale, pad_vocab(vocab_size)
    r_max = max(loops)
    configs = [(f"r={r}", r, 20) for r in loops] + [(f"iso-param r={r_max}", r_max, 4 + 16 * r_max)]
    rows = []
    for name, r, eff in configs:
        n_once, n_rec = param_split(d, r, eff)
        rows.append(dict(model=name, n_loops=r, layers_exec=eff, n_params=n_once + n_rec,
                         weight_bytes=2 * (n_once + n_rec + 2 * v * d),          # bf16; untied wte + lm_head
                         kv_bytes=2 * eff * context * d * 2,                      # K and V, one slot per executed layer
                         fwd_flops=forward_flops_per_token(d, r, n_layers_eff=eff, seq_len=context, vocab_size=v)))
    base = rows[list(loops).index(1)]
    for row in rows:
        for key in ("layers_exec", "weight_bytes", "kv_bytes", "fwd_flops"):
            row[key + "_x"] = row[key] / base[key]
    return rows


# -----------------------------------------------------------------------------
# CLI

def main(argv=None):
    ap = Parser(prog="flops.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True, parser_class=Parser)
    g = sub.add_parser("grid", help="Table 6 and the 116-run list")
    g.add_argument("--n-layers-eff", type=int, default=20, choices=sorted(DEPTH_VARIANTS))
    # bounded below too: --mfu 1e-300 --peak-flops 1e-300 would underflow to a division by zero
    g.add_argument("--mfu", type=number(float, "[1e-6, 1]"), default=None, help="plan GPU-hours at this model FLOPs "
                   "utilisation, in [1e-6, 1]")
    g.add_argument("--peak-flops", type=number(float, "[1e6, 1e20]"), default=989e12,
                   help="per-GPU peak FLOP/s (default H100 bf16 dense)")
    k = sub.add_parser("costs", help="inference costs, iso-depth vs iso-parameter")
    k.add_argument("--scale", type=number(int, "[1, 1e6]"), default=34)
    k.add_argument("--context", type=number(int, "[1, 1e9]"), default=4096)
    for sp in (g, k):
        sp.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    out = grid_runs(n_layers_eff=a.n_layers_eff) if a.cmd == "grid" else inference_costs(a.scale, a.context)
    if a.json:
        print(json.dumps(out, indent=1))
    elif a.cmd == "grid":
        _print_grid(out, a.mfu, a.peak_flops)
    else:
        print(f"inference at s={a.scale} (d={ASPECT_RATIO * a.scale}), context {a.context}, bf16, V=32000")
        for r in out:
            print(f"{r['model']:>16} | layers {r['layers_exec']:3d} ({r['layers_exec_x']:.1f}x) | N "
                  f"{r['n_params'] / 1e6:7.1f}M | weights {r['weight_bytes'] / 1e9:.2f} GB | KV "
                  f"{r['kv_bytes'] / 1e6:6.0f} MB ({r['kv_bytes_x']:.1f}x) | fwd {r['fwd_flops'] / 1e9:.2f} "
                  f"GFLOP/token ({r['fwd_flops_x']:.3f}x)")
    return 0


def _print_grid(runs, mfu, peak_flops):
    """Table 6: N (M) per (s, r) and r=1 tokens (B) per (s, C); then every run; then the GPU-hour plan."""
    loops = sorted({x["n_loops"] for x in runs})
    print("   s      d " + "".join(f"  N r={r:<3}" for r in loops) + "".join(f"{'D@%.3g' % c:>11}" for c in GRID))
    for s in sorted({x["scale"] for x in runs}):
        cell = {(x["flops_budget"], x["n_loops"]): x for x in runs if x["scale"] == s}    # this width's runs
        row = {r: x for (_, r), x in cell.items()}                                       # d and N do not depend on C
        print(f"{s:4d} {row[loops[0]]['d_model']:6d} " + "".join(f"{row[r]['n_params'] / 1e6:9.1f}" for r in loops)
              + "".join(f"{cell[c, 1]['tokens'] / 1e9:11.2f}" if (c, 1) in cell else f"{'-':>11}" for c in GRID))
    print(f"\n{len(runs)} runs: flops_budget n_loops scale d_model n_params tokens steps")
    for x in runs:
        print(f"{x['flops_budget']:9.3g} {x['n_loops']:2d} {x['scale']:3d} {x['d_model']:5d} {x['n_params']:12,d} "
              f"{x['tokens']:15,d} {x['steps']:7d}")
    if mfu is not None:   # planner: executed FLOPs = steps·B·F per run, at mfu x peak per GPU
        total = sum(x["tokens"] * x["flops_per_token"] for x in runs)
        print(f"\nplan: {total:.3e} FLOPs at MFU {mfu:.2f} x {peak_flops:.3g} FLOP/s = "
              f"{total / (mfu * peak_flops) / 3600:,.0f} GPU-hours")


if __name__ == "__main__":
    raise SystemExit(main())
