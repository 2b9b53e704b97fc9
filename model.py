"""
model.py -- the looped transformer of the paper, all of it, in one file.

Implements paper §3.1 and App. C (the App. G.1 case-study variants included):
    x = norm_emb(wte[idx]);  e = prelude(x)                        prelude runs once; e is fixed across loops
    for t in 0 .. r-1:  u(t) = W_inject [e ; h(t)]                 Eq. 5, W_inject init [I | 0], h(0) = e
                        h(t+1) = norm_recur(recur(u(t)))           one shared norm ends every iteration (App. C.1)
    logits = 15 tanh(lm_head(norm_final(coda(h(r)))) / 15)         coda runs once; softcap in fp32 (Table 4)
    l_eff = n_layers_prelude + n_loops * n_layers_recur + n_layers_coda = 20           iso-depth (§3.1)
Variants: additive / passthrough injection (App. C.2), hyperconnection lanes (Eq. 7), truncated BPTT (Eq. 6),
random state init (project ablation, after Huginn), diagonal injection (App. A, after Parcae; untested in the paper).
r = 1 is the plain baseline: 0-20-0, no injection, 3 model norms.
Run:   nothing to run; used by train.py / eval.py.   Test: pytest tests/test_model.py
Read in this order: ModelConfig -> Block -> LoopedGPT.forward -> init_weights -> generate; the attention backends
(which kernel runs, plumbing) come last.
Precision: fp32 parameters and residual stream; under --precision bf16 (the CUDA default) the trainer wraps forward
in bf16 autocast (matmuls bf16); logits, softcap and loss are fp32 either way. The model never prints.
Attention: FA-3, FA-2 or SDPA, resolved once per run (resolve_attention), and SDPA's own kernel (SDPA_BACKENDS);
attention_summary() is the start-up line that names the kernel, where it was imported from and, when FA-3 does not
run, why and how to get it.
Checks: a config is checked once, when built (ModelConfig.__post_init__); the modules trust their arguments.
Not here: parameter / FLOP formulas (flops.py; tests check they match this module), learning rates (optim.py).

paper -> code:  r n_loops | s scale (d = 64 s) | l_prelude / l_recur / l_coda n_layers_prelude / partition[1] / _coda |
                r_bwd n_loops_bwd | K hc_lanes | N_once / N_rec LoopedGPT.param_split()
"""
import contextlib
import importlib
import math
from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from flops import accounting_args, layout, pad_vocab

# INJECTIONS, defined once in flops.py (which counts their FLOPs): linear (Eq. 5), additive and passthrough (App. C.2),
# hyper (App. G.1, Eq. 7), diagonal (App. A, after Parcae). State inits: prelude, h(0) = e (App. C.1) | random,
# h(0) ~ N(0, std^2) (project ablation, after Huginn).

# -----------------------------------------------------------------------------
# Config

@dataclass
class ModelConfig:
    """Every architecture choice of one run; the defaults are the paper's s = 10, r = 4 reference (Table 4).

    Checked once, when built (__post_init__): a bad value is a ValueError naming the field, so train.py / eval.py
    turn it into a one-line error before any work. Combinations the paper's mechanism cannot train are refused too
    (random state without a path for e, hyperconnections or passthrough with truncated BPTT), not left to fail (or
    silently not learn) at step 2. Derived sizes are properties, so a config is never internally inconsistent.
    A new variant: a field here (default off: existing runs keep their identity), its parameters in LoopedGPT,
    its count in flops.py (ACCOUNTING) when it changes N or F; nothing else (README recipe)."""
    scale: int = 10                     # s; d_model = aspect_ratio * s (§3.1; s = 10 is the App. C.2 reference)
    aspect_ratio: int = 64              # d = 64 s (§3.1); the CPU mini study uses smaller values, e.g. 16
    n_loops: int = 4                    # r, iterations of the shared recurrent block (§3.1; grid r in {1,2,4,8})
    n_layers_eff: int = 20              # l_eff = l_prelude + r l_recur + l_coda (§3.1, iso-depth)
    n_layers_prelude: int = 2           # l_prelude for r > 1 (§3.1); r = 1 is 0-20-0 (authors' code)
    n_layers_coda: int = 2              # l_coda for r > 1 (§3.1)
    head_dim: int = 128                 # Table 4; n_head = d_model / head_dim
    vocab_size: int = 32001             # Llama-2's 32,000 + <|assistant_end|> (architecture §1); rows padded to 64
    seq_len: int = 2048                 # T (Table 4); RoPE tables cover 10 T positions (authors' code)
    injection: str = "linear"           # linear (Eq. 5) | additive | passthrough (App. C.2) | hyper (Eq. 7) | diagonal
    state_init: str = "prelude"         # h(0) = e (App. C.1) | random: h(0) ~ N(0, std^2) (project ablation)
    state_init_std: float = 1.0         # sigma of the random state; 1 = the RMS of a normalised state (project)
    hc_lanes: int = 2                   # K hyperconnection lanes (App. G.1)
    n_loops_bwd: Optional[int] = None   # r_bwd: gradient window (Eq. 6); None = full BPTT (project default)
    logit_softcap: float = 15.0         # z = 15 tanh(z / 15) (Table 4)
    rope_base: float = 10000.0          # RoPE theta (Table 4)
    norm_eps: float = 1e-6              # RMSNorm eps (Table 4)

    def __post_init__(self):
        # The one check of a config, wherever it enters (train.py's flags, a checkpoint's or a release meta's
        # model_config, a notebook). flops.accounting_args checks every field the accounting counts: integers in
        # range, a known injection, a layout that exists (r | 16, whole recurrent blocks), the BPTT window, hc lanes.
        # The other fields are checked here, one line each.
        accounting_args(self)
        def need(ok, msg):
            if not ok:
                raise ValueError(f"ModelConfig: {msg}")
        # RoPE halves head_dim; d = aspect_ratio x scale is never rounded (the paper never rounds d): another
        # scale is the cure when head_dim does not divide it
        need(type(self.head_dim) is int and self.head_dim >= 2 and self.head_dim % 2 == 0
             and self.d_model % self.head_dim == 0, f"head_dim={self.head_dim!r} must be even and divide d_model")
        # Only linear, additive and diagonal read e every iteration: with passthrough a random h(0) would cut the
        # prelude off the loop, and hyper's lanes start as copies of e, so the random state would be ignored.
        need({"prelude": True, "random": self.injection in ("linear", "additive", "diagonal")}.get(self.state_init),
             f"state_init={self.state_init!r} must be 'prelude', or 'random' with injection linear, additive, diagonal")
        # Passthrough (u = h) reads e only through h(0), and Eq. 6 detaches every iteration before the window, so
        # no gradient would ever reach wte, norm_emb or the prelude: they would silently stay at their init (and
        # DDP, finding them unused, fails at step 2). The release has the same zero gradient; refuse.
        need(self.injection != "passthrough" or self.n_loops_bwd in (None, self.n_loops),
             "injection='passthrough' needs full BPTT (n_loops_bwd=None): e enters only through h(0)")
        need(all(0 < v < math.inf for v in (self.state_init_std, self.logit_softcap, self.rope_base, self.norm_eps)),
             "state_init_std, logit_softcap, rope_base and norm_eps must be finite and > 0")   # nan fails too

    @property
    def d_model(self) -> int:
        """d = aspect_ratio x s (§3.1): width is the only thing the grid's s changes."""
        return self.aspect_ratio * self.scale

    @property
    def n_head(self) -> int:
        """H = d / head_dim: heads grow with width at a fixed head size of 128 (Table 4)."""
        return self.d_model // self.head_dim

    @property
    def partition(self) -> tuple:
        """(prelude, recur, coda) block counts; r = 1 gives (0, l_eff, 0) whatever prelude/coda say."""
        return layout(self.n_loops, self.n_layers_eff, self.n_layers_prelude, self.n_layers_coda)

    @property
    def vocab_padded(self) -> int:
        return pad_vocab(self.vocab_size)   # 32,001 -> 32,064 rows in wte / lm_head

    @property
    def loop_sweepable(self) -> bool:
        """Can the trained model run a test-time r' != r (loop extrapolation, App. A)? THE predicate (eval.py and the
        runs/ scripts ask here, never a list of names): not where parameters exist per iteration, as
        hyperconnections' alpha/M/beta (Eq. 7) exist for exactly r. A new per-iteration mechanism adds itself here."""
        return self.n_loops == 1 or self.injection != "hyper"        # r = 1 has no injection at all


# -----------------------------------------------------------------------------
# Building blocks: RMSNorm, RoPE, attention, ReLU^2 MLP, pre-norm Block (App. C.1, Table 4)

# RMSNorm with a learnable gain (init 1), eps 1e-6 (Table 4): torch's nn.RMSNorm, x / rms(x) * gain over the last
# dim via the fused F.rms_norm, which computes in the input's dtype.
RMSNorm = nn.RMSNorm


def rope_tables(n_pos: int, head_dim: int, base: float):
    """cos / sin of the RoPE angles pos * base^(-2j/D), each (n_pos, D/2); computed in fp64, stored fp32."""
    inv_freq = base ** (-torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)   # (D/2,)
    angles = torch.outer(torch.arange(n_pos, dtype=torch.float64), inv_freq)            # (n_pos, D/2)
    return angles.cos().float(), angles.sin().float()


def apply_rope(x, cos, sin):
    """Rotate the pairs (x_j, x_{j+D/2}) of every head (half-split RoPE). x (B, T, H, D); cos, sin (T, D/2)."""
    x1, x2 = x.chunk(2, dim=-1)                                   # (B, T, H, D/2) each
    cos, sin = cos[:, None, :].to(x.dtype), sin[:, None, :].to(x.dtype)
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)


def attend(q, k, v, backend="auto", sdpa="auto"):
    """Causal attention of Tq queries, the last Tq positions, over Tk >= Tq keys. q (B, Tq, H, D), k/v (B, Tk, H, D).

    Full causal attention, no window, no dropout (Table 4). backend: "fa3" | "fa2" | "sdpa" (resolved by
    resolve_attention) or "auto" (FlashAttention for half-precision CUDA tensors where it can run). sdpa: the
    kernel SDPA uses (SDPA_BACKENDS; "auto" = torch's own choice). Returns (B, Tq, H, D)."""
    Tq, Tk = q.size(1), k.size(1)
    half = q.is_cuda and q.dtype in (torch.float16, torch.bfloat16)
    if backend == "auto":
        backend = next((n for n in ("fa3", "fa2") if half and _attn_unusable(n, q.device, True) is None), "sdpa")
    if backend != "sdpa":
        if not half:                   # e.g. eval outside autocast with --attn fa2: bf16 autocast, or sdpa, is the cure
            raise ValueError(f"attention backend {backend} takes bf16/fp16 CUDA tensors, got {q.dtype} on {q.device}")
        out = _FLASH[backend](q, k, v, causal=True)               # causal mask is bottom-right aligned: Tq <= Tk ok
        return out[0] if isinstance(out, tuple) else out          # FA-3 may also return the log-sum-exp
    q, k, v = (t.transpose(1, 2) for t in (q, k, v))              # (B, H, T, D), SDPA's layout
    # Training / prefill (Tq = Tk): the plain causal mask. One decoded token (Tq = 1) sees every cached key: no mask.
    # A chunk after a cache (1 < Tq < Tk): query j sees keys <= Tk - Tq + j, an explicit bottom-right-aligned mask.
    mask = None if Tq in (1, Tk) else torch.ones(Tq, Tk, dtype=torch.bool, device=q.device).tril(diagonal=Tk - Tq)
    with contextlib.nullcontext() if sdpa == "auto" else sdpa_kernel([SDPA_BACKENDS[sdpa]]):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=Tq == Tk).transpose(1, 2)


class CausalSelfAttention(nn.Module):
    """Separate bias-free c_q, c_k, c_v, c_proj (d x d); RoPE, then parameter-free QK-norm (Table 4)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        d = cfg.d_model
        self.n_head, self.head_dim, self.eps = cfg.n_head, cfg.head_dim, cfg.norm_eps
        self.c_q, self.c_k, self.c_v, self.c_proj = (nn.Linear(d, d, bias=False) for _ in range(4))
        self.backend = self.sdpa = "auto"                            # set by LoopedGPT.set_attention

    def forward(self, x, rope, kv=None):
        """x (B, T, d) -> (B, T, d). rope: (cos, sin) for these T positions; kv: (KVCache, slot) when decoding, so
        the new keys/values are appended to this layer's slot and the queries attend over the whole cached prefix."""
        B, T, _ = x.shape
        q, k, v = (lin(x).view(B, T, self.n_head, self.head_dim) for lin in (self.c_q, self.c_k, self.c_v))  # (B,T,H,D)
        # QK-norm after RoPE (they commute: RoPE is a rotation). Cast back so all three share v's (autocast) dtype.
        q, k = (F.rms_norm(apply_rope(t, *rope), (self.head_dim,), eps=self.eps).to(v.dtype) for t in (q, k))
        if kv is not None:                                           # decoding: kv = (KVCache, this layer's slot)
            k, v = kv[0].update(kv[1], k, v)                         # (B, pos + T, H, D), the new keys appended
        return self.c_proj(attend(q, k, v, self.backend, self.sdpa).reshape(B, T, -1))   # attend: (B, T, H, D)


class MLP(nn.Module):
    """d -> 4d -> d with squared ReLU (Table 4), no biases."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.c_fc = nn.Linear(cfg.d_model, 4 * cfg.d_model, bias=False)
        self.c_proj = nn.Linear(4 * cfg.d_model, cfg.d_model, bias=False)

    def forward(self, x):
        """x (B, T, d) -> (B, T, d) through the (B, T, 4d) hidden layer, relu(z)^2 (Table 4)."""
        return self.c_proj(F.relu(self.c_fc(x)).square())


class Block(nn.Module):
    """Pre-norm block (App. C.1): x^ = x + Attn(RMSNorm(x)), x_out = x^ + MLP(RMSNorm(x^)). 12d^2 + 2d params."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.norm_attn = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.attn = CausalSelfAttention(cfg)
        self.norm_mlp = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.mlp = MLP(cfg)

    def forward(self, x, rope, kv=None):
        """x (B, T, d) -> (B, T, d): two residual updates, each reading a normalised copy of the stream."""
        x = x + self.attn(self.norm_attn(x), rope, kv)
        return x + self.mlp(self.norm_mlp(x))


DIAG_DECAY = 0.2 ** 0.5     # diagonal injection: exp(-Delta A) = sqrt(1/5) per channel at init (Parcae's default)


class DiagonalInjection(nn.Module):
    """Parcae's SSM-style injection (App. A; sandyresearch/parcae DiagonalInjection), d^2 + 2d parameters:

        u = exp(-Delta * A) * h + Delta * (B e),   A = exp(A_log) > 0,  Delta = softplus(dt_bias) > 0   (per channel)

    The decay exp(-Delta A) lies in (0, 1) for any parameter values, so the state's weight stays a contraction.
    It is the linear injection W_inject [e ; h] with W_inject = [diag(Delta) B | diag(exp(-Delta A))]: a full map of
    e but only a per-channel map of h (tests/test_variants.py checks this identity)."""

    def __init__(self, d: int):
        super().__init__()
        self.B = nn.Linear(d, d, bias=False)            # B (d, d): a matrix, so MuonH (param_groups); I_d at init
        # (d,) vectors (AdamW), made with their init: A_log = 0 (A = 1), and Delta = -ln(DIAG_DECAY) makes
        # exp(-Delta A) = DIAG_DECAY at A = 1; dt_bias is its inverse softplus, ln(e^Delta - 1)
        self.A_log = nn.Parameter(torch.zeros(d))
        self.dt_bias = nn.Parameter(torch.full((d,), math.log(math.expm1(-math.log(DIAG_DECAY)))))

    def forward(self, e, h):
        """e (prelude output), h (state), both (B, T, d) -> u (B, T, d), the recurrent block's input."""
        dt = F.softplus(self.dt_bias)                   # (d,) Delta > 0
        decay = torch.exp(-dt * torch.exp(self.A_log))  # (d,) exp(-Delta A) in (0, 1)
        return (decay * h + dt * self.B(e)).type_as(e)  # (B, T, d); B e in the autocast dtype, the sum in fp32


class KVCache:
    """Keys/values for decoding, ONE slot per executed layer: [prelude | r x recur | coda] = l_eff slots.

    Iteration i of the recur block writes its own slots, so a new token at iteration i attends to the earlier
    tokens' iteration-i keys exactly as in the full forward (architecture §7; no shared slot, no warm start).
    Tensors are allocated on the first write, in the activations' dtype/device. Inference only."""

    def __init__(self, n_slots: int, n_loops: int, max_len: int):
        self.n_slots, self.n_loops, self.max_len = n_slots, n_loops, max_len
        self.pos = 0                                   # tokens already cached (advanced once per model call)
        self.k = self.v = None                         # (n_slots, B, max_len, H, D) each

    def update(self, slot, k, v):
        """Write k, v (B, T, H, D) at positions pos .. pos + T of `slot`; return that slot's keys and values for
        positions 0 .. pos + T, each (B, pos + T, H, D). pos itself advances once per model call (forward)."""
        B, T, H, D = k.shape
        if self.k is None:
            self.k, self.v = (t.new_zeros(self.n_slots, B, self.max_len, H, D) for t in (k, v))
        self.k[slot, :, self.pos:self.pos + T] = k
        self.v[slot, :, self.pos:self.pos + T] = v
        return self.k[slot, :, :self.pos + T], self.v[slot, :, :self.pos + T]


# -----------------------------------------------------------------------------
# The looped model

class LoopedGPT(nn.Module):
    """prelude -> (read, recur blocks, norm_recur, write) x r -> coda; untied wte / lm_head (App. C.1)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        d = cfg.d_model
        # r = 1 is the plain 20-layer baseline: no injection and h(0) = e, whatever the config says (authors' code)
        self.injection = "passthrough" if cfg.n_loops == 1 else cfg.injection
        self.state_init = "prelude" if cfg.n_loops == 1 else cfg.state_init
        self.wte = nn.Embedding(cfg.vocab_padded, d)
        self.norm_emb = RMSNorm(d, cfg.norm_eps)                           # model norm 1: after the embedding
        # prelude (once), recur (shared, run r times), coda (once), in that order: blocks() and the init's RNG use it
        self.prelude, self.recur, self.coda = (nn.ModuleList(Block(cfg) for _ in range(n)) for n in cfg.partition)
        self.inject = nn.Linear(2 * d, d, bias=False) if self.injection == "linear" else None   # Eq. 5, [e ; h]
        self.diag = DiagonalInjection(d) if self.injection == "diagonal" else None                 # Parcae (App. A)
        self.hc_alpha = self.hc_mix = self.hc_beta = None
        if self.injection == "hyper":                                      # Eq. 7: per-iteration scalars, fp32
            r, K = cfg.n_loops, cfg.hc_lanes
            # made with their init (Zhu et al. cyclic): alpha_i one-hot at i mod K, M_i = I_K, beta_i = 1
            self.hc_alpha = nn.Parameter(F.one_hot(torch.arange(r) % K, K).float())   # read:  u = sum_k alpha_ik l_k
            self.hc_mix = nn.Parameter(torch.eye(K).repeat(r, 1, 1))                  # mix:   l <- M_i l ...
            self.hc_beta = nn.Parameter(torch.ones(r, K))                             # write: ... + beta_i (x) s
        self.norm_recur = RMSNorm(d, cfg.norm_eps)                         # model norm 2: ends every iteration
        self.norm_final = RMSNorm(d, cfg.norm_eps)                         # model norm 3: before lm_head
        self.lm_head = nn.Linear(d, cfg.vocab_padded, bias=False)
        # rope_cos, rope_sin: (10 T, D/2) each; not in state_dict
        for name, table in zip(("rope_cos", "rope_sin"), rope_tables(10 * cfg.seq_len, cfg.head_dim, cfg.rope_base)):
            self.register_buffer(name, table, persistent=False)
        self.init_weights()

    def blocks(self):
        """Every distinct Block once (prelude, recur, coda): for init and labelling, not the execution order."""
        return [*self.prelude, *self.recur, *self.coda]

    def set_attention(self, backend: str, sdpa: str = "auto"):
        """Use attention backend "fa3" | "fa2" | "sdpa" (from resolve_attention) or "auto" in every layer, and SDPA's
        kernel sdpa (a key of SDPA_BACKENDS; "auto" = torch's choice, as before the switch existed)."""
        for blk in self.blocks():
            blk.attn.backend, blk.attn.sdpa = backend, sdpa

    def hc_params(self):
        """The hyperconnection scalars alpha, M, beta (Eq. 7) that exist; [] for every other injection mode."""
        return [p for p in (self.hc_alpha, self.hc_mix, self.hc_beta) if p is not None]

    @torch.no_grad()
    def init_weights(self):
        """App. C.1 initialisation. Nothing is zero-initialised: MuonH keeps each matrix on a sphere of its init norm.
        Runs once, from __init__. Parameters whose init is a constant vector (gains, hc scalars, diagonal's A_log and
        dt_bias) are made with that value; the random draws (in this order: same seed, same weights) and the identity
        maps are here.

        | tensor                                        | init                                              |
        |-----------------------------------------------|---------------------------------------------------|
        | wte (vocab_padded, d)                         | N(0, 1)  (bf16 storage on GPU is the trainer's)   |
        | lm_head (vocab_padded, d)                     | N(0, sigma = 1e-3)                                |
        | c_q, c_k, c_v, attn.c_proj, mlp.c_fc          | U(-a, a), a = sqrt(3)/sqrt(d): std 1/sqrt(d)      |
        | mlp.c_proj (d, 4d)                            | U(-a', a'), a' = sqrt(3)/sqrt(4d): fan-in 4d      |
        | inject (d, 2d), input [e ; h]                 | [I_d | 0], so u(t) = e at init for every t        |
        | every RMSNorm gain                            | 1 (nn.RMSNorm's own init)                         |
        | hc alpha_i (K), M_i (K, K), beta_i (K)        | one-hot at i mod K, I_K, 1 (Zhu et al. cyclic)    |
        | diagonal B (d, d), A_log (d), dt_bias (d)     | I_d, 0 (A = 1), softplus^-1(-ln DIAG_DECAY) (Parcae)|
        """
        d = self.cfg.d_model
        a = (3.0 / d) ** 0.5
        nn.init.normal_(self.wte.weight, mean=0.0, std=1.0)
        nn.init.normal_(self.lm_head.weight, mean=0.0, std=1e-3)
        for blk in self.blocks():
            for lin in (blk.attn.c_q, blk.attn.c_k, blk.attn.c_v, blk.attn.c_proj, blk.mlp.c_fc):
                nn.init.uniform_(lin.weight, -a, a)
            nn.init.uniform_(blk.mlp.c_proj.weight, -a / 2, a / 2)        # sqrt(3)/sqrt(4d) = a / 2
        if self.inject is not None:
            self.inject.weight.copy_(torch.cat([torch.eye(d), torch.zeros(d, d)], dim=1))   # [I_d | 0]: u = e
        if self.diag is not None:
            self.diag.B.weight.copy_(torch.eye(d))                        # B = I_d: u = decay h + Delta e at init

    def param_groups(self) -> dict:
        """Optimizer labels (optimizer.md), by what a tensor is, never by a list of names: every nn.Linear weight
        (block matrices, inject, diagonal's B) but lm_head -> "matrix" (MuonH); wte, lm_head, the hc scalars -> their
        own AdamW groups; every other parameter -> "norm" (AdamW at the norm LR): the RMSNorm gains first, then
        any other vector (diagonal's A_log, dt_bias: per-channel like the gains, no width-free radius for MuonH to
        keep; Parcae trains them with AdamW too), so a new variant's vectors need no edit here or in optim.py.
        The order within each group is the checkpoints' (optimizer state is saved by position)."""
        gains = [m.weight for m in self.modules() if isinstance(m, RMSNorm)]
        linear = {id(m.weight) for m in self.modules() if isinstance(m, nn.Linear) and m is not self.lm_head}
        named = linear | {id(p) for p in (self.wte.weight, self.lm_head.weight, *self.hc_params(), *gains)}
        groups = dict(matrix=[p for p in self.parameters() if id(p) in linear], wte=[self.wte.weight],
                      lm_head=[self.lm_head.weight], norm=gains + [p for p in self.parameters() if id(p) not in named],
                      hc=self.hc_params())
        assert sorted(id(p) for g in groups.values() for p in g) == sorted(id(p) for p in self.parameters())
        return groups

    def param_split(self) -> tuple:
        """(N_once, N_rec) from module membership, as flops.param_split counts it (architecture §8.1): rec = recur
        blocks + inject (or diag), run every iteration; once = every other parameter but wte and lm_head (prelude,
        coda, the 3 model norms, hc scalars, and any parameter a variant adds)."""
        count = lambda *ps: sum(p.numel() for p in ps)
        n_rec = sum(count(*m.parameters()) for m in (self.recur, self.inject, self.diag) if m is not None)
        return count(*self.parameters()) - count(self.wte.weight, self.lm_head.weight) - n_rec, n_rec

    def _run(self, blocks, x, rope, kv_cache, first_slot):
        """Apply `blocks` in order; block j uses KV slot first_slot + j (one slot per executed layer)."""
        for j, blk in enumerate(blocks):
            x = blk(x, rope, None if kv_cache is None else (kv_cache, first_slot + j))
        return x

    def forward(self, idx, targets=None, reduction="mean", n_loops=None, generator=None, kv_cache=None,
                state_noise=None):
        """idx (B, T) int64 -> loss if targets (B, T) are given (-1 = ignored), else logits (B, T, vocab_size) fp32.

        reduction: "mean" | "sum" | "none" (then (B, T)). n_loops: run r' != r iterations (if cfg.loop_sweepable).
        generator: random source for state_init="random" (same device as the model), for deterministic eval.
        state_noise: (B, T, d) N(0, 1) draws for state_init="random", given by the caller (the trainer draws one per
        global batch row, so ranks differ and the result does not depend on the world size); None = draw here.
        kv_cache: a KVCache (from new_kv_cache) for incremental decoding; idx are the next tokens.
        """
        cfg = self.cfg
        n = kv_cache.n_loops if kv_cache is not None else n_loops or cfg.n_loops        # the r to run
        assert n_loops in (None, n) and (n == cfg.n_loops or cfg.loop_sweepable), "r' is the cache's, if sweepable"
        B, T = idx.shape
        pos = 0 if kv_cache is None else kv_cache.pos
        assert pos + T <= min(self.rope_cos.size(0), kv_cache.max_len if kv_cache else pos + T), "past RoPE or cache"
        rope = (self.rope_cos[pos:pos + T], self.rope_sin[pos:pos + T])     # (T, D/2) each
        n_pre, n_layers_recur = len(self.prelude), len(self.recur)
        # An n_loops override keeps the window's size, capped at n: a shorter run still backpropagates its last k
        # iterations. Where e enters every iteration (linear, additive, diagonal) the prelude gets gradient through
        # those; passthrough (e only in h(0)) is refused with truncation in ModelConfig for exactly that reason.
        k_bwd = n if cfg.n_loops_bwd is None else min(cfg.n_loops_bwd, n)   # gradient window r_bwd (Eq. 6)

        # 1. embed + prelude (once)
        # wte may be stored in bf16 on GPU (App. C.1); the residual stream starts in the norm gain's dtype (fp32)
        x = self.norm_emb(self.wte(idx).to(self.norm_emb.weight.dtype))   # (B, T, d)
        e = self._run(self.prelude, x, rope, kv_cache, 0)       # (B, T, d) prelude output, re-read every iteration
        # 2. recurrent state at the start
        mode = self.injection
        if mode == "hyper":
            lanes = [e] * cfg.hc_lanes                          # K lanes (B, T, d), copies of e (Eq. 7)
        elif self.state_init == "random":                       # Huginn-style h(0) ~ N(0, std^2 I), fresh each call
            if state_noise is None:
                state_noise = torch.randn(e.shape, generator=generator, device=e.device, dtype=e.dtype)
            h = state_noise.to(e.dtype) * cfg.state_init_std
        elif mode == "additive":
            h = torch.zeros_like(e)                             # h(0) = 0, so u(0) = e (App. C.2)
        else:
            h = e                                               # h(0) = e (App. C.1); passthrough, diagonal, r = 1
        # 3. r iterations of the shared block
        for i in range(n):
            # Truncated BPTT (Eq. 6): iterations i < r - r_bwd run without autograd, which equals detaching their
            # normalised output s (their only output) and saves their activations. Full BPTT: k_bwd = n.
            with torch.set_grad_enabled(torch.is_grad_enabled() and i >= n - k_bwd):
                if mode == "linear":
                    u = self.inject(torch.cat([e, h], dim=-1)).type_as(e)   # Eq. 5: W_inject [e ; h(i)]
                elif mode == "additive":
                    u = h + e                                               # App. C.2
                elif mode == "diagonal":
                    u = self.diag(e, h)                                     # exp(-Delta A) h + Delta B e (App. A)
                elif mode == "passthrough":
                    u = h                                                   # App. C.2; r = 1 baseline
                else:
                    u = sum(self.hc_alpha[i, kk] * lanes[kk] for kk in range(cfg.hc_lanes))   # Eq. 7 read
                u = self._run(self.recur, u, rope, kv_cache, n_pre + i * n_layers_recur)
                s = self.norm_recur(u)                                      # shared norm ends every iteration
            if mode == "hyper":                   # Eq. 7 write: l_j <- sum_k M_i[j, k] l_k + beta_i[j] s (fp32)
                s = s.float()
                lanes = [sum(self.hc_mix[i, j, kk] * lanes[kk] for kk in range(cfg.hc_lanes)) + self.hc_beta[i, j] * s
                         for j in range(cfg.hc_lanes)]
            else:
                h = s
        # 4. coda (once) and the head; hc: the coda reads the plain lane sum
        x = sum(lanes) if mode == "hyper" else h
        x = self._run(self.coda, x, rope, kv_cache, n_pre + n * n_layers_recur)
        if kv_cache is not None:
            kv_cache.pos += T
        logits = self.lm_head(self.norm_final(x))[..., :cfg.vocab_size].float()   # (B, T, V) drop pad columns
        logits = cfg.logit_softcap * torch.tanh(logits / cfg.logit_softcap)      # softcap in fp32 (Table 4)
        if targets is None:
            return logits
        loss = F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=-1, reduction=reduction)
        return loss.view(B, T) if reduction == "none" else loss

    # -------------------------------------------------------------------------
    # Decoding

    def new_kv_cache(self, max_len: int, n_loops: Optional[int] = None) -> KVCache:
        """An empty cache for sequences up to max_len tokens, with one slot per executed layer at this r."""
        n = n_loops or self.cfg.n_loops
        return KVCache(len(self.prelude) + n * len(self.recur) + len(self.coda), n, max_len)

    @torch.no_grad()
    def generate(self, idx, max_new_tokens, temperature=1.0, top_k=None, generator=None, n_loops=None):
        """Append max_new_tokens sampled tokens to idx (B, T0) with KV-cached decoding. temperature 0 = greedy.

        generator (same device as the model) makes sampling and the random state init reproducible."""
        # One cache for prompt + continuation: prefill writes every slot for T0 positions, each step one more.
        cache = self.new_kv_cache(idx.size(1) + max_new_tokens, n_loops)
        logits = self(idx, generator=generator, kv_cache=cache)[:, -1]      # prefill: (B, V)
        for t in range(max_new_tokens):
            if temperature == 0:
                nxt = logits.argmax(dim=-1, keepdim=True)                   # (B, 1)
            else:
                logits = logits / temperature
                if top_k is not None:
                    kth = torch.topk(logits, min(top_k, logits.size(-1))).values[:, -1:]   # (B, 1)
                    logits = logits.masked_fill(logits < kth, float("-inf"))
                nxt = torch.multinomial(F.softmax(logits, dim=-1), 1, generator=generator)
            idx = torch.cat([idx, nxt], dim=1)                             # (B, T0 + t + 1)
            if t + 1 < max_new_tokens:
                logits = self(nxt, generator=generator, kv_cache=cache)[:, -1]
        return idx


# -----------------------------------------------------------------------------
# Attention backends: which kernel runs (after the model: it is plumbing, not the recipe)

# Attention backends (Table 4: FA-3 on H100, FA-2 on A100). Which one runs is decided once per run by
# resolve_attention() from the device's compute capability and what is importable, and stored on every attention
# module (LoopedGPT.set_attention); nothing is chosen silently per call except under "auto" for callers that never
# resolve (eval.py's decoding), where FlashAttention is used for bf16/fp16 CUDA tensors on a capable device.
# FlashAttention only takes fp16/bf16 CUDA tensors; SDPA (F.scaled_dot_product_attention) runs anywhere.
ATTN_BACKENDS = ("auto", "fa3", "fa2", "sdpa")
# The kernel SDPA itself runs (issue 25 item 4: cuDNN attention is the fast one on Hopper), one switch for the whole
# run (LoopedGPT.set_attention; train.py --sdpa-backend). "auto" leaves torch's own choice, as before the switch;
# a named one is forced through torch.nn.attention.sdpa_kernel, which torch.compile traces, and a kernel that cannot
# run these inputs is torch's RuntimeError at the first step, never a silent fallback.
SDPA_BACKENDS = {"auto": None, "cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION,
                 "efficient": SDPBackend.EFFICIENT_ATTENTION, "math": SDPBackend.MATH}
# Where each FlashAttention is found, first importable module wins (issue 19 §4). FA-3 is not on PyPI: the
# flash-attention repo's hopper/ build (and the flash_attn_3 wheels made from it) installs the top-level module
# flash_attn_interface; newer packaged builds also ship it as flash_attn_3.flash_attn_interface. `pip install
# flash-attn` gives FA-2 only, as flash_attn.flash_attn_func; its own flash_attn.flash_attn_interface module is FA-2
# as well, so it is never taken for FA-3.
FLASH_MODULES = {"fa3": ("flash_attn_interface", "flash_attn_3.flash_attn_interface"), "fa2": ("flash_attn",)}
FLASH_HOWTO = {"fa3": "install FlashAttention-3: build the flash-attention repo's hopper/ folder (cd hopper && "
                      "python setup.py install) or install a flash_attn_3 wheel built for this torch and CUDA",
               "fa2": "install flash_attn (pip install flash-attn)"}


def _find_flash(name) -> tuple:
    """(flash_attn_func or None, where it came from or why not) for "fa3" / "fa2", trying FLASH_MODULES in order.

    A module that is installed but fails to import (a build against another torch or CUDA, a missing extension) is
    reported with its error, so the start-up line can tell "not installed" from "installed but broken"."""
    why = []
    for module in FLASH_MODULES[name]:
        try:
            return importlib.import_module(module).flash_attn_func, module
        except (ImportError, OSError, AttributeError) as err:   # OSError: a CUDA library the build needs is absent
            # "not installed" only when the module (or its package) itself is missing, not something it imports
            absent = isinstance(err, ModuleNotFoundError) and module.startswith(str(err.name))
            why.append(f"{module}: " + ("not installed" if absent else f"{type(err).__name__}: {err}"))
    return None, "; ".join(why)


# backend -> flash_attn_func (None: not importable), and backend -> the module it came from or why it did not
_FLASH, _FLASH_FROM = (dict(zip(("fa3", "fa2"), column)) for column in zip(_find_flash("fa3"), _find_flash("fa2")))


def _attn_unusable(name, device, bf16) -> Optional[str]:
    """Why backend `name` cannot run on `device` (with bf16 activations or not), or None if it can."""
    if name == "sdpa":
        return None
    if device.type != "cuda":
        return f"{name} needs a CUDA device, this is {device.type}"
    cap = tuple(torch.cuda.get_device_capability(device))           # (major, minor), e.g. (9, 0) on H100
    this = f"this device is {cap[0]}.{cap[1]}"
    reasons = ((name == "fa3" and cap[0] != 9, f"fa3 runs only on compute capability 9.x (Hopper), {this}"),
               (name == "fa2" and cap < (8, 0), f"fa2 needs compute capability >= 8.0 (Ampere or newer), {this}"),
               (_FLASH[name] is None, f"{name} is not importable: {FLASH_HOWTO[name]} ({_FLASH_FROM[name]})"),
               (not bf16, f"{name} takes only bf16/fp16 tensors; it needs --precision bf16"))
    return next((why for bad, why in reasons if bad), None)               # the first reason that applies


def attention_summary(backend: str, device, bf16: bool) -> str:
    """One line for the start-up print: the attention kernel that runs (backend from resolve_attention) and where
    it was imported from; unless it is FA-3, why FA-3 does not run here and, where that is the cure, how to get it."""
    origin = _FLASH_FROM.get(backend, "torch scaled_dot_product_attention" if backend == "sdpa" else "picked per call")
    why = None if backend == "fa3" else _attn_unusable("fa3", torch.device(device), bf16) or "--attn chose another"
    return f"attention kernel: {backend} ({origin})" + (f"; not fa3: {why}" if why else "")


def resolve_attention(requested: str, device, bf16: bool) -> tuple:
    """--attn value -> (backend, reason). auto: FA-3 on 9.x, else FA-2 on >= 8.0, else SDPA (first that can run).

    A forced backend that cannot run here is a ValueError naming the reason (never a silent fallback)."""
    why = {name: _attn_unusable(name, torch.device(device), bf16) for name in ("fa3", "fa2", "sdpa")}
    if requested != "auto" and why[requested]:
        raise ValueError(f"--attn {requested} cannot run here: {why[requested]} (use --attn auto or sdpa)")
    if requested != "auto":
        return requested, "forced by --attn"
    name = next(n for n, w in why.items() if w is None)                # sdpa runs anywhere: there is always one
    # the reason: why each backend tried before it cannot run, then the one that runs
    return name, "auto: " + "; ".join(list(why.values())[:list(why).index(name)] + [f"{name} runs here"])
