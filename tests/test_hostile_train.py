"""Hostile inputs and faults for train.py and runs/mini.sh (issue 12, rules 2-5 of the README's "Guarantees").

Every case asserts four things: the exit status, one line naming the culprit (the flag, file or run), no Python
traceback anywhere in the output, and that every file that existed before is byte-identical afterwards (except a file
the case repairs on purpose, named in the case). train.py runs in-process through its CLI entry point (runpy, like
`python train.py ...`) on the tiny conftest corpus; mini.sh runs as a subprocess, on its flag-checking paths and one
failing grid (the seeded data does not match its seq_len, so no training starts).
Run: pytest -q tests/test_hostile_train.py
"""
import errno
import fcntl
import hashlib
import json
import os
import runpy
import shlex
import shutil
import subprocess
import sys
import time
import dataclasses
import typing

import pytest
import torch

import common
import data
import train
from conftest import ROOT

TRAIN = os.path.join(ROOT, "train.py")
MINI = os.path.join(ROOT, "runs", "mini.sh")
# The tiny model of tests/test_train.py: d = 64, l_eff = 4 as 1-1-1 with r = 2, 8 rows of 32 tokens per step.
TINY = ["--scale", "1", "--head-dim", "32", "--n-layers-eff", "4", "--n-layers-prelude", "1", "--n-layers-coda",
        "1", "--n-loops", "2", "--seq-len", "32", "--batch-tokens", "256", "--device-batch", "4",
        "--eval-tokens", "512"]


@pytest.fixture(autouse=True)
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def snapshot(root):
    """{path: sha256} of every file under root."""
    out = {}
    for folder, _, names in os.walk(root):
        for n in names:
            p = os.path.join(folder, n)
            if os.path.isfile(p) and not os.path.islink(p):
                out[p] = hashlib.sha256(open(p, "rb").read()).hexdigest()
    return out


def assert_untouched(before, after, changed=()):
    """Every pre-existing file is still there, byte for byte (changed: files the case repairs on purpose)."""
    for p, h in before.items():
        if p not in changed:
            assert after.get(p) == h, f"{p} was modified or deleted"


def cli(argv, capsys, monkeypatch, env=None):
    """`python train.py ARGV` in-process: (exit status, stdout, stderr)."""
    monkeypatch.setattr(sys, "argv", ["train.py", *argv])
    for k, v in (env or {}).items():
        monkeypatch.setenv(k, v)
    code = 0
    try:
        runpy.run_path(TRAIN, run_name="__main__")
    except SystemExit as exc:
        code = exc.code
    out = capsys.readouterr()
    return code, out.out, out.err


def one_error_line(code, out, err, want_code, *culprits):
    """The error is exactly one line on stderr, naming every culprit; no traceback anywhere."""
    lines = [ln for ln in err.splitlines() if ln.strip()]
    print(f"\nexit {code}: {lines[-1] if lines else '(no stderr)'}")
    assert code == want_code, (code, err[-2000:])
    assert "Traceback" not in out + err
    assert len(lines) == 1 and lines[0].startswith("train.py: error:"), lines
    for c in culprits:
        assert c in lines[0], (c, lines[0])


def refused_untouched(argv, tmp_path, capsys, monkeypatch, *culprits):
    """`train.py ARGV` exits 2 with one error line naming every culprit, and every file under tmp_path is as it was."""
    before = snapshot(tmp_path)
    code, out_s, err = cli(argv, capsys, monkeypatch)
    one_error_line(code, out_s, err, 2, *culprits)
    assert_untouched(before, snapshot(tmp_path))


def tiny(data_dir, out_dir, *extra):
    return [*TINY, "--data", str(data_dir), "--out-dir", str(out_dir), *extra]


@pytest.fixture(scope="module")
def finished(tiny_data, tmp_path_factory):
    """A finished 2-step run (checkpoint at step 2, done.json): copy it, then break the copy."""
    out = tmp_path_factory.mktemp("finished") / "run"
    train.main(*train.parse_args(tiny(tiny_data, out, "--steps", "2")))
    return out


def copy_run(finished, tmp_path):
    out = tmp_path / "run"
    shutil.copytree(finished, out)
    return out


# -----------------------------------------------------------------------------
# 1. Values: finiteness and range at parse time, one line naming the flag (rule 5)

@pytest.mark.parametrize("flag, value", [
    ("--norm-eps", "inf"), ("--norm-eps", "nan"), ("--rope-base", "inf"), ("--logit-softcap", "inf"),
    ("--state-init-std", "inf"), ("--scale", "0"), ("--head-dim", "-2"), ("--muonh-lr", "-0.01"),
    ("--flops-budget", "nan"), ("--seed", "-1"), ("--eval-every", "-5"), ("--peak-flops", "inf"),
    ("--vocab-size", "1e10"), ("--seq-len", "1e10"), ("--log-every", "0"), ("--device-batch", "-1"),
    ("--steps", "1" + "0" * 400),                                # an int past float's range: no OverflowError
])
def test_bad_value_is_one_line_at_parse_time(flag, value, tmp_path, capsys, monkeypatch, tiny_data):
    before = snapshot(tmp_path)
    horizon = [] if flag == "--flops-budget" else ["--steps", "2"]
    argv = tiny(tiny_data, tmp_path / "run", *horizon, flag, value)
    code, out, err = cli(argv, capsys, monkeypatch)
    one_error_line(code, out, err, 2, flag, "must be")
    assert not (tmp_path / "run").exists()                       # nothing created before the error
    assert_untouched(before, snapshot(tmp_path))


def test_every_numeric_config_field_has_limits():
    """One table drives the checks: a new int/float field without a row would go unchecked."""
    for cls in (train.ModelConfig, train.TrainConfig):
        hints = typing.get_type_hints(cls)
        numeric = [f.name for f in dataclasses.fields(cls)
                   if any(t in (int, float) for t in (hints[f.name], *typing.get_args(hints[f.name])))]
        missing = [n for n in numeric if n not in train.LIMITS]
        print(f"\n{cls.__name__}: {len(numeric)} numeric fields, all in LIMITS: {not missing}")
        assert not missing


@pytest.mark.parametrize("flag, value", [("--compile-mode", "reduce-overhead"), ("--sdpa-backend", "cuDNN"),
                                         ("--precision", "fp16"), ("--attn", "flash")])
def test_bad_choice_is_one_line_at_parse_time(flag, value, tmp_path, capsys, monkeypatch, tiny_data):
    code, out, err = cli(tiny(tiny_data, tmp_path / "run", "--steps", "2", flag, value), capsys, monkeypatch)
    one_error_line(code, out, err, 2, flag, "must be one of", repr(value))
    assert not (tmp_path / "run").exists()


def test_unknown_flag_is_one_line(capsys, monkeypatch, tmp_path, tiny_data):
    code, out, err = cli(tiny(tiny_data, tmp_path / "run", "--steps", "2", "--n-loop", "4"), capsys, monkeypatch)
    one_error_line(code, out, err, 2, "--n-loop")


# -----------------------------------------------------------------------------
# 2. The out-dir: empty, a file, under a file, read-only, nearly full (rule 5), before any work

@pytest.mark.parametrize("case", ["empty", "file", "under-file"])
def test_unusable_out_dir(case, tmp_path, capsys, monkeypatch, tiny_data):
    (tmp_path / "notes.txt").write_text("a user's file\n")
    out = {"empty": "", "file": str(tmp_path / "notes.txt"), "under-file": str(tmp_path / "notes.txt" / "run")}[case]
    before = snapshot(tmp_path)
    code, out_s, err = cli(tiny(tiny_data, out, "--steps", "2"), capsys, monkeypatch)
    one_error_line(code, out_s, err, 2, "--out-dir")
    assert "nanoloop train" not in out_s                         # failed before printing the plan
    assert_untouched(before, snapshot(tmp_path))


def test_read_only_out_dir(tmp_path, capsys, monkeypatch, tiny_data):
    """A read-only file system (simulated: root ignores permission bits) fails at start-up, naming the folder."""
    ro = str(tmp_path / "ro")
    os.mkdir(ro)
    real_open = os.open

    def read_only(path, flags, *a, **kw):
        if str(path).startswith(ro) and flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT):
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(path))
        return real_open(path, flags, *a, **kw)
    monkeypatch.setattr(os, "open", read_only)
    code, out, err = cli(tiny(tiny_data, ro, "--steps", "2"), capsys, monkeypatch)
    one_error_line(code, out, err, 2, ro, "Read-only file system")
    assert os.listdir(ro) == []


def test_disk_full_during_checkpoint_keeps_the_previous_one(tmp_path, capsys, monkeypatch, tiny_data):
    out = tmp_path / "run"
    real_save, calls = torch.save, []

    def full_disk(obj, f, *a, **kw):                 # the 2nd checkpoint hits ENOSPC half-way, as torch reports it
        calls.append(obj["step"])
        if len(calls) == 1:
            return real_save(obj, f, *a, **kw)
        with open(f, "wb") as fh:
            fh.write(b"PK half a checkpoint")
        try:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        except OSError:
            raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598")
    monkeypatch.setattr(torch, "save", full_disk)
    code, out_s, err = cli(tiny(tiny_data, out, "--steps", "4", "--ckpt-every", "2"), capsys, monkeypatch)
    one_error_line(code, out_s, err, 1, "No space left on device", "ckpt.pt", "previous")
    monkeypatch.undo()
    assert calls == [2, 4] and torch.load(out / "ckpt.pt", weights_only=True)["step"] == 2
    assert sorted(os.listdir(out)) == [".nanoloop-train", "ckpt.pt", "log.jsonl"]   # no temporary left
    code, out_s, err = cli(tiny(tiny_data, out, "--steps", "4", "--ckpt-every", "2", "--resume"), capsys, monkeypatch)
    assert code == 0 and err == "" and (out / "done.json").exists()  # space freed: the rerun finishes


# -----------------------------------------------------------------------------
# 3. One writer per run directory (rule 4), a user's files (rule 2), a kill then a rerun (rule 3)

def test_second_trainer_is_refused_and_named(finished, tmp_path, capsys, monkeypatch, tiny_data):
    """A trainer writing the folder (a live process holding its claim) refuses a second one: one line, nothing
    touched; once it is gone the same command resumes."""
    out = copy_run(finished, tmp_path)
    os.remove(out / "done.json")                                 # a run in progress: checkpoint, no record
    holder = subprocess.Popen([sys.executable, "-c", "import common, sys, time; common.claim(sys.argv[1], 'train'); "
                               "print('held', flush=True); time.sleep(60)", str(out)], cwd=ROOT,
                              stdout=subprocess.PIPE, text=True, env=dict(os.environ, PYTHONPATH=ROOT))
    try:
        assert holder.stdout.readline().strip() == "held"
        refused_untouched(tiny(tiny_data, out, "--steps", "2", "--resume"), tmp_path, capsys, monkeypatch,
                          str(out), "being written by another train process")
    finally:
        holder.kill()
        holder.wait()
    code, out_s, err = cli(tiny(tiny_data, out, "--steps", "2", "--resume"), capsys, monkeypatch)
    assert code == 0 and err == "" and (out / "done.json").exists()


def test_a_users_folder_is_refused_unless_overwrite(tmp_path, capsys, monkeypatch, tiny_data):
    """An out-dir holding files train.py did not make is refused, naming it; with --overwrite the run writes its
    files beside them and the user's file is byte-identical."""
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("a user's file\n")
    refused_untouched(tiny(tiny_data, out, "--steps", "2"), tmp_path, capsys, monkeypatch, str(out), "--overwrite")
    assert sorted(os.listdir(out)) == ["notes.txt"]              # no marker left by the refusal
    before = snapshot(tmp_path)
    code, out_s, err = cli(tiny(tiny_data, out, "--steps", "2", "--overwrite"), capsys, monkeypatch)
    assert code == 0 and err == "" and (out / "done.json").exists()
    assert_untouched(before, snapshot(tmp_path))


@pytest.mark.parametrize("name", ["log.jsonl", "done.json", "ckpt.pt"])
def test_a_run_file_that_is_a_folder_is_refused(name, tmp_path, capsys, monkeypatch, tiny_data):
    """What train.py cannot read or append to, it names, before any work and without leaving a marker."""
    out = tmp_path / "run"
    (out / name).mkdir(parents=True)
    refused_untouched(tiny(tiny_data, out, "--steps", "2", "--resume"), tmp_path, capsys, monkeypatch, name)
    assert sorted(os.listdir(out)) == [name]


def test_kill_then_rerun_finishes(tmp_path, capsys, monkeypatch, tiny_data):
    """What a kill -9 leaves (a checkpoint, a temporary of an interrupted write, a torn last log line): the rerun
    ignores the temporary (it never deletes by pattern), drops the torn tail, and finishes (rule 3)."""
    out = tmp_path / "run"
    env = dict(os.environ, NANOLOOP_FAULT="kill@2", OMP_NUM_THREADS="1", PYTHONPATH=ROOT)
    argv = tiny(tiny_data, out, "--steps", "3", "--ckpt-every", "1")
    proc = subprocess.run([sys.executable, TRAIN, *argv], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == -9, proc.stderr[-500:]
    (out / ".ckpt.pt.0badf00d.tmp").write_bytes(b"half a checkpoint")
    log_before = (out / "log.jsonl").read_text()
    with open(out / "log.jsonl", "a") as f:
        f.write('{"step": 26, "loss": 5.4')
    code, out_s, err = cli([*argv, "--resume"], capsys, monkeypatch)
    assert code == 0 and "Traceback" not in out_s + err and err == ""
    assert "resumed" in out_s and "log.jsonl: dropped a torn last line" in out_s
    assert (out / "log.jsonl").read_text().startswith(log_before)   # repaired: the lines before the kill, then on
    assert (out / ".ckpt.pt.0badf00d.tmp").read_bytes() == b"half a checkpoint"   # ignored, not deleted
    assert sorted(os.listdir(out)) == [".ckpt.pt.0badf00d.tmp", ".nanoloop-train", "ckpt.pt", "done.json",
                                       "log.jsonl"]


# -----------------------------------------------------------------------------
# 4. Files in the out-dir that are not this run's (rules 1, 2)

def test_foreign_log_is_refused_and_kept(finished, tmp_path, capsys, monkeypatch, tiny_data):
    out = copy_run(finished, tmp_path)
    os.remove(out / "done.json")
    (out / "log.jsonl").write_text('{"step": 1, "loss": 4.8}\nmy notes, not JSON\n{"step": 2, "loss": 4.7}\n')
    refused_untouched(tiny(tiny_data, out, "--steps", "2", "--resume"), tmp_path, capsys, monkeypatch,
                      "log.jsonl line 2")


def test_record_of_another_run_is_not_handed_back(finished, tmp_path, capsys, monkeypatch, tiny_data):
    out = copy_run(finished, tmp_path)
    before = snapshot(tmp_path)
    code, out_s, err = cli(tiny(tiny_data, out, "--steps", "3", "--resume"), capsys, monkeypatch)  # was 2 steps
    one_error_line(code, out_s, err, 2, "done.json", "different run", "steps: 2 vs 3")
    assert_untouched(before, snapshot(tmp_path))


def test_corrupt_record_is_one_line(finished, tmp_path, capsys, monkeypatch, tiny_data):
    out = copy_run(finished, tmp_path)
    (out / "done.json").write_text('{"val_loss": 4.8')
    before = snapshot(tmp_path)
    code, out_s, err = cli(tiny(tiny_data, out, "--steps", "2", "--resume"), capsys, monkeypatch)
    one_error_line(code, out_s, err, 2, "done.json", "not a train.py record")
    assert_untouched(before, snapshot(tmp_path))


def test_nan_at_the_first_step_does_not_blame_the_lr(tmp_path, capsys, monkeypatch, tiny_data):
    code, out, err = cli(tiny(tiny_data, tmp_path / "run", "--steps", "3"), capsys, monkeypatch,
                         env={"NANOLOOP_FAULT": "nan@1"})
    one_error_line(code, out, err, 1, "step 1/3", "not the cause", "--norm-eps")
    assert "lower --muonh-lr" not in err


def test_atomic_write_never_follows_a_planted_link(tmp_path):
    """The temporary is created exclusively under a fresh name: a symlink planted at the old fixed name is ignored."""
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    os.symlink(victim, tmp_path / ".out.json.tmp")                # the name the old helper wrote through
    common.atomic_write(str(tmp_path / "out.json"), "{}\n")
    assert victim.read_text() == "precious\n" and (tmp_path / "out.json").read_text() == "{}\n"
    assert sorted(os.listdir(tmp_path)) == [".out.json.tmp", "out.json", "victim.txt"]


# -----------------------------------------------------------------------------
# 4b. One run identity (issue 18 §1): a record or checkpoint is this run's only if its identity is this run's

@pytest.mark.parametrize("flags, culprit", [
    (["--eval-tokens", "256"], "eval_tokens: 512 vs 256"), (["--precision", "bf16"], "precision: 'fp32' vs 'bf16'"),
    (["--case", "bptt"], "case: '' vs 'bptt'"), (["--seed", "1"], "seed: 0 vs 1")])
def test_finished_run_with_another_identity_is_not_handed_back(flags, culprit, finished, tmp_path, capsys,
                                                              monkeypatch, tiny_data):
    out = copy_run(finished, tmp_path)
    before = snapshot(tmp_path)
    code, out_s, err = cli(tiny(tiny_data, out, "--steps", "2", "--resume", *flags), capsys, monkeypatch)
    one_error_line(code, out_s, err, 2, "done.json", "different run", culprit)
    assert_untouched(before, snapshot(tmp_path))


def test_finished_run_is_handed_back_whatever_the_excluded_flags(finished, tmp_path, capsys, monkeypatch, tiny_data):
    """Fields that cannot change the result (device batch, checkpoint / eval cadence, logging) are not the identity."""
    out = copy_run(finished, tmp_path)
    before = snapshot(tmp_path)
    code, out_s, err = cli(tiny(tiny_data, out, "--steps", "2", "--resume", "--device-batch", "2", "--eval-every",
                                "1", "--ckpt-every", "7", "--log-every", "3"), capsys, monkeypatch)
    assert code == 0 and err == "" and "the run is finished (same run identity)" in out_s
    assert_untouched(before, snapshot(tmp_path))


def test_killed_run_resumed_on_another_packing_is_refused(tmp_path, capsys, monkeypatch, tiny_data):
    """Killed at step 2, then resumed with --data naming another packing of the same documents: refused, naming
    the data, instead of training on the other rows under the old record's name."""
    out = tmp_path / "run"
    env = dict(os.environ, NANOLOOP_FAULT="kill@2", OMP_NUM_THREADS="1", PYTHONPATH=ROOT)
    proc = subprocess.run([sys.executable, TRAIN, *tiny(tiny_data, out, "--steps", "4", "--ckpt-every", "1")],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == -9 and torch.load(out / "ckpt.pt", weights_only=True)["step"] == 2, proc.stderr[-500:]
    import random
    rng, docs = random.Random(0), []
    for _ in range(600):                                         # conftest's documents, packed with another seed
        n, start = rng.randint(5, 60), rng.randint(2, 120)
        docs.append([2 + (start + 3 * i) % 126 for i in range(n)])
    other = tmp_path / "other_packing"
    data.prepare_docs(docs, str(other), seq_len=32, vocab_size=128, bos_id=1, tokenizer_hash="synthetic-test",
                      val_docs=60, seed=1, source="tests/conftest.py synthetic")
    assert data.read_meta(str(other))["tokenizer_hash"] == data.read_meta(tiny_data)["tokenizer_hash"]
    capsys.readouterr()                                          # prepare_docs's progress lines
    before = snapshot(tmp_path)
    code, out_s, err = cli(tiny(other, out, "--steps", "4", "--ckpt-every", "1", "--resume"), capsys, monkeypatch)
    one_error_line(code, out_s, err, 2, "ckpt.pt", "different run", "data: ")
    assert_untouched(before, snapshot(tmp_path))


@pytest.mark.parametrize("case", ["zero-bytes", "copied", "no-identity"])
def test_a_record_this_run_did_not_write_is_not_finished(case, finished, tmp_path, capsys, monkeypatch, tiny_data):
    """A 0-byte done.json, one copied from another run, or one from a train.py without run identities is never
    taken for "finished" (a sweep that asks train.py skips none of them)."""
    out = copy_run(finished, tmp_path)
    rec = json.load(open(out / "done.json"))
    if case == "zero-bytes":
        (out / "done.json").write_bytes(b"")
    elif case == "copied":                                       # the record of a 3-step run of another seed
        other = tmp_path / "other"
        train.main(*train.parse_args(tiny(tiny_data, other, "--steps", "3", "--seed", "5")))
        shutil.copy(other / "done.json", out / "done.json")
    else:
        (out / "done.json").write_text(json.dumps({k: v for k, v in rec.items() if k != "identity"}))
    want = {"zero-bytes": ["not a train.py record", "not a JSON record"], "copied": ["different run", "steps: 3 vs 2"],
            "no-identity": ["different run", "identity: missing"]}[case]
    before = snapshot(tmp_path)
    code, out_s, err = cli(tiny(tiny_data, out, "--steps", "2", "--resume"), capsys, monkeypatch)
    one_error_line(code, out_s, err, 2, "done.json", *want)
    code, out_s, err = cli(tiny(tiny_data, out, "--steps", "2", "--plan"), capsys, monkeypatch)   # a sweep's question
    one_error_line(code, out_s, err, 2, "done.json", *want)
    assert_untouched(before, snapshot(tmp_path))


def test_checkpoint_without_identity_is_refused(finished, tmp_path, capsys, monkeypatch, tiny_data):
    out = copy_run(finished, tmp_path)
    os.remove(out / "done.json")
    ck = torch.load(out / "ckpt.pt", weights_only=True)
    del ck["identity"]
    torch.save(ck, out / "ckpt.pt")
    before = snapshot(tmp_path)
    code, out_s, err = cli(tiny(tiny_data, out, "--steps", "2", "--resume"), capsys, monkeypatch)
    one_error_line(code, out_s, err, 2, "ckpt.pt", "different run", "identity: missing")
    assert_untouched(before, snapshot(tmp_path))


# -----------------------------------------------------------------------------
# 4c. Memory (issue 18 §3) and a filesystem without flock (issue 19 §1)

@pytest.mark.parametrize("flags, env, culprit", [
    (["--vocab-size", "1e9"], {}, "physical RAM"),
    ([], {"NANOLOOP_MEMORY_CAP": "1e6"}, "NANOLOOP_MEMORY_CAP=1e6")])
def test_a_model_that_cannot_fit_is_refused_before_allocating(flags, env, culprit, tmp_path, capsys, monkeypatch,
                                                              tiny_data):
    monkeypatch.setattr(train, "LoopedGPT", None)                # building a model would raise TypeError
    code, out, err = cli(tiny(tiny_data, tmp_path / "run", "--steps", "2", *flags), capsys, monkeypatch, env=env)
    one_error_line(code, out, err, 2, "does not fit", "optimizer state need", "GiB", culprit)
    assert not (tmp_path / "run").exists()


def test_no_flock_still_trains(tmp_path, capsys, monkeypatch, tiny_data):
    """Lustre without -o flock / NFS nolock: flock fails with ENOLCK; the run proceeds (unlocked) and finishes."""
    calls = []

    def no_flock(fd, op):
        calls.append(op)
        raise OSError(errno.ENOLCK, os.strerror(errno.ENOLCK))
    monkeypatch.setattr(fcntl, "flock", no_flock)
    code, out_s, err = cli(tiny(tiny_data, tmp_path / "run", "--steps", "2"), capsys, monkeypatch)
    assert code == 0 and err == "" and calls and (tmp_path / "run" / "done.json").exists()


# -----------------------------------------------------------------------------
# 5. runs/mini.sh (subprocess; bash checks run before any Python starts)

def mini(*args, env=None, timeout=60):
    full = dict(os.environ, **(env or {}))
    return subprocess.run(["bash", MINI, *args], cwd=ROOT, env=full, capture_output=True, text=True, timeout=timeout)


def mini_error(proc, want_code, *culprits):
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    print(f"\nexit {proc.returncode}: {lines[-1] if lines else ''}")
    assert proc.returncode == want_code and "Traceback" not in proc.stdout + proc.stderr, proc.stderr[-2000:]
    assert len(lines) == 1 and lines[0].startswith("runs/mini.sh:"), lines
    for c in culprits:
        assert c in lines[0]


def test_mini_keeps_files_it_did_not_create(tmp_path):
    x = tmp_path / "X"
    (x / "data").mkdir(parents=True)
    (x / "data" / "important.txt").write_text("do not delete\n")
    before = snapshot(tmp_path)
    proc = mini("--quick", str(x))
    mini_error(proc, 2, str(x), "holds files this tool did not make")
    assert_untouched(before, snapshot(tmp_path))
    assert sorted(os.listdir(x)) == ["data"]


@pytest.mark.parametrize("jobs", ["0", "abc", "-1", " "])
def test_mini_bad_jobs_is_one_line_before_work(jobs, tmp_path):
    proc = mini("--quick", str(tmp_path / "out"), env={"JOBS": jobs})
    mini_error(proc, 2, "JOBS=")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("case", ["file", "empty"])
def test_mini_out_is_a_file_or_empty(case, tmp_path):
    (tmp_path / "f").write_text("a user's file\n")
    before = snapshot(tmp_path)
    proc = mini("--quick", str(tmp_path / "f") if case == "file" else "")
    mini_error(proc, 2, "OUT")
    assert_untouched(before, snapshot(tmp_path))


def test_mini_never_mixes_two_grids_in_one_out(tmp_path):
    """A --quick study and a full one (or two versions of the grid) in one OUT would be fitted together."""
    out = tmp_path / "study"
    (out / "runs" / "C3e10_r1_s1").mkdir(parents=True)
    (out / "runs" / "C3e10_r1_s1" / "done.json").write_text("{}\n")
    (out / ".nanoloop-mini").write_text("mini 0123456789abcdef\n")               # another grid's marker
    before = snapshot(tmp_path)
    proc = mini(str(out))                                            # the full grid into the quick study's folder
    mini_error(proc, 2, str(out), "another request of mini")
    assert_untouched(before, snapshot(tmp_path))


def test_mini_out_with_a_space_reaches_train_as_one_path(tmp_path):
    out = str(tmp_path / "my study")
    proc = mini("--quick", "--dry-run", out)
    assert proc.returncode == 0, proc.stderr
    lines = [ln for ln in proc.stdout.splitlines() if "train.py" in ln]
    argv = shlex.split(lines[0])[2:]
    mcfg, tcfg = train.parse_args(argv)
    print(f"\n{len(lines)} launch lines; first out-dir {tcfg.out_dir!r}")
    assert len(lines) == 24 and tcfg.data == out + "/data" and tcfg.out_dir.startswith(out + "/runs/")
    assert not os.path.exists(out)                                 # --dry-run writes nothing


def test_mini_failed_worker_stops_the_others_and_is_named(tmp_path, tiny_data):
    """A grid whose data does not fit (seq_len 32 vs the grid's 128): the first worker to fail names its run and
    log, the other worker is stopped, the script exits 1; the OUT path has a space in it."""
    out = tmp_path / "mini study"
    (out / "runs").mkdir(parents=True)                           # an earlier mini.sh's layout, adopted with
                                                                 # --overwrite (nothing is deleted)
    (out / "tokenizer.model").write_text("(unused: the data below exists)\n")
    shutil.copytree(tiny_data, out / "data")
    before = snapshot(tmp_path)
    t = time.time()
    proc = mini("--quick", "--overwrite", str(out), env={"JOBS": "2"}, timeout=600)
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    print(f"\nexit {proc.returncode} after {time.time() - t:.0f} s:\n" + "\n".join(lines))
    assert proc.returncode == 1 and "Traceback" not in proc.stdout + proc.stderr
    failed = [ln for ln in lines if " failed: " in ln]
    assert failed and all("seq_len 32" in ln and f"(log: {out}/runs/C6e10_r" in ln for ln in failed)
    assert lines[-1].startswith("runs/mini.sh: a worker failed") and "stopped" in lines[-1]
    assert "Traceback" in open(failed[0].split("(log: ")[1].rstrip(")")).read()  # the details are in the log
    alive = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            alive += [pid] if str(out).encode() in open(f"/proc/{pid}/cmdline", "rb").read() else []
        except OSError:
            pass
    assert not alive, f"workers left running: {alive}"
    assert_untouched(before, snapshot(tmp_path))
    assert not any(n.endswith(".json") for n in os.listdir(out / "runs"))    # no record, no fit
