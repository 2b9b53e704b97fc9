"""Tests for design.py (issue 20): a design never exceeds its budget, its costs are flops.py's, its run list is what
runs/grid.sh --only trains, the predicted variance is the fit's, sequential mode adds K new runs beside finished
ones, and bad input is one error line (exit 2) before any work. Small pools and light fits: the whole file runs in
well under 30 s on one core.

Run: python -m pytest -q tests/test_design.py
"""
import argparse
import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest

import design
import fit
import flops
from conftest import ROOT

SMALL = {4.64e17: (6, 8, 10, 12), 1e18: (6, 8, 10, 12, 14)}     # two Table 6 budgets: 36 runs


def cli(*args):
    """design.py as a user runs it: (exit status, stdout, stderr)."""
    proc = subprocess.run([sys.executable, "design.py", *args], cwd=ROOT, capture_output=True, text=True, timeout=60)
    return proc.returncode, proc.stdout, proc.stderr


def small_universe():
    theta, sigma = np.array(design.PAPER_THETA), design.PAPER_RMSE
    return design.universe([(design.make_pool(SMALL), theta, "cand")], sigma)


def test_pool_costs_are_flops_py_and_the_default_pool_is_table6():
    pool = design.make_pool()
    grid = {(g["flops_budget"], g["n_loops"], g["scale"]): g for g in flops.grid_runs()}
    assert len(pool["name"]) == len(grid) == 116
    for name, cost, tokens in zip(pool["name"], pool["cost"], pool["tokens"]):
        c, r, s = name[1:].split("_r")[0], int(name.split("_r")[1].split("_s")[0]), int(name.split("_s")[1])
        g = grid[(float(c), r, s)]
        assert tokens == g["tokens"] and cost == g["tokens"] * g["flops_per_token"]   # executed FLOPs, exactly


@pytest.mark.parametrize("share", [0.3, 0.43, 0.7, 1.0])
def test_a_design_never_exceeds_its_budget(share):
    U = small_universe()
    budget = share * U["cost"].sum()
    if share == 0.3:                         # below 5 runs of every r (0.42): refused, never over budget
        with pytest.raises(ValueError, match="cannot pay"):
            design.choose(U, budget)
        return
    S = design.choose(U, budget)
    assert U["cost"][S].sum() <= budget
    assert all((S & (U["r"] == r)).sum() >= 5 for r in (1, 2, 4, 8))         # fit.py fits each r alone
    # more budget never predicts a wider CI, and the whole pool is the floor
    assert design.variance(U, S)[0] >= design.variance(U, U["cand"])[0] * (1 - 1e-9)


def test_predicted_variance_is_the_fits_sampling_variance():
    # the linearised sandwich of the Huber fit against the spread of fit_block's phi over noisy replicates
    U = small_universe()
    theta, sigma = np.array(design.PAPER_THETA), design.PAPER_RMSE
    phis = []
    for rep in range(24):
        rng = np.random.default_rng(rep)
        runs = dict(U["runs"], val_loss=U["loss"] + sigma * rng.standard_normal(len(U["loss"])))
        phis.append(fit.fit_block(runs, None, restarts=20, seed=rep)["phi"])
    ratio = np.std(phis) / math.sqrt(design.variance(U, U["cand"])[0])
    print(f"\nempirical sd(phi) / predicted sd = {ratio:.2f} (24 replicates, 36 runs)")
    assert 0.6 < ratio < 1.6


def test_plan_list_is_what_grid_sh_only_trains_and_costs_add_up(tmp_path):
    out = tmp_path / "design.txt"
    rc, stdout, stderr = cli("plan", "--budget-gpu-hours", "20", "--out", str(out))
    assert rc == 0, stderr
    names = design.read_list(str(out))
    grid = {design.make_pool()["name"][i]: design.make_pool()["cost"][i] for i in range(116)}
    head = out.read_text().splitlines()[0]
    flops_total = float(head.split(" FLOPs = ")[0].split(", ")[-1])
    hours = float(head.split(" GPU-hours")[0].split(" = ")[-1])
    assert sum(grid[n] for n in names) == pytest.approx(flops_total, rel=1e-3) and hours <= 20
    assert hours == pytest.approx(design.gpu_hours(sum(grid[n] for n in names)), abs=0.05)
    env = dict(os.environ, OUT=str(tmp_path / "grid"), NPROC="8")
    proc = subprocess.run(["bash", "runs/grid.sh", "--dry-run", "--only", str(out)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    dirs = [line.split("--out-dir ")[1].split()[0] for line in proc.stdout.splitlines() if "train.py" in line]
    assert sorted(os.path.basename(d) for d in dirs) == sorted(names)
    # the same request may rewrite its own list; anything else is refused unless --overwrite
    assert cli("plan", "--budget-gpu-hours", "20", "--out", str(out))[0] == 0
    rc, _, stderr = cli("plan", "--budget-gpu-hours", "10", "--out", str(out))
    assert rc == 2 and "--overwrite" in stderr and len(stderr.strip().splitlines()) == 1
    assert cli("plan", "--budget-gpu-hours", "10", "--out", str(out), "--overwrite")[0] == 0


def test_case_list_runs_through_the_case_script(tmp_path):
    out = tmp_path / "case.txt"
    rc, _, stderr = cli("plan", "--delta-phi", "0.19", "--budget-flops", "4e19", "--budgets",
                        "4.64e17,1e18,2.15e18,4.64e18", "--out", str(out))
    assert rc == 0, stderr
    names = design.read_list(str(out))
    assert names and all("_r1_" not in n for n in names)                      # only the variant's looped runs
    proc = subprocess.run(["bash", "runs/case_hc.sh", "--dry-run", "--only", str(out)], cwd=ROOT, timeout=60,
                          env=dict(os.environ, OUT=str(tmp_path / "hc"), NPROC="8"), capture_output=True, text=True)
    assert proc.returncode == 0 and proc.stdout.count("train.py") == len(names), proc.stderr


def test_sequential_mode_adds_k_runs_beside_the_finished_ones(tmp_path):
    rows = sorted(flops.grid_runs(), key=lambda g: g["tokens"] * g["flops_per_token"])[:20]
    for g in rows:                           # 20 finished runs, records shaped like train.py's done.json
        d = tmp_path / "runs" / f"C{g['flops_budget']:g}_r{g['n_loops']}_s{g['scale']}".replace("e+", "e")
        d.mkdir(parents=True)
        rec = {k: g[k] for k in ("flops_budget", "n_loops", "scale", "d_model", "n_once", "n_rec", "tokens")}
        rec.update(val_loss=2.5 + 0.01 * g["scale"], config={"model_config": {"n_layers_eff": 20}})
        (d / "done.json").write_text(json.dumps(rec))
    rc, stdout, stderr = cli("plan", "--runs", str(tmp_path / "runs"), "--next", "8")
    assert rc == 0, stderr
    new = [line.split()[0] for line in stdout.splitlines() if line.startswith("C")]
    assert len(new) == 8 and not set(new) & set(os.listdir(tmp_path / "runs"))
    assert "(+20 finished)" in stdout


@pytest.mark.parametrize("args, needle", [
    (["plan"], "give one target"),
    (["plan", "--budget-flops", "1e18"], "cannot pay for 5 runs of every r"),
    (["plan", "--budget-flops", "1e20", "--target-halfwidth", "0.05"], "give one target"),
    (["plan", "--budget-flops", "-1"], "must be in (0, 1e30]"),
    (["plan", "--budget-flops", "1e20", "--bogus"], "unrecognized arguments: --bogus"),
    (["plan", "--budget-flops", "1e20", "--budgets", "3e17"], "need --scales"),
    (["plan", "--budget-flops", "1e20", "--prior", "README.md"], "not a JSON record"),
    (["plan", "--next", "4", "--runs", "no/such/dir"], "does not exist"),
    (["plan", "--target-halfwidth", "0.001"], "whole pool predicts"),
    (["plan", "--budget-flops", "1e20", "--out", "tests"], "is not a plain file"),
    (["simulate", "--out", "README.md"], "cannot use this folder"),
])
def test_bad_input_is_one_error_line(args, needle):
    rc, stdout, stderr = cli(*args)
    print(f"\n{' '.join(args)} -> {stderr.strip()}")
    assert rc == 2 and needle in stderr and len(stderr.strip().splitlines()) == 1 and stdout == ""


def test_grid_sh_refuses_a_bad_only_list_before_launching(tmp_path):
    bad = tmp_path / "bad.txt"
    bad.write_text("C4.64e17_r1_s6\nC3e17_r2_s8  # not a grid run\n")
    for args, needle in ((["--only", str(bad)], "does not have: C3e17_r2_s8"), (["--only"], "needs a FILE"),
                         (["--only", str(tmp_path / "none.txt")], "not a readable file")):
        proc = subprocess.run(["bash", "runs/grid.sh", *args], cwd=ROOT, capture_output=True, text=True, timeout=30,
                              env=dict(os.environ, OUT=str(tmp_path / "out"), NPROC="8"))
        assert proc.returncode == 2 and needle in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
        assert not (tmp_path / "out").exists()


def test_a_refused_fit_never_counts_as_covering():
    # a design of 3 runs cannot be fitted (6 parameters): every replicate fails, and none of them may count towards
    # coverage through its (-inf, inf) "interval"
    U = small_universe()
    theta, sigma = np.array(design.PAPER_THETA), design.PAPER_RMSE
    a = argparse.Namespace(reps=2, seed=0, restarts=5, bootstrap=4, boot_restarts=1)    # simulate's flags
    rows, hw, _ = design.replicate(U, lambda rng: [np.arange(len(U["r"])) < 3], theta[5], sigma, a, "3 runs")
    assert rows[0]["failed"] == 2 and rows[0]["coverage"] == 0.0 and np.isinf(hw).all()


# -----------------------------------------------------------------------------
# Hostile inputs (issue 24): numbers read from files pass the flags' limits, what cannot be read is named, one writer
# per output, a refusal changes nothing

def test_a_prior_fit_json_passes_the_limits_of_what_wrote_it(tmp_path):
    good = {"joint": {"theta": list(design.PAPER_THETA), "rmse": 0.01}}
    for edit, why in (({"theta": [40.0, 7.0, 0.4, 0.2, 0.4, 0.46]}, "inside fit.py's App. F box"),
                      ({"theta": [3.2, 6.9, 0.45, 0.2, 0.37, float("nan")]}, "inside fit.py's App. F box"),
                      ({"rmse": 1e300}, "an rmse in (0, 1]"), ({"rmse": 0}, "an rmse in (0, 1]"),
                      ({"theta": [3.2, 6.9, 0.45, 0.2, 0.37, True]}, "inside fit.py's App. F box")):
        (tmp_path / "fit.json").write_text(json.dumps({"joint": dict(good["joint"], **edit)}))
        rc, out, err = cli("plan", "--budget-gpu-hours", "20", "--prior", str(tmp_path / "fit.json"))
        assert rc == 2 and why in err and len(err.strip().splitlines()) == 1 and out == "", (edit, err)


@pytest.mark.parametrize("args, needle", [
    (["plan", "--budget-flops", "1e20", "--loops", "1,1"], "lists a value twice"),
    (["plan", "--budget-flops", "1e20", "--noise", "1e300"], "argument --noise"),
    (["plan", "--budget-gpu-hours", "1e300"], "argument --budget-gpu-hours"),
    (["plan", "--budget-flops", "1e20", "--delta-phi", "2.9"], "outside the fit's box"),
    (["plan", "--budget-flops", "1e20", "--scales", ",".join(map(str, range(1, 400))), "--tpp", "0.001,1e9"],
     "it needs 1 to 1000"),
    (["simulate", "--rounds", "20", "--next", "8"], "exceeds the grid's 116 runs"),
    (["simulate", "--reps", "1e9"], "argument --reps"),
    (["simulate", "--bootstrap", "100000", "--boot-restarts", "1000"], "at most 1e6 starts"),
])
def test_sizes_and_counts_from_flags_are_bounded(args, needle):
    rc, out, err = cli(*args)
    assert rc == 2 and needle in err and len(err.strip().splitlines()) == 1 and out == "", err


def test_a_reference_list_that_is_a_fifo_or_names_unknown_runs_is_refused(tmp_path):
    os.mkfifo(tmp_path / "fifo.txt")                     # open() would wait for a writer forever
    rc, _, err = cli("plan", "--reference", str(tmp_path / "fifo.txt"))
    assert rc == 2 and "not a readable file" in err
    (tmp_path / "ref.txt").write_text("C4.64e17_r1_s6\nC9e99_r1_s6\n")
    rc, _, err = cli("plan", "--reference", str(tmp_path / "ref.txt"))
    assert rc == 2 and "not in the pool: C9e99_r1_s6" in err


def test_plan_and_simulate_outputs_one_writer_and_refusals_change_nothing(tmp_path):
    import common
    (tmp_path / "mine.txt").write_text("mine\n")
    os.symlink(tmp_path / "mine.txt", tmp_path / "link.txt")
    rc, out, err = cli("plan", "--budget-gpu-hours", "20", "--out", str(tmp_path / "link.txt"), "--overwrite")
    assert rc == 2 and "is a link" in err and out == "" and (tmp_path / "mine.txt").read_text() == "mine\n"
    # simulate: a folder being written by another design.py is refused at once, and left as it was
    sim = tmp_path / "sim"
    assert common.claim(str(sim), "design", "another request") == "fresh"
    try:
        rc, _, err = cli("simulate", "--out", str(sim), "--reps", "1")
        assert rc == 2 and "being written by another design process" in err, err
    finally:
        common.release(str(sim))
    assert os.listdir(sim) == [".nanoloop-design"]
    mark = (sim / ".nanoloop-design").read_text()
    rc, _, err = cli("simulate", "--out", str(sim), "--reps", "1", "--rounds", "30")   # refused before the claim
    assert rc == 2 and (sim / ".nanoloop-design").read_text() == mark


def test_design_flag_limits_agree_with_train_limits():
    train = pytest.importorskip("train")
    for flag, interval in design.TRAIN.items():
        assert train.LIMITS[flag.replace("-", "_")][0] == interval, flag
