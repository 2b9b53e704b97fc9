"""Tests for the cluster path (issue 13 §2-5, §7): bf16 on CPU through the CUDA code path vs fp32, an inductor-compiled
CPU step vs eager (with eval through the uncompiled module: no second graph), the random state init drawn per global
row (2 ranks == 1 rank), rank 0's refusal reaches every rank (the gpu-check smoke mode: test_gpu_check.py).

Run: pytest -q tests/test_cluster.py   (the compiled test builds C++ kernels: ~15-30 s on an idle 2-core CPU)
"""
import os
import re
import shutil
import subprocess
import sys

import pytest
import torch

import optim
import train
from conftest import ROOT, run_torchrun
from test_train import TINY, losses, run, tiny_argv


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


# -----------------------------------------------------------------------------
# §5: --precision bf16 on CPU runs the CUDA numerics (autocast, bf16 wte + its Adam state, bf16 Polar Express)

BF16_STEPS = 8
BF16_TOL = 1e-3     # max |loss_bf16 - loss_fp32| per step, nats; measured 3.7e-5 over 8 steps on this CPU


def test_bf16_on_cpu_matches_fp32(tiny_data, tmp_path, monkeypatch):
    pe_dtypes = []
    polar = optim.polar_express
    monkeypatch.setattr(optim, "polar_express", lambda G, *a, **k: pe_dtypes.append(polar(G, *a, **k).dtype)
                        or polar(G, *a, **k))
    args = ["--steps", str(BF16_STEPS), "--eval-tokens", "512"]
    fp32 = run(tiny_argv(tiny_data, tmp_path / "fp32", *args))
    assert fp32["precision"] == "fp32" and set(pe_dtypes) == {torch.float32}        # the CPU default
    pe_dtypes.clear()
    bf16 = run(tiny_argv(tiny_data, tmp_path / "bf16", *args, "--precision", "bf16"))
    assert bf16["precision"] == "bf16" and set(pe_dtypes) == {torch.bfloat16}
    ck = torch.load(tmp_path / "bf16" / "ckpt.pt", weights_only=True)
    wte_state = ck["optimizer"]["state"][ck["optimizer"]["param_groups"][1]["params"][0]]   # group order: matrix, wte
    assert ck["model"]["wte.weight"].dtype == torch.bfloat16 and wte_state["exp_avg"].dtype == torch.bfloat16
    assert ck["model"]["lm_head.weight"].dtype == torch.float32                      # master weights stay fp32
    a, b = losses(tmp_path / "fp32"), losses(tmp_path / "bf16")
    diff = max(abs(x - y) for x, y in zip(a, b))
    print(f"\n{BF16_STEPS} steps: max |loss bf16 - loss fp32| = {diff:.2e} (tolerance {BF16_TOL}); val_loss "
          f"{bf16['val_loss']:.5f} vs {fp32['val_loss']:.5f}; losses {a[0]:.4f} -> {a[-1]:.4f}")
    assert 0 < diff <= BF16_TOL                              # bf16 really ran (not bitwise fp32), and stays close
    assert abs(bf16["val_loss"] - fp32["val_loss"]) <= BF16_TOL


def test_precision_and_attn_flags_fail_before_work(tiny_data, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(train, "LoopedGPT", None)                     # building a model would raise TypeError
    with pytest.raises(ValueError, match="--attn fa3 cannot run here: fa3 needs a CUDA device, this is cpu"):
        run(tiny_argv(tiny_data, tmp_path / "run", "--steps", "2", "--attn", "fa3"))
    assert not (tmp_path / "run").exists()
    for argv, msg in [(["--precision", "fp16"], "--precision must be one of auto, fp32, bf16"),
                      (["--attn", "flash"], "--attn must be one of auto, fa3, fa2, sdpa")]:
        with pytest.raises(SystemExit) as exc:
            train.parse_args(["--steps", "2", *argv])
        assert exc.value.code == 2 and msg in capsys.readouterr().err


# -----------------------------------------------------------------------------
# §2/§5: torch.compile (inductor) on CPU equals eager; eval through the uncompiled module adds no graph

# The smallest looped model (inductor's C++ build time grows with the graph): d = 32, one recurrent block x 2.
SMALLEST = ["--scale", "1", "--aspect-ratio", "32", "--head-dim", "16", "--n-layers-eff", "2", "--n-layers-prelude",
            "0", "--n-layers-coda", "0", "--n-loops", "2", "--seq-len", "32", "--batch-tokens", "128",
            "--device-batch", "4", "--eval-tokens", "256", "--steps", "2", "--eval-every", "1"]


@pytest.mark.skipif(not (shutil.which("g++") or shutil.which("c++")), reason="inductor on CPU needs a C++ compiler")
def test_compiled_cpu_step_matches_eager(tiny_data, tmp_path, monkeypatch, capsys):
    from torch._dynamo.utils import counters
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))              # issue 25 §5: the stable default
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    eager = run([*SMALLEST, "--data", tiny_data, "--out-dir", str(tmp_path / "eager")])
    torch._dynamo.reset()
    graphs = counters["stats"]["unique_graphs"]
    compiled = run([*SMALLEST, "--data", tiny_data, "--out-dir", str(tmp_path / "compiled"), "--compile", "true"])
    new_graphs = counters["stats"]["unique_graphs"] - graphs
    a, b = losses(tmp_path / "eager"), losses(tmp_path / "compiled")
    print(f"\neager losses {a}, compiled {b}; val_loss {eager['val_loss']:.6f} vs {compiled['val_loss']:.6f}; "
          f"dynamo graphs compiled over 2 steps + 2 evals: {new_graphs}")
    assert compiled["compile"] and not eager["compile"]
    assert max(abs(x - y) for x, y in zip(a, b)) <= 1e-4 and abs(eager["val_loss"] - compiled["val_loss"]) <= 1e-4
    assert new_graphs == 1                                   # one training graph, no break, no recompile for eval
    cache = tmp_path / "cache" / "nanoloop" / "inductor" / "sdpa-auto"     # inductor's on-disk cache, reused by
    assert "inductor cache         on" in capsys.readouterr().out and os.listdir(cache)   # the next process
    torch._dynamo.reset()


# -----------------------------------------------------------------------------
# §4: random state init: one draw per global row (ranks differ, world size does not matter); a shared filesystem

@pytest.mark.ddp
def test_random_state_init_two_ranks_match_one_rank(tiny_data, tmp_path):
    # old behaviour (every rank seeded alike, drawing in micro-step order) gave both ranks identical noise and a
    # different trajectory from 1 rank; per-row draws make 2 ranks x 2 rows == 1 rank x 4 micro-steps x 2 rows
    args = ["--steps", "4", "--device-batch", "2", "--eval-tokens", "480", "--state-init", "random"]
    one = run(tiny_argv(tiny_data, tmp_path / "one", *args))
    run_torchrun(["train.py", *tiny_argv(tiny_data, tmp_path / "two", *args)], nproc=2)
    a, b = losses(tmp_path / "one"), losses(tmp_path / "two")
    diff = max(abs(x - y) for x, y in zip(a, b))
    print(f"\nrandom state init, 4 steps: max |loss(1 rank) - loss(2 ranks)| = {diff:.2e}")
    assert len(b) == 4 and diff <= 1e-5
    more = run(tiny_argv(tiny_data, tmp_path / "db4", *args[:2], "--device-batch", "4", *args[4:]))
    assert max(abs(x - y) for x, y in zip(a, losses(tmp_path / "db4"))) <= 1e-5    # device batch does not matter
    assert more["val_loss"] == pytest.approx(one["val_loss"], abs=1e-5)


@pytest.mark.ddp
def test_rank_zero_decides_and_its_refusal_reaches_every_rank(tiny_data, tmp_path):
    # Rank 0 alone reads out_dir and decides fresh / resume / finished (issue 24 §4); its refusal is broadcast, so
    # every rank stops with the same one line instead of waiting in a collective. Each rank runs from its own
    # folder (tests/ddp_fs_worker.py): rank 0's holds a corrupt checkpoint, rank 1's nothing -- rank 1's view is
    # never consulted (a folder all ranks see is the launcher's to provide).
    for k in (0, 1):
        os.makedirs(tmp_path / f"node{k}" / "run")
    (tmp_path / "node0" / "run" / "ckpt.pt").write_bytes(b"not a checkpoint")
    worker = os.path.join(ROOT, "tests", "ddp_fs_worker.py")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", worker,
           str(tmp_path), *TINY, "--data", tiny_data, "--out-dir", "run", "--steps", "2", "--resume"]
    proc = subprocess.run(cmd, cwd=ROOT, env=dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=ROOT),
                          capture_output=True, text=True, timeout=240)
    lines = re.findall(r"rank \d error: [^\n]*", proc.stdout)   # one message per rank
    print("\n" + "\n".join(lines))
    assert proc.returncode != 0 and len(lines) == 2, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert all("run/ckpt.pt" in ln and "PyTorch checkpoint" in ln for ln in lines)
    assert lines[0].split("error: ")[1] == lines[1].split("error: ")[1]             # the same line on both ranks
    assert os.listdir(tmp_path / "node1" / "run") == []                               # nothing started


# -----------------------------------------------------------------------------
# §4 and issue 12: runs/slurm.sh (--out-dir=DIR, srun --cpus-per-task, --mem=0, the env hook, a sweep that skips)

def slurm(*args, env=None):
    return subprocess.run(["bash", "runs/slurm.sh", *args], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env={k: v for k, v in dict(os.environ, **(env or {})).items()
                               if not k.startswith("SLURM_") or (env and k in env)})


def test_slurm_reads_both_out_dir_forms(tmp_path):
    done = tmp_path / "finished"
    done.mkdir()
    (done / "done.json").write_text("{}")
    for form in (["--out-dir", str(done)], [f"--out-dir={done}"]):       # issue 12: '=' form read as no out-dir
        p = slurm("--dry-run", "--steps", "2", *form)
        print(f"\n{form} -> {p.stdout.strip()}")                          # issue 18: train.py decides "finished"
        assert p.returncode == 0 and p.stdout.startswith("torchrun ") and p.stdout.split()[-1] == "--resume"
        assert train.parse_args(p.stdout.split("train.py ")[1].split())[1].out_dir == str(done)
    p = slurm("--dry-run", "--steps", "2", f"--out-dir={tmp_path / 'new'}")
    assert p.returncode == 0 and p.stdout.startswith("torchrun ") and p.stdout.split()[-1] == "--resume"
    train.parse_args(p.stdout.split("train.py ")[1].split())
    p = slurm("--dry-run", "--steps", "2", "--out-dir=")
    assert p.returncode == 2 and "needs a value" in p.stderr


def test_slurm_srun_gets_cpus_and_the_job_all_memory():
    env = {"SLURM_JOB_ID": "7", "SLURM_CPUS_PER_TASK": "32", "SLURM_NNODES": "2", "SLURM_GPUS_ON_NODE": "8"}
    p = slurm("--dry-run", "--steps", "2", "--out-dir", "out/x", env=env)
    print(f"\n{p.stdout.strip()}")
    assert p.returncode == 0 and p.stdout.startswith(
        "srun --ntasks-per-node=1 --kill-on-bad-exit=1 --cpus-per-task=32 torchrun --nnodes=2 --nproc_per_node=8 ")
    assert "#SBATCH --mem=0\n" in open(os.path.join(ROOT, "runs", "slurm.sh")).read()


def test_slurm_environment_hook(tmp_path):
    hook = tmp_path / "activate"
    hook.write_text("echo hook-sourced >&2\nexport NPROC=3\n")          # e.g. `source venv/bin/activate`
    p = slurm("--dry-run", "--steps", "2", env={"NANOLOOP_ENV": str(hook)})
    assert p.returncode == 0 and "hook-sourced" in p.stderr and "--nproc_per_node=3 " in p.stdout
    p = slurm("--dry-run", "--steps", "2", env={"NANOLOOP_ENV": str(tmp_path / "missing")})
    assert p.returncode == 2 and "is not a file" in p.stderr


def test_slurm_sweep_submits_every_unqueued_run(tmp_path):
    grid = tmp_path / "grid"
    for cell in ("C1e18_r4_s10", "C4.64e17_r1_s6"):                    # two finished runs
        os.makedirs(grid / cell)
        (grid / cell / "done.json").write_text("{}")
    fake = tmp_path / "bin"                                             # squeue: one run already queued
    fake.mkdir()
    queued = f"nl-{grid}/C1e19_r8_s24".replace("/", "-")
    (fake / "squeue").write_text(f"#!/bin/sh\necho other-job\necho '{queued}'\n")
    os.chmod(fake / "squeue", 0o755)
    env = {"OUT": str(grid), "PATH": f"{fake}:{os.environ['PATH']}"}
    p = slurm("--sweep", "runs/grid.sh", "--dry-run", env=env)
    lines = p.stdout.splitlines()
    print(f"\n{p.stderr.strip()}\n{lines[0]}")
    # a done.json is no proof of "finished" (issue 18 §1): those jobs are submitted and train.py hands back the
    # record only if it is the same run; the queued one is not submitted twice
    assert p.returncode == 0 and len(lines) == 116 - 1 and "115 submitted (dry run) (2 with a done.json" in p.stderr
    assert "1 already queued" in p.stderr and not any("skip" in ln or "C1e19_r8_s24 " in ln for ln in lines)
    for line in lines:                                                  # the issue-12 one-liner submitted "skip ..."
        assert line.startswith("sbatch --job-name=nl-") and " runs/slurm.sh --flops-budget " in line
        train.parse_args(line.split(" runs/slurm.sh ")[1].split())
    p = slurm("--sweep", "runs/nope.sh", env=env)
    assert p.returncode == 2 and "no such script" in p.stderr
