"""Tests for runs/*.sh (issue 5 acceptance 6; style B10): every `train.py` launch line of every script parses through
train.parse_args with its bash arrays substituted (bash itself expands them under --dry-run), and each sweep lists
exactly the paper's runs: 116 for the grid (Table 6), 69 / 63 for the case studies (§5), 5 for Table 5, ...

Issue 18: a sweep never decides "finished" from the existence of a done.json (every run goes to train.py --resume,
here a fake torchrun on PATH that plays train.py's part), and paths with spaces and non-ASCII characters survive every
script under LC_ALL=C and C.UTF-8. Issue 24: runs/mini.sh owns its OUT through `python common.py claim` (one writer,
a refusal changes nothing, a cp -a copy is the same study) and its list of cases is read from the script itself.

Run: pytest -q tests/test_runs.py   (bash only, no training except two tiny runs; a stale flag fails here instead
of in a 116-run sweep)
"""
import glob
import hashlib
import math
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time

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
NO_TRAIN = {"bench.sh": "python runs/bench_train.py ", "gpu_check.sh": "gpu-check: 6 stages",
            "gpu_session.sh": "gpu-session: "}


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
            F = flops.flops_per_token(**flops.accounting_args(mcfg))   # the one ModelConfig -> accounting map
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


@pytest.mark.parametrize("env, args, needle", [
    ({}, ["--bogus"], "unknown argument '--bogus'"),          # used to launch the whole sweep with the typo ignored
    ({"NPROC": "abc"}, ["--dry-run"], "NPROC=abc must be a whole number"),
    ({"NPROC": "0"}, [], "NPROC=0 must be a whole number"),
])
def test_sweep_scripts_refuse_bad_arguments_before_launching(env, args, needle, tmp_path):
    # issue 12 rule 5 on every sweep script (they share runs/launch.bash): one line, exit 2, nothing created
    for script in LAUNCH_SCRIPTS:
        proc = subprocess.run(["bash", f"runs/{script}", *args], cwd=ROOT, capture_output=True, text=True,
                              env={**os.environ, "OUT": str(tmp_path / "out"), **env}, timeout=30)
        print(f"\n{script} {env} {args} -> {proc.stderr.strip()}")
        assert proc.returncode == 2 and needle in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
        assert proc.stdout == "" and not (tmp_path / "out").exists()


# -----------------------------------------------------------------------------
# Issue 18 §1: "finished" is train.py's decision. A fake torchrun on PATH plays train.py --resume: it trains a run
# without a record, hands back the record of the same run, and refuses (exit 2) any other done.json -- the 0-byte
# and the copied one the old sweep skipped as finished.

WEIRD = "x y/é ü"                                          # a space and non-ASCII characters in every path below
LAUNCH_SCRIPTS = ["grid.sh", "case_bptt.sh", "case_hc.sh", "ablation_injection.sh", "lr_sweep.sh", "depth.sh",
                  "extrapolate.sh"]                        # the sweeps that source runs/launch.bash
FAKE_TORCHRUN = r"""#!/usr/bin/env bash
out=; prev=
for a in "$@"; do [[ $prev == --out-dir ]] && out=$a; prev=$a; done
printf '%s\n' "$out" >> "$FAKE_CALLS"
[[ ${!#} == --resume ]] || { echo "fake: no --resume" >&2; exit 3; }
[[ -n ${FAKE_INTERRUPT_AT:-} && $(wc -l < "$FAKE_CALLS") -ge $FAKE_INTERRUPT_AT ]] && { kill -INT "$PPID"; exit 130; }
want="{\"run\": \"$out\"}"
if [[ -e $out/done.json ]]; then
  [[ $(cat "$out/done.json") == "$want" ]] && { echo "handed back $out"; exit 0; }
  echo "train.py: error: $out/done.json is not the record of this run" >&2; exit 2
fi
printf '%s' "$want" > "$out/done.json"; echo "trained $out"
"""


def fake_bin(tmp_path):
    """A folder holding the fake torchrun; returns the env to run a sweep with it first on PATH."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "torchrun").write_text(FAKE_TORCHRUN)
    os.chmod(bin_dir / "torchrun", 0o755)
    return {"PATH": f"{bin_dir}:{os.environ['PATH']}", "FAKE_CALLS": str(tmp_path / "calls.txt")}


def sweep(script, *args, env=None, locale="C.UTF-8", timeout=120):
    full = {**os.environ, "NPROC": "1", "LC_ALL": locale, **(env or {})}
    return subprocess.run(["bash", f"runs/{script}", *args], cwd=ROOT, env=full, capture_output=True, text=True,
                          timeout=timeout)


@pytest.mark.parametrize("script", LAUNCH_SCRIPTS)
def test_sweep_dry_run_keeps_odd_paths_whole(script, tmp_path):
    """Spaces, non-ASCII, glob characters, quotes, $(...) and backslashes in OUT come back as one word per path
    (shlex, as a user pasting the line into a shell gets them), under LC_ALL=C."""
    out = str(tmp_path / "é ü" / "a*b?[c] $(x) `y` 'q' \\z")
    proc = sweep(script, "--dry-run", env={"OUT": out}, locale="C")
    outs = [out_dir(argv) for _, argv in launches(proc.stdout.splitlines())]
    assert proc.returncode == 0 and outs and all(o.startswith(out + "/") for o in outs), proc.stdout[:500]
    assert len(set(outs)) == len(outs) and not os.path.exists(tmp_path / "é ü")


@pytest.mark.parametrize("locale", ["C", "C.UTF-8"])
def test_sweep_hands_every_run_to_train_py(locale, tmp_path):
    """`NPROC=1 bash runs/grid.sh`: a 0-byte done.json and one copied from another run are not skipped as finished:
    train.py refuses both, the sweep goes on, counts them failed, names them and exits 1."""
    out = tmp_path / WEIRD / "grid"
    env = {**fake_bin(tmp_path), "OUT": str(out)}
    cells = [out_dir(argv) for _, argv in launches(sweep("grid.sh", "--dry-run", env=env, locale=locale)
                                                    .stdout.splitlines())]
    assert len(cells) == 116 and cells[0].startswith(str(out) + "/")           # one word each, in any locale
    empty, copied, same = cells[3], cells[7], cells[11]
    for c in (empty, copied, same):
        os.makedirs(c)
    open(os.path.join(empty, "done.json"), "w").close()                          # 0 bytes
    open(os.path.join(copied, "done.json"), "w").write(f'{{"run": "{same}"}}')   # another run's record
    open(os.path.join(same, "done.json"), "w").write(f'{{"run": "{same}"}}')     # its own: handed back
    dry = sweep("grid.sh", "--dry-run", env=env, locale=locale)
    assert len(launches(dry.stdout.splitlines())) == 116 and "3 have a done.json" in dry.stderr
    proc = sweep("grid.sh", env=env, locale=locale)
    calls = open(env["FAKE_CALLS"], encoding="utf-8").read().splitlines()
    print(f"\n{locale}: exit {proc.returncode}; {len(calls)} train.py calls\n{proc.stderr.strip()}")
    assert calls == cells                                                         # every run, once, none skipped
    assert proc.returncode == 1 and "runs/grid.sh: 116 runs: 114 finished, 2 failed" in proc.stdout
    assert sorted(ln for ln in proc.stderr.splitlines() if ln.startswith("FAILED: ")) == sorted(
        [f"FAILED: {c} (exit 2: {c}/done.json is not the record of this run)" for c in (empty, copied)])
    assert os.path.getsize(os.path.join(empty, "done.json")) == 0                 # neither is replaced
    assert "handed back" in open(os.path.join(same, "train.log"), encoding="utf-8").read()
    assert "grid complete" not in proc.stdout


def test_sweep_stops_on_interrupt_and_refuses_link_and_odd_out(tmp_path):
    """Ctrl-C stops the sweep (it is not one failed run to step over); a train.log that is a link is not appended
    through; OUT=-x is a folder, never a flag; an OUT with a newline is refused before any launch."""
    env = {**fake_bin(tmp_path), "OUT": str(tmp_path / "abl")}
    victim = tmp_path / "victim.txt"
    victim.write_text("a user's file\n")
    os.makedirs(tmp_path / "abl" / "additive")
    os.symlink(victim, tmp_path / "abl" / "additive" / "train.log")
    proc = sweep("ablation_injection.sh", env={**env, "FAKE_INTERRUPT_AT": "3"})
    calls = open(env["FAKE_CALLS"]).read().splitlines()
    print(f"\ninterrupted: exit {proc.returncode}, calls {calls}\n{proc.stderr.strip()}")
    assert proc.returncode == 130 and [os.path.basename(c) for c in calls] == ["linear", "passthrough", "hyper"]
    assert "interrupted at run 4" in proc.stderr.splitlines()[-1]                # "random" is never started
    assert victim.read_text() == "a user's file\n" and "train.log is a link" in proc.stderr
    proc = sweep("extrapolate.sh", "--dry-run", env={**env, "OUT": "-x"})
    argvs = [argv for _, argv in launches(proc.stdout.splitlines())]
    assert proc.returncode == 0 and [out_dir(a) for a in argvs] == ["./-x/s34_r1", "./-x/s34_r4"]
    assert [parse("", a)[1].out_dir for a in argvs] == ["./-x/s34_r1", "./-x/s34_r4"]
    (tmp_path / "ext").mkdir()
    (tmp_path / "ext" / "s34_r1").write_text("a file where a run folder goes\n")
    proc = sweep("extrapolate.sh", env={**env, "OUT": str(tmp_path / "ext")})       # counted failed; the next runs
    assert proc.returncode == 1 and "2 runs: 1 finished, 1 failed" in proc.stdout and "cannot make" in proc.stderr
    assert (tmp_path / "ext" / "s34_r1").read_text() == "a file where a run folder goes\n"
    proc = sweep("extrapolate.sh", env={**env, "OUT": str(tmp_path / "a\nb")})
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1 and "newline" in proc.stderr
    assert proc.stdout == "" and len(open(env["FAKE_CALLS"]).read().splitlines()) == 4   # nothing launched


# -----------------------------------------------------------------------------
# runs/slurm.sh: the sweep submits every run not queued (its job's train.py decides), paths survive, no globbing

def test_slurm_sweep_leaves_finished_to_train_py_and_keeps_paths(tmp_path):
    grid = tmp_path / WEIRD
    os.makedirs(grid / "C1e18_r4_s10")
    (grid / "C1e18_r4_s10" / "done.json").write_text("")                       # 0 bytes: not "finished"
    (tmp_path / "--partition=gpuA").write_text("")                              # a glob would match this
    env = {"OUT": str(grid), "SBATCH_ARGS": "--partition=gpu* --qos=low", "PATH": os.environ["PATH"]}
    for locale in ("C", "C.UTF-8"):
        p = subprocess.run(["bash", "runs/slurm.sh", "--sweep", "runs/grid.sh", "--dry-run"], cwd=ROOT,
                           env={**os.environ, **env, "LC_ALL": locale}, capture_output=True, text=True, timeout=120)
        lines = p.stdout.splitlines()
        print(f"\n{locale}: {p.stderr.strip()}\n{lines[0]}")
        assert p.returncode == 0 and len(lines) == 116 and "116 submitted (dry run) (1 with a done.json" in p.stderr
        words = shlex.split(lines[0])
        assert words[:4] == ["sbatch", words[1], "--partition=gpu*", "--qos=low"] and words[4] == "runs/slurm.sh"
        outs = [out_dir(shlex.split(ln)) for ln in lines]
        assert all(o.startswith(str(grid) + "/") for o in outs) and str(grid / "C1e18_r4_s10") in outs
        train.parse_args(words[5:])
    # a sweep script that fails (here with two lines on stderr): one line, exit 2, nothing submitted
    bad = tmp_path / "bad.sh"
    bad.write_text("echo first >&2; echo 'second: the reason' >&2; exit 3\n")
    p = subprocess.run(["bash", "runs/slurm.sh", "--sweep", str(bad)], cwd=ROOT, env=os.environ,
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and p.stderr.strip().splitlines() == [
        f"runs/slurm.sh: bash {bad} --dry-run failed: second: the reason"] and p.stdout == ""
    # single-run mode: the launch line keeps the path as one word; bad numbers are refused in one line
    p = subprocess.run(["bash", "runs/slurm.sh", "--dry-run", "--steps", "2", "--out-dir", str(grid)], cwd=ROOT,
                       env={**os.environ, "LC_ALL": "C"}, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0 and shlex.split(p.stdout)[-2:] == [str(grid), "--resume"]
    p = subprocess.run(["bash", "runs/slurm.sh", "--steps", "2", "--out-dir", str(tmp_path / "--partition=gpuA")],
                       cwd=ROOT, env=os.environ, capture_output=True, text=True, timeout=60)   # a file in the way
    assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1 and "cannot make this folder" in p.stderr
    for bad in ({"NPROC": "abc"}, {"NPROC": "0"}, {"MASTER_PORT": "99999"}, {"MASTER_PORT": "x"}):
        for args in (["--dry-run", "--steps", "2"], ["--sweep", "runs/grid.sh", "--dry-run"]):
            if "MASTER_PORT" in bad and "--sweep" in args:
                continue
            p = subprocess.run(["bash", "runs/slurm.sh", *args], cwd=ROOT, env={**os.environ, **bad},
                               capture_output=True, text=True, timeout=60)
            assert p.returncode == 2 and p.stdout == "" and len(p.stderr.strip().splitlines()) == 1, (bad, p.stderr)
            assert list(bad)[0] in p.stderr


def test_slurm_real_tiny_run_in_an_odd_path(tmp_path, tiny_data):
    """One real torchrun through runs/slurm.sh (outside SLURM: one node, c10d on localhost) under LC_ALL=C, into a
    folder with a space and non-ASCII characters; the same command again hands back the same record; a 0-byte
    done.json is refused by train.py, not taken as finished, and left as it was."""
    import socket
    with socket.socket() as s:                                   # a free port: other test sessions share the host
        s.bind(("127.0.0.1", 0))
        port = str(s.getsockname()[1])
    tiny = ["--scale", "1", "--head-dim", "32", "--n-layers-eff", "4", "--n-layers-prelude", "1",
            "--n-layers-coda", "1", "--n-loops", "2", "--seq-len", "32", "--batch-tokens", "256", "--device-batch",
            "4", "--eval-tokens", "512", "--steps", "2", "--data", tiny_data]
    env = {**os.environ, "LC_ALL": "C", "NPROC": "1", "MASTER_PORT": port, "OMP_NUM_THREADS": "1"}
    env = {k: v for k, v in env.items() if not k.startswith("SLURM_")}
    run_dir = tmp_path / WEIRD / "run"

    def slurm(out):
        return subprocess.run(["bash", "runs/slurm.sh", *tiny, "--out-dir", str(out)], cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=300)
    p = slurm(run_dir)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    rec = open(run_dir / "done.json", "rb").read()
    again = slurm(run_dir)
    print(f"\nsecond call: {again.stdout.strip().splitlines()[-1:]}")
    assert again.returncode == 0 and open(run_dir / "done.json", "rb").read() == rec
    torn = tmp_path / WEIRD / "torn"
    torn.mkdir()
    (torn / "done.json").write_bytes(b"")
    p = slurm(torn)
    print(f"0-byte done.json: exit {p.returncode}: {[ln for ln in p.stdout.splitlines() if 'error' in ln][-1:]}")
    assert p.returncode != 0 and (torn / "done.json").read_bytes() == b"" and not (torn / "ckpt.pt").exists()


# -----------------------------------------------------------------------------
# runs/mini.sh owns OUT through `python common.py claim OUT mini GRID` and holds a flock on OUT/.nanoloop-mini while it
# runs (issue 24 rule 2 and 4). A `python` shim stops mini.sh at its first data step (after the claim and the lock),
# so these checks cost no training; SHIM_HOLD=SECONDS keeps it there (a mini.sh still running), touching SHIM_READY.

MINI_SHIM = f"""#!/bin/sh
case "$1" in data.py)
  if [ -n "$SHIM_HOLD" ]; then : > "$SHIM_READY"; sleep "$SHIM_HOLD"; fi
  echo "shim: stopped before data.py" >&2; exit 9 ;;
esac
exec {shlex.quote(sys.executable)} "$@"
"""


def mini(*args, shim=None, env=None, locale="C.UTF-8", timeout=60):
    full = {**os.environ, "LC_ALL": locale, **(env or {})}
    if shim:
        full["PATH"] = f"{shim}:{full['PATH']}"
    return subprocess.run(["bash", "runs/mini.sh", *args], cwd=ROOT, env=full, capture_output=True, text=True,
                          timeout=timeout)


def files(root):
    """{path: sha256 (None for a folder)} of everything under root (what a refusal must leave as it was)."""
    out = {}
    for d, dirs, names in os.walk(root):
        out.update({os.path.join(d, n): None for n in dirs})
        out.update({os.path.join(d, n): hashlib.sha256(open(os.path.join(d, n), "rb").read()).hexdigest()
                    for n in names})
    return out


@pytest.fixture()
def shim(tmp_path):
    d = tmp_path / "shim"
    d.mkdir()
    (d / "python").write_text(MINI_SHIM)
    os.chmod(d / "python", 0o755)
    return str(d)


def refused(proc, *needles):
    lines = proc.stderr.strip().splitlines()
    print(f"\nexit {proc.returncode}: {lines}")
    assert proc.returncode == 2 and len(lines) == 1 and lines[0].startswith("runs/mini.sh: "), proc.stderr
    assert proc.stdout == "" and all(n in lines[0] for n in needles)


def stopped(proc):
    """mini.sh got past its claim and lock and reached the data step, where the shim stopped it."""
    assert proc.returncode == 9 and "shim: stopped before data.py" in proc.stderr, proc.stderr
    return proc


@pytest.mark.parametrize("locale", ["C", "C.UTF-8"])
def test_mini_claims_only_its_own_out(locale, tmp_path, shim):
    out = tmp_path / WEIRD / "study"
    stopped(mini("--quick", str(out), shim=shim, locale=locale))               # new: claimed, then the shim stops
    assert sorted(os.listdir(out)) == [".nanoloop-mini", "runs"]
    stopped(mini("--quick", str(out), shim=shim, locale=locale))               # its own, same grid: resumed
    stopped(mini("--quick", "--case", "hc", str(out), shim=shim, locale=locale))   # a case shares the baseline's grid
    foreign = tmp_path / WEIRD / "foreign"                                     # runs/ and fit outputs it never made
    (foreign / "runs" / "C3e10_r1_s1").mkdir(parents=True)
    (foreign / "fit.json").write_text('{"phi": 0.5}\n')
    (foreign / "report.md").write_text("my notes\n")
    (tmp_path / "file").write_text("x\n")
    before = files(tmp_path)
    refused(mini(str(out), shim=shim, locale=locale), str(out), "another request of mini")   # the full grid
    refused(mini("--quick", str(foreign), shim=shim, locale=locale), str(foreign), "did not make", "--overwrite")
    refused(mini("--quick", "--case", "bptt", str(foreign), shim=shim, locale=locale), "did not make")
    refused(mini("--quick", str(tmp_path / "file"), shim=shim, locale=locale), "cannot use this folder")
    refused(mini("--quick", "a", "b"), "two OUT folders")
    refused(mini("--quick", "--bogus", str(out)), "unknown flag --bogus")
    refused(mini("--quick", str(tmp_path / "a\nb")), "newline")
    assert files(tmp_path) == before                                           # every refusal: nothing touched
    stopped(mini("--quick", "--overwrite", str(foreign), shim=shim, locale=locale))   # asked for: adopted, kept
    assert (foreign / "report.md").read_text() == "my notes\n" and (foreign / "fit.json").exists()


def test_mini_one_writer_per_out(tmp_path, shim):
    """While one mini.sh runs (held at its data step), a second on the same OUT -- same grid, a case, another grid
    with --overwrite -- is refused in one line and changes nothing; the tools mini.sh starts claim their own markers
    in the same folder (fit.py --out OUT, data.py --out OUT/data) without waiting on its lock. When it and every
    process it started have exited, the study resumes."""
    out = tmp_path / "study"
    ready = tmp_path / "ready"
    env = {"PATH": f"{shim}:{os.environ['PATH']}", "LC_ALL": "C.UTF-8", "SHIM_HOLD": "20", "SHIM_READY": str(ready)}
    first = subprocess.Popen(["bash", "runs/mini.sh", "--quick", str(out)], cwd=ROOT, env={**os.environ, **env},
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        for _ in range(300):                                     # until the first one holds OUT (at its data step)
            if ready.exists() or first.poll() is not None:
                break
            time.sleep(0.1)
        assert ready.exists(), first.communicate()[1]
        before = files(out)
        for args in (["--quick"], ["--quick", "--case", "additive"], ["--overwrite"]):
            refused(mini(*args, str(out), shim=shim), str(out), "being written by another")
        assert files(out) == before
        for tool, folder in (("fit", out), ("data", out / "data")):   # another tool's claim is not blocked
            p = subprocess.run([sys.executable, "common.py", "claim", str(folder), tool, "req", "--overwrite"],
                               cwd=ROOT, capture_output=True, text=True, timeout=30)
            assert p.returncode == 0 and p.stdout.strip() in ("fresh", "overwrite"), p.stderr
    finally:                 # the lock lives while any process mini.sh started does (they inherit it): kill all
        os.killpg(first.pid, signal.SIGKILL)
        first.communicate()
    stopped(mini("--quick", str(out), shim=shim))               # the holder is gone: resumed
    assert (out / ".nanoloop-mini").read_text().startswith("mini ")    # the marker kept its content (never emptied)


def test_mini_copied_study_is_the_same_study(tmp_path, shim):
    """`cp -a` of a study is the same study (issue 24, "Copies work"): the copy resumes under its new path -- also for
    a --case run, which shares the baseline's grid -- and mini.sh records no path or inode of its own: its marker
    is the same bytes in both, and neither names a path. The real end-to-end check (train, fit, eval on the copy)
    is test_mini_quick_study_copy_runs_to_its_last_line, opt-in because it trains 42 runs."""
    out = tmp_path / "study"
    stopped(mini("--quick", str(out), shim=shim))
    (out / "runs" / "C6e10_r1_s1").mkdir()
    (out / "runs" / "C6e10_r1_s1" / "done.json").write_text('{"val_loss": 5.0}\n')
    (out / "report.md").write_text("the study's report\n")
    copy = tmp_path / "moved" / "copy"
    copy.parent.mkdir()
    subprocess.run(["cp", "-a", str(out), str(copy)], check=True)
    original = files(out)
    stopped(mini("--quick", "--case", "additive", str(copy), shim=shim))        # resumed, not "did not make"
    stopped(mini("--quick", str(copy), shim=shim))
    assert files(out) == original and sorted(os.listdir(copy / "runs")) == ["C6e10_r1_s1", "case_additive"]
    mark = (copy / ".nanoloop-mini").read_bytes()
    assert mark == (out / ".nanoloop-mini").read_bytes() and str(tmp_path).encode() not in mark
    refused(mini(str(copy), shim=shim), "another request of mini")           # still refuses another grid


def test_mini_failed_run_leaves_no_claims_in_out(tmp_path, shim, tiny_data):
    """The workers share their launch list and run claims in a temporary folder outside OUT: a mini.sh stopped
    while training leaves nothing in OUT that a rerun (or a copy) must clear, and a rerun has no stale claim to trip
    on (here every run fails at once: the tiny corpus has seq_len 32, the grid 128)."""
    out = tmp_path / "study"
    stopped(mini("--quick", str(out), shim=shim))
    (out / "tokenizer.model").write_text("(unused: the data below exists)\n")
    shutil.copytree(tiny_data, out / "data")                    # seq_len 32: every run fails fast at its data check
    for _ in range(2):
        proc = mini("--quick", str(out), env={"JOBS": "2"}, timeout=300)
        assert proc.returncode == 1 and "a worker failed" in proc.stderr.strip().splitlines()[-1], proc.stderr
        left = sorted(n for n in os.listdir(out / "runs") if not n.endswith(".log"))
        assert not any(n.endswith(".claim") for n in left) and "launch.txt" not in os.listdir(out), left


def test_mini_cases_come_from_the_script(tmp_path):
    """`runs/mini.sh --list-cases` is the one list of cases (no test or script keeps its own copy). For each case the
    --dry-run adds one run per looped cell of the baseline grid, in RUNS/case_NAME/, with --case NAME and a model
    that differs from the baseline cell's; the baseline's launch lines are unchanged."""
    proc = mini("--list-cases")
    cases = proc.stdout.split()
    assert proc.returncode == 0 and len(cases) >= 5 and cases == sorted(cases)
    base = [ln for ln in mini("--quick", "--dry-run", str(tmp_path)).stdout.splitlines() if "train.py" in ln]
    base_cfg = {train.parse_args(shlex.split(ln)[2:])[1].out_dir.rsplit("/", 1)[1]: train.parse_args(
        shlex.split(ln)[2:]) for ln in base}
    looped = sorted(n for n, (m, _) in base_cfg.items() if m.n_loops > 1)
    for case in cases:
        lines = [ln for ln in mini("--quick", "--dry-run", "--case", case, str(tmp_path)).stdout.splitlines()
                 if "train.py" in ln]
        mine = [ln for ln in lines if f"/runs/case_{case}/" in ln]
        assert [ln for ln in lines if ln not in mine] == base
        cells = []
        for ln in mine:
            mcfg, tcfg = train.parse_args(shlex.split(ln)[2:])
            cell = tcfg.out_dir.rsplit("/", 1)[1]
            bm, bt = base_cfg[cell]
            cells.append(cell)
            assert tcfg.case == case and mcfg != bm and (mcfg.n_loops, mcfg.scale) == (bm.n_loops, bm.scale)
            assert tcfg.flops_budget == bt.flops_budget
        print(f"\n{case}: {len(mine)} looped runs")
        assert sorted(cells) == looped
    assert not os.path.exists(tmp_path / "runs")


# Every tool mini.sh calls, faked (the workers, data.py, eval.py, fit.py): its control flow end to end in a second.
# eval.py refuses a loop sweep of a case's model as the real one does for a model that cannot run r' != r.
FAKE_TOOLS = f"""#!/bin/sh
echo "$*" >> "$SHIM_CALLS"
case "$1" in
  -) cat > /dev/null; exit 0 ;;
  data.py) exit 0 ;;
  eval.py) case "$2" in */case_*) echo "eval.py: error: --n-loops-sweep: this model cannot run r' != r" >&2
                                  exit 2 ;; esac; exit 0 ;;
  fit.py) case "$*" in *--cases*) ;; *--case*) echo "delta_phi(x) = +0.1 [0.0, 0.2]" ;; *) echo "phi = 0.5" ;; esac
          exit 0 ;;
esac
exec {shlex.quote(sys.executable)} "$@"
"""


def test_mini_copy_runs_to_its_last_line_with_fake_tools(tmp_path):
    """A cp -a copy of a study, then `mini.sh --quick --case NAME COPY` (fake tools): resumed, every step reached,
    a loop sweep that eval.py refuses is said as "loop sweep skipped: <eval's line>" and the study goes on (no list of
    names in the script), the last line is delta_phi, and the original study is untouched."""
    shim = tmp_path / "shim"
    shim.mkdir()
    (shim / "python").write_text(FAKE_TOOLS)
    os.chmod(shim / "python", 0o755)
    calls = tmp_path / "calls.txt"
    out = tmp_path / "study"
    env = {"SHIM_CALLS": str(calls)}
    lines = [ln for ln in mini("--quick", "--dry-run", "--case", "hc", str(out)).stdout.splitlines() if "train.py" in ln]
    for ln in lines:                             # a finished study and case: every run has a record
        run = train.parse_args(shlex.split(ln)[2:])[1].out_dir
        os.makedirs(run)
        open(os.path.join(run, "done.json"), "w").write('{"val_loss": %.2f}\n' % (4 + len(run) % 7 / 10))
    proc = mini("--quick", "--overwrite", str(out), shim=str(shim), env=env)     # adopted: mini.sh's from now on
    assert proc.returncode == 0 and proc.stdout.strip().splitlines()[-1] == "phi = 0.5", proc.stdout + proc.stderr
    copy = tmp_path / "elsewhere" / "copy"
    copy.parent.mkdir()
    subprocess.run(["cp", "-a", str(out), str(copy)], check=True)
    original = files(out)
    calls.write_text("")
    proc = mini("--quick", "--case", "hc", str(copy), shim=str(shim), env=env)
    out_lines = proc.stdout.strip().splitlines()
    print(proc.stdout)
    assert proc.returncode == 0 and out_lines[-1] == "delta_phi(x) = +0.1 [0.0, 0.2]", proc.stderr
    skipped = [ln for ln in out_lines if "loop sweep skipped: " in ln]
    assert len(skipped) == 3 and all(ln.endswith("eval.py: error: --n-loops-sweep: this model cannot run r' != r")
                                     for ln in skipped)
    made = calls.read_text().splitlines()
    assert sum(c.startswith("eval.py ") and "/case_hc/" not in c for c in made) == 3      # the baseline's sweeps ran
    assert any(c.startswith("fit.py --cases ") for c in made) and files(out) == original


@pytest.mark.skipif(os.environ.get("NANOLOOP_MINI") != "1", reason="trains ~40 runs (minutes): NANOLOOP_MINI=1")
def test_mini_quick_study_copy_runs_to_its_last_line(tmp_path):
    """Issue 24 acceptance "Copies work", for real: a finished `runs/mini.sh --quick` study, copied with cp -a,
    then `bash runs/mini.sh --quick --case additive COPY` runs to its last line (delta_phi) and the original is
    untouched. Opt-in: NANOLOOP_MINI=1 python -m pytest -q tests/test_runs.py -k copy_runs (17 min on the shared
    2-core machine: 410 s for the study, 598 s for the case on the copy)."""
    out, copy = tmp_path / "study", tmp_path / "copy"
    proc = mini("--quick", str(out), timeout=1800)
    assert proc.returncode == 0 and "phi = " in proc.stdout, proc.stdout[-2000:] + proc.stderr[-2000:]
    subprocess.run(["cp", "-a", str(out), str(copy)], check=True)
    original = files(out)
    proc = mini("--quick", "--case", "additive", str(copy), timeout=1800)
    print(proc.stdout[-1500:])
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert proc.stdout.strip().splitlines()[-1].startswith("delta_phi(additive) = ")
    assert files(out) == original


@pytest.mark.parametrize("locale", ["C", "C.UTF-8"])
def test_mini_dry_run_paths_in_any_locale(locale, tmp_path):
    out = str(tmp_path / WEIRD)
    proc = mini("--quick", "--dry-run", "--case", "hc", out, locale=locale)
    lines = [ln for ln in proc.stdout.splitlines() if "train.py" in ln]
    assert proc.returncode == 0 and len(lines) == 24 + 18
    for ln in lines:
        _, tcfg = train.parse_args(shlex.split(ln)[2:])
        assert tcfg.data == out + "/data" and tcfg.out_dir.startswith(out + "/runs/")
    assert not os.path.exists(out)                                              # --dry-run writes nothing


def test_mini_worker_hands_a_torn_record_to_train(tmp_path, shim, tiny_data):
    """The launch list the workers read (shlex) carries an OUT with a space and non-ASCII characters under LC_ALL=C,
    and a 0-byte done.json is not skipped as finished: the first run (largest budget first) reaches train.main with
    that exact path, which refuses the record; the run is named with its log, mini.sh exits 1, the file is kept."""
    out = tmp_path / WEIRD / "study"
    stopped(mini("--quick", str(out), shim=shim))                 # claimed by mini.sh itself
    (out / "tokenizer.model").write_text("(unused: the data below exists)\n")
    shutil.copytree(tiny_data, out / "data")
    (out / "runs" / "C6e10_r8_s3").mkdir()
    (out / "runs" / "C6e10_r8_s3" / "done.json").write_bytes(b"")
    proc = mini("--quick", str(out), env={"JOBS": "1"}, locale="C", timeout=300)
    lines = proc.stderr.strip().splitlines()
    print(f"\nexit {proc.returncode}:\n" + "\n".join(lines))
    failed = [ln for ln in lines if " failed: " in ln]
    assert proc.returncode == 1 and failed and failed[0].startswith("runs/mini.sh: run C6e10_r8_s3 failed: ")
    assert f"(log: {out}/runs/C6e10_r8_s3.log)" in failed[0]
    assert lines[-1].startswith("runs/mini.sh: a worker failed")
    assert (out / "runs" / "C6e10_r8_s3" / "done.json").read_bytes() == b""
    assert not any(n.endswith(".json") for n in os.listdir(out / "runs"))
