"""
runs/bench_eval.py -- eval.py's scorer benchmark (runs/bench.sh section 5), kept out of the core file.

Tokens/s of the batched continuation scorer (eval.score_examples) vs one example at a time, on the same examples in
the same process (best of 2 timings each, alternating, so a noisy shared CPU hurts both alike), and the largest
difference of their per-example losses (only float summation order differs). The model is a random tiny one (a CPU
mini-study shape by default: d = 64, r = 4, l_eff = 10): the scorer's speed depends on the prompt lengths and the
batch width, not on the weights or which tokens they are, so no trained run or task file is needed.

Usage: python runs/bench_eval.py [--equal-length 64] [--out FILE.json [--overwrite]]
       (FILE: replaced only if this request wrote it)
"""
import os, random, sys, time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))   # the repository's flat files
import torch  # noqa: E402

import common, eval as E  # noqa: E402


def bench_scorer(model, examples, *, batch_tokens=8192, repeats=2) -> dict:
    """Batched vs one-at-a-time tokens/s and the largest per-example |difference| in nats, printed and returned.
    batch_tokens = 0 is eval.score_examples's one-example-per-forward mode."""
    n_in = sum(len(e.tokens) - 1 for e in examples)              # model input positions processed per pass
    score = lambda ex, bt: E.score_examples(model, ex, batch_tokens=bt)[0]  # noqa: E731
    # warm-up: the first forward pays for allocator and kernel set-up, which neither timing should include
    score(examples[:4], batch_tokens)
    best, nats = {0: float("inf"), batch_tokens: float("inf")}, {}
    # alternate the two modes so that a burst of load from other jobs falls on both, and keep each one's best
    for _ in range(repeats):
        for bt in best:
            t0 = time.perf_counter()
            nats[bt] = score(examples, bt)
            best[bt] = min(best[bt], time.perf_counter() - t0)
    one, many = n_in / best[0], n_in / best[batch_tokens]
    diff = max((abs(a - b) for a, b in zip(nats[0], nats[batch_tokens])), default=0.0)
    # speedup > 1: batching pays; the issue-6 target is >= 3x on equal-length prompts
    print(f"bench | {len(examples)} examples, {n_in:,} tokens | one-at-a-time {one:,.0f} tok/s | batched {many:,.0f} "
          f"tok/s | speedup {many / one:.1f}x | max |diff| {diff:.2e} nats")
    return dict(n_examples=len(examples), input_tokens=n_in, batch_tokens=batch_tokens, one_at_a_time_tok_s=one,
                batched_tok_s=many, max_abs_diff_nats=diff, speedup=many / one)


def synthetic_examples(n, vocab, lengths=(32, 48, 64, 80, 96, 112, 128), span=3, seed=0):
    """Random token sequences (BOS first) with the length spread of (cropped) few-shot prompts and a short gold span
    at the end: scoring speed depends on the lengths and the batch width, not on which tokens they are."""
    g = random.Random(seed)
    # each example draws its length L, then its L - 1 tokens (the generator interleaves the draws in that order)
    return [E.Example([1] + [g.randrange(2, vocab) for _ in range(L - 1)], L - span, 3 * span)
            for L in (g.choice(lengths) + 1 for _ in range(n))]


def random_model(a):
    """The bench model and its examples, sized before it is built (ModelConfig's own checks raise ValueError)."""
    torch.manual_seed(0)
    cfg = E.ModelConfig(n_layers_prelude=1, n_layers_coda=1, **{k: getattr(a, k) for k in (
        "scale", "aspect_ratio", "head_dim", "n_loops", "n_layers_eff", "vocab_size", "seq_len")})
    # parameters from eval.model_bytes (device bytes / 4, the RoPE tables included): too large a model is refused
    # before allocating, not an out-of-memory crash
    if E.model_bytes(cfg)[1] > 4e9:
        raise ValueError(f"a bench model of ~{E.model_bytes(cfg)[1] / 4e9:.1f}B parameters is too large; lower --scale")
    device = common.init_dist()[2]
    model = E.LoopedGPT(cfg).to(device).eval()
    print(f"bench model: d_model {cfg.d_model}, r {cfg.n_loops}, l_eff {cfg.n_layers_eff}, vocab {cfg.vocab_size}, "
          f"{device.type}, {torch.get_num_threads()} threads")
    # mixed lengths 1/4 .. 1 x seq_len in 8 steps, like cropped few-shot prompts; or one length (the best case)
    lengths = (a.equal_length,) if a.equal_length else range(a.seq_len // 4, a.seq_len + 1, a.seq_len // 8)
    return model, synthetic_examples(a.n_examples, a.vocab_size, tuple(lengths))


def main(argv=None):
    """The figures, printed and returned; with --out also written as json. Bad input: one line, exit 2."""
    p = common.Parser(prog="runs/bench_eval.py", description=__doc__.split("\n\n")[1])
    # the random model's shape (defaults: a CPU mini-study model, d = 64, r = 4, l_eff = 10; its prompts are 1/4 .. 1
    # x --seq-len tokens), the examples scored and the batched scorer's width
    for flag, interval, default in (
            ("--scale", "[1, inf)", 1), ("--aspect-ratio", "[1, inf)", 64), ("--head-dim", "[1, inf)", 32),
            ("--n-loops", "[1, 1024]", 4), ("--n-layers-eff", "[1, inf)", 10), ("--vocab-size", "[8, inf)", 2048),
            ("--seq-len", "[8, 65536]", 128), ("--n-examples", "[8, inf)", 256), ("--batch-tokens", "[8, inf)", 8192)):
        p.add_argument(flag, type=common.number(int, interval), default=default)
    # one length for every prompt: batching's best case, the issue-6 target (>= 3x); 0 = mixed lengths 1/4 .. 1 x T
    p.add_argument("--equal-length", type=common.number(int, "[0, inf)"), default=0, help="one length (0: mixed)")
    p.add_argument("--out", help="also write the figures to this json file")
    p.add_argument("--overwrite", action="store_true", help="let --out replace a file this script did not write")
    a = p.parse_args(argv)
    if a.equal_length > a.seq_len:
        p.error(f"argument --equal-length: must be <= --seq-len ({a.seq_len}), got {a.equal_length}")
    # the request is every flag that shapes the figures: the same command replaces its own --out, nothing else
    request = {k: v for k, v in vars(a).items() if k not in ("out", "overwrite")}
    key = common.request_key("bench_eval", request)
    try:
        # checked before any work: a file this script did not write for this request is kept unless --overwrite
        if a.out:
            common.check_new(a.out, a.overwrite, "--out", "runs/bench_eval.py", key)
        model, examples = random_model(a)
        out = dict(request, **bench_scorer(model, examples, batch_tokens=a.batch_tokens))
        if a.out:
            common.write_json(a.out, out, "runs/bench_eval.py", key)
    except (ValueError, OSError) as err:
        common.fail("runs/bench_eval.py", err)
    return out


if __name__ == "__main__":
    main()
