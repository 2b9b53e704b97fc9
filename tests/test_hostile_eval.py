"""Hostile-input tests for eval.py's CLIs (issues 12, 18): main (checkpoint), `primitives`, runs/bench_eval.py.

Every case asserts the exit status, a one-line message that names the culprit (flag, file and line), no traceback,
and that every file that existed before is byte-identical afterwards. Most cases run eval.main in-process: a
SystemExit is what the shell would see (a str code = that line on stderr and status 1; an int = argparse's status
with the line on stderr); any other exception escapes and fails the test, which is the "no traceback" check. One
case runs a real `python eval.py` to confirm the same from the outside. The fixtures are test_eval.py's tiny
tokenizer and a run of its tiny model with random weights (d_model 32, seq_len 64: RoPE covers 640 positions)."""
import dataclasses
import gzip
import json
import shutil
import re
import os
import subprocess
import sys

import pytest
import torch

import eval as E
import data

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "runs"))
import bench_eval  # noqa: E402
from test_eval import SEQ_LEN, corpus_texts, tiny_model, tok  # noqa: F401  (tok: the module-scoped tokenizer)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory, tok):
    """A run in train.py's layout (ckpt.pt + done.json + a prepared data dir) with random weights: these cases test
    what the CLI refuses, not what a model learned, so test_eval.py's few training steps are skipped."""
    root = tmp_path_factory.mktemp("hostile_run")
    data_dir, out = str(root / "data"), str(root / "out")
    data.prepare_docs(tok.encode(corpus_texts(200, seed=11)), data_dir, seq_len=SEQ_LEN, vocab_size=tok.vocab_size,
                      bos_id=tok.bos_id, tokenizer_hash=tok.identity, val_docs=40, seed=0,
                      source="tests/test_hostile_eval.py", tokenizer=tok.spec)
    model = tiny_model()
    os.makedirs(out)
    torch.save({"model": model.state_dict(), "model_config": dataclasses.asdict(model.cfg),
                "train_config": {"data": data_dir, "eval_tokens": -1}, "tokenizer_hash": tok.identity},
               os.path.join(out, "ckpt.pt"))
    with open(os.path.join(out, "done.json"), "w") as f:
        json.dump({"val_loss": None}, f)
    return dict(out=out, data=data_dir)


def cli(argv, capsys):
    """(exit status, the message, stdout) of `python eval.py *argv` (argv[0] == "bench": runs/bench_eval.py),
    run in-process."""
    msg = ""
    try:
        bench_eval.main(argv[1:]) if argv[:1] == ["bench"] else E.main(argv)
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        # common.fail's exit carries its line (str), as does SystemExit("msg"); argparse's exit only prints it
        msg = str(e) if isinstance(e.code, str) or ": error: " in str(e) else ""
    out, err = capsys.readouterr()
    return code, (msg or err).strip(), out


def snapshot(*roots):
    """{path: bytes} of every file under roots (the 'pre-existing files are byte-identical' check)."""
    files = {}
    for root in roots:
        for d, _, names in os.walk(root):
            for n in names:
                with open(os.path.join(d, n), "rb") as f:
                    files[os.path.join(d, n)] = f.read()
    return files


def refused(argv, capsys, status, *culprits, roots=()):
    """Run argv, assert the status, one line naming every culprit, nothing scored, no file changed or added."""
    before = snapshot(*roots)
    code, msg, out = cli(argv, capsys)
    assert code == status, msg
    assert msg and "\n" not in msg and "Traceback" not in msg
    for c in culprits:
        assert c in msg, f"{c!r} not named in {msg!r}"
    assert "val_loss" not in out and "task " not in out                 # failed before any scoring
    assert snapshot(*roots) == before
    return msg


@pytest.fixture()
def tasks(tmp_path):
    """A task dir holding the five reasoning-primitive files, 20 items each."""
    d = tmp_path / "tasks"
    E.write_primitives(str(d), n=20)
    return d


# -----------------------------------------------------------------------------
# 1. numbers: finiteness and range when parsed, naming the flag (exit 2, argparse's status)

MAIN_FLAGS = [("--temperature", "nan"), ("--temperature", "inf"), ("--temperature", "-0.5"), ("--top-k", "-1"),
              ("--max-new-tokens", "0"), ("--seed", "-3"), ("--n-loops", "0"), ("--n-loops", "2.5"),
              ("--device-batch", "0"), ("--batch-tokens", "-1"), ("--val-tokens", "-2"), ("--val-tokens", "1.5")]


@pytest.mark.parametrize("flag,value", MAIN_FLAGS, ids=[f"{f}={v}" for f, v in MAIN_FLAGS])
def test_main_numeric_flags_checked_at_parse(flag, value, run_dir, capsys):
    refused([run_dir["out"], "--sample", "hi", flag, value], capsys, 2, f"argument {flag}", value,
            roots=[os.path.dirname(run_dir["out"])])


SUB_FLAGS = [(["bench", "--seq-len", "0"], "--seq-len"), (["bench", "--n-examples", "nan"], "--n-examples"),
             (["bench", "--n-loops", "-1"], "--n-loops"), (["bench", "--equal-length", "999"], "--equal-length"),
             (["bench", "--batch-tokens", "inf"], "--batch-tokens"), (["primitives", "--out", "x", "--n", "0"], "--n"),
             (["primitives", "--out", "x", "--n", "1.5"], "--n"), (["bench", "--no-such-flag"], "--no-such-flag")]


@pytest.mark.parametrize("argv,flag", SUB_FLAGS, ids=[" ".join(a) for a, _ in SUB_FLAGS])
def test_bench_and_primitives_flags_checked_at_parse(argv, flag, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)                                          # `--out x` must not be created
    refused(argv, capsys, 2, flag, roots=[str(tmp_path)])
    assert not os.path.exists(tmp_path / "x")


def test_bench_model_checks_before_allocating(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    refused(["bench", "--scale", "4096"], capsys, 2, "parameters", "--scale", roots=[str(tmp_path)])
    refused(["bench", "--head-dim", "3"], capsys, 2, "head_dim=3", roots=[str(tmp_path)])
    refused(["bench", "--n-loops", "3"], capsys, 2, "n_loops=3", roots=[str(tmp_path)])


def test_sample_prompt_not_utf8(run_dir, capsys):
    refused([run_dir["out"], "--sample", "caf\udce9"], capsys, 2, "--sample", "UTF-8",
            roots=[os.path.dirname(run_dir["out"])])


# -----------------------------------------------------------------------------
# 2. --out: a missing folder, a folder, --sample; a foreign file is refused unless --overwrite; eval's own replaced

def test_out_in_missing_folder_fails_before_any_scoring(run_dir, capsys, tmp_path):
    missing = tmp_path / "no" / "such"
    refused([run_dir["out"], "--tasks", "none", "--out", str(missing / "e.json")], capsys, 2, "--out",
            str(missing), "does not exist", roots=[os.path.dirname(run_dir["out"]), str(tmp_path)])
    assert not (tmp_path / "no").exists()


def test_out_folder_and_out_with_sample_refused(run_dir, capsys, tmp_path):
    roots = [os.path.dirname(run_dir["out"]), str(tmp_path)]
    refused([run_dir["out"], "--tasks", "none", "--out", str(tmp_path)], capsys, 2, str(tmp_path), "not a plain file",
            roots=roots)
    refused([run_dir["out"], "--sample", "x", "--out", str(tmp_path / "s.json")], capsys, 2, "--sample", "--out",
            roots=roots)


def test_foreign_out_file_refused_unless_overwrite(run_dir, capsys, tmp_path):
    roots = [os.path.dirname(run_dir["out"]), str(tmp_path)]
    notes = tmp_path / "notes.json"
    notes.write_text('{"my": "own results"}\n')
    refused([run_dir["out"], "--tasks", "none", "--out", str(notes)], capsys, 2, str(notes), "--overwrite",
            roots=roots)
    # an eval.json of another checkpoint is foreign too
    other = tmp_path / "other.json"
    other.write_text(json.dumps(dict(checkpoint="/elsewhere/ckpt.pt", n_loops=2, tasks={})))
    refused([run_dir["out"], "--tasks", "none", "--out", str(other)], capsys, 2, str(other), roots=roots)
    # a link is never followed (its target stays as it was)
    link = tmp_path / "link.json"
    link.symlink_to(notes)
    refused([run_dir["out"], "--tasks", "none", "--out", str(link)], capsys, 2, str(link), roots=roots)
    # eval.py's own file for this checkpoint and r is replaced by a rerun; --overwrite replaces a foreign one
    own = tmp_path / "own.json"
    for _ in range(2):
        assert cli([run_dir["out"], "--tasks", "none", "--val-tokens", "0", "--out", str(own)], capsys)[0] == 0
    assert json.loads(own.read_text())["checkpoint"] == os.path.abspath(run_dir["out"])
    # ... also when the same run is named by its ckpt.pt this time
    ckpt = os.path.join(run_dir["out"], "ckpt.pt")
    assert cli([ckpt, "--tasks", "none", "--val-tokens", "0", "--out", str(own)], capsys)[0] == 0
    code, msg, _ = cli([run_dir["out"], "--tasks", "none", "--val-tokens", "0", "--out", str(notes), "--overwrite"],
                       capsys)
    assert code == 0 and json.loads(notes.read_text())["n_loops"] == 2
    # another r is another request: eval_r4's file is not replaced by an r = 2 evaluation
    r4 = tmp_path / "r4.json"
    assert cli([run_dir["out"], "--tasks", "none", "--val-tokens", "0", "--n-loops", "4", "--out", str(r4)],
               capsys)[0] == 0
    refused([run_dir["out"], "--tasks", "none", "--out", str(r4)], capsys, 2, str(r4), "did not write it", roots=roots)


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders")
def test_out_in_read_only_folder(run_dir, capsys, tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    try:
        refused([run_dir["out"], "--tasks", "none", "--out", str(ro / "e.json")], capsys, 2, str(ro), "not writable")
    finally:
        ro.chmod(0o700)


# -----------------------------------------------------------------------------
# 3. task files: a malformed record names the file and the line, and fails before the checkpoint is even loaded

def _arc(task_dir, lines):
    path = task_dir / "world_knowledge" / "arc_easy.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"".join(line + b"\n" for line in lines))
    return str(path)


GOOD_MC = json.dumps({"query": "Q?", "choices": ["a", "b"], "gold": 1}).encode()
BAD_RECORDS = [
    ("gold-true", json.dumps({"query": "Q?", "choices": ["a", "b"], "gold": True}).encode(), "gold"),
    ("gold-float", json.dumps({"query": "Q?", "choices": ["a", "b"], "gold": 1.0}).encode(), "gold"),
    ("bad-utf8", b'{"query": "Q\xff?", "choices": ["a", "b"], "gold": 0}', "invalid UTF-8"),
    ("lone-surrogate", b'{"query": "Q\\ud800?", "choices": ["a", "b"], "gold": 0}', "surrogate"),
    ("delimiter-int", json.dumps({"query": "Q?", "choices": ["a", "b"], "gold": 0, "delimiter": 3}).encode(),
     "delimiter"),
    ("torn-json", b'{"query": "Q?", "choices": ["a", ', "invalid JSON"),
]


@pytest.mark.parametrize("rec,culprit", [b[1:] for b in BAD_RECORDS], ids=[b[0] for b in BAD_RECORDS])
def test_malformed_task_record_named_by_file_and_line(rec, culprit, run_dir, capsys, tmp_path, tasks):
    path = _arc(tmp_path / "tasks", [GOOD_MC] * 11 + [rec] + [GOOD_MC])           # line 12 is the bad one
    # arc_easy is listed last of all tasks on purpose: it still fails before the val loss and the other tasks
    refused([run_dir["out"], "--tasks", "reasoning_primitives", "arc_easy", "--task-dir", str(tmp_path / "tasks")],
            capsys, 2, f"{path}:12", culprit, roots=[os.path.dirname(run_dir["out"]), str(tmp_path)])


def test_too_few_items_for_the_shots_refused_before_scoring(run_dir, capsys, tmp_path, tasks):
    path = _arc(tmp_path / "tasks", [GOOD_MC] * 10)                  # arc_easy is 10-shot: 11 items at least
    refused([run_dir["out"], "--tasks", "reasoning_primitives", "arc_easy", "--task-dir", str(tmp_path / "tasks")],
            capsys, 2, path, "10-shot", "at least 11", roots=[os.path.dirname(run_dir["out"]), str(tmp_path)])


def test_gzipped_task_file_bad_record_and_truncation(tmp_path):
    recs = [{"query": "Q?", "choices": ["a", "b"], "gold": 0}, {"query": "Q?", "choices": ["a", "b"], "gold": [1]}]
    path = str(tmp_path / "arc_easy.jsonl.gz")
    with gzip.open(path, "wt") as f:
        f.write("\n".join(json.dumps(r) for r in recs) + "\n")
    with pytest.raises(ValueError, match=f"{path}:2: .*gold"):
        E.load_task_file(path)
    raw = gzip.compress(("\n".join([json.dumps(dict(recs[0], query=f"Q{i}?")) for i in range(500)]) + "\n").encode())
    with open(path, "wb") as f:
        f.write(raw[:len(raw) // 2])                                             # a truncated download
    with pytest.raises(ValueError, match=f"{path}.*cannot read the file"):
        E.load_task_file(path)


def test_olmo_requests_bad_doc_id_and_a_doc_counted_twice(tmp_path):
    req = {"doc_id": [1], "idx": 0, "label": ["w"], "request": {"context": "Q:", "continuation": " w"}}
    path = str(tmp_path / "requests.jsonl.gz")
    for recs, line in (([req], 1), ([dict(req, doc_id=3), dict(req, doc_id=4), dict(req, doc_id=3)], 3)):
        with gzip.open(path, "wt") as f:
            f.write("\n".join(json.dumps(r) for r in recs) + "\n")
        with pytest.raises(ValueError, match=f"{path}:{line}: .*one gold request per doc_id"):
            E.load_task_file(path)


# -----------------------------------------------------------------------------
# 4. paths, sizes and --max-new-tokens: refused before the work, with the value that would fit

def test_missing_task_dir_data_dir_and_oversized_val_tokens(run_dir, capsys, tmp_path):
    roots = [os.path.dirname(run_dir["out"])]
    refused([run_dir["out"], "--task-dir", str(tmp_path / "nope")], capsys, 2, "--task-dir", "nope", roots=roots)
    refused([run_dir["out"], "--data", str(tmp_path / "nodata")], capsys, 2, "--data", "nodata", roots=roots)
    msg = refused([run_dir["out"], "--tasks", "none", "--val-tokens", "99999999"], capsys, 2, "--val-tokens",
                  "99,999,999", roots=roots)
    assert "-1" in msg                                                    # says what to use instead


def test_val_loss_never_skipped_silently_when_the_data_moved(run_dir, tok, capsys, tmp_path):
    """A run whose recorded data dir is gone: the val loss it would report is refused in one line naming the dir and
    the way out (--data or --val-tokens 0), before any scoring; with --val-tokens 0 the tasks alone are scored."""
    moved = _run_variant(tmp_path / "moved", str(tmp_path / "gone"), tok)
    refused([moved, "--tokenizer", tok.spec, "--tasks", "induction_head"], capsys, 2, str(tmp_path / "gone"),
            "--val-tokens 0", roots=[str(tmp_path)])
    res = E.main([moved, "--tokenizer", tok.spec, "--tasks", "induction_head", "--val-tokens", "0"])
    assert "val_loss" not in res and res["tasks"]["induction_head"]["status"] == "ok"


def test_max_new_tokens_beyond_rope_refused_before_decoding(run_dir, tok, capsys):
    roots = [os.path.dirname(run_dir["out"])]
    prompt = ""
    while 1 + len(tok.encode([prompt])[0]) < 600:                         # a long prompt: few positions are left
        prompt += "The cat sat on the mat. "
    n_prompt = 1 + len(tok.encode([prompt])[0])
    assert 600 <= n_prompt < 640
    msg = refused([run_dir["out"], "--sample", prompt, "--max-new-tokens", "5000"], capsys, 2,
                  "--max-new-tokens 5000", "RoPE covers 640", roots=roots)
    most = int(msg.rsplit("<= ", 1)[1])
    assert most == 640 + 1 - n_prompt                                     # the last token is never forwarded
    # the largest value it names really decodes (greedy, to the last RoPE position); one more is refused
    text = E.main([run_dir["out"], "--sample", prompt, "--max-new-tokens", str(most), "--temperature", "0"])
    assert isinstance(text, str)
    refused([run_dir["out"], "--sample", prompt, "--max-new-tokens", str(most + 1)], capsys, 2,
            f"--max-new-tokens {most + 1}", roots=roots)


# -----------------------------------------------------------------------------
# 5. a task that cannot be scored does not throw away the others: eval.json is written, exit 1 names the task

def test_failed_task_keeps_the_other_results(run_dir, capsys, tmp_path, tasks):
    long_ctx = " ".join(f"w{i}" for i in range(900))                          # > 640 positions uncropped
    recs = [{"context": long_ctx + f" {i}\nAnswer:", "continuation": "x"} for i in range(6)]
    path = tasks / "closed_book_qa" / "webq.jsonl"
    path.parent.mkdir()
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    out = tmp_path / "e.json"
    code, msg, _ = cli([run_dir["out"], "--tasks", "induction_head", "webq", "--task-dir", str(tasks), "--no-crop",
                        "--val-tokens", "0", "--out", str(out)], capsys)
    print(f"\n  -> exit {code}: {msg}")
    assert code == 2 and "\n" not in msg and "webq" in msg and "RoPE" in msg
    saved = json.loads(out.read_text())
    assert saved["failed"] == ["webq"] and saved["tasks"]["webq"]["status"] == "error"
    assert saved["tasks"]["induction_head"]["status"] == "ok" and saved["tasks"]["induction_head"]["n"] == 20
    assert saved["axes"]["parametric_knowledge"]["complete"] is False


def test_disk_full_at_the_end_prints_the_result_instead_of_losing_it(run_dir, capsys, tmp_path, tasks, monkeypatch):
    def full(path, obj, tool, key):
        raise OSError(28, "No space left on device", path)
    monkeypatch.setattr(E, "write_json", full)
    out = tmp_path / "e.json"
    code, msg, stdout = cli([run_dir["out"], "--tasks", "induction_head", "--task-dir", str(tasks), "--out", str(out)],
                            capsys)
    assert code == 2 and "\n" not in msg and f"could not write {out}" in msg and "No space left" in msg
    saved = json.loads(stdout[stdout.index("{\n"):])                        # the whole result, on stdout
    assert saved["tasks"]["induction_head"]["n"] == 20 and saved["val_loss"] > 0 and not out.exists()


# -----------------------------------------------------------------------------
# 6. primitives: a task dir that is a file, and task files that differ from what would be written

def test_primitives_never_replace_other_files(capsys, tmp_path):
    afile = tmp_path / "afile"
    afile.write_text("mine\n")
    refused(["primitives", "--out", str(afile)], capsys, 2, str(afile), "cannot use this folder", roots=[str(tmp_path)])
    d = tmp_path / "tasks"
    assert cli(["primitives", "--out", str(d), "--n", "10"], capsys)[0] == 0
    assert cli(["primitives", "--out", str(d), "--n", "10"], capsys)[0] == 0          # a rerun: identical bytes
    culprit = str(d / "reasoning_primitives" / "var_assign_d0_math.jsonl")
    refused(["primitives", "--out", str(d), "--n", "12"], capsys, 2, str(d / "reasoning_primitives"), "--overwrite",
            roots=[str(tmp_path)])
    assert cli(["primitives", "--out", str(d), "--n", "12", "--overwrite"], capsys)[0] == 0
    assert len(E.load_task_file(culprit)) == 12


# -----------------------------------------------------------------------------
# 7. the same from the outside: a real process, stderr one line, no traceback

def test_real_process_one_line_no_traceback(run_dir, tmp_path):
    # one process only (importing torch costs seconds on a loaded box); the in-process cases cover the rest
    before = snapshot(os.path.dirname(run_dir["out"]))
    out = str(tmp_path / "missing" / "e.json")
    proc = subprocess.run([sys.executable, "eval.py", run_dir["out"], "--tasks", "none", "--out", out], cwd=ROOT,
                          capture_output=True, text=True, timeout=120, env=dict(os.environ, OMP_NUM_THREADS="1"))
    print(f"\n  exit {proc.returncode}: {proc.stderr.strip()}")
    assert proc.returncode == 2 and proc.stdout == ""
    assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr
    assert f"--out {out}" in proc.stderr and "does not exist" in proc.stderr
    assert snapshot(os.path.dirname(run_dir["out"])) == before and not os.path.exists(tmp_path / "missing")


# -----------------------------------------------------------------------------
# 8. eval identity (issue 18 §3): the data's tokenizer is the checkpoint's whatever --tokenizer says; ids within the
#    model's vocabulary; finite weights; a model too large for this machine refused up front, naming its size

def _run_variant(root, data_dir, tok, mutate=None, **kw):
    """A run dir like run_dir's (tiny random model, ckpt.pt + done.json) with mutate(ck) applied to its checkpoint."""
    model = tiny_model(**kw)
    ck = {"model": model.state_dict(), "model_config": dataclasses.asdict(model.cfg),
          "train_config": {"data": data_dir, "eval_tokens": -1}, "tokenizer_hash": tok.identity}
    if mutate:
        mutate(ck)
    os.makedirs(root)
    torch.save(ck, os.path.join(root, "ckpt.pt"))
    with open(os.path.join(root, "done.json"), "w") as f:
        json.dump({"val_loss": None}, f)
    return str(root)


def _data(root, tok, **kw):
    """A prepared val/train split of the test corpus, tokenised by tok but recorded as kw says (hash, vocab)."""
    args = dict(seq_len=SEQ_LEN, vocab_size=tok.vocab_size, bos_id=tok.bos_id, tokenizer_hash=tok.identity,
                val_docs=40, seed=0, source="tests/test_hostile_eval.py", tokenizer=tok.spec)
    data.prepare_docs(tok.encode(corpus_texts(200, seed=11)), str(root), **dict(args, **kw))
    return str(root)


def test_data_of_another_tokenizer_refused_whatever_tokenizer_says(run_dir, tok, capsys, tmp_path):
    other = _data(tmp_path / "other", tok, tokenizer_hash="sentencepiece:another")
    roots = [os.path.dirname(run_dir["out"]), str(tmp_path)]
    for extra in (["--tasks", "none"], ["--tasks", "induction_head", "--val-tokens", "0"]):   # even with no val loss
        refused([run_dir["out"], "--data", other, "--tokenizer", tok.spec, *extra], capsys, 2, "--data", other,
                "sentencepiece:another", tok.identity, roots=roots)
    # a checkpoint that records no tokenizer (a release, an old run): the data is checked against the tokenizer
    bare = _run_variant(tmp_path / "bare", other, tok, mutate=lambda ck: ck.pop("tokenizer_hash"))
    refused([bare, "--tokenizer", tok.spec, "--tasks", "none"], capsys, 2, "sentencepiece:another",
            f"tokenizer is {tok.identity}", roots=roots)
    # the data's own tokenizer.model swapped for another one: the copy no longer matches the recorded hash
    swapped = _data(tmp_path / "swapped", tok)
    foreign = data.train_tokenizer(corpus_texts(60, seed=3), 360, str(tmp_path / "t360.model"), num_threads=1)
    with open(foreign.spec, "rb") as src, open(os.path.join(swapped, "tokenizer.model"), "wb") as dst:
        dst.write(src.read())
    bare2 = _run_variant(tmp_path / "bare2", swapped, tok, mutate=lambda ck: ck.pop("tokenizer_hash"))
    refused([bare2, "--tasks", "none"], capsys, 2, foreign.identity, roots=roots)


def test_ids_beyond_the_model_vocabulary_refused(run_dir, tok, capsys, tmp_path):
    roots = [os.path.dirname(run_dir["out"]), str(tmp_path)]
    wide = _data(tmp_path / "wide", tok, vocab_size=tok.vocab_size + 64)      # a meta of a larger vocabulary
    refused([run_dir["out"], "--data", wide, "--tasks", "none"], capsys, 2, "--data", f"{tok.vocab_size + 64:,}",
            "beyond the model's vocabulary", roots=roots)
    small = _run_variant(tmp_path / "small", run_dir["data"], tok, vocab_size=256)   # model vocab < tokenizer's
    refused([small, "--sample", "hi"], capsys, 2, f"tokenizer vocab {tok.vocab_size}", "model vocab 256",
            roots=roots)


def test_non_finite_weights_refused_before_scoring(run_dir, tok, capsys, tmp_path):
    def poison(ck):
        ck["model"]["lm_head.weight"][0, 0] = float("nan")
        ck["model"]["recur.0.mlp.c_fc.weight"][1, 2] = float("inf")
    bad = _run_variant(tmp_path / "nan", run_dir["data"], tok, mutate=poison)
    refused([bad, "--tasks", "induction_head"], capsys, 2, "2 holding NaN or inf", "lm_head.weight",
            "recur.0.mlp.c_fc.weight", roots=[str(tmp_path)])
    assert not os.path.exists(os.path.join(bad, "eval.json"))


RELEASE_MC = dict(sequence_len=64, vocab_size=384, size=4, n_head=2, n_kv_head=2, n_embd=256, n_prelude=1,
                  n_recur_block=1, n_coda=1, num_recur=2, bptt_k=2, input_injection="inject_init_prelude",
                  num_lanes=2, logit_softcap=15.0)


@pytest.mark.parametrize("field,value,culprit", [
    ("sequence_len", 10 ** 8, "GiB for its weights and RoPE tables"),      # RoPE: 10 T x D/2 entries
    ("vocab_size", 10 ** 10, "key 'model_config.vocab_size' must be in [2, 1e9]"),   # --vocab-size's limit
    ("n_embd", 10 ** 12, "key 'model_config.n_embd' must be in [1, 1e9]"),
    ("sequence_len", 1e8, "key 'model_config.sequence_len' must be int, got float"),
    ("logit_softcap", float("nan"), "key 'model_config.logit_softcap' must be a finite number"),
    ("num_recur", "2", "key 'model_config.num_recur' must be int, got str"),
])
def test_release_meta_sizes_and_types_refused_up_front(tmp_path, capsys, field, value, culprit):
    """A hand-edited release meta: refused by the reader or by the memory check before its weights are even read
    (the model file here is not a checkpoint at all), one line naming the file."""
    root = tmp_path / "rel"
    root.mkdir()
    (root / "model_000100.pt").write_bytes(b"never read: the meta is refused first")
    meta = root / "meta_000100.json"
    meta.write_text(json.dumps(dict(step=100, val_loss=3.5, model_config=dict(RELEASE_MC, **{field: value}))))
    with pytest.raises(ValueError, match=re.escape(culprit)) as exc:
        E.load_checkpoint(str(root))
    assert str(meta) in str(exc.value) and "\n" not in str(exc.value)
    refused([str(root), "--tasks", "none"], capsys, 2, str(meta), culprit, roots=[str(tmp_path)])


def test_nanoloop_checkpoint_too_large_and_hand_edited_entries(run_dir, tok, capsys, tmp_path):
    roots = [str(tmp_path)]
    huge = _run_variant(tmp_path / "huge", run_dir["data"], tok,
                        mutate=lambda ck: ck["model_config"].update(seq_len=10 ** 8))   # RoPE of 10^9 positions
    refused([huge, "--tasks", "none"], capsys, 2, os.path.join(huge, "ckpt.pt"), "seq_len 100,000,000", "GiB",
            roots=roots)
    for name, mutate, culprit in (
            ("str_tokens", lambda ck: ck["train_config"].update(eval_tokens="-1"), "'train_config.eval_tokens'"),
            ("list_config", lambda ck: ck.update(train_config=["data"]), "'train_config' must be dict"),
            ("int_hash", lambda ck: ck.update(tokenizer_hash=7), "'tokenizer_hash' must be str")):
        run = _run_variant(tmp_path / name, run_dir["data"], tok, mutate=mutate)
        refused([run, "--tasks", "none"], capsys, 2, os.path.join(run, "ckpt.pt"), culprit, roots=roots)


def test_eval_json_is_ours_by_its_header_and_a_copied_run_keeps_it(run_dir, capsys, tmp_path):
    """Rule 2 through the CLI: eval.json carries its written_by header, so a run folder copied as a whole (cp -a)
    still holds this request's own file and a rerun there replaces it; a header naming another tool or request is
    not ours (refused, file untouched) until --overwrite."""
    copy = tmp_path / "copy"
    shutil.copytree(run_dir["out"], copy, symlinks=True)
    assert cli([str(copy), "--tasks", "none", "--val-tokens", "0"], capsys)[0] == 0
    saved = json.loads((copy / "eval.json").read_text())
    assert saved["written_by"]["tool"] == "eval" and saved["n_loops"] == 2
    moved = tmp_path / "moved"
    shutil.copytree(copy, moved, symlinks=True)                 # eval.json inside: still this request's own
    assert cli([str(moved), "--tasks", "none", "--val-tokens", "0"], capsys)[0] == 0
    (moved / "eval.json").write_text(json.dumps(dict(saved, written_by={"tool": "fit", "key": "x"})))
    refused([str(moved), "--tasks", "none", "--val-tokens", "0"], capsys, 2, str(moved / "eval.json"), "--overwrite",
            roots=[str(tmp_path)])
    assert cli([str(moved), "--tasks", "none", "--val-tokens", "0", "--overwrite"], capsys)[0] == 0


def test_release_meta_of_another_step_or_type_refused(tmp_path, capsys):
    """A meta copied from another step would report that step's val_loss as this one's; a string val_loss or a
    meta that is not an object are the reader's one-line errors."""
    root = tmp_path / "rel"
    root.mkdir()
    (root / "model_000100.pt").write_bytes(b"never read")
    meta = root / "meta_000100.json"
    for doc, culprit in ((dict(step=5, model_config=RELEASE_MC), "key 'step' is 5, but it sits beside model_000100"),
                         (dict(step=100, val_loss="3.5", model_config=RELEASE_MC), "key 'val_loss' must be"),
                         ([RELEASE_MC], "expected a JSON object, got list")):
        meta.write_text(json.dumps(doc))
        refused([str(root), "--tasks", "none"], capsys, 2, str(meta), culprit, roots=[str(tmp_path)])


# -----------------------------------------------------------------------------
# 9. rules through the CLI on the light mechanisms: what cannot be read is named (never waited on), a model that
# cannot run r' != r says so through the model, one writer per primitives folder

def test_fifos_and_links_named_never_waited_on(run_dir, tok, capsys, tmp_path):
    """A FIFO where a file is read or written would block open() forever: each is refused by name, exit 2."""
    roots = [os.path.dirname(run_dir["out"])]          # not tmp_path: the snapshot itself would open the FIFOs
    os.mkfifo(tmp_path / "out.json")
    refused([run_dir["out"], "--tasks", "none", "--out", str(tmp_path / "out.json")], capsys, 2,
            str(tmp_path / "out.json"), "not a plain file", roots=roots)
    task = tmp_path / "tasks" / "world_knowledge" / "arc_easy.jsonl"
    task.parent.mkdir(parents=True)
    os.mkfifo(task)
    refused([run_dir["out"], "--tasks", "arc_easy", "--task-dir", str(tmp_path / "tasks")], capsys, 2, str(task),
            "not a plain file", roots=roots)
    (tmp_path / "fiforun").mkdir()
    os.mkfifo(tmp_path / "fiforun" / "ckpt.pt")
    refused([str(tmp_path / "fiforun"), "--tasks", "none"], capsys, 2, str(tmp_path / "fiforun" / "ckpt.pt"),
            "not a plain file", roots=roots)


def test_loop_sweep_refused_through_the_model(run_dir, tok, capsys, tmp_path):
    """runs/mini.sh relies on this exit 2 instead of a list of case names: hyperconnections exist for exactly r."""
    run = _run_variant(tmp_path / "hc", run_dir["data"], tok, injection="hyper")
    msg = refused([run, "--n-loops-sweep", "1,2", "--tasks", "none"], capsys, 2, "--n-loops-sweep", "r'=1",
                  "injection 'hyper'", roots=[str(tmp_path)])
    assert not os.path.exists(os.path.join(run, "eval.json")), msg
    assert cli([run, "--n-loops-sweep", "2", "--tasks", "none", "--val-tokens", "64"], capsys)[0] == 0   # r' = r


def test_primitives_one_writer_and_a_users_folder(capsys, tmp_path):
    """The reasoning_primitives folder is eval.py's: a user's own file there is never replaced (refused, untouched),
    and a second writer while the first holds the folder is refused, not interleaved."""
    import fcntl
    mine = tmp_path / "a" / "reasoning_primitives" / "induction_head.jsonl"
    mine.parent.mkdir(parents=True)
    mine.write_text('{"context": "my own", "continuation": "file"}\n')
    refused(["primitives", "--out", str(tmp_path / "a"), "--n", "5"], capsys, 2, "--overwrite", roots=[str(tmp_path)])
    b = tmp_path / "b"
    assert cli(["primitives", "--out", str(b), "--n", "5"], capsys)[0] == 0
    with open(b / "reasoning_primitives" / ".nanoloop-eval-primitives") as held:   # another writer holds it
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        refused(["primitives", "--out", str(b), "--n", "5"], capsys, 2, "another", roots=[str(tmp_path)])
