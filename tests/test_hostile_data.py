"""Hostile input for data.py (issues 12, 24): every ordinary mistake or fault is one line naming the culprit, with the
right exit status, no traceback, and every file that existed before byte-identical after. Issue 24's rules are tested
through the CLI, never through a mechanism: one writer per output, a kill then a rerun finishes, what cannot be read
is named, every number read from a file passes its flag's limits, a refusal changes nothing.

Most cases call data.main in-process (a Python start-up per case would cost seconds on a loaded 2-core box); what
SystemExit carries is exactly what `python data.py ...` prints, and one case runs the real process to prove it.
An unexpected exception would escape data.main and fail the test with its traceback.
Run: python -m pytest -q tests/test_hostile_data.py
"""
import hashlib
import json
import os
import random
import subprocess
import sys
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import data
from conftest import ROOT

WORDS = ["the", "cat", "sat", "on", "a", "mat", "while", "dog", "ran", "far", "away", "from", "home", "and", "then"]


def text(n_words, seed):
    rng = random.Random(seed)
    return " ".join(rng.choice(WORDS) for _ in range(n_words)).capitalize() + "."


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    """A 300-piece BPE of our own (vocab 300) on tiny synthetic text."""
    path = str(tmp_path_factory.mktemp("tok") / "tok.model")
    data.train_tokenizer(["\n".join(text(30, i) for i in range(3000))], 300, path, num_threads=1)
    return path


def snapshot(root):
    """{relative path: sha256} of every file under root."""
    out = {}
    for d, _, files in os.walk(root):
        for f in files:
            p = os.path.join(d, f)
            # a FIFO is named, never opened (it would wait for a writer)
            out[os.path.relpath(p, root)] = hashlib.sha256(open(p, "rb").read()).hexdigest() if os.path.isfile(p) \
                else "not a file"
    return out


def cli(argv, root, capsys, code):
    """Run data.main(argv); check the exit status, that every pre-existing file under root is unchanged, and that the
    error output is one line. Returns that line."""
    before = snapshot(root)
    got, err = 0, ""
    try:
        data.main([str(a) for a in argv])
    except SystemExit as e:
        got = e.code if isinstance(e.code, int) else 1        # python prints a str code to stderr and exits 1
        err = "" if isinstance(e.code, int) or e.code is None else e.code + "\n"
    out, err2 = capsys.readouterr()
    err = err2 + err
    after = snapshot(root)
    changed = [k for k, v in before.items() if after.get(k) != v]
    assert not changed, f"pre-existing files changed or removed: {changed}"
    assert got == code, (got, err)
    assert "Traceback" not in out + err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1, err
    return lines[0]


def write_jsonl(path, records):
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records))
    return path


def good_records(n=60):
    return [{"text": text(40 + i % 50, i)} for i in range(n)]


def prepare_args(src, tok, out, *extra):
    return ["prepare", "--source", src, "--tokenizer", tok, "--out", out, "--seq-len", "32", *extra]

# -----------------------------------------------------------------------------
# Bad records: file and line named, before any work (nothing is created)


@pytest.mark.parametrize("record, culprit", [
    ('{"text": 42}', 'src.jsonl:3: "text" is int'),
    ('{"text": null}', 'src.jsonl:3: "text" is NoneType'),
    ('{"body": "x"}', 'src.jsonl:3: no "text" field'),
    ('[1, 2]', 'src.jsonl:3: expected a JSON object'),
    ('{"text": "unterminated', 'src.jsonl:3: invalid JSON'),
    ('{"text": "a\\ud800b"}', 'src.jsonl:3: a string holds a lone surrogate'),     # was a TypeError traceback
])
def test_bad_jsonl_record_names_file_and_line(tmp_path, tok, capsys, record, culprit):
    recs = good_records()
    recs[2] = record
    src = write_jsonl(tmp_path / "src.jsonl", recs)
    line = cli(prepare_args(src, tok, tmp_path / "out"), tmp_path, capsys, 2)
    assert culprit in line
    assert not (tmp_path / "out").exists()


def test_invalid_utf8_names_file_and_line(tmp_path, tok, capsys):
    raw = b"".join(json.dumps(r).encode() + b"\n" for r in good_records(10))
    (tmp_path / "src.jsonl").write_bytes(raw + b'{"text": "caf\xe9"}\n')
    assert "src.jsonl:11: invalid UTF-8" in cli(prepare_args(tmp_path / "src.jsonl", tok, tmp_path / "out"),
                                                tmp_path, capsys, 2)
    (tmp_path / "doc.txt").write_bytes(b"line one\nline two\nbad \xff byte\n")
    assert "doc.txt:3: invalid UTF-8" in cli(prepare_args(tmp_path / "doc.txt", tok, tmp_path / "out"),
                                             tmp_path, capsys, 2)
    assert not (tmp_path / "out").exists()


def test_parquet_text_column_of_numbers_and_corrupt_parquet(tmp_path, tok, capsys):
    pq.write_table(pa.table({"text": pa.array(list(range(50)))}), tmp_path / "nums.parquet")
    assert "nums.parquet: column 'text' holds int64" in cli(
        prepare_args(tmp_path / "nums.parquet", tok, tmp_path / "out"), tmp_path, capsys, 2)
    good = tmp_path / "good.parquet"
    pq.write_table(pa.table({"text": [r["text"] for r in good_records()]}), good)
    (tmp_path / "cut.parquet").write_bytes(good.read_bytes()[:len(good.read_bytes()) // 2])   # truncated copy
    assert "cut.parquet: not a readable parquet file" in cli(
        prepare_args(tmp_path / "cut.parquet", tok, tmp_path / "out"), tmp_path, capsys, 2)
    assert not (tmp_path / "out").exists()

# -----------------------------------------------------------------------------
# Values checked when parsed (exit 2, before the tokenizer is even loaded)


@pytest.mark.parametrize("flag, value", [("--max-docs", "-20000"), ("--max-docs", "0"), ("--doc-chars", "-1"),
                                         ("--seq-len", "0"), ("--rows-per-file", "0"), ("--val-docs", "0"),
                                         ("--seed", "-1"), ("--seq-len", "abc"), ("--workers", "-2")])
def test_out_of_range_values_fail_at_parse(tmp_path, capsys, flag, value):
    line = cli(["prepare", "--source", "default", "--tokenizer", "missing.model", "--out", tmp_path / "o",
                flag, value], tmp_path, capsys, 2)
    assert f"argument {flag}" in line and value in line


def test_tokenizer_cli_values_and_existing_out(tmp_path, tok, capsys):
    assert "argument --vocab-size" in cli(["tokenizer", "--corpus", "default", "--vocab-size", "10", "--out",
                                           tmp_path / "t.model"], tmp_path, capsys, 2)
    (tmp_path / "mine.model").write_bytes(b"the user's own model")
    line = cli(["tokenizer", "--corpus", "default", "--out", tmp_path / "mine.model"], tmp_path, capsys, 2)
    assert "mine.model exists" in line and "--overwrite" in line


def test_val_docs_larger_than_the_corpus_fails_before_any_work(tmp_path, tok, capsys):
    src = write_jsonl(tmp_path / "src.jsonl", good_records(20))
    line = cli(prepare_args(src, tok, tmp_path / "out", "--val-docs", "20"), tmp_path, capsys, 2)
    assert "--val-docs 20 must be in [1, 19]" in line and not (tmp_path / "out").exists()
    line = cli(prepare_args(src, tok, tmp_path / "out", "--rows-per-file", "10000000"), tmp_path, capsys, 2)
    assert "--rows-per-file 10,000,000" in line and not (tmp_path / "out").exists()     # no 1 GB row buffer


def test_out_under_a_file_refused_before_any_write(tmp_path, tok, capsys):
    src = write_jsonl(tmp_path / "src.jsonl", good_records())
    for out, why in ((src, "File exists"), (src / "sub", "Not a directory")):
        assert f"cannot use this folder ({why})" in cli(prepare_args(src, tok, out), tmp_path, capsys, 2)


def test_missing_source_and_foreign_tokenizer(tmp_path, tok, capsys):
    assert "matches no file" in cli(prepare_args(tmp_path / "nothing*.jsonl", tok, tmp_path / "out"),
                                    tmp_path, capsys, 2)
    (tmp_path / "fake.model").write_bytes(b"\x00\x01 not a model")
    src = write_jsonl(tmp_path / "src.jsonl", good_records())
    assert "fake.model is not a sentencepiece model" in cli(
        prepare_args(src, tmp_path / "fake.model", tmp_path / "out"), tmp_path, capsys, 2)

# -----------------------------------------------------------------------------
# --out: only this same request's directory is reused or resumed; anything else needs --overwrite (common.claim)


def test_out_dir_with_foreign_files_is_refused_and_overwrite_keeps_them(tmp_path, tok, capsys):
    src = write_jsonl(tmp_path / "src.jsonl", good_records())
    out = tmp_path / "out"
    out.mkdir()
    (out / "important.txt").write_text("keep me")
    line = cli(prepare_args(src, tok, out), tmp_path, capsys, 2)
    assert "important.txt" in line and "--overwrite" in line
    data.main(prepare_args(str(src), tok, str(out), "--overwrite"))
    assert (out / "important.txt").read_text() == "keep me" and (out / "meta_val.json").exists()
    capsys.readouterr()
    # the same request again: reused, nothing rewritten; a different request (another seed): refused
    before = snapshot(out)
    data.main(prepare_args(str(src), tok, str(out)))
    assert "nothing to do" in capsys.readouterr().out and snapshot(out) == before
    line = cli(prepare_args(src, tok, out, "--seed", "1"), tmp_path, capsys, 2)
    assert "another request of data" in line and "--overwrite" in line


def test_overwrite_deletes_nothing_and_refuses_shards_in_the_way(tmp_path, tok, capsys):
    """--overwrite lets prepare write into a folder it does not own, but never deletes: a shard of another set, which
    the loader would read with the new files, is refused by name and the folder is left as it was."""
    src = write_jsonl(tmp_path / "src.jsonl", good_records())
    out = tmp_path / "out"
    data.main(prepare_args(str(src), tok, str(out)))
    capsys.readouterr()
    line = cli(prepare_args(src, tok, out, "--seed", "1", "--overwrite"), tmp_path, capsys, 2)
    assert "train-00000.parquet, a shard of another prepare" in line
    # the authors' layout in the way: the same refusal; a folder of other files: written, the files kept
    pub = published(tmp_path)
    assert "a shard of another prepare" in cli(prepare_args(src, tok, pub, "--overwrite"), tmp_path, capsys, 2)
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep")
    data.main(prepare_args(str(src), tok, str(tmp_path / "mine"), "--overwrite"))
    assert (tmp_path / "mine" / "notes.txt").read_text() == "keep" and (tmp_path / "mine" / "meta_val.json").exists()


def test_modified_prepared_set_is_packed_again(tmp_path, tok, capsys):
    """A finished set of this same request whose file was modified is not reused as it is: the folder is this
    request's own, so the rerun packs it again, to the bytes it had."""
    src = write_jsonl(tmp_path / "src.jsonl", good_records())
    out = tmp_path / "out"
    data.main(prepare_args(str(src), tok, str(out)))
    before = snapshot(out)
    f0 = out / "train-00000.parquet"
    rows = pq.read_table(f0).column("tokens").to_pylist()
    pq.write_table(pa.table({"tokens": pa.array(rows[::-1], type=pa.list_(pa.uint16()))}), f0)
    capsys.readouterr()
    data.main(prepare_args(str(src), tok, str(out)))
    assert "wrote" in capsys.readouterr().out and snapshot(out) == before


def kill_at_third_shard(monkeypatch):
    """Make the third parquet write raise KeyboardInterrupt (a kill mid-prepare); returns the real writer."""
    real, calls = pq.write_table, []

    def die_on_third(table, path):
        calls.append(path)
        if len(calls) == 3:
            raise KeyboardInterrupt
        real(table, path)
    monkeypatch.setattr(pq, "write_table", die_on_third)
    return real


def test_cli_prepare_killed_midway_resumes_by_itself(tmp_path, tok, capsys, monkeypatch):
    """A kill after the 2nd shard (and a half-written temporary left behind): the same command finishes the job and
    the result is byte-identical to an uninterrupted prepare. The temporary is not removed (a tool deletes nothing
    by its name's pattern) and no reader sees it."""
    src = write_jsonl(tmp_path / "src.jsonl", good_records(400))
    args = lambda out: prepare_args(str(src), tok, str(out), "--rows-per-file", "8", "--val-docs", "40")
    data.main(args(tmp_path / "whole"))
    real = kill_at_third_shard(monkeypatch)
    with pytest.raises(SystemExit) as exc:
        data.main(args(tmp_path / "cut"))
    assert exc.value.code == 130 and "rerun the same command to resume" in capsys.readouterr().err
    monkeypatch.setattr(pq, "write_table", real)
    (tmp_path / "cut" / ".train-00002.parquet.0badc0de.tmp").write_bytes(b"PAR1 half")    # as a kill -9 leaves it
    capsys.readouterr()
    data.main(args(tmp_path / "cut"))
    cap = capsys.readouterr()
    assert "resuming train" in cap.err and "(resumed)" in cap.out
    cut = snapshot(tmp_path / "cut")
    assert cut.pop(".train-00002.parquet.0badc0de.tmp") and cut == snapshot(tmp_path / "whole")
    assert "ok:" in (data.main(["check", str(tmp_path / "cut")]) or capsys.readouterr().out)

# -----------------------------------------------------------------------------
# Long lines: never dropped without a word


def test_long_lines_are_split_for_the_tokenizer_and_counted(tmp_path, capsys):
    long_line = " ".join(text(8, i) for i in range(800))                          # ~40k chars, one line
    assert len(long_line.encode()) > data.SPM_MAX_LINE
    src = write_jsonl(tmp_path / "src.jsonl", good_records(300) + [{"text": long_line}])
    data.main(["tokenizer", "--corpus", str(src), "--vocab-size", "300", "--out", str(tmp_path / "t.model")])
    err = capsys.readouterr().err
    assert "1 line(s) over 16,384 bytes were cut" in err
    pieces = data._split_long(long_line, data.SPM_MAX_LINE // 4)
    assert "".join(pieces) == long_line and max(map(len, pieces)) <= data.SPM_MAX_LINE // 4

# -----------------------------------------------------------------------------
# Prepacked data (ours or the authors'): bad ids, a lying meta, corrupt files -> one line, at load time


def published(tmp_path, train_max=290, val_max=290, vocab=300, stats=True):
    """A directory in the release's layout (its meta keys only, no hashes)."""
    out = tmp_path / "pub"
    out.mkdir(exist_ok=True)
    for split, top in (("train", train_max), ("val", val_max)):
        rows = np.random.default_rng(0).integers(2, 200, size=(6, 33)).astype(np.uint16)
        rows[:, 0] = 1
        rows[3, 7] = top
        pq.write_table(pa.table({"tokens": pa.array(rows.tolist(), type=pa.list_(pa.uint16()))}),
                       out / f"{split}-00000.parquet", write_statistics=stats)
        (out / f"meta_{split}.json").write_text(json.dumps(dict(vocab_size=vocab, bos_token_id=1, seq_len=32,
                                                                row_capacity=33, total_rows=6, num_shards=1)))
    return out


@pytest.mark.parametrize("kw, culprit", [
    (dict(train_max=300), "train-00000.parquet: token id 300 >= vocab_size 300"),        # an id >= vocab
    (dict(train_max=299, vocab=200), "train-00000.parquet: token id 299 >= vocab_size 200"),   # meta too small
    (dict(val_max=5000, stats=False), "val-00000.parquet: row 3 holds token id 5,000"),  # val only, no statistics
])
def test_prepacked_bad_ids_are_refused_at_load(tmp_path, capsys, kw, culprit):
    out = published(tmp_path, **kw)
    assert culprit in cli(["check", out], tmp_path, capsys, 2)
    split = "val" if "val" in culprit else "train"
    with pytest.raises(ValueError, match="token id"):                  # at construction: before any training step
        data.PackedLoader(str(out), split, seq_len=32, batch_rows=2, device_batch=2)


def test_prepacked_corrupt_parquet_and_meta(tmp_path, capsys):
    out = published(tmp_path)
    assert "ok:" in (data.main(["check", str(out)]) or capsys.readouterr().out)
    (out / "val-00000.parquet").write_bytes(os.urandom(500))
    assert "val-00000.parquet: not a readable parquet file" in cli(["check", out], tmp_path, capsys, 2)
    (out / "meta_train.json").write_text('{"vocab_size": 300, "seq_len": ')
    assert "meta_train.json: not a JSON record" in cli(["check", out], tmp_path, capsys, 2)
    (out / "meta_train.json").write_text('{"vocab_size": "300", "seq_len": 32}')
    assert "meta_train.json: key 'vocab_size' must be int, got str '300'" in cli(["check", out], tmp_path, capsys, 2)


def test_real_process_one_line_exit_2(tmp_path, tok):
    """The same path end to end in a real `python data.py` process: exit 2, one stderr line, no traceback."""
    src = write_jsonl(tmp_path / "src.jsonl", [{"text": "fine"}, {"text": 42}])
    proc = subprocess.run([sys.executable, "data.py", "prepare", "--source", str(src), "--tokenizer", tok,
                           "--out", str(tmp_path / "out")], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines() == [proc.stderr.strip()]
    assert 'src.jsonl:2: "text" is int' in proc.stderr and not (tmp_path / "out").exists()

# -----------------------------------------------------------------------------
# Issue 24's general properties, through the real CLI: one writer per output, a kill then a rerun finishes, what a
# tool cannot read it names, every number read from a file passes its flag's limits.


def spawn(argv):
    """A real `python data.py ...` process, started now (not waited for)."""
    return subprocess.Popen([sys.executable, "data.py", *map(str, argv)], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def test_two_concurrent_writers_are_never_both_told_wrote(tmp_path):
    """Two tokenizer runs on one --out, then two prepares into one folder, started together: at most one says it
    wrote (the other is refused in one line, or finds the finished set), and what is left is whole."""
    src = write_jsonl(tmp_path / "src.jsonl", good_records(400))
    runs = [spawn(["tokenizer", "--corpus", src, "--vocab-size", 300, "--out", tmp_path / "t.model"]) for _ in range(2)]
    outs = [(p.wait(timeout=120), *p.communicate()) for p in runs]
    assert sum("trained" in out for _, out, _ in outs) == 1, outs
    assert [code for code, _, _ in outs].count(2) == 1 and data.load_tokenizer(str(tmp_path / "t.model")).vocab_size
    args = prepare_args(src, tmp_path / "t.model", tmp_path / "out", "--rows-per-file", "4")
    runs = [spawn(args) for _ in range(2)]
    outs = [(p.wait(timeout=120), *p.communicate()) for p in runs]
    assert sum("wrote" in out for _, out, _ in outs) == 1, outs
    assert all(code == 0 and "nothing to do" in out or code == 2 and "another data process" in err
               for code, out, err in outs if "wrote" not in out), outs
    assert "ok:" in subprocess.run([sys.executable, "data.py", "check", tmp_path / "out"], cwd=ROOT,
                                   capture_output=True, text=True, timeout=120).stdout


def test_kill_9_then_rerun_finishes_to_the_same_bytes(tmp_path, tok):
    """SIGKILL mid-prepare (no Python cleanup runs): the same command resumes and writes what an uninterrupted run
    writes; anything the kill left is a hidden temporary no reader sees."""
    src = write_jsonl(tmp_path / "src.jsonl", [{"text": text(40 + i % 50, i)} for i in range(1500)])
    args = lambda out: prepare_args(src, tok, out, "--rows-per-file", "8", "--val-docs", "40")
    assert subprocess.run([sys.executable, "data.py", *map(str, args(tmp_path / "whole"))], cwd=ROOT,
                          capture_output=True, timeout=300).returncode == 0
    p = spawn(args(tmp_path / "cut"))
    while p.poll() is None and not (tmp_path / "cut" / "train-00020.parquet").exists():
        time.sleep(0.02)
    p.kill()
    assert p.wait() == -9, "prepare finished before the kill: make the corpus larger"
    rerun = subprocess.run([sys.executable, "data.py", *map(str, args(tmp_path / "cut"))], cwd=ROOT,
                           capture_output=True, text=True, timeout=300)
    assert rerun.returncode == 0, rerun.stderr
    cut = {k: v for k, v in snapshot(tmp_path / "cut").items() if not k.endswith(".tmp")}
    assert cut == snapshot(tmp_path / "whole")


def test_what_cannot_be_read_is_named_never_waited_on(tmp_path, tok, capsys):
    """A FIFO as a source file, a tokenizer, an --out file, a shard or a meta: refused by name, at once (open() on a
    FIFO would wait for a writer forever; the alarm turns a hang into a failure). A linked folder is followed."""
    import signal
    signal.signal(signal.SIGALRM, lambda *_: pytest.fail("hung on a FIFO"))
    signal.alarm(60)
    try:
        src = tmp_path / "src"
        src.mkdir()
        write_jsonl(src / "a.jsonl", good_records())
        os.mkfifo(src / "b.jsonl")
        assert "b.jsonl, which is no regular file" in cli(prepare_args(f"{src}/*", tok, tmp_path / "o"),
                                                              tmp_path, capsys, 2)
        os.remove(src / "b.jsonl")
        os.symlink(src, src / "loop")                                           # a link loop: the same file twice
        assert "the file" in cli(prepare_args(f"{src}/**/*.jsonl", tok, tmp_path / "o"), tmp_path, capsys, 2)
        os.remove(src / "loop")
        os.mkfifo(tmp_path / "fifo.model")
        assert "fifo.model" in cli(prepare_args(src / "a.jsonl", tmp_path / "fifo.model", tmp_path / "o"),
                                   tmp_path, capsys, 2)
        assert "fifo.model is not a plain file" in cli(["tokenizer", "--corpus", src / "a.jsonl", "--vocab-size",
                                                        300, "--out", tmp_path / "fifo.model"], tmp_path, capsys, 2)
        pub = published(tmp_path)
        os.symlink(pub, tmp_path / "link")                                       # a linked data folder: followed
        assert "ok:" in (data.main(["check", str(tmp_path / "link")]) or capsys.readouterr().out)
        os.remove(pub / "val-00000.parquet")
        os.mkfifo(pub / "val-00000.parquet")
        assert "val-00000.parquet: not a regular file" in cli(["check", pub], tmp_path, capsys, 2)
        os.remove(pub / "meta_train.json")
        os.mkfifo(pub / "meta_train.json")
        assert "meta_train.json: is a FIFO" in cli(["check", pub], tmp_path, capsys, 2)
        os.symlink(tmp_path / "target", tmp_path / "outlink")                    # --out a link to a folder: followed
        (tmp_path / "target").mkdir()
        data.main(prepare_args(str(src / "a.jsonl"), tok, str(tmp_path / "outlink")))
        assert (tmp_path / "target" / "meta_val.json").exists()
    finally:
        signal.alarm(0)


@pytest.mark.parametrize("key, value", [("seq_len", 0), ("seq_len", 1 << 20), ("vocab_size", 1 << 40),
                                        ("vocab_size", True), ("total_rows", -1), ("bos_token_id", -3),
                                        ("num_shards", 1.5)])
def test_meta_numbers_pass_the_limits_of_their_flags(tmp_path, capsys, key, value):
    """A meta's numbers meet the limits of the flags that could have set them (--seq-len <= 2^17, train.py's
    --vocab-size <= 1e9, counts >= 0): a hand-edited value is one line naming the file and the key."""
    pub = published(tmp_path)
    meta = json.loads((pub / "meta_train.json").read_text())
    (pub / "meta_train.json").write_text(json.dumps({**meta, key: value}))
    assert f"meta_train.json: key '{key}'" in cli(["check", pub], tmp_path, capsys, 2)


def test_a_refusal_changes_nothing(tmp_path, tok, capsys):
    """Refused at each point (a foreign folder, a foreign file, a bad record after the folder exists): every file and
    marker is as it was; a folder the refused command would have made does not exist."""
    src = write_jsonl(tmp_path / "src.jsonl", good_records())
    out = tmp_path / "out"
    data.main(prepare_args(str(src), tok, str(out)))
    capsys.readouterr()
    bad = write_jsonl(tmp_path / "bad.jsonl", good_records()[:5] + ['{"text": 1}'])
    for argv in (prepare_args(src, tok, out, "--seed", "7"), prepare_args(bad, tok, out),
                 prepare_args(bad, tok, out, "--overwrite"), prepare_args(bad, tok, tmp_path / "new"),
                 ["tokenizer", "--corpus", src, "--vocab-size", 300, "--out", tok]):
        cli(argv, tmp_path, capsys, 2)                          # cli() checks every file under tmp_path unchanged
    assert not (tmp_path / "new").exists() and sorted(os.listdir(out))[0] == ".nanoloop-data"


def test_a_tampered_prepare_state_is_refused_by_name(tmp_path, tok, capsys, monkeypatch):
    """The resume state is a file too: its counts and its saved documents pass the limits a prepare could have
    written, else the rerun is refused in one line naming it, changing nothing."""
    src = write_jsonl(tmp_path / "src.jsonl", good_records(400))
    args = prepare_args(str(src), tok, str(tmp_path / "cut"), "--rows-per-file", "8", "--val-docs", "40")
    real = kill_at_third_shard(monkeypatch)
    with pytest.raises(SystemExit):
        data.main(args)
    monkeypatch.setattr(pq, "write_table", real)
    capsys.readouterr()
    path = tmp_path / "cut" / ".prepare-state.json"
    good = json.loads(path.read_text())
    for progress in ({"rows": -1}, {"window": [[[1, 5, 6], -4]]}, {"window": 5}, {"window": [["x", 3]]}):
        path.write_text(json.dumps({**good, "progress": {**good["progress"], **progress}}))
        assert ".prepare-state.json" in cli(args, tmp_path, capsys, 2)
