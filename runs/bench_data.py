"""
runs/bench_data.py -- data.py's throughput figures (runs/bench.sh section 3), kept out of the core file.

  1. tokenise + pack tokens/s on the default corpus with a 1,024-piece BPE: a one-thread encode loop (one call per
     document) vs one batched encode call on all cores, alternating repeats, best of each;
  2. the streaming prepare on a generated corpus of --mb MB (documents of made-up words, log-normal lengths, so
     packing both fits and crops): MB/s, cpu-s/MB and the peak RSS of the `data.py prepare` child process.
Measured once (2-core CPU shared with ~8 jobs, so CPU time compares, wall time does not): --mb 1000 -> 1,001 MB,
269M tokens, peak RSS 602 MiB, 276 cpu-s = 0.276 cpu-s/MB. The in-memory prepare it replaced, on 50 MB of the same
kind of text: 0.32 cpu-s/MB and 1,031 MiB (~87 bytes/token, i.e. ~22 GB at 1 GB of text).

Usage: python runs/bench_data.py [--mb 16] [--seq-len 2048] [--workers 0] [--out DIR [--overwrite]]
--out keeps the corpus and tokenizers in DIR (a folder this script owns whole: new, empty, or its own for the same
request) and writes the figures to DIR/bench_data.json (atomically); without it a temporary folder
is used and removed.
"""
import contextlib, json, os, resource, subprocess, sys, tempfile, time

# numpy for the corpus generator's seeded draws (it is data.py's dependency anyway)
import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)                                           # the project is flat top-level files
import common, data  # noqa: E402


def generate_corpus(path, mb, seed=0):
    """Write a synthetic jsonl corpus of ~mb megabytes: documents of made-up words (log-normal lengths: median ~250
    words, a tail past 5,000, so packing both fits and crops), drawn from a pool of 10,000 random sentences so
    that 1 GB takes about a minute of one core. Returns the bytes written."""
    rng = np.random.default_rng(seed)
    syl = np.array(["th", "e", "an", "ing", "or", "st", "re", "ou", "al", "er", "ch", "ea", "in", "to", "ly", "qu"])
    words = ["".join(rng.choice(syl, rng.integers(1, 5))) for _ in range(5000)]
    # sizes -> one flat draw of sum(sizes) ids below n, cut by np.split into groups of those sizes (drawn in that order)
    draw = lambda sizes, n: np.split(rng.integers(0, n, size=int(sizes.sum())), np.cumsum(sizes)[:-1])  # noqa: E731
    sentences = draw(rng.integers(4, 16, size=10_000), len(words))          # 4-15 words per sentence
    pool = [" ".join(words[i] for i in s.tolist()).capitalize() + "." for s in sentences]

    def write(tmp):
        """The corpus into the atomic writer's temporary: 64 documents at a time until int(mb * 1e6) bytes (ASCII
        only: json.dumps escapes anything else, so a character is a byte)."""
        with open(tmp, "wb") as f:
            while f.tell() < int(mb * 1e6):
                # 64 documents of log-normal sentence counts, then each document's sentence ids
                docs = draw((rng.lognormal(3.2, 1.0, size=64) + 1).astype(int), len(pool))
                f.write("".join(json.dumps({"text": " ".join(pool[j] for j in d)}) + "\n" for d in docs).encode())
    common.atomic_write(path, write)
    return os.path.getsize(path)


def pack_bench(tok, texts, seq_len, repeats=2):
    """tokens/s of tokenise+pack, one-thread per-doc loop vs one batched call on all cores. -> the speed-up."""
    ncpu = os.cpu_count() or 1
    # the two ways to tokenise the same texts: what a naive loop gets, and what prepare's batched call gets
    runs = {"1 thread, per-doc loop": lambda: [tok.encode([t], num_threads=1)[0] for t in texts],
            f"{ncpu} threads, batched": lambda: tok.encode(texts, num_threads=ncpu)}
    best = {label: (float("inf"), 0.0) for label in runs}          # (wall s, cpu s) of the fastest repeat
    for _ in range(repeats):
        for label, encode in runs.items():
            t0, c0 = time.perf_counter(), time.process_time()      # process_time sums all threads
            docs = encode()
            data.best_fit_plan([len(d) + 1 for d in docs], seq_len + 1)      # + BOS per document
            best[label] = min(best[label], (time.perf_counter() - t0, time.process_time() - c0))
    # the tokens of the last repeat's documents (every repeat encodes the same texts to the same ids)
    n_tokens = sum(len(d) + 1 for d in docs)
    for label, (dt, cpu) in best.items():
        print(f"bench {label:>24}: {n_tokens / dt:>12,.0f} tokens/s ({n_tokens:,} tokens in {dt:.2f} s wall, "
              f"{cpu:.2f} s cpu = {cpu / dt:.1f} cores busy)")
    (one, _), (many, _) = best.values()
    print(f"bench speed-up {one / many:.2f}x with {ncpu} threads (target >= 2x on 2 cores)")
    return dict(tokens=n_tokens, one_thread_s=one, all_cores_s=many, speedup=one / many)


def stream_bench(work, mb, seq_len, workers):
    """The streaming prepare as a child process on a generated corpus; its peak RSS is getrusage of the child."""
    corpus, tok_path = os.path.join(work, "corpus.jsonl"), os.path.join(work, "corpus_tokenizer.model")
    # generated once per folder and size: the seed fixes its bytes, so a reused corpus is the same corpus
    if not os.path.isfile(corpus) or abs(os.path.getsize(corpus) - mb * 1e6) > 1e6:
        t0 = time.time()
        print(f"bench stream: generated {generate_corpus(corpus, mb) / 1e6:,.0f} MB corpus in {time.time() - t0:.0f} s")
    # a 1,024-piece BPE trained on the corpus's first ~2 MB (1,000 documents): the prepare's own tokenizer
    if not os.path.isfile(tok_path):
        data.train_tokenizer(list(data.iter_source(corpus, max_docs=1000)), 1024, tok_path)
    # made here, removed here: always a fresh prepare
    with tempfile.TemporaryDirectory(prefix=".prepared-", dir=work, ignore_cleanup_errors=True) as out:
        # a child process: its peak RSS and CPU time are the prepare's own, not this script's or the corpus's
        t0, c0 = time.time(), resource.getrusage(resource.RUSAGE_CHILDREN)
        proc = subprocess.run([sys.executable, os.path.join(ROOT, "data.py"), "prepare", "--source", corpus,
                               "--tokenizer", tok_path, "--out", out, "--seq-len", str(seq_len), "--workers",
                               str(workers)], capture_output=True, text=True)
        wall, c1 = time.time() - t0, resource.getrusage(resource.RUSAGE_CHILDREN)
        if proc.returncode:
            raise ValueError(f"bench prepare failed: {(proc.stderr.strip().splitlines() or ['no output'])[-1]}")
        tokens = sum(data.read_meta(out, s)["doc_tokens"] for s in ("train", "val"))
    mb, cpu = os.path.getsize(corpus) / 1e6, (c1.ru_utime - c0.ru_utime) + (c1.ru_stime - c0.ru_stime)
    peak = c1.ru_maxrss / 1024                                     # KiB -> MiB; the largest child so far: the prepare
    print(f"bench stream-prepare: {mb:,.0f} MB, {tokens:,} tokens, seq_len {seq_len}, workers {workers} | "
          f"{wall:.1f} s wall = {mb / wall:.2f} MB/s ({tokens / wall:,.0f} tok/s) | {cpu:.1f} s cpu = "
          f"{cpu / mb:.3f} cpu-s/MB | peak RSS {peak:,.0f} MiB ({peak * 2 ** 20 / max(tokens, 1):.2f} bytes/token)")
    return dict(mb=mb, wall=wall, cpu=cpu, peak_mib=peak, tokens=tokens)


def main(argv=None):
    """Both figures, printed; with --out also written to OUT/bench_data.json. Bad input: one line, exit 2."""
    p = common.Parser(prog="runs/bench_data.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--mb", type=common.number(float, "(0, 1e6)"), default=16.0, help="corpus MB (issue 13: 1000)")
    p.add_argument("--seq-len", type=common.number(int, "[1, 131072]"), default=2048, help="rows of the stream part")
    p.add_argument("--workers", type=common.number(int, "[0, 256]"), default=0)
    p.add_argument("--out", help="keep the corpus and tokenizers here and write bench_data.json")
    p.add_argument("--overwrite", action="store_true", help="adopt an --out that holds other files")
    a = p.parse_args(argv)
    # what this invocation asks for: the same request resumes its own --out folder (corpus and tokenizers reused)
    request = dict(mb=a.mb, seq_len=a.seq_len, pack_seq_len=128, workers=a.workers)   # part 1: 128-token rows
    try:
        # --out is this script's whole (common.claim): adopted if new or empty, resumed if its marker names this
        # request, else refused unless --overwrite; everything in it, bench_data.json included, is then ours
        if a.out:
            common.claim(a.out, "bench_data", request, a.overwrite)
        # without --out: a temporary folder, removed after
        with contextlib.nullcontext(a.out) if a.out else tempfile.TemporaryDirectory(prefix="nanoloop-bench-") as work:
            # the pack part's 1,024-piece BPE, trained on the default corpus unless --out already holds it
            texts, path = data.read_source("default")[0], os.path.join(work, "tokenizer.model")
            tok = data.load_tokenizer(path) if os.path.isfile(path) else data.train_tokenizer(texts, 1024, path)
            figures = dict(request, pack=pack_bench(tok, texts, request["pack_seq_len"]),
                           stream=stream_bench(work, a.mb, a.seq_len, a.workers))
        if a.out:
            common.atomic_write(os.path.join(a.out, "bench_data.json"), json.dumps(figures, indent=2) + "\n")
    except (ValueError, OSError) as err:
        common.fail("runs/bench_data.py", err)
    return figures


if __name__ == "__main__":
    main()
