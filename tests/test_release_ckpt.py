"""Loading the authors' release checkpoints (issue 11 §2) and reading corrupt checkpoints safely (issue 12).

The release layout is written here by the test's own fixture, from the facts of issue 11 §2 (no release code):
DIR/model_<step:06d>.pt = a state_dict in the release's names (transformer.wte, transformer.{prelude,recur,coda}.i
with n1/n3 norms, inject, lane_alpha/lane_mixing/lane_beta, ...), c_q/c_k rows for RoPE by -theta, optionally a bf16
wte and _orig_mod. keys; DIR/meta_<step:06d>.json = {"step", "val_loss", "model_config": GPTConfig fields}.
Checks: round trips for r = 1, linear r = 4, additive, hyper; the RoPE flip on a hand-computed forward; the eval and
train CLIs on a release dir; every refusal, and corrupt ckpt.pt files in eval.py and train.py, as one-line errors.
Run: pytest -q tests/test_release_ckpt.py   (tiny models, a few seconds)
"""
import dataclasses
import json
import math
import os
import re
from dataclasses import asdict

import pytest
import torch
import torch.nn.functional as F

import checkpoint
import data
import eval as E
import train
from model import LoopedGPT, ModelConfig

V, T = 50, 16                     # vocab 50 (64 padded rows), context 16


def cfg_of(**kw):
    """d = 32 (scale 1 x aspect 32), 4 heads of 8; default linear r = 4 as 1-1-1 (l_eff 6)."""
    base = dict(scale=1, aspect_ratio=32, head_dim=8, n_loops=4, n_layers_eff=6, n_layers_prelude=1,
                n_layers_coda=1, vocab_size=V, seq_len=T)
    return ModelConfig(**dict(base, **kw))


def random_model(cfg, seed=0):
    """Every parameter moved off its init (identity inject, unit norms, one-hot lanes), so a misplaced tensor shows."""
    torch.manual_seed(seed)
    model = LoopedGPT(cfg)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim == 2 and not name.startswith("hc_"):
                p.copy_(torch.randn_like(p) / p.size(1) ** 0.5)
            else:
                p.add_(0.3 * torch.randn_like(p))
        model.wte.weight.copy_(model.wte.weight.bfloat16().float())   # representable in bf16: the trip is exact
    return model.eval()


def flip_rope_rows(w, head_dim):
    """Negate the second-half output rows of every head (its own inverse)."""
    w = w.clone().view(-1, head_dim, w.size(1))
    w[:, head_dim // 2:] *= -1
    return w.view(-1, w.size(2))


def release_state(model):
    """A nanoloop model's weights under the release's names and RoPE direction."""
    out = {}
    for k, v in model.state_dict().items():
        m = re.fullmatch(r"(prelude|recur|coda)\.(\d+)\.(.+)", k)
        if m:
            rest = {"norm_attn.weight": "n1.weight", "norm_mlp.weight": "n3.weight"}.get(m.group(3), m.group(3))
            if rest in ("attn.c_q.weight", "attn.c_k.weight"):
                v = flip_rope_rows(v, model.cfg.head_dim)
            k = f"transformer.{m.group(1)}.{m.group(2)}.{rest}"
        else:
            k = {"wte.weight": "transformer.wte.weight", "hc_alpha": "lane_alpha", "hc_mix": "lane_mixing",
                 "hc_beta": "lane_beta"}.get(k, k)
        out[k] = v.clone()
    return out


def release_config(cfg):
    p, l, c = cfg.partition
    inj = "passthrough" if cfg.n_loops == 1 else {"linear": "inject_init_prelude", "hyper": "hyperconnect"}.get(
        cfg.injection, cfg.injection)
    return dict(sequence_len=cfg.seq_len, vocab_size=cfg.vocab_size, size=cfg.scale, n_head=cfg.n_head,
                n_kv_head=cfg.n_head, n_embd=cfg.d_model, n_prelude=p, n_recur_block=l, n_coda=c,
                num_recur=cfg.n_loops, bptt_k=cfg.n_loops_bwd or cfg.n_loops, input_injection=inj,
                num_lanes=cfg.hc_lanes, logit_softcap=cfg.logit_softcap)


def write_release(root, state, model_config, step=100, bf16_wte=False, compiled=False, **meta):
    """The release's save_checkpoint: torch.save(state_dict) + json.dump(meta, indent=2)."""
    os.makedirs(root, exist_ok=True)
    state = {("_orig_mod." if compiled else "") + k: (v.bfloat16() if bf16_wte and k.endswith("wte.weight") else v)
             for k, v in state.items()}
    torch.save(state, os.path.join(root, f"model_{step:06d}.pt"))
    with open(os.path.join(root, f"meta_{step:06d}.json"), "w") as f:
        json.dump(dict(dict(step=step, val_loss=3.5, model_config=model_config), **meta), f, indent=2)
    return str(root)


def one_line_error(exc):
    """The message of a refusal: one line, and never the unsafe advice PyTorch's own text gives."""
    msg = str(exc.value)
    assert "\n" not in msg and "weights_only=False" not in msg and "Traceback" not in msg, msg
    return msg


# -----------------------------------------------------------------------------
# Round trips: r = 1, linear r = 4, additive, hyper (bf16 wte and _orig_mod. keys on the way)

@pytest.mark.parametrize("kw,variant", [
    (dict(n_loops=1, n_layers_eff=3, n_layers_prelude=0, n_layers_coda=0, injection="passthrough"), {}),   # 0-3-0
    (dict(), dict(bf16_wte=True, compiled=True)),                               # linear r = 4, CUDA-run format
    (dict(injection="additive"), dict(bf16_wte=True)),
    (dict(injection="hyper", hc_lanes=2), dict(compiled=True)),
    (dict(n_loops=2, n_layers_eff=6, n_layers_prelude=2, n_layers_coda=2, n_loops_bwd=1), {}),   # 2-1-2, bptt 1
])
def test_round_trip(tmp_path, kw, variant):
    cfg = cfg_of(**kw)
    model = random_model(cfg)
    root = write_release(tmp_path / "rel", release_state(model), release_config(cfg), **variant)
    loaded, ck = E.load_checkpoint(root)
    assert loaded.cfg == cfg and ck["release"]["step"] == 100 and ck["model_config"] == asdict(cfg)
    idx = torch.randint(0, V, (2, T), generator=torch.Generator().manual_seed(0))
    # the release's bf16 RoPE tables (installed on load) change logits only slightly
    with torch.no_grad():
        want, release = model(idx), loaded(idx)
    assert 0 < (release - want).abs().max() < 0.05
    for name in ("rope_cos", "rope_sin"):                       # with nanoloop's tables, as in the source model
        getattr(loaded, name).copy_(getattr(model, name))
    with torch.no_grad():
        got = loaded(idx)
    print(f"\n{cfg.injection} r={cfg.n_loops} {cfg.partition}: max |dlogit| {(got - want).abs().max():.2e}")
    assert torch.equal(got, want)
    for k, v in loaded.state_dict().items():                    # every tensor in place (fp32, the flip undone)
        assert torch.equal(v, model.state_dict()[k]), k


def test_odd_scale_keeps_d_and_reads_the_aspect_ratio(tmp_path):
    """s = 3 at aspect 48 with head_dim 64 gives 144 -> 192 in the release: loaded as d = 192 = 4 x 48, 3 heads."""
    cfg = ModelConfig(scale=4, aspect_ratio=48, head_dim=64, n_loops=2, n_layers_eff=4, n_layers_prelude=1,
                      n_layers_coda=1, vocab_size=V, seq_len=T)
    rc = dict(release_config(cfg), size=3)
    loaded, _ = E.load_checkpoint(write_release(tmp_path / "rel", release_state(random_model(cfg)), rc,
                                             user_config=dict(aspect_ratio=48, head_dim=64)))
    assert (loaded.cfg.d_model, loaded.cfg.scale, loaded.cfg.aspect_ratio, loaded.cfg.n_head) == (192, 4, 48, 3)


# -----------------------------------------------------------------------------
# The RoPE direction: a release checkpoint against a forward computed by hand from the release's formulas

def test_rope_flip_matches_a_hand_computed_release_forward(tmp_path):
    d, H, D = 16, 2, 8
    g = torch.Generator().manual_seed(0)
    rnd = lambda *s: torch.randn(*s, generator=g)
    blk = "transformer.recur.0."
    sd = {"transformer.wte.weight": rnd(64, d), "lm_head.weight": rnd(64, d) / 4,
          "norm_emb.weight": 1 + 0.3 * rnd(d), "norm_recur.weight": 1 + 0.3 * rnd(d),
          "norm_final.weight": 1 + 0.3 * rnd(d), blk + "n1.weight": 1 + 0.3 * rnd(d),
          blk + "n3.weight": 1 + 0.3 * rnd(d),
          blk + "mlp.c_fc.weight": rnd(4 * d, d) / 4, blk + "mlp.c_proj.weight": rnd(d, 4 * d) / 8}
    for n in "qkv":
        sd[blk + f"attn.c_{n}.weight"] = rnd(d, d) / 4
    sd[blk + "attn.c_proj.weight"] = rnd(d, d) / 4
    mc = dict(sequence_len=T, vocab_size=V, size=1, n_head=H, n_kv_head=H, n_embd=d, n_prelude=0, n_recur_block=1,
              n_coda=0, num_recur=1, bptt_k=1, input_injection="passthrough", num_lanes=2, logit_softcap=15.0)
    model, _ = E.load_checkpoint(write_release(tmp_path / "rel", sd, mc))
    idx = torch.randint(0, V, (1, T), generator=g)

    def rms(x, w=None):
        y = x / torch.sqrt((x * x).mean(-1, keepdim=True) + 1e-6)
        return y if w is None else y * w

    def release_forward(sign):
        """One block, by hand. sign=-1: the release's rotation by -theta (bf16 tables); +1: nanoloop's direction."""
        inv = 1.0 / (10000 ** (torch.arange(0, D, 2, dtype=torch.float32) / D))
        ang = torch.arange(10 * T, dtype=torch.float32)[:, None] * inv[None]             # (10T, D/2)
        cos, sin = ang.cos().bfloat16().float()[:T, None], ang.sin().bfloat16().float()[:T, None]   # (T, 1, D/2)
        x = rms(sd["transformer.wte.weight"][idx[0]], sd["norm_emb.weight"])              # (T, d)
        h = rms(x, sd[blk + "n1.weight"])
        q, k, v = (h @ sd[blk + f"attn.c_{n}.weight"].T for n in "qkv")
        q, k, v = (t.view(T, H, D) for t in (q, k, v))                                   # (T, H, D)

        def rope(t):
            t1, t2 = t[..., :D // 2], t[..., D // 2:]
            return torch.cat([t1 * cos - sign * t2 * sin, sign * t1 * sin + t2 * cos], -1)
        q, k = rms(rope(q)), rms(rope(k))                                                # QK-norm after RoPE
        att = torch.einsum("thd,shd->hts", q, k) / math.sqrt(D)                          # (H, T, T)
        att = att.masked_fill(torch.ones(T, T).triu(1).bool(), float("-inf")).softmax(-1)
        y = torch.einsum("hts,shd->thd", att, v).reshape(T, d) @ sd[blk + "attn.c_proj.weight"].T
        x = x + y
        x = x + F.relu(rms(x, sd[blk + "n3.weight"]) @ sd[blk + "mlp.c_fc.weight"].T).square() @ \
            sd[blk + "mlp.c_proj.weight"].T
        x = rms(rms(x, sd["norm_recur.weight"]), sd["norm_final.weight"])                 # norm_recur, norm_final
        z = (x @ sd["lm_head.weight"].T)[:, :V]
        return 15 * torch.tanh(z / 15)                                                   # (T, V)

    with torch.no_grad():
        got = model(idx)[0]
    release, unflipped = release_forward(-1), release_forward(+1)
    print(f"\nhand-computed release forward: max |dlogit| {(got - release).abs().max():.2e}; "
          f"against the unflipped direction {(got - unflipped).abs().max():.2e}")
    assert torch.allclose(got, release, atol=1e-5, rtol=0)
    assert (got - unflipped).abs().max() > 1e-2                  # the direction matters: the test can fail


# -----------------------------------------------------------------------------
# Refusals: each a one-line ValueError naming what is wrong

def _release(tmp_path, mutate_config=None, mutate_state=None, cfg=None, **meta):
    cfg = cfg or cfg_of()
    sd, mc = release_state(random_model(cfg)), release_config(cfg)
    if mutate_config:
        mutate_config(mc)
    if mutate_state:
        mutate_state(sd)
    return write_release(tmp_path / "rel", sd, mc, **meta)


@pytest.mark.parametrize("case,match", [
    (dict(mutate_state=lambda s: s.update({"transformer.recur.0.attn.rope_gate": torch.ones(3)})),
     r"1 unknown: transformer\.recur\.0\.attn\.rope_gate"),
    (dict(mutate_state=lambda s: s.pop("lm_head.weight")), r"1 missing: lm_head\.weight"),
    (dict(mutate_config=lambda c: c.update(n_kv_head=2)), r"grouped-query attention \(n_kv_head 2 != n_head 4\)"),
    (dict(mutate_config=lambda c: c.update(num_recur=3, n_prelude=0, n_coda=0)), "cannot express.*divide 16"),
    # r = 1 is nanoloop's one stack (0-3-0 here): a release's prelude / coda tensors have no place in it
    (dict(mutate_config=lambda c: c.update(num_recur=1)), r"weights do not match.*unknown: transformer\.prelude\.0\."),
    (dict(mutate_config=lambda c: c.update(sandwich_norm=True)), r"unknown fields \['sandwich_norm'\]"),
    (dict(mutate_config=lambda c: c.pop("num_recur")), r"missing fields \['num_recur'\]"),
    (dict(mutate_config=lambda c: c.update(input_injection="gated")), "input_injection 'gated' not in"),
    (dict(mutate_config=lambda c: c.update(vocab_size=200)),
     r"2 with another shape: transformer\.wte\.weight \(64, 32\) vs \(256, 32\)"),
    (dict(mutate_state=lambda s: [s.update({k[len("transformer."):]: s.pop(k)}) for k in list(s)
                                  if k.startswith("transformer.wte")]), "holds nanoloop names \\(wte\\.weight\\)"),
])
def test_release_refusals(tmp_path, case, match):
    root = _release(tmp_path, **case)
    with pytest.raises(ValueError) as exc:
        E.load_checkpoint(root)
    assert re.search(match, one_line_error(exc)), str(exc.value)


def test_release_dir_files(tmp_path):
    root = _release(tmp_path)
    for bad, match in (("step", "has no step 7; steps: \\[100\\]"), ("trunc", "truncated or corrupt"),
                       ("empty", "is empty"), ("meta", "meta_000100.json: cannot read")):
        with pytest.raises(ValueError) as exc:
            if bad == "step":
                E.load_checkpoint(root, step=7)
            else:
                path = os.path.join(root, "meta_000100.json" if bad == "meta" else "model_000100.pt")
                if bad == "meta":
                    os.rename(path, path + ".bak")
                else:
                    raw = open(path, "rb").read()
                    open(path, "wb").write(raw[:len(raw) // 2] if bad == "trunc" else b"")
                E.load_checkpoint(root)
        assert re.search(match, one_line_error(exc)), str(exc.value)
    with pytest.raises(ValueError, match="no checkpoint there"):       # neither a release nor a run
        E.load_checkpoint(str(tmp_path))


# -----------------------------------------------------------------------------
# nanoloop's ckpt.pt: corrupt, foreign or mismatched files are one-line errors in eval.py and train.py

def _corrupt_ckpts(root, cfg, extra=None):
    """{case: path} of broken ckpt.pt files; `extra` entries complete a train.py checkpoint."""
    model = random_model(cfg)
    good = dict(model=model.state_dict(), model_config=asdict(cfg), **(extra or {}))
    cases = {}

    def put(name, writer):
        path = os.path.join(root, name, "ckpt.pt")
        os.makedirs(os.path.dirname(path))
        writer(path)
        cases[name] = path
    torch.save(good, os.path.join(root, "good.pt"))
    raw = open(os.path.join(root, "good.pt"), "rb").read()
    put("truncated", lambda p: open(p, "wb").write(raw[:len(raw) // 2]))
    put("random", lambda p: open(p, "wb").write(torch.randint(0, 256, (4096,), dtype=torch.uint8,
                                                               generator=torch.Generator().manual_seed(0)).numpy()))
    put("zero", lambda p: open(p, "wb").write(b""))
    put("text", lambda p: open(p, "w").write("step,loss\n1,5.4\n"))
    put("tensor", lambda p: torch.save(torch.ones(3), p))
    put("object", lambda p: torch.save(dict(good, hook=os.getcwd), p))      # a global (code): refused, never run
    put("missing_key", lambda p: torch.save({k: v for k, v in good.items() if k != "model_config"}, p))
    other = random_model(ModelConfig(**dict(asdict(cfg), n_layers_prelude=2, n_layers_eff=cfg.n_layers_eff + 1)))
    put("arch_mismatch", lambda p: torch.save(dict(good, model=other.state_dict()), p))   # weights of a 2-1-1
    return cases


EXPECT = {"truncated": "truncated or corrupt", "random": "not a PyTorch checkpoint", "zero": "is empty",
          "text": "truncated or corrupt", "tensor": "holds a Tensor", "object": "refused",
          "missing_key": r"no \['model_config'\] entry",
          "arch_mismatch": r"weights do not match.* unknown: prelude\.1\."}


def test_corrupt_ckpt_in_eval(tmp_path):
    for case, path in _corrupt_ckpts(str(tmp_path), cfg_of()).items():
        for arg in (os.path.dirname(path), path):                # the run dir and the file itself
            with pytest.raises(SystemExit) as exc:
                E.main([arg, "--tasks", "none"])
            msg = one_line_error(exc)
            assert msg.startswith("eval.py: ") and re.search(EXPECT[case], msg) and path in msg, (case, msg)
    with pytest.raises(SystemExit, match="--step selects a step of a release directory"):
        E.main([os.path.dirname(path), "--step", "3"])
    # a hand-edited model_config is refused where a model is built from it (a resume builds from the flags)
    ck = dict(model=random_model(cfg_of()).state_dict(), model_config=dict(asdict(cfg_of()), n_loops=3))
    torch.save(ck, tmp_path / "bad_config.pt")
    with pytest.raises(SystemExit, match="bad_config.pt: invalid model_config: .*n_loops"):
        E.main([str(tmp_path / "bad_config.pt"), "--tasks", "none"])


def test_corrupt_ckpt_in_train_resume(tiny_data, tmp_path):
    argv = ["--scale", "1", "--head-dim", "32", "--n-layers-eff", "4", "--n-layers-prelude", "1", "--n-layers-coda",
            "1", "--n-loops", "2", "--seq-len", "32", "--batch-tokens", "256", "--device-batch", "4",
            "--eval-tokens", "512", "--steps", "2", "--resume", "--data", tiny_data]
    mcfg, tcfg = train.parse_args(argv)
    mcfg = ModelConfig(**dict(asdict(mcfg), vocab_size=128))                 # what the run would train
    extra = {k: 0 for k in checkpoint.RESUME_KEYS if k not in ("model", "model_config")}
    extra.update(train_config=asdict(tcfg), tokenizer_hash="synthetic-test",         # the conftest corpus
                 identity=train.run_identity(mcfg, tcfg, data.data_identity(tiny_data), None, "fp32", "sdpa", False))
    for case, path in _corrupt_ckpts(str(tmp_path), mcfg, extra).items():
        with pytest.raises(ValueError) as exc:
            train.main(*train.parse_args(argv + ["--out-dir", os.path.dirname(path)]))
        msg = one_line_error(exc)
        assert re.search(EXPECT[case], msg) and path in msg, (case, msg)
        assert sorted(os.listdir(os.path.dirname(path))) == ["ckpt.pt"]       # refused before writing anything


# -----------------------------------------------------------------------------
# The CLIs on a release dir: eval.py (val loss, tasks, --n-loops, --sample, --step) and train.py --init-from

@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """A sentencepiece tokenizer (vocab 300) and a prepared data dir (seq_len 16) that records it."""
    root = tmp_path_factory.mktemp("corpus")
    texts = [f"Question: what is {i} plus {i % 7}? Answer: {i + i % 7}. The cat sat on the mat." for i in range(400)]
    tok = data.train_tokenizer(texts, 300, str(root / "tok.model"), num_threads=1)
    data.prepare_docs(tok.encode(texts), str(root / "data"), seq_len=T, vocab_size=tok.vocab_size,
                      bos_id=tok.bos_id, tokenizer_hash=tok.identity, val_docs=40, seed=0, source="test",
                      tokenizer=tok.spec)
    return tok, str(root / "data")


def test_eval_cli_on_a_release_dir(tmp_path, corpus):
    tok, data_dir = corpus
    cfg = cfg_of(vocab_size=tok.vocab_size)                  # every sampled id decodes
    model = random_model(cfg)
    root = write_release(tmp_path / "rel", release_state(model), release_config(cfg), step=50)
    write_release(root, release_state(random_model(cfg, seed=1)), release_config(cfg), step=100)
    res = E.main([root, "--step", "50", "--data", data_dir, "--tasks", "none", "--val-tokens", str(8 * T)])
    loaded, _ = E.load_checkpoint(root, step=50)
    loader = data.PackedLoader(data_dir, "val", seq_len=T, batch_rows=8, device_batch=8)
    assert res["val_loss"] == pytest.approx(E.val_loss(loaded, loader, 8 * T), rel=1e-9)
    assert res["release"]["step"] == 50 and os.path.isfile(os.path.join(root, "eval_000050.json"))
    latest = E.main([root, "--data", data_dir, "--tasks", "none", "--val-tokens", str(8 * T), "--n-loops", "8"])
    assert latest["release"]["step"] == 100 and latest["n_loops"] == 8
    assert os.path.isfile(os.path.join(root, "eval_000100_r8.json"))
    text = E.main([os.path.join(root, "model_000050.pt"), "--tokenizer", tok.spec, "--sample", "The cat",
                   "--max-new-tokens", "5", "--temperature", "0"])
    assert text == tok.decode(loaded.generate(torch.tensor([[tok.bos_id] + tok.encode(["The cat"])[0]]), 5,
                                              temperature=0)[0, -5:].tolist())
    # a file names its own step: another --step is refused
    with pytest.raises(SystemExit, match="--step 100 contradicts the file name model_000050.pt"):
        E.main([os.path.join(root, "model_000050.pt"), "--step", "100", "--data", data_dir, "--tasks", "none"])
    # the release's default val set (70.8M tokens) does not fit this data: a one-line error with the fix
    with pytest.raises(SystemExit, match=r"eval_tokens \(set --val-tokens\) 70,778,880: .* scores whole rows"):
        E.main([root, "--data", data_dir, "--tasks", "none"])
    # an id past the tokenizer (the release's <|assistant_end|> after Llama-2's pieces) ends the sampled text
    loaded.generate = lambda idx, n, **kw: torch.cat([idx, torch.tensor([[5, 6, tok.vocab_size, 7]])], 1)
    assert E.sample(loaded, tok, "The cat", 4) == (tok.decode([5, 6]), [5, 6, tok.vocab_size, 7])


def _first_step_loss(model, data_dir, tok_hash):
    """The loss train.py logs for step 1 (8 rows as 2 micro-batches of 4, mean of the two means), from `model`."""
    loader = data.PackedLoader(data_dir, "train", seq_len=T, batch_rows=8, device_batch=4, tokenizer_hash=tok_hash)
    with torch.no_grad():
        return sum(model(*loader.next_batch()).item() for _ in range(2)) / 2


def test_train_init_from_release_and_run(tmp_path, corpus, capsys):
    tok, data_dir = corpus
    cfg = cfg_of(n_loops=2, vocab_size=320)                                   # 1-2-1 at r = 2
    model = random_model(cfg, seed=3)
    root = write_release(tmp_path / "rel", release_state(model), release_config(cfg), bf16_wte=True)
    base = ["--seq-len", str(T), "--batch-tokens", str(8 * T), "--device-batch", "4", "--eval-tokens", str(8 * T),
            "--steps", "1", "--data", data_dir, "--muonh-lr", "1e-3"]
    out = tmp_path / "out"
    rec = train.main(*train.parse_args(base + ["--init-from", root, "--out-dir", str(out)]))
    assert rec["config"]["model_config"] == asdict(cfg)                       # the architecture came with it
    first = json.loads(open(out / "log.jsonl").readline())["loss"]
    want = _first_step_loss(model, data_dir, tok.identity)
    print(f"\n--init-from release: first-step loss {first:.6f}, the release model's {want:.6f}, a fresh model's "
          f"{_first_step_loss(random_model(cfg, seed=9), data_dir, tok.identity):.6f}")
    assert first == pytest.approx(want, rel=1e-6)
    # a flag that contradicts the checkpoint is refused when parsed, naming both values -- also a flag typed at its
    # default value (--n-loops 1 is the default; the checkpoint has r = 2), which used to be silently replaced
    for flags, want in ((["--n-loops", "8", "--n-layers-eff", "12"], r"'n_loops': \(8, 2\)"),
                        (["--n-loops", "1"], r"'n_loops': \(1, 2\)")):
        with pytest.raises(SystemExit) as exc:
            train.parse_args(base + ["--init-from", root, "--out-dir", str(tmp_path / "o2"), *flags])
        assert exc.value.code == 2 and re.search(want, capsys.readouterr().err)
    assert not (tmp_path / "o2").exists()
    # a typed flag equal to the checkpoint's is fine; a config built in code keeps the default-takes-checkpoint rule
    mc, _ = train.parse_args(base + ["--init-from", root, "--out-dir", str(tmp_path / "o2"), "--n-loops", "2"])
    assert mc.n_loops == 2
    with pytest.raises(ValueError, match=r"'n_loops': \(8, 2\)"):
        train.main(dataclasses.replace(mc, n_loops=8, n_layers_eff=12), train.parse_args(base + [
            "--init-from", root, "--out-dir", str(tmp_path / "o2")])[1])
    # a nanoloop run as the source: its tokenizer must be the data's
    ck = dict(model=model.state_dict(), model_config=asdict(cfg), tokenizer_hash="another-tokenizer")
    os.makedirs(tmp_path / "run")
    torch.save(ck, tmp_path / "run" / "ckpt.pt")
    with pytest.raises(ValueError, match="tokenised with another-tokenizer"):
        train.main(*train.parse_args(base + ["--init-from", str(tmp_path / "run"), "--out-dir", str(tmp_path / "o3")]))
    assert not (tmp_path / "o3").exists()
