"""Tests for the staged device check (runs/gpu_check.sh -> runs/gpu_check.py) and the training benchmark
(runs/bench_train.py), both re-homed from train.py (issue 19 §5, issue 18 §4), in their CPU smoke modes.

- `--cpu-smoke` runs all six stages, each in its own process, and the JSON holds every one as ok, with figures that
  mean something (KV-cached decoding == full forward in fp32, 2 ranks == 1 rank, no graph break); stage 5 takes the
  fallback path (NCCL refuses, gloo runs) as a GPU with an NCCL older than 2.30 does;
- killed with SIGKILL once the JSON shows stage 2, the JSON still holds stages 1-2 (it is rewritten after every
  stage, atomically);
- --budget drops the stages that no longer fit by their estimates, and says so; the default budget runs all six on
  one H200 by the measured estimates (issue 25); bad flags are one-line errors (exit 2) before any
  work; an --out the tool did not write for the same request is never replaced.
- runs/bench_train.py --levers (issue 25 item 4): one cell per lever, each JSON written, a failing lever recorded;
  runs/gpu_session.sh (the one prepared GPU call) in --cpu-smoke keeps what fits its budget; --dry-run's plan.
Run: python -m pytest -q tests/test_gpu_check.py -s      (~2.5 min on an idle 2-core CPU; the smoke run is ~30 s)
"""
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from conftest import ROOT

sys.path.insert(0, os.path.join(ROOT, "runs"))
import bench_train  # noqa: E402
import gpu_check  # noqa: E402

ENV = dict(os.environ, OMP_NUM_THREADS="1")


def check(*args, **kw):
    return subprocess.run(["bash", "runs/gpu_check.sh", *args], cwd=ROOT, env=ENV, capture_output=True, text=True,
                          timeout=300, **kw)


def test_cpu_smoke_runs_every_stage(tmp_path):
    out = tmp_path / "gpu_check.json"
    t = time.time()
    proc = check("--cpu-smoke", "--out", str(out))
    print(f"\n{proc.stdout}\nwall {time.time() - t:.1f} s")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rec = json.loads(out.read_text())
    stages = rec["stages"]
    assert [stages[str(n)]["status"] for n in range(1, 7)] == ["ok"] * 6 and rec["plan"]["dropped"] == []
    env, attn, mem, rate, ddp, comp = (stages[str(n)]["result"] for n in range(1, 7))
    assert env["attention"] == "sdpa" and env["attention_line"].startswith("attention kernel: sdpa") and \
        env["peak"][0] is None                                           # a CPU has no datasheet peak: MFU n/a
    assert attn["kv_chunked_vs_full_sdpa_fp32"] < 1e-5 and 0 < attn["sdpa_bf16_vs_fp32"] < 0.1 * attn["ref_max_abs"]
    assert sorted(mem) == ["mode", "rule", "s16_r8", "s28_r8", "s34_r1"]
    assert all(mem[c]["ckpt_bytes"] > 0 and "peak_rss" in mem[c]["eval"] for c in ("s16_r8", "s28_r8", "s34_r1"))
    assert sorted(rate) == ["s10_r4", "s6_r4"]                            # --all-cells: all six
    assert all(c["tok_per_s"] > 0 and c["mfu"] is None and 0 < c["optim_share"] < 1 for c in rate.values())
    two = ddp["two_ranks"]
    assert ddp["max_abs_loss_diff"] < 1e-5 and two["muonh_shards"] == 2 and two["ranks_weight_sum_spread"] == 0
    assert two["backend"] == "gloo" and [f[:5] for f in two["fallback"]] == ["nccl:"]   # NCCL refused, gloo ran
    assert all(comp[v]["breaks"] == 0 for v in ("r4", "r8_bptt4", "r4_hyper", "r1"))
    assert comp["train"]["recompiles"] == 0 and comp["train"]["compile_s"] > 0
    assert sorted(os.listdir(tmp_path)) == ["gpu_check.json"]           # no scratch left
    again = check("--cpu-smoke", "--budget", "400", "--out", str(out))  # another request: refused, file kept
    assert again.returncode == 2 and len(again.stderr.strip().splitlines()) == 1 and "--overwrite" in again.stderr
    assert json.loads(out.read_text()) == rec


def test_killed_after_stage_2_keeps_stages_1_and_2(tmp_path):
    out = tmp_path / "gpu_check.json"
    proc = subprocess.Popen(["bash", "runs/gpu_check.sh", "--cpu-smoke", "--out", str(out)], cwd=ROOT, env=ENV,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline, stages = time.time() + 120, {}
    while time.time() < deadline and "2" not in stages:
        time.sleep(0.05)
        if out.exists():
            stages = json.loads(out.read_text())["stages"]             # atomic: never half a file
    os.killpg(proc.pid, signal.SIGKILL)                                # the whole check, its stage process too
    proc.wait(timeout=30)
    rec = json.loads(out.read_text())
    print(f"\nkilled with stages {sorted(rec['stages'])} in the JSON")
    assert proc.returncode == -signal.SIGKILL
    assert [rec["stages"][n]["status"] for n in ("1", "2")] == ["ok", "ok"] and "3" not in rec["stages"]


def test_budget_drops_the_last_stages(tmp_path):
    out = tmp_path / "gpu_check.json"
    proc = check("--cpu-smoke", "--budget", "9", "--out", str(out))     # stage 1 (~5 s) fits, 1 + 2 (~10 s) does not
    print(f"\n{proc.stdout}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "dropped: 2 attention (~5 s), 3 memory (~6 s), 4 throughput" in proc.stdout.splitlines()[0]
    rec = json.loads(out.read_text())
    assert rec["plan"]["dropped"] == [2, 3, 4, 5, 6] and rec["stages"]["1"]["status"] == "ok"
    assert all(rec["stages"][str(n)]["status"] == "dropped" and "--budget 9 s" in rec["stages"][str(n)]["reason"]
               for n in range(2, 7))


@pytest.mark.parametrize("argv, dropped", [([], "none"), (["--all-cells"], "4 throughput (~400 s)"),
                                           (["--all-cells", "--budget", "700"], "none"),
                                           (["--stages", "1,3,5", "--budget", "200"], "2 attention (~20 s), 4 "
                                            "throughput (~140 s), 5 ddp (~100 s), 6 compile (~40 s)")])
def test_default_budget_runs_every_stage_on_one_gpu(argv, dropped, capsys):
    # issue 25: the estimates are the H200's measured times (stage 4: 369 s for six cells, 50-63 s of compile per
    # cell). The default --budget 480 (8 minutes) must plan all six stages, stage 4 at its two default cells;
    # --all-cells needs more budget, and a stage that does not fit no longer drops the smaller ones after it.
    assert gpu_check.main(["--dry-run", *argv]) == 0
    line = capsys.readouterr().out.strip()
    print(f"\n{argv} -> {line}")
    assert line.endswith(f"dropped: {dropped}")
    est = {n: v[1] or 10 + gpu_check.CELL_S * 2 for n, v in gpu_check.STAGES.items()}
    assert sum(est.values()) <= 480 and est[4] >= 2 * 50 and est[3] >= 72      # measured: >= 50 s per compiled cell


@pytest.mark.parametrize("argv, msg", [
    (["--cpu-smoke", "--budget", "-1"], "argument --budget: must be in (0, 1e6), got -1"),
    (["--cpu-smoke", "--budget", "nan"], "argument --budget: must be a finite number in (0, 1e6)"),
    (["--cpu-smoke", "--budget", "soon"], "argument --budget: expected a number, got 'soon'"),
    (["--cpu-smoke", "--stages", "1,7"], "argument --stages: expected stage numbers 1-6, comma-separated, got '1,7'"),
    (["--budget", "100"], "no CUDA device visible"),                  # this CPU machine, without --cpu-smoke
    (["--cpu-smoke", "--out", "FOLDER"], "is not a plain file; move it away"),
    (["--cpu-smoke", "--out", "FOREIGN"], "exists and this request did not write it; pass --overwrite"),
])
def test_bad_flags_are_one_line_errors_before_any_work(argv, msg, tmp_path, capsys, monkeypatch):
    (tmp_path / "foreign.json").write_text('{"mine": "not yours"}')
    argv = [{"FOLDER": str(tmp_path), "FOREIGN": str(tmp_path / "foreign.json")}.get(x, x) for x in argv]
    monkeypatch.setattr(gpu_check, "run_child", None)                   # any stage started: TypeError
    with pytest.raises(SystemExit) as exc:
        gpu_check.main(argv)
    err = capsys.readouterr().err
    print(f"\n{argv} -> {err.strip()}")
    assert exc.value.code == 2 and len(err.strip().splitlines()) == 1 and msg in err
    assert (tmp_path / "foreign.json").read_text() == '{"mine": "not yours"}'


# -----------------------------------------------------------------------------
# runs/bench_train.py (was `train.py --bench-steps`)

TINY = ["--scale", "1", "--aspect-ratio", "32", "--head-dim", "16", "--n-layers-eff", "4", "--n-layers-prelude", "1",
        "--n-layers-coda", "1", "--n-loops", "2", "--seq-len", "32", "--vocab-size", "128", "--device-batch", "4"]


def test_bench_train_reports_and_owns_its_output(tmp_path, capsys):
    out = tmp_path / "bench.json"
    rec = bench_train.main([*TINY, "--steps", "3", "--out", str(out)])
    line = capsys.readouterr().out.strip()
    print(f"\n{line}")
    assert line.startswith("bench | n_loops 2 | bptt full | d_model 32 | tok/s ")
    assert "| mfu n/a: 'cpu' is not in PEAK_FLOPS" in line                   # train.py's table: no guessed figure
    assert rec["tok_per_s"] > 0 and rec["mfu"] is None and rec["peak_rss"] > 0 and len(rec["losses"]) == 4
    saved = json.loads(out.read_text())
    assert saved["tok_per_s"] == rec["tok_per_s"] and sorted(os.listdir(tmp_path)) == ["bench.json"]
    bench_train.main([*TINY, "--steps", "3", "--out", str(out)])        # the same request: its own file, replaced
    with pytest.raises(SystemExit) as exc:                              # another request: refused, file kept
        bench_train.main([*TINY, "--steps", "2", "--out", str(out)])
    assert exc.value.code == 2 and "--overwrite" in capsys.readouterr().err
    bench_train.main([*TINY, "--steps", "2", "--out", str(out), "--overwrite"])
    assert json.loads(out.read_text())["steps"] == 2


@pytest.mark.parametrize("argv, msg", [(["--steps", "0"], "argument --steps: must be in [1, inf), got 0"),
                                       (["--device-batch", "2.5"], "argument --device-batch"),
                                       (["--n-loops", "3"], "n_loops=3 must divide 16"),
                                       (["--injection", "passthrough", "--n-loops-bwd", "1"], "needs full BPTT")])
def test_bench_train_bad_flags_are_one_line(argv, msg, capsys, monkeypatch):
    monkeypatch.setattr(bench_train, "train_bench", None)              # any work started: TypeError
    with pytest.raises(SystemExit) as exc:
        bench_train.main([*TINY, *argv])
    err = capsys.readouterr().err.strip()
    assert exc.value.code == 2 and len(err.splitlines()) == 1 and msg in err, err


def test_bench_sh_lines_parse_through_bench_train(tmp_path, monkeypatch):
    # runs/bench.sh part 1 calls runs/bench_train.py (no longer train.py --bench-steps): every line it would run is
    # accepted by bench_train's CLI and its ModelConfig, up to the work (train_bench replaced by a sentinel)
    import shlex
    proc = subprocess.run(["bash", "runs/bench.sh", "--dry-run", str(tmp_path / "b")], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)
    lines = proc.stdout.splitlines()
    assert proc.returncode == 0 and len(lines) == 5 and not (tmp_path / "b").exists()   # a dry run writes nothing

    class Started(Exception):
        pass

    def sentinel(*a, **k):
        raise Started
    monkeypatch.setattr(bench_train, "train_bench", sentinel)
    for line in lines:
        words = shlex.split(line)
        assert words[:2] == ["python", "runs/bench_train.py"]
        with pytest.raises(Started):
            bench_train.main(words[2:])


def test_bench_sh_refuses_a_foreign_out(tmp_path):
    # issue 18 §2: `bash runs/bench.sh OUT` used to overwrite OUT/train_bench.txt; a folder it did not make is refused
    (tmp_path / "train_bench.txt").write_text("my notes")
    proc = subprocess.run(["bash", "runs/bench.sh", str(tmp_path)], cwd=ROOT, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 2 and "files this tool did not make" in proc.stderr and "--overwrite" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    assert sorted(os.listdir(tmp_path)) == ["train_bench.txt"] and (tmp_path / "train_bench.txt").read_text() == \
        "my notes"


# -----------------------------------------------------------------------------
# runs/gpu_session.sh (issue 25): the one prepared GPU call; here its --cpu-smoke and --dry-run

def test_gpu_session_smoke_keeps_what_fits_its_budget(tmp_path):
    # The whole session on CPU: env, gpu_check (stage 1 here; the device default adds stage 5), then the lever
    # cells in priority order until the budget is spent; every cell measured has its JSON, the rest is skipped.
    out = tmp_path / "s"
    t = time.time()
    proc = subprocess.run(["bash", "runs/gpu_session.sh", "--cpu-smoke", "--check-stages", "1", "--budget", "40",
                           str(out)], cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=300)
    print(f"\n{proc.stdout[-2500:]}\nwall {time.time() - t:.0f} s")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert json.loads((out / "gpu_check.json").read_text())["stages"]["1"]["status"] == "ok"
    assert "torch" in (out / "env.txt").read_text() and "done; the cells" in (out / "session.log").read_text()
    base = json.loads((out / "levers" / "s6_r1_base.json").read_text())
    assert (base["scale"], base["n_loops"], base["device_batch"], base["accum"], base["lever"]) == (6, 1, 4, 1, "base")
    assert base["tok_per_s"] > 0 and base["peak_rss"] > 0 and base["mfu"] is None and base["mode"] is None
    assert "budget spent: skipped" in proc.stdout
    again = subprocess.run(["bash", "runs/gpu_session.sh", "--cpu-smoke", "--budget", "1", str(tmp_path)], cwd=ROOT,
                           capture_output=True, text=True, timeout=60)           # a folder it did not make
    assert again.returncode == 2 and "pass --overwrite" in again.stderr and len(again.stderr.splitlines()) == 1


def test_gpu_session_dry_run(capsys):
    proc = subprocess.run(["bash", "runs/gpu_session.sh", "--dry-run"], cwd=ROOT, capture_output=True, text=True,
                          timeout=60)
    lines = proc.stdout.splitlines()
    assert proc.returncode == 0 and all(ln.startswith("gpu-session: ") for ln in lines) and len(lines) == 11
    assert "--stages 1,5 --budget 130" in lines[1] and lines[2].endswith("--accum 4 --steps 3 --levers base --out "
                                                                          "out/gpu_session/levers")


def test_bench_train_levers_one_cell_each(tmp_path, capsys):
    # issue 25 item 4: one cell per lever, each JSON written as measured; a lever that cannot run here (cuDNN
    # attention on a CPU) is recorded as failed and the next cell runs
    assert bench_train.lever("rows64+cudnn+reduce-overhead") == dict(rows=64, mode="reduce-overhead", sdpa="cudnn")
    bench_train.main([*TINY, "--accum", "2", "--steps", "1", "--levers", "base", "cudnn", "rows2+math", "--out",
                      str(tmp_path / "lv")])
    lines = capsys.readouterr().out.strip().splitlines()
    print("\n" + "\n".join(lines))
    cells = {n: json.loads((tmp_path / "lv" / f"s1_r2_{n}.json").read_text()) for n in ("base", "cudnn", "rows2+math")}
    assert "failed: RuntimeError" in lines[1] and "error" in cells["cudnn"]
    assert (cells["rows2+math"]["device_batch"], cells["rows2+math"]["accum"], cells["rows2+math"]["sdpa"]) == \
        (2, 4, "MATH") and "| lever rows2+math: 2 rows x 4, mode default, sdpa MATH" in lines[2]


@pytest.mark.parametrize("argv, msg", [(["--levers", "rows3"], "a lever's rows must divide the 4 rows of a step"),
                                       (["--levers", "fast"], "unknown lever 'fast'")])
def test_bench_train_bad_levers_are_one_line(argv, msg, capsys, tmp_path):
    with pytest.raises(SystemExit) as exc:
        bench_train.main([*TINY, *argv, "--out", str(tmp_path / "unused")])
    err = capsys.readouterr().err.strip()
    assert exc.value.code == 2 and len(err.splitlines()) == 1 and msg in err and not (tmp_path / "unused").exists()
