"""Tests for forking a looped variant (issue 14): the diagonal injection (App. A, after Parcae) end to end, test-time
loop sweeps (eval.py --n-loops-sweep), the paired delta-phi CI of a case study (fit.py --case) and the case-study
launch lists of runs/mini.sh --case NAME.

The exact identity tested: u = exp(-Delta A) h + Delta (B e) is the linear injection W_inject [e ; h] with
W_inject = [diag(Delta) B | diag(exp(-Delta A))]; a linear model holding that W_inject and the diagonal model's other
weights gives the same logits (fp32, 1e-5) at the trained r, at a test-time r' and with a seeded random state init.
Run: python -m pytest -q tests/test_variants.py -s
"""
import dataclasses
import json
import math
import os
import subprocess

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import eval as E
import fit
import flops
from conftest import ROOT
from model import DIAG_DECAY, LoopedGPT, ModelConfig
from optim import build_optimizer, hyperp_lrs

VOCAB = 128


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def tiny_cfg(**kw):
    """d = 32 (two heads of 16), l_eff = 10 in a 1-(8/r)-1 layout, vocab 128, T = 32."""
    base = dict(scale=2, aspect_ratio=16, head_dim=16, n_layers_eff=10, n_layers_prelude=1, n_layers_coda=1,
                vocab_size=VOCAB, seq_len=32, injection="diagonal")
    base.update(kw)
    return ModelConfig(**base)


def tokens(B=2, T=16, seed=0):
    return torch.randint(0, VOCAB, (B, T), generator=torch.Generator().manual_seed(seed))


def perturb(m, scale=0.1):
    """Move every parameter off its init, so no test passes by the identity-like initialisation."""
    with torch.no_grad():
        for p in m.parameters():
            p.add_(scale * torch.randn_like(p))
    return m


# -----------------------------------------------------------------------------
# Diagonal injection: accounting, optimizer labels, init

@pytest.mark.parametrize("r", [1, 2, 4, 8])
@pytest.mark.parametrize("state_init", ["prelude", "random"])
def test_diagonal_param_count_and_groups(r, state_init):
    cfg = tiny_cfg(n_loops=r, state_init=state_init)
    m = LoopedGPT(cfg)
    d = cfg.d_model
    n_model = sum(p.numel() for p in m.parameters()) - m.wte.weight.numel() - m.lm_head.weight.numel()
    want = flops.param_split(d, r, 10, 1, 1, injection="diagonal")
    assert n_model == sum(want) and m.param_split() == want
    if r == 1:                                   # the baseline never has an injection
        assert m.diag is None and want == flops.param_split(d, 1, 10, 1, 1, injection="linear")
        return
    # d^2 + 2d more than the parameter-free modes, all of it recurrent (used every iteration)
    assert want[1] - flops.param_split(d, r, 10, 1, 1, injection="additive")[1] == d * d + 2 * d
    groups = m.param_groups()
    assert any(p is m.diag.B.weight for p in groups["matrix"])                       # B -> MuonH
    assert any(p is m.diag.A_log for p in groups["norm"]) and any(p is m.diag.dt_bias for p in groups["norm"])
    opt = build_optimizer(groups, hyperp_lrs(d, r, 1e6))
    kind = {id(p): g["kind"] for g in opt.param_groups for p in g["params"]}
    assert kind[id(m.diag.B.weight)] == "muonh"
    assert kind[id(m.diag.A_log)] == kind[id(m.diag.dt_bias)] == "adamw"


def test_diagonal_flops_convention():
    # B e is loop-invariant but charged in every iteration, like W_inject's e half (Eq. 1 footnote 2): the diagonal
    # injection adds mult (d^2 + 2d) to the parameter-free modes' count, mult = 2(r - k) + 6k (Eq. 6)
    for d, r, k in ((640, 2, None), (640, 4, None), (640, 8, None), (640, 4, 2), (32, 8, 4)):
        mult = 6 * r if k is None else 2 * (r - k) + 6 * k
        extra = flops.flops_per_token(d, r, injection="diagonal", n_loops_bwd=k) - \
            flops.flops_per_token(d, r, injection="additive", n_loops_bwd=k)
        assert extra == mult * (d * d + 2 * d)
    assert flops.flops_per_token(640, 4, injection="diagonal") == 1_037_537_280            # s = 10, r = 4
    assert flops.flops_per_token(640, 1, injection="diagonal") == 1_027_676_160            # r = 1: no injection
    assert 3 * flops.forward_flops_per_token(640, 4, injection="diagonal") == 1_037_537_280


def test_diagonal_init_and_first_input():
    m = LoopedGPT(tiny_cfg(n_loops=4))
    d = m.cfg.d_model
    dt = F.softplus(m.diag.dt_bias)
    decay = torch.exp(-dt * m.diag.A_log.exp())
    assert torch.equal(m.diag.B.weight, torch.eye(d)) and torch.equal(m.diag.A_log, torch.zeros(d))
    assert torch.allclose(decay, torch.full((d,), math.sqrt(1 / 5)), atol=1e-6) and DIAG_DECAY == math.sqrt(0.2)
    assert torch.allclose(dt, torch.full((d,), math.log(5) / 2), atol=1e-6)            # Delta = -ln sqrt(1/5)
    # h(0) = e, so u(0) = (exp(-Delta A) + Delta) e = (0.447 + 0.805) e at init
    idx = tokens()
    seen = []
    hook = m.recur[0].register_forward_pre_hook(lambda mod, args: seen.append(args[0].detach().clone()))
    with torch.no_grad():
        m(idx)
        e = m.prelude[0](m.norm_emb(m.wte(idx)), (m.rope_cos[:16], m.rope_sin[:16]))
    hook.remove()
    assert len(seen) == 4 and torch.allclose(seen[0], (math.sqrt(0.2) + math.log(5) / 2) * e, atol=1e-5)


# -----------------------------------------------------------------------------
# The exact identity with the linear injection, gradients, KV-cached decoding

def linear_twin(m):
    """The linear-injection model with W_inject = [diag(Delta) B | diag(exp(-Delta A))] and m's other weights."""
    twin = LoopedGPT(dataclasses.replace(m.cfg, injection="linear"))
    state = {k: v for k, v in m.state_dict().items() if not k.startswith("diag.")}
    with torch.no_grad():
        dt = F.softplus(m.diag.dt_bias)                                   # (d,)
        decay = torch.exp(-dt * m.diag.A_log.exp())                       # (d,)
        state["inject.weight"] = torch.cat([dt[:, None] * m.diag.B.weight, torch.diag(decay)], dim=1)   # (d, 2d)
    twin.load_state_dict(state)
    return twin


@pytest.mark.parametrize("state_init", ["prelude", "random"])
def test_diagonal_equals_linear_with_matching_injection(state_init):
    m = perturb(LoopedGPT(tiny_cfg(n_loops=4, state_init=state_init)))
    twin = linear_twin(m)
    idx = tokens()
    with torch.no_grad():
        for n_loops in (None, 2, 7):                                      # trained r and test-time r'
            a = m(idx, n_loops=n_loops, generator=torch.Generator().manual_seed(1))
            b = twin(idx, n_loops=n_loops, generator=torch.Generator().manual_seed(1))
            err = (a - b).abs().max().item()
            print(f"{state_init} r'={n_loops}: max |diagonal - linear twin| = {err:.2e}")
            assert err < 1e-5
    # and the identity is not vacuous: a different decay changes the output
    with torch.no_grad():
        m.diag.A_log.add_(1.0)
        assert (m(idx, generator=torch.Generator().manual_seed(1))
                - twin(idx, generator=torch.Generator().manual_seed(1))).abs().max() > 1e-3


@pytest.mark.parametrize("n_loops_bwd", [None, 1])
def test_diagonal_gradients_reach_A_log_dt_bias_B(n_loops_bwd):
    m = perturb(LoopedGPT(tiny_cfg(n_loops=4, n_loops_bwd=n_loops_bwd)), 0.02)
    idx = tokens()
    m(idx, idx.roll(-1, dims=1)).backward()
    for name, p in (("A_log", m.diag.A_log), ("dt_bias", m.diag.dt_bias), ("B", m.diag.B.weight)):
        g = p.grad
        print(f"bwd={n_loops_bwd} {name}: |grad| = {g.norm():.3e}")
        assert g is not None and torch.isfinite(g).all() and g.norm() > 1e-6
    # the gradient is the analytic one: d loss / d A_log equals a finite difference along a random direction
    v = torch.randn_like(m.diag.A_log)
    with torch.no_grad():
        base = m.diag.A_log.clone()
        m.diag.A_log.copy_(base + 1e-3 * v)
        up = m(idx, idx.roll(-1, dims=1)).item()
        m.diag.A_log.copy_(base - 1e-3 * v)
        down = m(idx, idx.roll(-1, dims=1)).item()
        m.diag.A_log.copy_(base)
    assert abs((up - down) / 2e-3 - (m.diag.A_log.grad * v).sum().item()) < 2e-3


def test_diagonal_greedy_decoding_at_a_test_time_r():
    # cached == full forward for diagonal is test_model's test_cached_decoding_equals_full_forward[4-diagonal];
    # here: greedy decoding through the cache at r' = 6 equals the uncached argmax loop at r' = 6
    m = perturb(LoopedGPT(tiny_cfg(n_loops=4)), 0.02)
    idx = tokens(T=24)
    out = m.generate(idx[:, :6], 6, temperature=0, n_loops=6)            # greedy decoding at a test-time r' = 6
    ref = idx[:, :6]
    with torch.no_grad():
        for _ in range(6):
            ref = torch.cat([ref, m(ref, n_loops=6)[:, -1].argmax(-1, keepdim=True)], dim=1)
    assert torch.equal(out, ref)


def test_diagonal_config_validation():
    with pytest.raises(ValueError, match="state_init='random' must be"):
        tiny_cfg(n_loops=4, injection="passthrough", state_init="random")
    tiny_cfg(n_loops=4, injection="diagonal", state_init="random")        # allowed: exp(-Delta A) reads the state


# -----------------------------------------------------------------------------
# eval.py --n-loops-sweep

class _Tok:
    """The conftest corpus is raw token ids (no tokenizer file); the sweep only needs its vocab size and identity."""
    vocab_size, identity, bos_id = VOCAB, "synthetic-test", 1


def _checkpoint(root, data_dir, **kw):
    torch.manual_seed(0)                  # the same weights whichever tests ran before (the init draws from torch's RNG)
    m = perturb(LoopedGPT(tiny_cfg(**kw)), 0.05)
    out = os.path.join(root, "run")
    os.makedirs(out, exist_ok=True)
    torch.save({"model": m.state_dict(), "model_config": dataclasses.asdict(m.cfg),
                "train_config": {"data": data_dir, "eval_tokens": 32 * 16}}, os.path.join(out, "ckpt.pt"))
    with open(os.path.join(out, "done.json"), "w") as fh:
        json.dump({"val_loss": None}, fh)
    return out, m


# every mode whose weights are the same at any r' (hc's per-iteration scalars exist for the trained r only)
@pytest.mark.parametrize("injection,state_init", [("linear", "prelude"), ("linear", "random"),
                                                  ("additive", "prelude"), ("diagonal", "prelude")])
def test_eval_n_loops_sweep_writes_curve(tiny_data, tmp_path, monkeypatch, injection, state_init):
    monkeypatch.setattr(E, "tokenizer_for", lambda *a, **k: _Tok())
    out, m = _checkpoint(str(tmp_path), tiny_data, n_loops=2, injection=injection, state_init=state_init)
    res = E.main([out, "--n-loops-sweep", "1,2,4,8,16", "--tasks", "none"])
    with open(os.path.join(out, "eval.json")) as fh:
        saved = json.load(fh)
    curve = saved["n_loops_sweep"]
    print("\n" + " ".join(f"r'={p['n_loops']}: {p['val_loss']:.4f}" for p in curve))
    assert [p["n_loops"] for p in curve] == [1, 2, 4, 8, 16] and curve == res["n_loops_sweep"]
    # r' really changes the forward (past r' = 4 the contracting state may converge to float precision)
    assert len({round(p["val_loss"], 6) for p in curve[:3]}) == 3
    if state_init == "prelude":                                              # r' = r is the trained model's loss
        assert curve[1]["val_loss"] == pytest.approx(saved["val_loss"], rel=1e-9)
    again = E.main([out, "--n-loops-sweep", "1,2,4,8,16", "--tasks", "none"])["n_loops_sweep"]
    assert again == curve                                                    # seeded: a random state repeats too
    # fit.py picks the curve up beside done.json
    assert fit._read_sweep(os.path.join(out, "eval.json")) == curve


def test_eval_n_loops_sweep_refuses_hyper_before_any_work(tiny_data, tmp_path, monkeypatch):
    monkeypatch.setattr(E, "tokenizer_for", lambda *a, **k: _Tok())
    monkeypatch.setattr(E, "val_loss", lambda *a, **k: pytest.fail("val_loss ran before the refusal"))
    out, _ = _checkpoint(str(tmp_path), tiny_data, n_loops=2, injection="hyper")
    with pytest.raises(SystemExit, match=r"injection 'hyper' cannot run r'=1 \(trained r=2\).*exactly 2 iterations"):
        E.main([out, "--n-loops-sweep", "1,2,4", "--tasks", "none"])
    for bad in ("0,2", "2,2", "a", "", "1,,2", "1,2,"):
        with pytest.raises(SystemExit, match="--n-loops-sweep wants"):
            E.main([out, "--n-loops-sweep", bad])
    with pytest.raises(SystemExit, match="drop --n-loops"):
        E.main([out, "--n-loops-sweep", "2,4", "--n-loops", "4"])


# -----------------------------------------------------------------------------
# fit.py --case: the paired delta-phi CI; the case-study summary

TRUTH = {"E": 1.57, "A": 25.0, "B": 1000.0, "alpha": 0.199, "beta": 0.369}
LOW = (4.64e17, 1e18)


def _records(root, phi, loops, case=None, injection="linear", seed=0, noise=0.005):
    rng = np.random.default_rng(seed)
    for i, run in enumerate(r for r in flops.grid_runs(loops=loops, injection=injection) if r["flops_budget"] in LOW):
        n_eff = run["n_once"] + run["n_loops"] ** phi * run["n_rec"]
        loss = TRUTH["E"] + TRUTH["A"] * n_eff ** -TRUTH["alpha"] + TRUTH["B"] * run["tokens"] ** -TRUTH["beta"]
        rec = {k: run[k] for k in ("flops_budget", "n_loops", "scale", "d_model", "n_once", "n_rec", "tokens")}
        rec["val_loss"] = loss + noise * rng.standard_normal()
        rec["config"] = {"model_config": dict(aspect_ratio=64, n_loops=run["n_loops"], n_layers_eff=20,
                                              n_layers_prelude=2, n_layers_coda=2, injection=injection,
                                              hc_lanes=2, n_loops_bwd=None, vocab_size=32001, seq_len=2048)}
        if case:
            rec["case"] = case
        d = os.path.join(root, f"{case or 'base'}_{i:03d}")
        os.makedirs(d)
        with open(os.path.join(d, "done.json"), "w") as fh:
            json.dump(rec, fh)


@pytest.mark.filterwarnings("ignore:fit over")
def test_case_delta_phi_ci_is_paired(tmp_path):
    # a "copy" case: the baseline's own looped runs relabelled. Paired resamples (the same cells drawn for both)
    # refit identical data, so every bootstrap delta is exactly 0; independent resamples would scatter it as widely
    # as phi itself
    _records(str(tmp_path), 0.46, (1, 2, 4, 8), noise=0.02)
    for rec in fit.load_records(str(tmp_path)):                          # the same losses, labelled "copy"
        if rec["n_loops"] > 1:
            d = os.path.dirname(rec["source"]) + "_copy"
            os.makedirs(d)
            with open(os.path.join(d, "done.json"), "w") as fh:
                json.dump(dict({k: v for k, v in rec.items() if k not in ("source", "arch")}, case="copy"), fh)
    runs = fit.runs_from_rows(fit.load_records(str(tmp_path)))
    # run_case's inputs: the case with the baseline's r = 1 runs, and the baseline, each in canonical order
    variant = fit._canonical_order(fit.select_runs(runs, "copy"))
    base = fit._canonical_order(fit.select_runs(runs, None))
    vblk, bblk = fit.fit_block(variant, None, restarts=10), fit.fit_block(base, None, restarts=10)
    c = fit.paired_delta_bootstrap(variant, base, {"joint": vblk}, bblk, n_boot=6, seed=0, boot_restarts=0,
                                   progress=False)
    c["delta_phi"] = vblk["phi"] - bblk["phi"]
    print(f"\ncopy case: delta {c['delta_phi']:+.4f} [{c['delta_phi_lo']:+.4f}, {c['delta_phi_hi']:+.4f}]; "
          f"baseline phi CI [{c['baseline_phi_lo']:.3f}, {c['baseline_phi_hi']:.3f}]")
    assert c["paired_cells"] == 8 and c["delta_phi"] == 0 and c["delta_phi_lo"] == c["delta_phi_hi"] == 0
    assert c["baseline_phi_hi"] - c["baseline_phi_lo"] > 0.01                # phi alone does scatter


@pytest.mark.filterwarnings("ignore:fit over")
def test_case_delta_phi_recovers_shift_with_ci_and_summary(tmp_path, capsys):
    # baseline phi 0.46; a diagonal-injection case at phi 0.66 (its own accounting: B, A_log, dt_bias in N_rec)
    _records(str(tmp_path / "runs"), 0.46, (1, 2, 4, 8))
    _records(str(tmp_path / "runs"), 0.66, (2, 4, 8), case="diagonal", injection="diagonal", seed=1)
    out = tmp_path / "study"
    res = fit.main([str(tmp_path / "runs"), "--case", "diagonal", "--out", str(out / "case_diagonal"),
                    "--restarts", "10", "--bootstrap", "8", "--boot-restarts", "0"])
    c = res["case"]
    # the baseline study's outputs as runs/mini.sh leaves them (its fit.json and report.md), from the refit above
    with open(out / "fit.json", "w") as fh:
        json.dump(fit._jsonable({"joint": c["baseline"], "runs": c["baseline_runs"]}), fh)
    (out / "report.md").write_text("# fit.py report\n\n## Table 2: joint law (Eq. 3)\n")
    line = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("delta_phi(diagonal) = ")]
    print(f"\n{line}")
    # the line carries the rule-6 flag names of this light protocol after the CI (issue 12)
    assert line and line[0].startswith(f"delta_phi(diagonal) = {c['delta_phi']:+.3f} [{c['delta_phi_lo']:+.3f}, "
                                       f"{c['delta_phi_hi']:+.3f}]")
    assert abs(c["delta_phi"] - 0.20) < 0.06 and c["delta_phi_lo"] <= c["delta_phi"] <= c["delta_phi_hi"]
    assert c["delta_phi_lo"] > 0                                    # a 0.2 shift at 5 mnats of noise is resolved
    # the summary table lands in study/report.md below the baseline's report, regenerated on every call
    for flags in (["--overwrite"], []):               # the hand-written report.md is adopted once
        summary = fit.main(["--cases", str(out), *flags])
    assert [r["name"] for r in summary["rows"]] == ["baseline", "diagonal"]
    report = open(out / "report.md").read()
    assert report.count(fit.CASES_MARK) == 1 and "## Table 2: joint law" in report
    assert f"| diagonal | {res['joint']['phi']:.3f}" in report and os.path.isfile(out / "cases.png")
    # the case's flags (this light protocol has some) are in its row, each with the fits it concerns
    row = summary["rows"][1]
    assert [name for name, _ in row["flags"]] == [f["name"] for f in res["flags"]] and row["flags"]
    assert f"| {', '.join(f['name'] for f in res['flags'])} |" in report
    assert f"- diagonal: {res['flags'][0]['name']}: {'; '.join(res['flags'][0]['items'])}" in report
    with pytest.raises(SystemExit):
        fit.main(["--cases", str(tmp_path / "nothing")])
    assert "no fit.json" in capsys.readouterr().err


# -----------------------------------------------------------------------------
# runs/mini.sh --case NAME: launch lists

def _mini(*args):
    return subprocess.run(["bash", os.path.join(ROOT, "runs", "mini.sh"), *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)


def test_mini_case_bad_name():
    for args in (["--case", "gated"], ["--case"]):
        proc = _mini("--dry-run", *args)
        assert proc.returncode == 2 and "--case" in proc.stderr


# -----------------------------------------------------------------------------
# issue 19 §1: passthrough with truncated BPTT, refused in one process and on 2 gloo ranks before any work

@pytest.mark.ddp
def test_passthrough_truncated_refused_on_one_process_and_two_ranks(tiny_data, tmp_path):
    # It used to cut wte and the prelude out of the graph: DDP failed at step 2 ("Expected to have finished
    # reduction"), one process trained without ever updating them. Now every rank refuses it in one line, exit 2.
    import sys
    from test_train import TINY
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=ROOT)
    argv = [*TINY, "--data", tiny_data, "--out-dir", str(tmp_path / "run"), "--steps", "3", "--n-loops-bwd", "1"]
    launchers = {1: [sys.executable, "train.py"],
                 2: [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "train.py"]}
    for ranks, launch in launchers.items():
        p = subprocess.run([*launch, *argv, "--injection", "passthrough"], cwd=ROOT, env=env, capture_output=True,
                           text=True, timeout=240)
        said = [ln for ln in (p.stdout + p.stderr).splitlines() if "passthrough' needs full BPTT" in ln]
        print(f"\n{ranks} rank(s): exit {p.returncode}; {said[0]}")
        assert p.returncode != 0 and len(said) == ranks and said[0].startswith("train.py: error: ModelConfig: ")
        assert "Expected to have finished reduction" not in p.stderr and not (tmp_path / "run").exists()
        if ranks == 1:
            assert p.returncode == 2 and "Traceback" not in p.stderr
    # the same truncation with an injection that re-reads e every iteration trains on 2 ranks past step 2
    p = subprocess.run([*launchers[2], *argv, "--injection", "linear"], cwd=ROOT, env=env, capture_output=True,
                       text=True, timeout=240)
    assert p.returncode == 0, p.stderr[-3000:]
    assert json.load(open(tmp_path / "run" / "done.json"))["n_loops_bwd"] == 1
