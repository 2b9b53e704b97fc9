"""Tests for model.py: the looped transformer (paper §3.1, App. C, App. G.1) and its match with flops.py.

Issue 2 acceptance 5 (model counts == flops.param_split) and 6 (init per App. C.1, u(0) = e, truncated BPTT, hc
lanes, KV-cached decoding == full forward, SDPA fallback, bad configs), plus overfitting one batch and the r = 1
plain-transformer check. All CPU, fp32, tiny shapes (d = 32..128, vocab 128, T <= 32).
Run: python -m pytest -q tests/test_model.py -s   (-s shows the measured numbers)
"""
import importlib.util
import math
import os
import sys
import types
import warnings

import pytest
import torch
import torch.nn.functional as F

import flops
import model
from model import LoopedGPT, ModelConfig

VOCAB = 128
MODES = ["linear", "additive", "passthrough", "hyper", "random"]     # "random" = linear + random state init


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)        # every test builds its models from the same seed: deterministic numbers


def tiny_cfg(**kw):
    """d = 16 * 2 = 32, two heads of 16, vocab 128, T = 32: a full 20-layer stack in well under a second."""
    base = dict(scale=2, aspect_ratio=16, head_dim=16, vocab_size=VOCAB, seq_len=32)
    base.update(kw)
    return ModelConfig(**base)


def mode_kwargs(mode):
    return dict(injection="linear", state_init="random") if mode == "random" else dict(injection=mode)


def tokens(B=2, T=16, seed=0):
    return torch.randint(0, VOCAB, (B, T), generator=torch.Generator().manual_seed(seed))


def recur_inputs(m, idx, **fw):
    """u(t) for every iteration t: the inputs of the first recur block, captured by a forward pre-hook."""
    seen = []
    hook = m.recur[0].register_forward_pre_hook(lambda mod, args: seen.append(args[0].detach().clone()))
    try:
        m(idx, **fw)
    finally:
        hook.remove()
    return seen


def prelude_output(m, idx):
    """e: the prelude output (the embedding norm's output when there is no prelude)."""
    with torch.no_grad():
        x = m.norm_emb(m.wte(idx))
        rope = (m.rope_cos[:idx.size(1)], m.rope_sin[:idx.size(1)])
        for blk in m.prelude:
            x = blk(x, rope)
    return x


# -----------------------------------------------------------------------------
# Acceptance 5: parameter counts == flops.py, for every r and every mode

@pytest.mark.parametrize("r", [1, 2, 4, 8])
@pytest.mark.parametrize("mode", MODES)
def test_param_count_matches_flops(r, mode):
    cfg = tiny_cfg(n_loops=r, **mode_kwargs(mode))
    m = LoopedGPT(cfg)
    n_model = sum(p.numel() for p in m.parameters()) - m.wte.weight.numel() - m.lm_head.weight.numel()
    injection = "linear" if mode == "random" else mode                 # random state init counts as linear
    n_once, n_rec = flops.param_split(cfg.d_model, r, injection=injection, hc_lanes=cfg.hc_lanes)
    print(f"r={r} {mode:11s} model N={n_model:,} split={m.param_split()} | flops N={n_once + n_rec:,} "
          f"split={(n_once, n_rec)}")
    assert n_model == n_once + n_rec
    assert m.param_split() == (n_once, n_rec)
    # the optimizer labels cover every parameter once, and the once/rec split is a partition of N
    groups = m.param_groups()
    assert set(groups) == {"matrix", "wte", "lm_head", "norm", "hc"}
    assert sum(p.numel() for g in groups.values() for p in g) == sum(p.numel() for p in m.parameters())
    assert sum(m.param_split()) == n_model


def test_param_count_at_paper_width():
    # §3.1 / Table 6: at s = 10 (d = 640), N = 98.3 / 59.8 / 40.2 / 30.3 M; exact integers in architecture §8.1.
    # Built on the meta device (shapes only), so the real 40M-100M parameter models cost nothing.
    want = {1: 98_331_520, 2: 59_818_880, 4: 40_152_960, 8: 30_320_000}
    for r, n in want.items():
        with torch.device("meta"):
            m = LoopedGPT(ModelConfig(n_loops=r))
        n_once, n_rec = m.param_split()
        print(f"s=10 r={r}: N_once={n_once:,} N_rec={n_rec:,} N={n_once + n_rec:,} ({(n_once + n_rec) / 1e6:.1f}M)")
        assert n_once + n_rec == n
        assert (n_once, n_rec) == flops.param_split(640, r)
    assert m.wte.weight.shape == (32064, 640)                             # 32,001 padded to a multiple of 64


# -----------------------------------------------------------------------------
# Acceptance 6: initialisation (App. C.1)

def test_init_statistics():
    cfg = tiny_cfg(scale=2, aspect_ratio=64, head_dim=32, n_loops=4)  # d = 128 for tighter statistics
    m = LoopedGPT(cfg)
    d = cfg.d_model
    a = math.sqrt(3 / d)
    wte, head = m.wte.weight, m.lm_head.weight
    print(f"wte std {wte.std():.4f} (want 1), lm_head std {head.std():.3e} (want 1e-3)")
    assert wte.shape == (cfg.vocab_padded, d) and abs(wte.std().item() - 1) < 0.03 and abs(wte.mean()) < 0.03
    assert abs(head.std().item() / 1e-3 - 1) < 0.03 and abs(head.mean()) < 1e-4
    for blk in m.blocks():
        for w in (blk.attn.c_q.weight, blk.attn.c_k.weight, blk.attn.c_v.weight, blk.attn.c_proj.weight,
                  blk.mlp.c_fc.weight):
            assert w.abs().max() <= a and w.abs().max() > 0.98 * a              # U(-a, a), bounded tails
            assert abs(w.std().item() * math.sqrt(d) - 1) < 0.05                 # std 1/sqrt(d)
        w = blk.mlp.c_proj.weight                                                # (d, 4d): fan-in 4d
        assert w.shape == (d, 4 * d) and w.abs().max() <= a / 2 and w.abs().max() > 0.98 * a / 2
        assert abs(w.std().item() * math.sqrt(4 * d) - 1) < 0.05
        # Frobenius norms (architecture §3): ~sqrt(d) for d x d, ~2 sqrt(d) for c_fc, ~sqrt(d) for mlp.c_proj
        assert abs(blk.attn.c_q.weight.norm() / math.sqrt(d) - 1) < 0.05
        assert abs(blk.mlp.c_fc.weight.norm() / (2 * math.sqrt(d)) - 1) < 0.05
        assert abs(blk.mlp.c_proj.weight.norm() / math.sqrt(d) - 1) < 0.05
    w = m.inject.weight                                                          # (d, 2d), input [e ; h]
    assert torch.equal(w, torch.cat([torch.eye(d), torch.zeros(d, d)], dim=1))
    assert abs(w.norm().item() - math.sqrt(d)) < 1e-4
    norms = m.param_groups()["norm"]
    assert len(norms) == 2 * len(list(m.blocks())) + 3 and all(torch.equal(g, torch.ones(d)) for g in norms)
    # nothing zero-initialised: MuonH needs every matrix's radius > 0
    assert all(p.norm() > 0 for p in m.param_groups()["matrix"])


def test_hc_init_and_count():
    for r in (2, 4, 8):
        for K in (2, 3):
            m = LoopedGPT(tiny_cfg(n_loops=r, injection="hyper", hc_lanes=K))
            n_hc = sum(p.numel() for p in m.param_groups()["hc"])
            assert n_hc == r * (K * K + 2 * K)                       # App. G.1: r(K^2 + 2K)
            assert all(p.dtype == torch.float32 for p in m.param_groups()["hc"])
            assert m.inject is None
            for i in range(r):                                # cyclic init: alpha_i = e_(i mod K), M = I, beta = 1
                assert torch.equal(m.hc_alpha[i], F.one_hot(torch.tensor(i % K), K).float())
                assert torch.equal(m.hc_mix[i], torch.eye(K)) and torch.equal(m.hc_beta[i], torch.ones(K))
    print("hc scalars at K=2: r=2 16, r=4 32, r=8 64")
    assert [sum(p.numel() for p in LoopedGPT(tiny_cfg(n_loops=r, injection="hyper")).hc_params())
            for r in (2, 4, 8)] == [16, 32, 64]


# -----------------------------------------------------------------------------
# Acceptance 6: what the recurrent block sees at init

@pytest.mark.parametrize("mode", ["linear", "random", "additive"])
def test_u0_equals_e_at_init(mode):
    # W_inject = [I | 0] reads only e, so u(t) = e for every t at init (App. C.1), even from a random state;
    # additive starts from h(0) = 0, so u(0) = e (App. C.2).
    m = LoopedGPT(tiny_cfg(n_loops=4, **mode_kwargs(mode)))
    idx = tokens()
    e = prelude_output(m, idx)
    us = recur_inputs(m, idx)
    assert len(us) == 4
    errs = [(u - e).abs().max().item() for u in us]
    print(f"{mode}: max |u(t) - e| per iteration = {errs}")
    if mode == "additive":
        assert errs[0] == 0 and min(errs[1:]) > 0.1                   # later iterations add h(t) != 0
    else:
        assert max(errs) < 1e-6


def test_hc_lanes_at_init_give_u0_equal_e():
    # Eq. 7 with alpha_i = e_(i mod K), M = I, beta = 1: lanes start as (e, e); u(0) = e; every write adds s(0) to
    # both lanes, so u(1) = e + s(0) with s(0) = norm_recur(recur(e)) (architecture §6).
    m = LoopedGPT(tiny_cfg(n_loops=4, injection="hyper"))
    idx = tokens()
    e = prelude_output(m, idx)
    us = recur_inputs(m, idx)
    rope = (m.rope_cos[:idx.size(1)], m.rope_sin[:idx.size(1)])
    with torch.no_grad():
        s0 = e
        for blk in m.recur:
            s0 = blk(s0, rope)
        s0 = m.norm_recur(s0)
    print(f"hc: max |u(0) - e| = {(us[0] - e).abs().max():.2e}, max |u(1) - (e + s0)| = "
          f"{(us[1] - e - s0).abs().max():.2e}")
    assert torch.allclose(us[0], e, atol=1e-6)
    assert torch.allclose(us[1], e + s0, atol=1e-5)


# -----------------------------------------------------------------------------
# Acceptance 6: truncated BPTT (Eq. 6)

def grads(m, idx):
    m.zero_grad(set_to_none=True)
    m(idx, idx).backward()
    return {n: p.grad.clone() for n, p in m.named_parameters() if p.grad is not None}


def test_truncated_bptt_detached_loops_get_no_gradient():
    r, k = 4, 2
    trunc = LoopedGPT(tiny_cfg(n_loops=r, n_loops_bwd=k))
    with torch.no_grad():                       # move W_inject off [I | 0] so the state path actually matters
        trunc.inject.weight.add_(0.5 * torch.randn_like(trunc.inject.weight) / math.sqrt(trunc.cfg.d_model))
    full = LoopedGPT(tiny_cfg(n_loops=r))
    full.load_state_dict(trunc.state_dict())
    idx = tokens()

    # (a) Which iterations' states receive gradient: a hook on each iteration's norm_recur output.
    def state_grad_norms(m):
        got = {}
        calls = []

        def fwd_hook(mod, args, out):
            i = len(calls)
            calls.append(out.requires_grad)
            if out.requires_grad:
                out.register_hook(lambda g: got.__setitem__(i, g.norm().item()))
        h = m.norm_recur.register_forward_hook(fwd_hook)
        m(idx, idx).backward()
        h.remove()
        return got, calls
    got_t, calls_t = state_grad_norms(trunc)
    got_f, _ = state_grad_norms(full)
    print(f"state grad norms per iteration: truncated {got_t}, full {got_f}")
    assert calls_t == [False, False, True, True]                  # i < r - k run detached
    assert sorted(got_t) == [2, 3] and sorted(got_f) == [0, 1, 2, 3]
    assert all(v > 0 for v in got_f.values())

    # (b) Same gradients as a full-BPTT model whose first r - k states are made constants by a hook: the detached
    # loops contribute nothing, and running them under no_grad changes nothing.
    n_calls = []

    def detach_early(mod, args, out):
        n_calls.append(1)
        return out.detach() if len(n_calls) <= r - k else out
    g_trunc = grads(trunc, idx)
    h = full.norm_recur.register_forward_hook(detach_early)
    g_ref = grads(full, idx)
    h.remove()
    g_full = grads(full, idx)
    worst = max((g_trunc[n] - g_ref[n]).abs().max().item() for n in g_ref)
    name = "recur.0.mlp.c_fc.weight"
    moved = ((g_full[name] - g_trunc[name]).norm() / g_full[name].norm()).item()
    print(f"max |grad_trunc - grad_ref| = {worst:.2e}; |grad_full - grad_trunc| / |grad_full| on {name} = {moved:.3f}")
    assert set(g_trunc) == set(g_ref) and worst < 1e-6
    assert moved > 0.01                                           # truncation really removes gradient paths
    assert g_trunc["prelude.0.attn.c_q.weight"].norm() > 0       # the prelude still learns through e


def test_every_accepted_truncated_config_trains_every_weight():
    # issue 19 §1: passthrough + n_loops_bwd < r left wte and the prelude without gradient (DDP then failed at step
    # 2, one process silently never trained them). Every config ModelConfig accepts must give EVERY parameter a
    # non-zero gradient; the one that cannot is refused when built.
    checked, refused = 0, []
    for mode in ("linear", "additive", "passthrough", "hyper", "diagonal", "random"):
        for r, k in [(2, 1), (4, 1), (4, 2), (4, 4), (8, 4)]:
            try:
                cfg = tiny_cfg(n_layers_eff=2 + r, n_layers_prelude=1, n_layers_coda=1, n_loops=r, n_loops_bwd=k,
                               **mode_kwargs(mode))
            except ValueError as err:
                refused.append((mode, r, k, str(err)))
                continue
            m = LoopedGPT(cfg)
            g = grads(m, tokens())
            dead = [n for n, p in m.named_parameters() if n not in g or not g[n].abs().sum() > 0]
            assert not dead, f"{mode} r={r} k={k}: no gradient for {dead}"
            checked += 1
    print(f"\n{checked} truncated configs train every weight; refused: {[(m, r, k) for m, r, k, _ in refused]}")
    assert {(m, r, k) for m, r, k, _ in refused} == {("hyper", r, k) for r, k in [(2, 1), (4, 1), (4, 2), (8, 4)]} | \
        {("passthrough", r, k) for r, k in [(2, 1), (4, 1), (4, 2), (8, 4)]}
    assert all("passthrough' needs full BPTT" in e for m, _, _, e in refused if m == "passthrough")


# -----------------------------------------------------------------------------
# Acceptance 6: KV-cached decoding == full forward (one KV slot per recurrence)

@pytest.mark.parametrize("r,mode", [(1, "linear"), (4, "linear"), (4, "hyper"), (4, "additive"), (4, "diagonal")])
def test_cached_decoding_equals_full_forward(r, mode):
    # (a random state init draws fresh noise per call, so only h(0) = e has a position-exact cached counterpart)
    torch.manual_seed(0)
    m = LoopedGPT(tiny_cfg(n_loops=r, injection=mode))
    with torch.no_grad():   # perturb every parameter so the test is not passed by the identity-like init
        for p in m.parameters():
            p.add_(0.02 * torch.randn_like(p))
    idx = tokens(B=2, T=24)
    with torch.no_grad():
        full = m(idx)                                                  # (B, T, V)
        cache = m.new_kv_cache(max_len=24)
        assert cache.n_slots == 20                                     # l_eff slots for every r
        parts = [m(idx[:, :5], kv_cache=cache)]                        # prefill
        parts += [m(idx[:, t:t + 1], kv_cache=cache) for t in range(5, 20)]   # one token at a time
        parts.append(m(idx[:, 20:24], kv_cache=cache))                 # a chunk after a cache (masked path)
    cached = torch.cat(parts, dim=1)
    err = (cached - full).abs().max().item()
    print(f"r={r} {mode}: max |cached - full| logits = {err:.2e}")
    assert cached.shape == full.shape and err < 1e-5


def test_generate_greedy_matches_uncached_loop_and_extrapolation():
    torch.manual_seed(0)
    m = LoopedGPT(tiny_cfg(n_loops=4))
    with torch.no_grad():
        for p in m.parameters():
            p.add_(0.05 * torch.randn_like(p))
    prompt = tokens(B=2, T=6)
    for n_loops in (None, 6):                                          # 6: test-time extrapolation beyond r = 4
        out = m.generate(prompt, 8, temperature=0, n_loops=n_loops)
        ref = prompt
        with torch.no_grad():
            for _ in range(8):
                nxt = m(ref, n_loops=n_loops)[:, -1].argmax(-1, keepdim=True)
                ref = torch.cat([ref, nxt], dim=1)
        assert out.shape == (2, 14) and torch.equal(out, ref)
    g1, g2 = torch.Generator().manual_seed(3), torch.Generator().manual_seed(3)
    s1 = m.generate(prompt, 8, temperature=1.0, top_k=5, generator=g1)
    s2 = m.generate(prompt, 8, temperature=1.0, top_k=5, generator=g2)
    assert torch.equal(s1, s2) and s1.min() >= 0 and s1.max() < VOCAB


# -----------------------------------------------------------------------------
# Acceptance 6: attention backend

def test_sdpa_fallback_when_flash_attn_absent(monkeypatch):
    # A private copy of model.py imported with flash-attn absent / present (None = not importable in sys.modules).
    def load_fresh(name, fake_modules):
        with monkeypatch.context() as mp:
            for mod_name, mod in fake_modules.items():
                mp.setitem(sys.modules, mod_name, mod)
            spec = importlib.util.spec_from_file_location(name, os.path.abspath(model.__file__))
            fresh = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(fresh)
        return fresh
    no_fa3 = {"flash_attn_interface": None, "flash_attn_3": None, "flash_attn_3.flash_attn_interface": None}
    absent = load_fresh("model_no_flash", {"flash_attn": None, **no_fa3})
    assert absent._FLASH == {"fa3": None, "fa2": None}
    fake = types.ModuleType("flash_attn")
    fake.flash_attn_func = lambda q, k, v, causal: q
    present = load_fresh("model_fake_flash", {"flash_attn": fake, **no_fa3})
    assert present._FLASH["fa2"] is fake.flash_attn_func and present._FLASH["fa3"] is None
    # CPU: auto resolves to SDPA, and the forward goes through F.scaled_dot_product_attention once per executed
    # layer (l_eff = 20) even where flash-attn is importable (it takes only half-precision CUDA tensors)
    assert present.resolve_attention("auto", "cpu", True)[0] == "sdpa"
    calls = []
    sdpa = F.scaled_dot_product_attention
    monkeypatch.setattr(F, "scaled_dot_product_attention", lambda *a, **kw: calls.append(1) or sdpa(*a, **kw))
    m = present.LoopedGPT(present.ModelConfig(scale=2, aspect_ratio=16, head_dim=16, vocab_size=VOCAB, seq_len=32))
    m(tokens())
    print(f"SDPA calls per forward: {len(calls)}")
    assert len(calls) == 20
    m.set_attention("fa2")                                   # forced FlashAttention on fp32 CPU tensors: an error
    with pytest.raises(ValueError, match="takes bf16/fp16 CUDA tensors"):
        m(tokens())


def test_sdpa_backend_switch():
    """Issue 25 item 4: SDPA's kernel is one switch (set_attention's sdpa; train.py --sdpa-backend). "auto" is the
    call as it was before the switch existed (no sdpa_kernel context: bit-identical); "math" forces torch's
    reference kernel, equal to the default kernel to fp32 rounding on CPU."""
    m = LoopedGPT(tiny_cfg(n_loops=2))
    idx = tokens()
    with torch.no_grad():
        before = m(idx)
        m.set_attention("sdpa", sdpa="math")
        forced = m(idx)
        m.set_attention("auto", sdpa="auto")
        again = m(idx)
    print(f"\nSDPA math vs auto on CPU: max diff {(forced - before).abs().max():.1e}")
    assert torch.equal(again, before) and torch.allclose(forced, before, atol=1e-4)
    assert set(model.SDPA_BACKENDS) == {"auto", "cudnn", "flash", "efficient", "math"}


@pytest.mark.parametrize("cap, fa3, fa2, bf16, want", [
    ((9, 0), True, True, True, "fa3"),          # H100 / H200: FlashAttention-3
    ((9, 0), False, True, True, "fa2"),         # Hopper without the FA-3 build: FA-2
    ((8, 0), True, True, True, "fa2"),          # A100: FA-3 is Hopper-only
    ((8, 9), False, False, True, "sdpa"),       # L40S without flash-attn
    ((7, 5), True, True, True, "sdpa"),         # T4: neither
    ((9, 0), True, True, False, "sdpa"),        # fp32 activations: FlashAttention cannot take them
])
def test_attention_backend_by_capability(monkeypatch, cap, fa3, fa2, bf16, want):
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: cap)
    monkeypatch.setitem(model._FLASH, "fa3", (lambda *a, **k: None) if fa3 else None)
    monkeypatch.setitem(model._FLASH, "fa2", (lambda *a, **k: None) if fa2 else None)
    got, why = model.resolve_attention("auto", "cuda", bf16)
    print(f"\ncapability {cap}, fa3 {fa3}, fa2 {fa2}, bf16 {bf16} -> {got} ({why})")
    assert got == want
    for forced in ("fa3", "fa2", "sdpa"):                    # forcing: the same backend, or an error saying why
        if forced == want or forced == "sdpa" or (forced == "fa2" and want == "fa3" and fa2):
            assert model.resolve_attention(forced, "cuda", bf16) == (forced, "forced by --attn")
        else:
            with pytest.raises(ValueError, match=f"--attn {forced} cannot run here: "):
                model.resolve_attention(forced, "cuda", bf16)


def test_flash_attention_found_under_its_install_names(monkeypatch, tmp_path):
    # issue 19 §4: `pip install flash-attn` has no flash_attn_interface; FA-3 is also installed as the packaged
    # flash_attn_3.flash_attn_interface. A module that is there but fails to import is told apart from an absent one.
    fa3 = lambda q, k, v, causal: (q, None)
    pkg, sub = types.ModuleType("flash_attn_3"), types.ModuleType("flash_attn_3.flash_attn_interface")
    sub.flash_attn_func = fa3
    for name, mod in [("flash_attn_interface", None), ("flash_attn_3", pkg), ("flash_attn_3.flash_attn_interface", sub)]:
        monkeypatch.setitem(sys.modules, name, mod)
    assert model._find_flash("fa3") == (fa3, "flash_attn_3.flash_attn_interface")
    monkeypatch.setitem(sys.modules, "flash_attn_3.flash_attn_interface", None)
    fn, why = model._find_flash("fa3")
    assert fn is None and why == "flash_attn_interface: not installed; flash_attn_3.flash_attn_interface: not installed"
    monkeypatch.delitem(sys.modules, "flash_attn_interface")              # a build whose CUDA extension is missing
    (tmp_path / "flash_attn_interface.py").write_text("import flash_attn_3_cuda_ext_not_built\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    fn, why = model._find_flash("fa3")
    print(f"\n{why}")
    assert fn is None and why.startswith("flash_attn_interface: ModuleNotFoundError: No module named "
                                         "'flash_attn_3_cuda_ext_not_built'")


def test_attention_summary_names_the_kernel_and_how_to_get_fa3(monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    monkeypatch.setitem(model._FLASH, "fa3", None)
    monkeypatch.setitem(model._FLASH_FROM, "fa3", "flash_attn_interface: not installed")
    monkeypatch.setitem(model._FLASH, "fa2", lambda *a, **k: None)
    monkeypatch.setitem(model._FLASH_FROM, "fa2", "flash_attn")
    backend = model.resolve_attention("auto", "cuda", True)[0]
    line = model.attention_summary(backend, "cuda", True)               # H100 with pip's flash-attn only
    print(f"\n{line}")
    assert backend == "fa2" and line.startswith("attention kernel: fa2 (flash_attn); not fa3: fa3 is not importable")
    assert "hopper/" in line and "flash_attn_3 wheel" in line and "\n" not in line
    monkeypatch.setitem(model._FLASH, "fa3", lambda *a, **k: None)
    monkeypatch.setitem(model._FLASH_FROM, "fa3", "flash_attn_interface")
    assert model.attention_summary("fa3", "cuda", True) == "attention kernel: fa3 (flash_attn_interface)"
    assert model.attention_summary("sdpa", "cuda", False).endswith("not fa3: fa3 takes only bf16/fp16 tensors; it "
                                                                    "needs --precision bf16")
    assert model.attention_summary("fa2", "cuda", True).endswith("not fa3: --attn chose another")
    assert model.attention_summary("sdpa", "cpu", False) == ("attention kernel: sdpa (torch scaled_dot_product_"
                                                             "attention); not fa3: fa3 needs a CUDA device, this is cpu")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))
    assert "only on compute capability 9.x" in model.attention_summary("fa2", "cuda", True)    # A100: no hint


def test_forced_attention_errors_name_the_reason(monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 6))
    monkeypatch.setitem(model._FLASH, "fa2", None)
    for req, dev, bf16, msg in [("fa3", "cuda", True, "only on compute capability 9.x"),
                                ("fa2", "cuda", True, "not importable: install flash_attn"),
                                ("fa3", "cpu", True, "needs a CUDA device")]:
        with pytest.raises(ValueError, match=msg) as exc:
            model.resolve_attention(req, dev, bf16)
        print(f"\n--attn {req} on {dev}: {exc.value}")
    monkeypatch.setitem(model._FLASH, "fa2", lambda *a, **k: None)
    with pytest.raises(ValueError, match="needs --precision bf16"):
        model.resolve_attention("fa2", "cuda", False)


# -----------------------------------------------------------------------------
# Acceptance 6: bad configs and bad calls raise a clear ValueError

@pytest.mark.parametrize("kw,msg", [
    (dict(n_loops=3), "must divide 16"),
    (dict(scale=3, aspect_ratio=10, head_dim=16), "must be even and divide d_model"),
    (dict(injection="gated"), "injection must be one of"),
    (dict(state_init="zeros"), "state_init='zeros' must be"),
    (dict(n_loops=4, n_layers_prelude=3), "positive multiple of n_loops=4"),
    (dict(n_loops=4, n_loops_bwd=0), "n_loops_bwd must be an integer in"),
    (dict(n_loops=4, n_loops_bwd=5), "n_loops_bwd=5"),
    (dict(n_loops=4, injection="hyper", n_loops_bwd=2), "full BPTT"),
    (dict(injection="hyper", hc_lanes=1), "hc_lanes must be >= 2"),
    (dict(injection="passthrough", state_init="random"), "state_init='random' must be"),
    (dict(n_loops=4, injection="passthrough", n_loops_bwd=2), "passthrough' needs full BPTT"),   # issue 19 §1
    (dict(head_dim=15, aspect_ratio=15), "must be even"),
    (dict(scale=2.0), "scale must be an int"),
])
def test_bad_config_raises(kw, msg):
    with pytest.raises(ValueError, match=msg) as err:
        tiny_cfg(**kw)
    print(err.value)


def test_a_new_parameter_needs_no_edit_in_the_optimizer_or_the_split():
    """Issue 24 §7: a variant's new parameters are grouped by what they are and counted by membership. A vector, a
    per-iteration stack of vectors and a new nn.Linear added to the model: the first two go to AdamW ("norm"), the
    Linear to MuonH ("matrix"), all three into N_once, and one optimizer step moves them, with no edit elsewhere."""
    import optim
    m = LoopedGPT(tiny_cfg(n_loops=2))
    base = m.param_split()
    d = m.cfg.d_model
    m.gate = torch.nn.Parameter(torch.ones(d))                                    # (d,)
    m.loop_emb = torch.nn.Parameter(torch.zeros(2, d))                            # (r, d)
    m.mix = torch.nn.Linear(d, d, bias=False)                                      # (d, d)
    groups = m.param_groups()
    assert any(p is m.gate for p in groups["norm"]) and any(p is m.loop_emb for p in groups["norm"])
    assert any(p is m.mix.weight for p in groups["matrix"])
    assert m.param_split() == (base[0] + d + 2 * d + d * d, base[1])
    opt = optim.build_optimizer(groups, optim.hyperp_lrs(d, 2, 10 ** 6))
    for p in (m.gate, m.loop_emb, m.mix.weight):
        p.grad = torch.ones_like(p)
    before = [p.detach().clone() for p in (m.gate, m.loop_emb, m.mix.weight)]
    opt.step()
    assert all(not torch.equal(a, p) for a, p in zip(before, (m.gate, m.loop_emb, m.mix.weight)))


def test_loop_sweepable_is_the_one_predicate():
    """Issue 24 §7: whether a model can run a test-time r' != r is ModelConfig.loop_sweepable (eval.py asks it, and
    refuses r' != r where it is False: tests/test_variants.py). True means the model runs any r'; False marks the
    per-iteration parameters: hyperconnections have alpha/M/beta for exactly r iterations (Eq. 7)."""
    for mode in ("linear", "additive", "passthrough", "diagonal"):
        cfg = tiny_cfg(n_loops=4, injection=mode)
        assert cfg.loop_sweepable
        m = LoopedGPT(cfg)
        with torch.no_grad():
            assert all(m(tokens(), n_loops=r).isfinite().all() for r in (1, 2, 8))     # r' != r runs
    assert tiny_cfg(n_loops=1, injection="hyper").loop_sweepable                     # r = 1: no injection at all
    m = LoopedGPT(tiny_cfg(n_loops=4, injection="hyper"))
    assert not m.cfg.loop_sweepable and m.hc_alpha.shape[0] == m.hc_mix.shape[0] == m.hc_beta.shape[0] == 4


# -----------------------------------------------------------------------------
# Behaviour: r = 1 is a plain transformer, losses, overfitting, random state, extrapolation

def test_n_loops_1_is_plain_20_layer_transformer():
    cfg = tiny_cfg(n_loops=1, injection="linear", state_init="random")     # injection / state ignored at r = 1
    m = LoopedGPT(cfg)
    assert (len(m.prelude), len(m.recur), len(m.coda)) == (0, 20, 0) and m.inject is None
    assert m.hc_params() == [] and m.param_split()[0] == 3 * cfg.d_model   # once = the 3 model norms only
    idx = tokens()
    rope = (m.rope_cos[:16], m.rope_sin[:16])
    with torch.no_grad():
        x = m.norm_emb(m.wte(idx))
        for blk in m.recur:                                                # 20 pre-norm blocks, once
            x = blk(x, rope)
        z = m.lm_head(m.norm_final(m.norm_recur(x)))[..., :VOCAB]          # all three model norms
        want = 15 * torch.tanh(z / 15)
        got = m(idx)
    print(f"r=1 vs hand-built 20-layer stack: max diff {(got - want).abs().max():.1e}")
    assert torch.equal(got, want)


def test_loss_reductions_and_ignore_index():
    m = LoopedGPT(tiny_cfg(n_loops=2))
    idx = tokens()
    tgt = idx.clone()
    tgt[:, :4] = -1                                                         # ignored positions
    with torch.no_grad():
        per_tok = m(idx, tgt, reduction="none")
        logits = m(idx)
    assert per_tok.shape == idx.shape and torch.all(per_tok[:, :4] == 0)
    assert torch.allclose(m(idx, tgt, reduction="sum"), per_tok.sum())
    assert torch.allclose(m(idx, tgt), per_tok.sum() / 24)
    assert logits.dtype == torch.float32 and logits.shape == (2, 16, VOCAB) and logits.abs().max() <= 15


def test_overfit_one_batch():
    torch.manual_seed(0)
    m = LoopedGPT(tiny_cfg(n_loops=4))
    idx = tokens(B=2, T=25, seed=1)
    x, y = idx[:, :-1], idx[:, 1:]
    opt = torch.optim.Adam(m.parameters(), lr=1e-2)
    losses = []
    for _ in range(30):
        loss = m(x, y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    print(f"overfit one batch: loss {losses[0]:.3f} -> {losses[-1]:.3f} in 30 Adam steps")
    assert abs(losses[0] - math.log(VOCAB)) < 0.3 and losses[-1] < 0.5 * losses[0]


def test_random_state_is_fresh_noise_and_seedable():
    m = LoopedGPT(tiny_cfg(n_loops=4, state_init="random", state_init_std=1.0))
    with torch.no_grad():                                   # let the state half of W_inject see the noise
        m.inject.weight[:, m.cfg.d_model:].normal_(0, 0.1)
    idx = tokens()
    with torch.no_grad():
        a, b = m(idx), m(idx)
        c = m(idx, generator=torch.Generator().manual_seed(7))
        d = m(idx, generator=torch.Generator().manual_seed(7))
    print(f"random state: |two unseeded calls| diff {(a - b).abs().max():.2e}, seeded diff {(c - d).abs().max()}")
    assert (a - b).abs().max() > 1e-4 and torch.equal(c, d)


@pytest.mark.parametrize("mode", ["linear", "hyper"])
def test_works_under_bf16_autocast(mode):
    # On CUDA the trainer runs the model under bf16 autocast; CPU autocast exercises the same dtype paths. The residual
    # stream stays fp32 (no bf16 input meets an fp32 norm gain), logits / loss are fp32, hc scalars stay fp32.
    m = LoopedGPT(tiny_cfg(n_loops=4, injection=mode))
    m.wte.to(dtype=torch.bfloat16)                                       # as train.py stores it on GPU (App. C.1)
    idx = tokens()
    with warnings.catch_warnings():
        warnings.simplefilter("error")                                   # e.g. rms_norm's dtype-mismatch warning
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = m(idx, idx)
            logits = m(idx)
            out = m.generate(idx[:, :4], 4, temperature=0)
        loss.backward()
    print(f"{mode} under bf16 autocast: loss {loss.item():.4f} ({loss.dtype}), logits {logits.dtype}")
    assert loss.dtype == logits.dtype == torch.float32 and math.isfinite(loss.item()) and out.shape == (2, 8)
    assert all(p.dtype == torch.float32 and p.grad is not None for p in m.param_groups()["matrix"] + m.hc_params())


def test_n_loops_override_runs_that_many_iterations():
    m = LoopedGPT(tiny_cfg(n_loops=4))
    idx = tokens()
    assert len(recur_inputs(m, idx)) == 4
    assert len(recur_inputs(m, idx, n_loops=8)) == 8                     # test-time loop extrapolation (App. A)
    assert len(recur_inputs(m, idx, n_loops=1)) == 1
