"""Hostile input for fit.py and flops.py (issue 12): every user error is one line naming its culprit, exits non-zero
before any fit, prints no traceback and leaves every pre-existing file byte-identical; outputs are never mixed or
half-written; and a fit the data cannot support says so next to phi (rule 6).
Fits here use the lightest protocol (2 restarts, 0-5 bootstrap resamples) on 20-28 runs: the flags are what is
tested, not the estimates.
Run: python -m pytest -q tests/test_hostile_fit.py
"""
import contextlib
import csv
import io
import json
import os
import shutil
import subprocess
import sys
import time

import numpy as np
import pytest

import common
import fit
import flops

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LIGHT = ["--restarts", "2", "--bootstrap", "0"]          # the lightest protocol: flags, not estimates, are tested
COLS = ("flops_budget", "n_loops", "d_model", "n_once", "n_rec", "tokens", "val_loss")


# -----------------------------------------------------------------------------
# Helpers

def _rows(budgets=(4.64e17, 1e18, 2.15e18), loops=(1, 4), noise=0.01, truth=None, seed=0):
    """Synthetic runs of Eq. 3 (fit.synthetic_rows) at a few budgets and loops: 28 runs by default."""
    return [r for r in fit.synthetic_rows(0.46, noise, seed, truth) if r["flops_budget"] in budgets
            and r["n_loops"] in loops]


def _write_csv(path, rows, cols=COLS):
    with open(path, "w", newline="") as fh:
        wr = csv.writer(fh)
        wr.writerow(cols)
        for row in rows:
            wr.writerow([repr(row[k]) if isinstance(row[k], float) else row[k] for k in cols])
    return str(path)


def _write_records(root, rows):
    """One folder with a done.json per run, as runs/grid.sh leaves them."""
    for i, row in enumerate(rows):
        os.makedirs(root / f"run{i}", exist_ok=True)
        rec = {k: row[k] for k in COLS}
        (root / f"run{i}" / "done.json").write_text(json.dumps(rec))
    return str(root)


def _snapshot(root):
    """{relative path: bytes} of every file under root (folders included as None)."""
    out = {}
    for dirpath, dirs, files in os.walk(root):
        for d in dirs:
            out[os.path.relpath(os.path.join(dirpath, d), root)] = None
        for f in files:
            p = os.path.join(dirpath, f)
            # a FIFO is recorded, never opened (open() would wait for a writer forever)
            out[os.path.relpath(p, root)] = open(p, "rb").read() if os.path.isfile(p) else os.path.islink(p)
    return out


def _cli(main, argv):
    """Run main(argv) in-process; returns (exit code, stdout, stderr + the SystemExit message)."""
    out, err = io.StringIO(), io.StringIO()
    code = 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            main(argv)
        except SystemExit as e:
            if isinstance(e.code, str):          # raise SystemExit("msg"): Python prints msg, exit status 1
                err.write(e.code + "\n")
                code = 1
            else:
                code = e.code or 0
    return code, out.getvalue(), err.getvalue()


def _refused(main, argv, culprit, root, code=None):
    """main(argv) must fail with one line naming culprit, no traceback, and root unchanged."""
    before = _snapshot(root)
    rc, out, err = _cli(main, argv)
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert rc != 0 and (code is None or rc == code), (rc, out, err)
    assert len(lines) == 1, err
    assert "Traceback" not in err and "Traceback" not in out
    assert culprit in lines[0], (culprit, lines[0])
    assert _snapshot(root) == before, "a pre-existing file changed or a new one appeared"
    return lines[0]


@pytest.fixture
def good_csv(tmp_path):
    return _write_csv(tmp_path / "runs.csv", _rows())


# -----------------------------------------------------------------------------
# fit.py: bad values, named by file and line, refused before any fit

@pytest.mark.parametrize("col,value,culprit", [
    ("tokens", "1e300", "tokens='1e300' must be in [1, 1e16] (training tokens: a count, not billions)"),
    ("tokens", "-5", "tokens='-5' must be in [1, 1e16]"),
    ("tokens", "0.5", "tokens='0.5' must be in [1, 1e16]"),
    ("val_loss", "nan", "val_loss='nan' must be a finite number in (0, 100]"),
    ("val_loss", "1e308", "val_loss='1e308' must be in (0, 100] (nats)"),
    ("val_loss", "x", "val_loss='x' expected a number"),
    ("flops_budget", "inf", "flops_budget='inf' must be a finite number"),
    ("n_loops", "3", "n_loops=3 is not an architecture flops.py can count"),
    ("n_loops", "2.5", "n_loops='2.5' expected an integer"),
    ("n_loops", "1e300", "n_loops='1e300' must be in [1, 16]"),
])
def test_bad_value_named_by_file_and_line(tmp_path, col, value, culprit):
    rows = _rows()
    path = tmp_path / "runs.csv"
    _write_csv(path, rows)
    text = path.read_text().splitlines()
    header = text[0].split(",")
    fields = text[3].split(",")
    fields[header.index(col)] = value
    text[3] = ",".join(fields)
    if col == "n_loops":                    # no widths: nothing but flops.py's layout can reject r = 3
        text = [",".join(f for h, f in zip(header, ln.split(",")) if h != "d_model") for ln in text]
    path.write_text("\n".join(text) + "\n")
    line = _refused(fit.main, ["--csv", str(path), "--out", str(tmp_path / "out")] + LIGHT, culprit, tmp_path)
    assert f"{path}:4:" in line                                   # file and line of the bad row
    assert not os.path.exists(tmp_path / "out")


def test_n_loops_3_without_widths_fails_before_the_fit(tmp_path, monkeypatch):
    rows = _rows()
    for row in rows[:14]:
        row["n_loops"] = 3                                         # half the grid claims r = 3
    path = _write_csv(tmp_path / "r3.csv", rows, cols=tuple(c for c in COLS if c != "d_model"))
    monkeypatch.setattr(fit, "fit_law", lambda *a, **k: pytest.fail("a fit ran before the input was checked"))
    _refused(fit.main, ["--csv", path, "--out", str(tmp_path / "o")] + LIGHT, "n_loops=3", tmp_path)


@pytest.mark.parametrize("text,culprit", [
    ("flops_budget,n_loops,n_once,n_rec,tokens,val_loss\n1e18,1,0,1000,1000,2.5\n1e18,1,0,1000,1000,2.5,9\n",
     ":3: 7 fields, but the header has 6"),
    ("flops_budget,n_loops,n_once,n_rec,tokens,val_loss\n1e18,1,0,1000\n", ":2: 4 fields, but the header has 6"),
    ("val_loss,val_loss,tokens\n1,2,3\n", ":1: column 'val_loss' appears twice"),
    ("", ":1: no header row"),
    ("flops_budget,n_loops,n_once,n_rec,tokens,val_loss\n", "no data rows"),
    ("a,b\n\"1,2\n", "malformed CSV"),
])
def test_malformed_csv_named_by_file_and_line(tmp_path, text, culprit):
    path = tmp_path / "bad.csv"
    path.write_text(text)
    line = _refused(fit.main, ["--csv", str(path), "--out", str(tmp_path / "o")], culprit, tmp_path)
    assert str(path) in line


def test_csv_not_utf8_and_missing(tmp_path):
    path = tmp_path / "bin.csv"
    path.write_bytes(b"flops_budget,val_loss\n\xff\xfe\x00junk\n")
    _refused(fit.main, ["--csv", str(path), "--out", str(tmp_path / "o")], "not UTF-8 text", tmp_path)
    _refused(fit.main, ["--csv", str(tmp_path / "nope.csv"), "--out", str(tmp_path / "o")], "does not exist", tmp_path)
    _refused(fit.main, ["--csv", str(tmp_path), "--out", str(tmp_path / "o")], "is not a file", tmp_path)


def test_malformed_and_foreign_done_json(tmp_path):
    runs = tmp_path / "runs"
    _write_records(runs, _rows())
    (runs / "run3" / "done.json").write_text('{\n "n_loops": 1,\n "val_loss": 2.5,,\n}')
    line = _refused(fit.main, [str(runs), "--out", str(tmp_path / "o")], "not a JSON record", tmp_path)
    assert os.path.join("run3", "done.json") in line and "line 3" in line     # file and line
    (runs / "run3" / "done.json").write_text("[1, 2]")
    _refused(fit.main, [str(runs), "--out", str(tmp_path / "o")], "expected a JSON object", tmp_path)
    rec = {k: _rows()[3][k] for k in COLS}
    rec["val_loss"] = True                                                  # JSON true is not a loss
    (runs / "run3" / "done.json").write_text(json.dumps(rec))
    _refused(fit.main, [str(runs), "--out", str(tmp_path / "o")], "key 'val_loss' must be int/float, got bool True",
             tmp_path)
    rec["val_loss"], rec["scale"] = 2.5, "wide"
    del rec["d_model"]
    (runs / "run3" / "done.json").write_text(json.dumps(rec))
    _refused(fit.main, [str(runs), "--out", str(tmp_path / "o")], "key 'scale' must be int, got str 'wide'", tmp_path)
    rec["scale"], rec["config"] = 6, {"n_layers_eff": 10 ** 400}          # a count flops.py cannot multiply
    (runs / "run3" / "done.json").write_text(json.dumps(rec))
    _refused(fit.main, [str(runs), "--out", str(tmp_path / "o")],
             "config n_layers_eff must be an integer in [1, 1e+09]", tmp_path)


def test_cases_summary_refuses_a_broken_fit_json_by_name(tmp_path):
    # fit.py --cases DIR: a case's fit.json that is torn, not an object, or not a joint fit is named, and report.md
    # is not rewritten (it used to be a traceback, or a silently skipped case)
    (tmp_path / "fit.json").write_text(json.dumps({"joint": {"phi": 0.5, "r2": 0.9, "n": 20}}))
    (tmp_path / "case_x").mkdir()
    for text, culprit in (('{"joint": ', "not a JSON record"), ("[1, 2]", "expected a JSON object, got list"),
                          ('{"joint": {"phi": "a"}}', "no numeric phi, r2 and n")):
        (tmp_path / "case_x" / "fit.json").write_text(text)
        line = _refused(fit.main, ["--cases", str(tmp_path)], culprit, tmp_path)
        assert os.path.join("case_x", "fit.json") in line


def test_only_unfinished_runs_is_an_error_that_names_them(tmp_path):
    for name in ("C1e18_r1_s6", "C1e18_r4_s6"):
        os.makedirs(tmp_path / "runs" / name)
        (tmp_path / "runs" / name / "ckpt.pt").write_bytes(b"\0" * 16)
    _refused(fit.main, [str(tmp_path / "runs"), "--out", str(tmp_path / "o")], "2 unfinished run folders", tmp_path)


def test_no_meaningful_fit_is_refused(tmp_path):
    rows = _rows()
    for row in rows:
        row["val_loss"] = 3.0                                    # all losses equal: every law with A = B = 0 fits
    path = _write_csv(tmp_path / "flat.csv", rows)
    _refused(fit.main, ["--csv", path, "--out", str(tmp_path / "o")] + LIGHT, "same val_loss (3)", tmp_path)
    path = _write_csv(tmp_path / "r4.csv", _rows(loops=(4,)))     # one r: phi is not identified
    _refused(fit.main, ["--csv", path, "--out", str(tmp_path / "o")] + LIGHT, "at least two architectures", tmp_path)
    _refused(fit.main, ["--csv", str(tmp_path / "flat.csv"), "--law", "chinchilla", "--out", str(tmp_path / "o")]
             + LIGHT, "same val_loss", tmp_path)


@pytest.mark.parametrize("flag,value", [("--restarts", "0"), ("--bootstrap", "-1"), ("--seed", "-1"),
                                        ("--noise", "nan"), ("--phi", "inf"), ("--loops", "1,x"),
                                        ("--restarts", "1e9"), ("--boot-restarts", "abc")])
def test_bad_flags_one_line_at_parse(tmp_path, good_csv, flag, value):
    _refused(fit.main, ["--csv", good_csv, "--out", str(tmp_path / "o"), flag, value], f"argument {flag}", tmp_path,
             code=2)


# -----------------------------------------------------------------------------
# fit.py --out: checked before the fit, never replaced without --overwrite, never mixed

def test_out_naming_a_file_or_unwritable_fails_before_the_fit(tmp_path, good_csv, monkeypatch):
    monkeypatch.setattr(fit, "fit_law", lambda *a, **k: pytest.fail("a fit ran before --out was checked"))
    (tmp_path / "afile").write_text("mine\n")
    _refused(fit.main, ["--csv", good_csv, "--out", str(tmp_path / "afile")] + LIGHT,
             "afile: cannot use this folder (File exists)", tmp_path)
    _refused(fit.main, ["--csv", good_csv, "--out", str(tmp_path / "afile" / "sub")] + LIGHT,
             "cannot use this folder (Not a directory)", tmp_path)
    os.makedirs(tmp_path / "o" / "phi.png")                       # one of our names, but a folder
    _refused(fit.main, ["--csv", good_csv, "--out", str(tmp_path / "o"), "--overwrite"] + LIGHT,
             "phi.png is not a plain file", tmp_path)


def test_out_holding_another_fit_is_refused(tmp_path, good_csv, monkeypatch):
    monkeypatch.setattr(fit, "fit_law", lambda *a, **k: pytest.fail("a fit ran before --out was checked"))
    out = tmp_path / "o"
    os.makedirs(out)
    (out / "fit.json").write_text(json.dumps({"request": {"input": "/elsewhere.csv"}}))
    (out / "phi.png").write_bytes(b"old figure")
    (out / "notes.txt").write_text("the user's own file\n")
    _refused(fit.main, ["--csv", good_csv, "--out", str(out)] + LIGHT, "holds files this tool did not make "
             "(fit.json, notes.txt, phi.png); pick a new folder or pass --overwrite", tmp_path)
    (out / "fit.json").unlink()                                   # a stray phi.png alone is not ours either
    _refused(fit.main, ["--csv", good_csv, "--out", str(out)] + LIGHT, "holds files this tool did not make", tmp_path)


def test_synthetic_never_replaces_a_different_file(tmp_path):
    (tmp_path / "s.csv").write_text("my data\n")
    _refused(fit.main, ["--synthetic", str(tmp_path / "s.csv")], "exists and this request did not write it",
             tmp_path)
    _refused(fit.main, ["--synthetic", str(tmp_path), "--overwrite"], "is not a plain file", tmp_path)
    _refused(fit.main, ["--synthetic", str(tmp_path / "s.csv" / "x.csv")], "cannot write (Not a directory)",
             tmp_path)
    assert _cli(fit.main, ["--synthetic", str(tmp_path / "s.csv"), "--overwrite"])[0] == 0
    assert len(fit.load_csv(str(tmp_path / "s.csv"))) == 116
    assert _cli(fit.main, ["--synthetic", str(tmp_path / "s.csv")])[0] == 0          # same bytes: same request


@pytest.fixture(scope="module")
def noise_fit(tmp_path_factory):
    """Uniform-noise losses in [2, 6] (issue 12's example), fitted through the CLI; returns (csv, out, stdout)."""
    tmp = tmp_path_factory.mktemp("noise")
    rows = _rows()
    rng = np.random.default_rng(0)
    for row in rows:
        row["val_loss"] = float(rng.uniform(2, 6))
    path = _write_csv(tmp / "noise.csv", rows)
    rc, out, err = _cli(fit.main, ["--csv", path, "--out", str(tmp / "out"), "--restarts", "2", "--bootstrap", "5",
                                   "--boot-restarts", "0"])
    assert rc == 0 and "Traceback" not in err, err
    return path, tmp / "out", out


def test_uniform_noise_does_not_print_a_confident_phi(noise_fit):
    _, out, stdout = noise_fit
    phi_line = [ln for ln in stdout.splitlines() if ln.startswith("phi = ")]
    print(phi_line)
    assert len(phi_line) == 1 and "WARNING:" in phi_line[0] and "low_r2" in phi_line[0]
    assert "few_resamples" in phi_line[0]                           # 5 resamples make no 95% CI
    assert "WARNING [low_r2]" in stdout
    res = json.load(open(out / "fit.json"))
    names = [f["name"] for f in res["flags"]]
    assert "low_r2" in names and len(names) == len(set(names))     # one flag per condition
    assert all(f["message"] for f in res["flags"])
    report = open(out / "report.md").read()
    assert "## Warnings" in report and "**low_r2**" in report
    assert "WARNING: " in [ln for ln in report.splitlines() if ln.startswith("| Joint, φ free")][0]
    assert sorted(res["outputs"]) == sorted(os.listdir(out))[1:]    # the listed set and the marker, no temporaries
    assert sorted(os.listdir(out))[0] == ".nanoloop-fit"


def test_overwrite_removes_the_earlier_outputs_and_nothing_else(noise_fit, tmp_path):
    csv_path, first, _ = noise_fit
    out = tmp_path / "out"
    shutil.copytree(first, out)
    (out / "notes.txt").write_text("the user's own file\n")
    (out / ".phi.png.0badc0de.tmp").write_bytes(b"half a figure")     # a temporary left by a killed fit.py
    (out / "mine.tmp").write_text("not ours\n")
    # a different request (--law chinchilla) into the folder of a joint fit: refused, then allowed with --overwrite
    _refused(fit.main, ["--csv", csv_path, "--law", "chinchilla", "--out", str(out)] + LIGHT, "--overwrite", tmp_path)
    rc, stdout, err = _cli(fit.main, ["--csv", csv_path, "--law", "chinchilla", "--out", str(out), "--overwrite"]
                           + LIGHT)
    assert rc == 0, err
    # no stale phi.png (the joint fit's fit.json listed it); the user's files and the temporary stay (a tool never
    # removes a file by its name's pattern alone; nothing reads a ".NAME.<hex>.tmp")
    assert sorted(os.listdir(out)) == [".nanoloop-fit", ".phi.png.0badc0de.tmp", "fit.json", "mine.tmp", "notes.txt",
                                       "pred_vs_actual.png", "report.md"]
    assert (out / "notes.txt").read_text() == "the user's own file\n"
    assert "chinchilla" in json.load(open(out / "fit.json"))
    # the same request again rewrites its own outputs without --overwrite (a resumed runs/mini.sh does this)
    rc, _, err = _cli(fit.main, ["--csv", csv_path, "--law", "chinchilla", "--out", str(out)] + LIGHT)
    assert rc == 0, err


def test_failed_figures_or_full_disk_leave_the_folder_as_it_was(noise_fit, tmp_path, monkeypatch):
    csv_path, first, _ = noise_fit
    out = tmp_path / "out"
    shutil.copytree(first, out)
    argv = ["--csv", csv_path, "--law", "chinchilla", "--out", str(out), "--overwrite"] + LIGHT

    def boom(*a, **k):
        raise RuntimeError("renderer exploded")
    monkeypatch.setattr(fit, "make_figures", boom)
    _refused(fit.main, argv, "drawing the figures failed (RuntimeError: renderer exploded); nothing was written",
             tmp_path)
    monkeypatch.undo()
    real, calls = os.open, []

    def full_disk(path, flags, *a, **k):
        if flags & os.O_EXCL:                                   # common.atomic_write creating a temporary
            calls.append(path)
            if len(calls) > 2:                                  # two temporaries written, then the disk is full
                raise OSError(28, "No space left on device")
        return real(path, flags, *a, **k)
    monkeypatch.setattr(common.os, "open", full_disk)
    _refused(fit.main, argv, "cannot write (No space left on device); nothing was changed", tmp_path)
    assert len(calls) == 3 and not [n for n in os.listdir(out) if n.endswith(".tmp")]


def test_figures_draw_degenerate_data(noise_fit):
    # figures never crash: one point per (budget, r) cell, an undefined R^2, a loss of 1e308, a NaN in the bootstrap
    _, out, _ = noise_fit
    res = json.load(open(out / "fit.json"))
    runs = fit.runs_from_rows(fit.load_csv(noise_fit[0]))
    for blk in res["per_arch"].values():
        blk["theta"] = np.array(blk["theta"])
    first = np.unique(np.stack([runs["flops_budget"], runs["n_loops"]]), axis=1, return_index=True)[1]
    one = fit.subset(runs, np.isin(np.arange(len(runs["val_loss"])), first))        # one point per cell
    one["val_loss"][0] = 1e308
    res["joint"]["r2"], res["phi0"]["r2"] = float("nan"), None
    res["bootstrap"]["phi"][0] = float("nan")
    figs = fit.make_figures(res, one)
    assert set(figs) == {"iso_flops.png", "pred_vs_actual.png", "frontier.png", "phi.png"}
    assert all(v[:8] == b"\x89PNG\r\n\x1a\n" for v in figs.values())


# -----------------------------------------------------------------------------
# Rule 6: bound, low R^2, single budget, too few runs, unfinished runs -> flags next to phi

def test_bound_and_unfinished_runs_are_flagged(tmp_path):
    # E = 0.01 lies below the App. F box (e >= -3, E >= 0.0498): the fit parks e on its bound; two run folders
    # were killed (a checkpoint, a log) and have no done.json
    runs = tmp_path / "runs"
    _write_records(runs, _rows(noise=0.0, truth={"E": 0.01}))
    for name, f in (("killed_a", "ckpt.pt"), ("killed_b", "log.jsonl")):
        os.makedirs(runs / name)
        (runs / name / f).write_bytes(b"x")
    rc, stdout, err = _cli(fit.main, [str(runs), "--out", str(tmp_path / "out")] + LIGHT)
    assert rc == 0, err
    phi_line = [ln for ln in stdout.splitlines() if ln.startswith("phi = ")][0]
    print(phi_line)
    assert "on_bound" in phi_line and "unfinished_runs" in phi_line and "(no bootstrap CI)" in phi_line
    flags = {f["name"]: f["message"] for f in json.load(open(tmp_path / "out" / "fit.json"))["flags"]}
    assert "joint fit: e" in flags["on_bound"]
    assert "2 under" in flags["unfinished_runs"] and "killed_a" in flags["unfinished_runs"]
    assert "**unfinished_runs**" in open(tmp_path / "out" / "report.md").read()


def test_single_budget_and_few_runs_are_flagged(tmp_path):
    path = _write_csv(tmp_path / "one.csv", _rows(budgets=(1e18,), loops=(1, 2, 4, 8)))   # 5 widths x 4 r
    # one restart: a single-budget optimum lies in a flat valley where every polish runs thousands of iterations
    rc, stdout, err = _cli(fit.main, ["--csv", path, "--out", str(tmp_path / "out"), "--restarts", "1",
                                      "--bootstrap", "0"])
    assert rc == 0, err
    phi_line = [ln for ln in stdout.splitlines() if ln.startswith("phi = ")][0]
    assert "single_budget" in phi_line and "few_runs" in phi_line
    flags = {f["name"]: f["message"] for f in json.load(open(tmp_path / "out" / "fit.json"))["flags"]}
    assert "every run at C = 1e+18" in flags["single_budget"]
    assert "r=1 fit: 5 runs for 5 parameters" in flags["few_runs"]


def test_assess_flags_each_condition_once():
    # assess() on hand-made fit blocks: each condition is one named flag; a clean result has none
    th = [3.0, 7.0, 0.5, 0.3, 0.3, 0.5]                               # a, b, e, alpha, beta, phi: inside the box
    blk = {"on_bounds": [], "r2": 0.99, "n": 40, "theta": th}
    runs = {"flops_budget": np.array([1e18] * 20 + [2e18] * 20), "n_loops": np.array([1, 4] * 20),
            "tokens": np.arange(40.0) + 1, "val_loss": np.linspace(2, 3, 40), "group": ["x"] * 40}
    res = {"joint": dict(blk), "per_arch": {"1": dict(blk, n=20, theta=th[:5]), "4": dict(blk, n=20, theta=th[:5])},
           "bootstrap": {"phi": [0.5] * 200, "n_resamples": 200}}
    assert fit.assess(res, runs) == []
    res["joint"]["on_bounds"], res["per_arch"]["4"]["on_bounds"] = ["phi"], ["e"]
    res["per_arch"]["1"]["theta"] = [3.0, 7.0, 0.5, 0.0005, 0.3]         # alpha a hair above 0: counts as on it
    res["joint"]["r2"], res["per_arch"]["1"]["r2"] = -0.01, float("nan")
    res["per_arch"]["4"]["n"] = 6
    res["bootstrap"] = {"phi": [3.0] * 10 + [0.5] * 40, "n_resamples": 50}
    flags = {f["name"]: f["message"] for f in fit.assess(res, runs)}
    assert sorted(flags) == ["few_resamples", "few_runs", "low_r2", "on_bound"]
    assert "joint fit: phi; r=1 fit: alpha; r=4 fit: e; bootstrap: 10 of 50" in flags["on_bound"]
    assert "joint fit R² = -0.010; r=1 fit R² = nan" in flags["low_r2"]
    assert "r=4 fit: 6 runs for 5 parameters" in flags["few_runs"]


# -----------------------------------------------------------------------------
# flops.py: every numeric flag finite and in range when parsed

@pytest.mark.parametrize("argv,culprit", [
    (["grid", "--mfu", "0.4", "--peak-flops", "inf"], "argument --peak-flops"),
    (["grid", "--peak-flops", "0"], "argument --peak-flops"),
    (["grid", "--peak-flops", "nan"], "argument --peak-flops"),
    (["grid", "--peak-flops", "-1e15"], "argument --peak-flops"),
    (["grid", "--mfu", "nan"], "argument --mfu"),
    (["grid", "--mfu", "1.5"], "argument --mfu"),
    (["costs", "--context", "-1"], "argument --context"),
    (["costs", "--scale", "0"], "argument --scale"),
])
def test_flops_flags_validated_at_parse(tmp_path, argv, culprit):
    line = _refused(flops.main, argv, culprit, tmp_path, code=2)
    assert line.startswith("flops.py ")


def test_cli_subprocess_exit_status_and_one_line(tmp_path):
    # the real entry points: exit status, one stderr line, no traceback
    for cmd, code, culprit in ((["flops.py", "grid", "--mfu", "0.4", "--peak-flops", "inf"], 2, "--peak-flops"),
                               (["fit.py", "--csv", str(tmp_path / "none.csv"), "--out", str(tmp_path / "o")], 2,
                                "does not exist")):
        p = subprocess.run([sys.executable, *cmd], cwd=ROOT, capture_output=True, text=True, timeout=120)
        lines = p.stderr.strip().splitlines()
        assert p.returncode == code and len(lines) == 1 and culprit in lines[0], (p.returncode, p.stderr)
        assert "Traceback" not in p.stderr and p.stdout == ""
    assert os.listdir(tmp_path) == []


# -----------------------------------------------------------------------------
# Issue 18: which runs a fit used, the case baseline's budgets, start-up failures, hand-edited records, ownership

def _case_tree(root, base_budgets=(4.64e17, 1e18, 2.15e18), case_budgets=(4.64e17, 1e18, 2.15e18), seed=0):
    """A runs folder as runs/mini.sh leaves it: baseline r = 1, 4 at base_budgets and a case "x" (r = 4 only, phi
    0.66: it borrows the baseline's r = 1 runs) at case_budgets, one done.json each."""
    _write_records(root, _rows(budgets=base_budgets, seed=seed))
    for i, row in enumerate(r for r in fit.synthetic_rows(0.66, 0.01, seed + 1) if r["n_loops"] == 4
                            and r["flops_budget"] in case_budgets):
        os.makedirs(root / "case_x" / f"run{i}")
        (root / "case_x" / f"run{i}" / "done.json").write_text(json.dumps(dict({k: row[k] for k in COLS}, case="x")))
    return str(root)


def test_cases_refuses_a_delta_phi_against_another_runs_folder(tmp_path, capsys):
    # D/fit.json fitted from runs B, D/case_x/fit.json from runs A: the case row's delta-phi would not be the
    # difference of the two phi the table shows. Refused, one line naming both; refitting D from A makes it agree
    a, b, d = _case_tree(tmp_path / "a"), _case_tree(tmp_path / "b", seed=7), tmp_path / "study"
    assert _cli(fit.main, [b, "--out", str(d)] + LIGHT)[0] == 0
    assert _cli(fit.main, [a, "--case", "x", "--out", str(d / "case_x")] + LIGHT)[0] == 0
    res = json.load(open(d / "case_x" / "fit.json"))
    assert res["runs"]["n"] == 28 and res["case"]["baseline_runs"]["n"] == 28 and "request_key" in res
    assert sorted(res["runs"]["dirs"])[:2] == ["case_x/run0", "case_x/run1"]
    line = _refused(fit.main, ["--cases", str(d)], "its baseline was refitted on other runs", tmp_path)
    assert os.path.join("case_x", "fit.json") in line and os.path.join("study", "fit.json") in line
    assert _cli(fit.main, [a, "--out", str(d), "--overwrite"] + LIGHT)[0] == 0
    rc, out, err = _cli(fit.main, ["--cases", str(d)])
    assert rc == 0, err
    base = json.load(open(d / "fit.json"))
    assert base["runs"]["digest"] == res["case"]["baseline_runs"]["digest"]       # the same runs, same digest
    row = [ln for ln in open(d / "report.md").read().splitlines() if ln.startswith("| x |")][0].split(" | ")
    phi, bphi, dphi = float(row[1].split()[0]), float(row[2]), float(row[3].split()[0])
    assert abs(phi - bphi - dphi) <= 0.0011                                       # the two phi shown, to rounding
    assert f"delta_phi {res['case']['delta_phi']:+.3f} vs baseline phi {res['case']['baseline']['phi']:.3f}" in out


def test_cases_writes_into_its_baseline_fits_folder_and_a_copy_of_it(tmp_path):
    # --cases writes into the baseline fit's folder as that fit's own request: no --overwrite needed, on the study
    # and on a `cp -a` copy of it (runs/mini.sh --case NAME COPY: case fit, baseline refit, --cases, in that order)
    a, d = _case_tree(tmp_path / "a"), tmp_path / "study"
    assert _cli(fit.main, [a, "--out", str(d)] + LIGHT)[0] == 0
    assert _cli(fit.main, [a, "--case", "x", "--out", str(d / "case_x")] + LIGHT)[0] == 0
    assert _cli(fit.main, ["--cases", str(d)])[0] == 0
    assert _cli(fit.main, ["--cases", str(d)])[0] == 0                            # again: its own files
    assert (d / "cases.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert _cli(fit.main, [a, "--out", str(d)] + LIGHT)[0] == 0                   # the fit rewrites its folder
    copy = tmp_path / "copy"
    shutil.copytree(d, copy, symlinks=True)
    for argv in ([a, "--case", "x", "--out", str(copy / "case_x"), "--overwrite"], [a, "--out", str(copy),
                 "--overwrite"]):
        assert _cli(fit.main, argv + LIGHT)[0] == 0
    rc, out, err = _cli(fit.main, ["--cases", str(copy)])
    assert rc == 0 and "| x |" in (copy / "report.md").read_text(), err
    # a folder that is not this fit's: its fit.json names another request than its marker -> refused, unchanged
    res = json.loads((copy / "fit.json").read_text())
    res["request"]["seed"] = 99
    (copy / "fit.json").write_text(json.dumps(res))
    _refused(fit.main, ["--cases", str(copy)], "holds another request of fit", tmp_path)
    # a figure name taken by a link is never written through, even with --overwrite
    os.symlink(tmp_path / "a", d / "cases_loops.png")
    _refused(fit.main, ["--cases", str(d), "--overwrite"], "cases_loops.png is a link", tmp_path)


def test_cases_checks_every_number_it_shows(tmp_path):
    # a hand-edited case fit.json: a CI bound that is text, a sweep curve that is not one, a frontier row that is no
    # record -- each is one line naming the file, never a traceback or a figure of garbage
    a, d = _case_tree(tmp_path / "a"), tmp_path / "study"
    assert _cli(fit.main, [a, "--out", str(d)] + LIGHT)[0] == 0
    assert _cli(fit.main, [a, "--case", "x", "--out", str(d / "case_x")] + LIGHT)[0] == 0
    good = json.loads((d / "case_x" / "fit.json").read_text())
    for edit in ({"bootstrap": {"phi_lo": "x", "phi_hi": 1.0}}, {"loop_sweep": [{"n_loops": 4, "curve": [1]}]},
                 {"frontier": {"rows": [1]}}, {"case": dict(good["case"], delta_phi=float("inf"))}):
        (d / "case_x" / "fit.json").write_text(json.dumps(dict(good, **edit)))
        line = _refused(fit.main, ["--cases", str(d)], "not a fit.py result", tmp_path)
        assert os.path.join("case_x", "fit.json") in line


def test_case_baseline_on_fewer_budgets_says_so_and_flags_it(tmp_path):
    # the case has 2.15e18, the baseline does not: the baseline is refitted on 2 of the case's 3 budgets, and the
    # message says so (it said "on the same budgets"); with one budget left, single_budget is raised for it
    runs = _case_tree(tmp_path / "r", base_budgets=(4.64e17, 1e18))
    rc, out, err = _cli(fit.main, [runs, "--case", "x", "--out", str(tmp_path / "o")] + LIGHT)
    assert rc == 0, err
    assert "refitted on 2 of the case's 3 budgets (no baseline runs at C = 2.15e+18)" in out
    assert "refitted on the same budgets" not in out
    res = json.load(open(tmp_path / "o" / "fit.json"))
    flags = {f["name"]: f["message"] for f in res["flags"]}
    assert "no baseline runs at C = 2.15e+18" in flags["budget_mismatch"]
    assert "Baseline (refitted on 2 of the case's 3 budgets" in open(tmp_path / "o" / "report.md").read()
    runs = _case_tree(tmp_path / "s", base_budgets=(1e18,), case_budgets=(4.64e17, 1e18))
    rc, out, err = _cli(fit.main, [runs, "--case", "x", "--out", str(tmp_path / "o1")] + LIGHT)
    assert rc == 0, err
    phi_line = [ln for ln in out.splitlines() if ln.startswith("phi = ")][0]
    assert "single_budget" in phi_line and "budget_mismatch" in phi_line
    flags = {f["name"]: f["message"] for f in json.load(open(tmp_path / "o1" / "fit.json"))["flags"]}
    assert "case baseline fit: every run at C = 1e+18" in flags["single_budget"]
    # a fit of the same runs with every budget present says "the same budgets" and raises neither flag
    runs = _case_tree(tmp_path / "t")
    rc, out, _ = _cli(fit.main, [runs, "--case", "x", "--out", str(tmp_path / "o2")] + LIGHT)
    assert rc == 0 and "refitted on the same budgets" in out and "budget_mismatch" not in out


def test_a_folder_with_only_train_log_is_an_unfinished_run(tmp_path):
    # what runs/launch.bash leaves when a cell fails at start-up: train.log and nothing else
    runs = tmp_path / "runs"
    _write_records(runs, _rows())
    os.makedirs(runs / "C1e18_r4_s8")
    (runs / "C1e18_r4_s8" / "train.log").write_text("train.py: error: --data out/x: no such folder\n")
    assert "train.log" in fit.UNFINISHED
    rc, out, err = _cli(fit.main, [str(runs), "--out", str(tmp_path / "o")] + LIGHT)
    assert rc == 0, err
    assert "unfinished_runs" in [ln for ln in out.splitlines() if ln.startswith("phi = ")][0]
    flags = {f["name"]: f["message"] for f in json.load(open(tmp_path / "o" / "fit.json"))["flags"]}
    assert "1 under" in flags["unfinished_runs"] and "C1e18_r4_s8" in flags["unfinished_runs"]


@pytest.mark.parametrize("key,value,culprit", [
    ("val_loss", "2.5", "key 'val_loss' must be int/float, got str '2.5'"),
    ("val_loss", float("nan"), "key 'val_loss' must be a finite number in (0, 100]"),
    ("tokens", 1e300, "key 'tokens' must be in [1, 1e16]"),
    ("n_loops", 32, "key 'n_loops' must be in [1, 16]"),
    ("n_loops", 4.0, "key 'n_loops' must be int, got float"),
    ("flops_budget", -1.0, "key 'flops_budget' must be in (0, 1e30]"),
    ("case", 5, "key 'case' must be str"),
    ("identity", "abc", "key 'identity' must be dict"),
    ("n_loops", 2, "key 'n_loops' is 2 but the record's config says 4"),
    ("flops_budget", 2e18, "key 'flops_budget' is 2e+18 but the record's config says 1e+18"),
    ("case", "bptt", "key 'case' is 'bptt' but the record's config says ''"),
])
def test_a_hand_edited_done_json_field_is_one_line_naming_file_and_key(tmp_path, key, value, culprit):
    runs = tmp_path / "runs"
    _write_records(runs, _rows())
    path = runs / "run15" / "done.json"                 # r = 4 at C = 1e18
    rec = json.loads(path.read_text())
    assert rec["n_loops"] == 4 and rec["flops_budget"] == 1e18
    rec["config"] = {"model_config": {"n_loops": 4}, "train_config": {"flops_budget": 1e18, "case": ""}}
    rec[key] = value
    path.write_text(json.dumps(rec))                  # json writes NaN for float("nan"), as a hand edit might
    line = _refused(fit.main, [str(runs), "--out", str(tmp_path / "o")] + LIGHT, culprit, tmp_path)
    assert str(path) in line


def test_eval_json_sweep_hand_edited_is_named(tmp_path):
    # a loop sweep beside a run is read with the record; a torn or edited one is named, not silently dropped
    runs = tmp_path / "runs"
    _write_records(runs, _rows())
    for text, culprit in (('{"n_loops_sweep": ', "not a JSON record"),
                          ('{"n_loops_sweep": [{"n_loops": 2, "val_loss": "low"}]}', "n_loops_sweep must be a list")):
        (runs / "run3" / "eval.json").write_text(text)
        line = _refused(fit.main, [str(runs), "--out", str(tmp_path / "o")] + LIGHT, culprit, tmp_path)
        assert os.path.join("run3", "eval.json") in line


def test_outputs_that_are_links_and_case_baseline_flag_are_refused(tmp_path, good_csv):
    # a link in --out is never written through, even with --overwrite; --case baseline names the main grid
    (tmp_path / "mine.txt").write_text("mine\n")
    os.makedirs(tmp_path / "o")
    os.symlink(tmp_path / "mine.txt", tmp_path / "o" / "report.md")
    _refused(fit.main, ["--csv", good_csv, "--out", str(tmp_path / "o"), "--overwrite"] + LIGHT, "is a link",
             tmp_path)
    _refused(fit.main, ["--csv", good_csv, "--case", "baseline", "--out", str(tmp_path / "p")], "names the main grid",
             tmp_path, code=2)


def test_record_limits_agree_with_train_limits():
    # "the same limits as the CLI": where a record field is a train.py flag, fit.py's range is train.py's
    train = pytest.importorskip("train")
    for key in ("flops_budget", "n_loops"):
        assert fit.LIMITS[key][0] == train.LIMITS[key][0], key


def test_two_concurrent_fits_into_one_out_are_never_both_told_wrote(tmp_path, good_csv):
    # one writer per output folder: while a fit.py holds --out, a second one (any request) is refused at once, one
    # line, and changes nothing; the first then finishes
    out = tmp_path / "o"
    first = subprocess.Popen([sys.executable, "fit.py", "--csv", good_csv, "--out", str(out), "--restarts", "300",
                              "--bootstrap", "40"], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        for _ in range(600):                                        # the claim comes before any fit
            if (out / ".nanoloop-fit").exists() or first.poll() is not None:
                break
            time.sleep(0.05)
        assert first.poll() is None, "the first fit ended before the second started; make it heavier"
        for argv in (["--csv", good_csv, "--out", str(out), "--restarts", "300", "--bootstrap", "40"],
                     ["--csv", good_csv, "--out", str(out), "--overwrite"] + LIGHT):
            before = _snapshot(out)
            rc, _, err = _cli(fit.main, argv)
            assert rc == 2 and "is being written by another fit process" in err, err
            assert _snapshot(out) == before
    finally:
        stdout, stderr = first.communicate(timeout=600)
    assert first.returncode == 0 and "wrote " in stdout, stderr


def test_linked_runs_are_followed_and_a_link_loop_or_fifo_is_named(tmp_path):
    runs = tmp_path / "runs"
    _write_records(runs, _rows())
    shutil.move(str(runs / "run3"), tmp_path / "elsewhere")
    os.symlink(tmp_path / "elsewhere", runs / "run3")             # a run linked in: followed, fitted
    assert len(fit.load_records(str(runs))) == 28
    os.symlink(runs, runs / "run3" / "back")                      # a loop: named, not walked forever
    _refused(fit.main, [str(runs), "--out", str(tmp_path / "o")] + LIGHT, "a link loop or a duplicate", tmp_path)
    os.remove(runs / "run3" / "back")
    for name in ("eval.json", "done.json"):                       # a FIFO is named, never opened (it would block)
        os.remove(runs / "run5" / "done.json") if name == "done.json" else None
        os.mkfifo(runs / "run5" / name)
        _refused(fit.main, [str(runs), "--out", str(tmp_path / "o")] + LIGHT, "is a FIFO", tmp_path)
        os.remove(runs / "run5" / name)
    os.symlink("/dev/zero", runs / "run6" / "eval.json")          # a device behind a link: refused, never read
    _refused(fit.main, [str(runs), "--out", str(tmp_path / "o")] + LIGHT, "folder or device, not a file", tmp_path)


def test_runs_on_different_data_are_not_fitted_as_one_study(tmp_path):
    runs = tmp_path / "runs"
    _write_records(runs, _rows())
    for i, (data, tok) in enumerate([("d1", "t1")] * 27 + [("d2", "t1")]):
        path = runs / f"run{i}" / "done.json"
        rec = json.loads(path.read_text())
        rec.update(identity={"data": data}, tokenizer_hash=tok)
        if i == 5:                                                # a record that predates the field matches any
            del rec["identity"]
        path.write_text(json.dumps(rec))
    _refused(fit.main, [str(runs), "--out", str(tmp_path / "o")] + LIGHT, "were trained on different data (data: "
             "'d1' vs 'd2')", tmp_path)
    rec = json.loads((runs / "run27" / "done.json").read_text())
    rec.update(identity={"data": "d1"}, tokenizer_hash="t2")      # same data, another tokenizer
    (runs / "run27" / "done.json").write_text(json.dumps(rec))
    _refused(fit.main, [str(runs), "--out", str(tmp_path / "o")] + LIGHT, "tokenizer: 't1' vs 't2'", tmp_path)


def test_record_numbers_pass_the_flag_limits_and_the_accounting(tmp_path):
    # the executed FLOPs design.py costs a finished run with, and N_once + N_rec against the width of its config
    runs = tmp_path / "runs"
    _write_records(runs, _rows())
    path = runs / "run15" / "done.json"
    rec = json.loads(path.read_text())
    for edit, culprit in (({"flops": 1e300}, "key 'flops' must be in (0, 1e30]"),
                          ({"flops": "many"}, "key 'flops' must be int/float"),
                          ({"n_rec": rec["n_rec"] + 1}, "record and accounting disagree")):
        path.write_text(json.dumps(dict(rec, **edit)))
        _refused(fit.main, [str(runs), "--out", str(tmp_path / "o")] + LIGHT, culprit, tmp_path)
    # no width in the record itself: its config's is used, so an edited N is still caught
    bare = {k: v for k, v in rec.items() if k != "d_model"}
    path.write_text(json.dumps(dict(bare, n_rec=rec["n_rec"] + 1, config={"model_config": {
        "n_loops": rec["n_loops"], "d_model": rec["d_model"]}})))
    _refused(fit.main, [str(runs), "--out", str(tmp_path / "o")] + LIGHT, "record and accounting disagree", tmp_path)


def test_a_fifo_marker_and_an_unbounded_bootstrap_are_one_line(tmp_path, good_csv):
    os.makedirs(tmp_path / "o")
    os.mkfifo(tmp_path / "o" / ".nanoloop-fit")                   # reading it would wait forever
    _refused(fit.main, ["--csv", good_csv, "--out", str(tmp_path / "o")] + LIGHT, "is not a plain file", tmp_path)
    _refused(fit.main, ["--csv", good_csv, "--out", str(tmp_path / "p"), "--bootstrap", "100000", "--boot-restarts",
                        "1000"], "at most 1e6 starts", tmp_path, code=2)


def test_a_refused_fit_leaves_the_folder_and_its_marker_as_they_were(tmp_path, good_csv):
    # refusals raised after the claim (data no fit can use) give the folder back: no new folder, the old marker text
    flat = _rows()
    for row in flat:
        row["val_loss"] = 3.0
    flat_csv = _write_csv(tmp_path / "flat.csv", flat)
    _refused(fit.main, ["--csv", flat_csv, "--out", str(tmp_path / "new")] + LIGHT, "same val_loss", tmp_path)
    assert _cli(fit.main, ["--csv", good_csv, "--out", str(tmp_path / "o")] + LIGHT)[0] == 0
    _refused(fit.main, ["--csv", flat_csv, "--out", str(tmp_path / "o"), "--overwrite"] + LIGHT, "same val_loss",
             tmp_path)
    assert _cli(fit.main, ["--csv", good_csv, "--out", str(tmp_path / "o")] + LIGHT)[0] == 0   # still its folder
