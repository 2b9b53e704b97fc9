"""Tests for runs/*.sh (issue 5 acceptance 6; style B10): every `train.py` launch line of every script parses through
train.parse_args with its bash arrays substituted (bash itself expands them under --dry-run), and each sweep lists
exactly the paper's runs: 116 for the grid (Table 6), 69 / 63 for the case studies (§5), 5 for Table 5, ...

Run: pytest -q tests/test_runs.py   (bash only, no training; a stale flag fails here instead of in a 116-run sweep)
"""
import glob
import math
import os
import shlex
import subprocess

import pytest

import flops
import train
from conftest import ROOT

SCRIPTS = sorted(glob.glob(os.path.join(ROOT, "runs", "*.sh")))
# Runs per script under --dry-run (None: a script of another issue; it must still parse).
COUNTS = {"grid.sh": 116, "case_bptt.sh": 69, "case_hc.sh": 63, "ablation_injection.sh": 5, "lr_sweep.sh": 112,
          "depth.sh": 160, "extrapolate.sh": 2, "slurm.sh": 1, "mini.sh": 44}
# slurm.sh launches the one run it is given; the dry-run test hands it a grid cell.
EXAMPLE_ARGS = {"slurm.sh": ["--flops-budget", "2.15e19", "--n-loops", "4", "--scale", "34",
                             "--out-dir", "out/grid/C2.15e19_r4_s34"]}
LOWER_BUDGETS = {4.64e17, 1e18, 2.15e18, 4.64e18}            # the case studies' four budgets (§5)
# Scripts that launch no training run (issue 19: the benchmark and the device check left train.py): what their
# --dry-run prints instead.
NO_TRAIN = {"bench.sh": "python runs/bench_train.py ", "gpu_check.sh": "gpu-check: 6 stages"}


def dry_run(script, out_root):
    """stdout lines of `bash SCRIPT --dry-run` with OUT pointed at a scratch folder."""
    name = os.path.basename(script)
    env = dict(os.environ, OUT=str(out_root / name), NPROC="8")
    proc = subprocess.run(["bash", script, "--dry-run", *EXAMPLE_ARGS.get(name, [])], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, f"{name} --dry-run failed:\n{proc.stderr}"
    return proc.stdout.splitlines()


def launches(lines):
    """(line, train.py argv) for every launch line: the words after the one ending in train.py."""
    out = []
    for line in lines:
        words = shlex.split(line)
        at = [i for i, w in enumerate(words) if os.path.basename(w) == "train.py"]
        if at:
            out.append((line, words[at[0] + 1:]))
    return out


def parse(line, argv):
    try:
        return train.parse_args(argv)
    except SystemExit as err:                      # argparse / config errors exit 2 with a message on stderr
        raise AssertionError(f"launch line does not parse (exit {err.code}):\n  {line}") from None


def out_dir(argv):
    return argv[argv.index("--out-dir") + 1]


@pytest.mark.parametrize("script", SCRIPTS, ids=os.path.basename)
def test_script_header_and_strict_mode(script):
    src = open(script).read()
    print(f"\n{os.path.basename(script)}: {src.count(chr(10))} lines")
    assert "set -euo pipefail" in src and "--dry-run" in src and "Usage" in src
    assert "cd ~" not in src and "$HOME" not in src                   # no absolute or home paths (style B10)


@pytest.mark.parametrize("script", SCRIPTS, ids=os.path.basename)
def test_every_launch_line_parses(script, tmp_path):
    name = os.path.basename(script)
    lines = dry_run(script, tmp_path)
    runs = launches(lines)
    if name in NO_TRAIN:
        assert not runs and all(ln.startswith(NO_TRAIN[name]) for ln in lines), lines
        return
    want = COUNTS.get(name)
    print(f"\n{name} --dry-run: {len(runs)} train.py launches" + (f" (expected {want})" if want else ""))
    assert runs, f"{name} --dry-run printed no train.py line"
    for line, argv in runs:
        mcfg, tcfg = parse(line, argv)
        if tcfg.flops_budget is not None:          # the horizon main() derives must be at least one step
            F = flops.flops_per_token(mcfg.d_model, mcfg.n_loops, mcfg.n_layers_eff, mcfg.n_layers_prelude,
                                      mcfg.n_layers_coda, mcfg.injection, mcfg.hc_lanes, mcfg.n_loops_bwd,
                                      mcfg.seq_len, mcfg.vocab_size)
            assert flops.tokens_for_budget(tcfg.flops_budget, F, tcfg.batch_tokens)[0] >= 1, line
    if want is not None:                           # this scripts: exact counts, resumable, distinct dirs
        assert len(runs) == want
        assert all("--resume" in argv and "--out-dir" in argv for _, argv in runs)
        assert len({out_dir(argv) for _, argv in runs}) == want


def configs(script, tmp_path):
    return [parse(line, argv) for line, argv in launches(dry_run(os.path.join(ROOT, "runs", script), tmp_path))]


def test_grid_dry_run_lists_table6(tmp_path):
    runs = configs("grid.sh", tmp_path)
    cells = sorted((t.flops_budget, m.n_loops, m.scale) for m, t in runs)
    paper = sorted((x["flops_budget"], x["n_loops"], x["scale"]) for x in flops.grid_runs())
    print(f"\ngrid.sh: {len(runs)} runs; flops.grid_runs(): {len(paper)}")
    assert len(runs) == 116 and cells == paper
    for m, t in runs:                              # everything else at the paper defaults
        assert (m.n_layers_eff, m.injection, m.n_loops_bwd, m.state_init, m.seq_len, m.head_dim) == \
            (20, "linear", None, "prelude", 2048, 128)
        assert (t.batch_tokens, t.muonh_lr, t.case, t.d_ref) == (262144, 0.014, "", None)


def test_case_studies_and_ablations_match_the_paper(tmp_path):
    bptt = configs("case_bptt.sh", tmp_path)
    assert {t.flops_budget for _, t in bptt} == LOWER_BUDGETS and {m.n_loops for m, _ in bptt} == {2, 4, 8}
    assert all(m.n_loops_bwd == math.ceil(m.n_loops / 2) and t.case == "bptt" for m, t in bptt)   # App. G.1
    hc = configs("case_hc.sh", tmp_path)
    per_r = {r: sum(m.n_loops == r for m, _ in hc) for r in (2, 4, 8)}
    assert per_r == {2: 21, 4: 21, 8: 21} and {t.flops_budget for _, t in hc} == LOWER_BUDGETS     # App. G.2
    assert all(m.injection == "hyper" and m.hc_lanes == 2 and m.n_loops_bwd is None for m, _ in hc)
    abl = configs("ablation_injection.sh", tmp_path)                                               # Table 5
    assert sorted((m.injection, m.state_init) for m, _ in abl) == sorted(
        [("linear", "prelude"), ("additive", "prelude"), ("passthrough", "prelude"), ("hyper", "prelude"),
         ("linear", "random")])
    assert all((m.scale, m.n_loops, t.flops_budget) == (10, 4, 1e18) for m, t in abl)
    lr = configs("lr_sweep.sh", tmp_path)                                                          # App. D
    assert sorted({t.muonh_lr for _, t in lr}) == [0.008, 0.010, 0.012, 0.014, 0.016, 0.018, 0.020, 0.024]
    assert {(m.scale, t.tokens_per_param, t.batch_tokens) for m, t in lr} == {
        (10, 10, 262144), (8, 10, 262144), (14, 10, 262144), (10, 20, 262144), (10, 40, 262144),
        (10, 10, 524288), (10, 10, 1048576)}
    depth = configs("depth.sh", tmp_path)                                                          # G.4 (earlier)
    assert {(m.n_layers_eff, m.n_layers_prelude, m.n_layers_coda) for m, _ in depth} == {(18, 1, 1), (24, 4, 4)}
    ext = configs("extrapolate.sh", tmp_path)                                                      # App. I
    assert sorted(m.n_loops for m, _ in ext) == [1, 4]
    assert all(m.scale == 34 and t.steps * t.batch_tokens == 46_999_797_760 for m, t in ext)
    print(f"\nbptt {len(bptt)}, hc {len(hc)} ({per_r}), injection {len(abl)}, lr {len(lr)}, depth {len(depth)}, "
          f"extrapolate {len(ext)}")


def test_sweeps_skip_finished_runs(tmp_path):
    """Resumable: a run whose done.json exists is skipped; the rest are still listed (with --resume)."""
    lines = dry_run(os.path.join(ROOT, "runs", "grid.sh"), tmp_path)
    first = out_dir(launches(lines)[0][1])
    os.makedirs(first)
    open(os.path.join(first, "done.json"), "w").write("{}")
    again = dry_run(os.path.join(ROOT, "runs", "grid.sh"), tmp_path)
    skipped = [ln for ln in again if ln.startswith("skip")]
    print(f"\nafter finishing {first}: {len(launches(again))} launches, skipped: {skipped}")
    assert len(launches(again)) == 115 and skipped == [f"skip {first} (done.json exists)"]


@pytest.mark.parametrize("env, args, needle", [
    ({}, ["--bogus"], "unknown argument '--bogus'"),          # used to launch the whole sweep with the typo ignored
    ({"NPROC": "abc"}, ["--dry-run"], "NPROC=abc must be a whole number"),
    ({"NPROC": "0"}, [], "NPROC=0 must be a whole number"),
])
def test_sweep_scripts_refuse_bad_arguments_before_launching(env, args, needle, tmp_path):
    # issue 12 rule 5 on every sweep script (they share runs/launch.bash): one line, exit 2, nothing created
    for script in ("grid.sh", "case_hc.sh", "lr_sweep.sh"):
        proc = subprocess.run(["bash", f"runs/{script}", *args], cwd=ROOT, capture_output=True, text=True,
                              env={**os.environ, "OUT": str(tmp_path / "out"), **env}, timeout=30)
        print(f"\n{script} {env} {args} -> {proc.stderr.strip()}")
        assert proc.returncode == 2 and needle in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
        assert proc.stdout == "" and not (tmp_path / "out").exists()
