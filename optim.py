"""
optim.py -- MuonH for the matrices, AdamW for everything else, HyperP learning-rate transfer, the LR schedule.

Implements paper §4.1 and App. D (recipe, LR sweep and transfer), following HyperP (arXiv:2603.28743):
    MuonH, per matrix W with radius R = ||W_0||_F (its init):
        m <- m + (1-mu)(g - m);  n = g + mu(m - g)          Nesterov momentum, mu = 0.95
        O = PolarExpress_5(n / (1.02 ||n||_F))              ~ U V^T of n (Amsel et al. 2025, arXiv:2505.16932)
        U = R O / ||O||_F;  W <- W - eta U;  W <- R W / ||W||_F     update and weights on the sphere ||.||_F = R
    AdamW (betas 0.8/0.95, eps 1e-10, no weight decay) on wte, lm_head, RMSNorm gains, hyperconnection scalars.
    HyperP peak LRs:  eta_MuonH = 0.014 b (D/D_ref)^-0.32;  wte 0.3 b w;  lm_head 0.004 b w;  norm 0.005 w;  hc 0.01 w
        with w = (d/640)^-1/2 and b = (B/262,144)^0.558.  Schedule: lr_mult = 0.1 + 0.9 (N - step)/N.
Run:   python train.py --plan --scale 10 --tokens 983315200 [--n-loops 4]   prints every peak LR with its rule
       (the MuonH step benchmark is runs/bench_optim.py, the per-step op count runs/op_count.py)
Test:  pytest tests/test_optim.py
Read in this order: reference -> hyperp_lrs -> lr_multiplier -> polar_express -> muonh_update -> MuonHAdamW ->
build_optimizer
Not here: which parameter is a "matrix" (model.py param_groups), the token horizon (flops.py / train.py).
Distributed: sharded MuonH (optimizer.md §4). train.py wraps the model in DDP, so after backward every rank holds the
same all-reduced (mean) gradients. Each rank then runs MuonH only on the whole matrices it owns (a contiguous chunk of
every same-shape stack), keeps momentum and R only for those, and all-gathers the updated weights; AdamW's small
tensors stay replicated. state_dict() gathers a full, world-size-independent state; load_state_dict() keeps the
owned part. World size 1 owns everything and gathers nothing: the replicated optimizer, bit for bit.
"""
import math

import torch
import torch.distributed as dist


# -----------------------------------------------------------------------------
# Constants (paper §4.1 unless stated; "release" = kschwethelm/looped-lm-scaling at ad7d8f3)

MUONH_LR = 0.014            # base LR fed to HyperP; shared optimum of the App. D.1 sweep for r=1 and r=4
WTE_LR = 0.3                # AdamW embedding LR (§4.1)
LM_HEAD_LR = 0.004          # AdamW unembedding LR (§4.1)
NORM_LR = 0.005             # AdamW RMSNorm-gain LR (§4.1)
HC_LR = 0.01                # AdamW hyperconnection-lane LR; the paper gives none (release gpt.py setup_optimizer)
ADAM_BETAS = (0.8, 0.95)    # release setup_optimizer default (nanochat lineage)
ADAM_EPS = 1e-10            # release setup_optimizer
MUONH_MOMENTUM = 0.95       # constant from step 0: the release has no 0.85 -> 0.95 ramp (setup_optimizer)
NS_STEPS = 5                # Polar Express iterations
FINAL_LR_FRAC = 0.1         # "each LR linearly decayed to 10% of its peak" (§4.1)
REF_SCALE = 10              # the HyperP reference is the s = 10 model of the run's aspect ratio (App. C.2, D.1)
D_MODEL_REF = 640           # its width on the paper's grid (release base_train.py: REF_SIZE * aspect_ratio)
BATCH_REF = 262_144         # B_ref = 2^18 tokens, the App. D.1 batch-sweep winner
BATCH_EXP = 0.558           # eta* ∝ B^0.558 (HyperP §5.4; the release uses it instead of nanochat's sqrt rule)
DATA_EXP = 0.32             # eta* ∝ D^-0.32 (HyperP §3.4; paper App. D.2)
REF_DATA_RATIO = 10         # D_ref = 10 x effective params of the reference (App. D.1: ratio 10, "~1B tokens")

# Polar Express coefficients (a, b, c) of p(x) = a x + b x^3 + c x^5, one triple per iteration; the optimal
# 5-step schedule of Amsel et al. 2025 (arXiv:2505.16932) for a safety factor of 2e-2 and cushion 2, the values
# nanochat (and the release, nanochat/optim.py) use. Composed, they map every x in [1e-3, 1] into [0.859, 1.141].
POLAR_EXPRESS_COEFFS = ((8.156554524902461, -22.48329292557795, 15.878769915207462),
                        (4.042929935166739, -2.808917465908714, 0.5000178451051316),
                        (3.8916678022926607, -2.772484153217685, 0.5060648178503393),
                        (3.285753657755655, -2.3681294933425376, 0.46449024233003106),
                        (2.3465413258596377, -1.7097828382687081, 0.42323551169305323))

# What the release (nanochat/optim.py muon_step_fused, nanochat/gpt.py setup_optimizer, scripts/base_train.py)
# settles where the paper is silent, as read there:
#   - momentum: buffer.lerp_(g, 1 - mu), then the direction g.lerp_(buffer, mu); mu = 0.95 with no ramp.
#   - pre-scale by 1.02 ||X||_F + 1e-6 in bf16, 5 iterations, X^T X form for tall matrices; then rescale to R
#     in bf16 (norm clamped at 1e-10), W -= bf16(lr) U, W *= R / ||W||_F (clamped). No shape factor, WD or
#     second moment. muonh_update repeats it op for op (bf16 on CPU: bit-identical, tests/test_optim.py).
#   - R = ||W||_F per matrix at the first step, cached (per shape group, in the first param's state) and saved.
#     Here R lives in each parameter's own state: same numbers, and a checkpoint does not depend on the grouping.
#   - LRs: MuonH gets batch x data factors, no width factor; wte / lm_head get batch x width; norm (0.005) and
#     hc (0.01) get width only. D_ref from a meta-device reference model (0-20-0 for r=1, 2-4-2 for looped),
#     its effective params counted at the training run's r (base_train.py get_scaling_params uses the run's r).
#   - schedule: get_lr_multiplier with warmup 0 and a warmdown over all N steps to final_lr_frac 0.1.
#   - the fused kernel rounds the update and eta to bf16 on GPU, and so does the bf16 path here; the fp32 path (CPU)
#     applies eta in fp32.
#   - one torch.compile'd kernel per same-shape stack (AdamW: one per tensor); here the same on CUDA (AdamW: one
#     foreach op per formula term and group), eager on CPU, where inductor's fusion would change the rounding.

# MuonHAdamW: the optional settings of a group of each kind, with their defaults
GROUP_DEFAULTS = {"muonh": {"momentum": MUONH_MOMENTUM, "ns_steps": NS_STEPS},
                  "adamw": {"betas": ADAM_BETAS, "eps": ADAM_EPS}}
# build_optimizer: contract group name -> (optimizer kind, key of its peak LR in the hyperp_lrs dict)
GROUPS = {"matrix": ("muonh", "muonh_lr"), "wte": ("adamw", "wte_lr"), "lm_head": ("adamw", "lm_head_lr"),
          "norm": ("adamw", "norm_lr"), "hc": ("adamw", "hc_lr")}


# -----------------------------------------------------------------------------
# HyperP learning-rate transfer (paper §4.1, App. D.2)

def reference(n_loops, aspect_ratio=64, head_dim=128, n_layers_eff=20, n_layers_prelude=2, n_layers_coda=2):
    """(d_model_ref, D_ref): the HyperP reference of a run, its ONE definition (train.py and the CLI call it).

    The release (scripts/base_train.py) builds the reference at s = REF_SCALE = 10 of the run's aspect ratio:
      d_model_ref = 10 x aspect_ratio, the muP width anchor w = (d / d_model_ref)^-1/2, NOT rounded (D_REF_DIM);
      D_ref = 10 x the effective params of the reference model, whose own width is 10 x aspect_ratio rounded UP
              to a multiple of head_dim (as the release builds every model), counted at the run's r.
    The two widths differ only when 10 x aspect_ratio is not a multiple of head_dim (never on the paper's grid: 640).
    The layout is the run's depth (l_eff, prelude, coda; see reference_tokens); the paper's defaults give the release's
    constants, 983,315,200 (r=1), 606,380,800 / 1,016,083,200 / 1,835,488,000 (r = 2 / 4 / 8).
    Its arguments are a run's checked config (ModelConfig, or this file's CLI), so they are trusted here."""
    width = REF_SCALE * aspect_ratio
    built = -(-width // head_dim) * head_dim                 # the reference model's width (ceil to head_dim)
    return width, reference_tokens(n_loops, built, n_layers_eff, n_layers_prelude, n_layers_coda)


def reference_tokens(n_loops, d_model=D_MODEL_REF, n_layers_eff=20, n_layers_prelude=2, n_layers_coda=2,
                     ratio=REF_DATA_RATIO, ref_loops=4):
    """D_ref: `ratio` x the reuse-weighted, embedding-free parameter count of a reference model of width d_model,
    counted at the TRAINING run's r = n_loops (App. D.2; optimizer.md §2.3). Which width: reference() decides.

    The release (scripts/base_train.py, build_reference_model + get_scaling_params) builds one reference per family
    and takes its effective params with the run's own num_recur, not the reference's:
        r = 1:   0-20-0 passthrough     l_eff (12 d^2 + 2 d) + 3 d                          -> 983,315,200 at d = 640
        r > 1:   2-4-2 linear injection (p + c)(12 d^2 + 2 d) + 3 d + r [l_rec (12 d^2 + 2 d) + 2 d^2]
                 = 19,667,840 + r 20,485,120 at d = 640
    (12 d^2 per block: Q, K, V, O and the 4x MLP; 2 d: its two RMSNorm gains; 3 d: the three model norms; 2 d^2:
    W_inject, run once per loop.) So the looped reference is NOT one constant: an r=2 run is referenced against a
    smaller D_ref than an r=8 run, which moves its MuonH LR by (D_ref(r)/D_ref(4))^0.32 (1.18x less at r=2).
    D_ref must not follow the current model's width: that would cancel the horizon correction.
    Other depths (a project generalisation; the paper's grid gives the release's numbers): the reference keeps the
    run's l_eff and prelude/coda, with a recurrent block of (l_eff - p - c) / ref_loops layers (2-4-2 at l_eff = 20;
    1-2-1 for the CPU mini study's l_eff = 10; a fractional count is kept as it is, it only sets a constant).
    """
    block = 12 * d_model ** 2 + 2 * d_model           # one transformer block, gains included (§3.2 n_b + norms)
    if n_loops == 1:                                  # r=1 family: one plain stack, passthrough, no W_inject
        return int(ratio * (n_layers_eff * block + 3 * d_model))
    once = n_layers_prelude + n_layers_coda
    l_rec = (n_layers_eff - once) / ref_loops         # 4 at the paper's 2-4-2; > 0 for any layout that exists
    effective = once * block + 3 * d_model + n_loops * (l_rec * block + 2 * d_model ** 2)   # counted at the run's r
    return int(round(ratio * effective))


def hyperp_lrs(d_model, n_loops, tokens, batch_tokens=BATCH_REF, base_lr=MUONH_LR, d_ref=None,
               d_model_ref=D_MODEL_REF, batch_ref=BATCH_REF):
    """Peak LR of every group for a run of width d_model, r = n_loops, D = tokens, B = batch_tokens.

    (d_model_ref, d_ref) come from reference(); left out, they are the paper's (reference(n_loops)). A d_ref alone
    overrides D_ref; a non-paper d_model_ref needs its d_ref too, so no second rule for D_ref exists here.
    batch_ref is the batch at which the base LRs were tuned (App. D.1: 2^18 tokens). A scaled-down study whose
    batch is far below it (the CPU mini study runs ~2K-token steps) re-anchors here instead of extrapolating the
    (B/B_ref)^0.558 rule two orders of magnitude outside the range it was fitted on.

    D is the run's token horizon: int(C / F_train) for grid runs (release base_train.py, target-FLOPs path).
    MuonH gets no width factor: the sphere radius R ∝ sqrt(d_out) already transfers across width (HyperP Thm 2).
    Only MuonH gets the data factor and only MuonH, wte and lm_head the batch factor (release base_train.py).
    There is no depth factor: l_eff = 20 for every r.
    """
    if d_ref is None:
        assert d_model_ref == D_MODEL_REF, "a non-paper d_model_ref needs the d_ref optim.reference() gives with it"
        d_ref = reference(n_loops)[1]
    # width w: the muP rule, applied to AdamW only (release setup_optimizer); batch b
    w, b = (d_model / d_model_ref) ** -0.5, (batch_tokens / batch_ref) ** BATCH_EXP
    # eta = 0.014 b (D/D_ref)^-0.32 (App. D.2); norm and hc are hard-coded without b in the release
    return {"muonh_lr": base_lr * b * (tokens / d_ref) ** -DATA_EXP, "wte_lr": WTE_LR * b * w,
            "lm_head_lr": LM_HEAD_LR * b * w, "norm_lr": NORM_LR * w, "hc_lr": HC_LR * w}


# -----------------------------------------------------------------------------
# Schedule: no warmup, linear decay to 10% (§4.1; release base_train.py with warmdown ratio 1, final frac 0.1)

def lr_multiplier(step, total_steps):
    """1 at step 0, falling linearly to 0.1 at step == total_steps (the loop's final, eval-only step)."""
    return FINAL_LR_FRAC + (1.0 - FINAL_LR_FRAC) * (total_steps - step) / total_steps


def set_lr_multiplier(optimizer, mult):
    """lr = initial_lr * mult for every group (the multiplier is shared by all groups; momentum is never scheduled)."""
    for group in optimizer.param_groups:
        group["lr"] = group["initial_lr"] * mult


# -----------------------------------------------------------------------------
# MuonH math (HyperP; release nanochat/optim.py muon_step_fused)

def polar_express(G, steps=NS_STEPS, bf16=None):
    """Approximate polar factor U V^T of each matrix in G (..., rows, cols), with singular values in [0.859, 1.141].

    bf16 on CUDA (as the release), fp32 on CPU (fp64 stays fp64: the DDP test runs in fp64); bf16=True/False forces
    it (train.py --precision: bf16 on CPU runs the CUDA numerics, fp32 on CUDA the CPU ones). The input is
    pre-scaled by 1.02 ||G||_F so all singular values lie below 1, where the polynomials are designed to work.
    p(X) = a X + b X X^T X + c (X X^T)^2 X, the odd quintic above, grouped through the SMALL Gram matrix, as the
    release writes it: wide (rows <= cols) A = X X^T, X <- a X + (b A + c A^2) X; tall A = X^T X,
    X <- a X + X (b A + c A^2) in bf16 (the release's kernel), the wide form on the transpose in fp32 (see below)."""
    bf16 = G.is_cuda if bf16 is None else bf16
    X = G.to(torch.bfloat16 if bf16 else torch.promote_types(G.dtype, torch.float32))   # fp64 stays fp64
    X = X / (X.norm(dim=(-2, -1), keepdim=True) * 1.02 + 1e-6)     # ||X||_2 <= ||X||_F < 1
    tall = X.size(-2) > X.size(-1)
    # bf16 iterates a tall matrix in the release's X^T X form, op for op (its kernel, bitwise). fp32 / fp64 iterate
    # it on its transpose, as every earlier nanoloop run did: the two forms are equal in exact arithmetic but differ
    # by an ulp at some small shapes (e.g. 32 x 8, the mini study's s = 1 MLP), so the fp32 results stay bit for bit.
    gram_right = tall and X.dtype == torch.bfloat16
    flip = tall and not gram_right
    X = X.mT if flip else X                                         # flipped: (..., cols, rows), now wide
    for a, b, c in POLAR_EXPRESS_COEFFS[:steps]:
        A = X.mT @ X if gram_right else X @ X.mT                    # (..., k, k), k = min(rows, cols)
        B = b * A + c * (A @ A)                                     # (..., k, k)
        X = a * X + (X @ B if gram_right else B @ X)
    return X.mT if flip else X


def muonh_update(G, W, M, R, mu, lr, ns_steps=NS_STEPS, bf16=None):
    """One MuonH step for a stack of K same-shape matrices: what the release's fused kernel does, op for op.
    Returns the new weights (K, rows, cols); W itself is not written (inductor 2.13 miscompiles an in-place retraction
    that reduces over the tensor it writes: KeyError 'buf28' on CPU, the release's kernel included).

    G: (K, rows, cols) gradients, overwritten (it ends as the Nesterov direction); W: (K, rows, cols) weights;
    M: their momentum, updated in place; R: (K, 1, 1) radii ||W_0||_F (fp32; fp64 for fp64 weights).
    mu, lr: Python floats (the CPU fp32 path: eta applied in fp32, one rounding) or 0-d fp32 CPU tensors (the bf16
    and compiled paths). As tensors they are rounded as the release rounds them: mu to G's dtype, eta and eta U to
    the update's dtype (bf16: 0.014 -> 0.013977), and one compiled graph then serves every LR of the schedule.
    Any scalar on the orthogonalised direction (e.g. Muon's sqrt(max(1, rows/cols)) shape factor) cancels in the
    rescale to R, so there is none: every matrix takes the same angular step eta.
    """
    mu = mu.to(G.dtype) if isinstance(mu, torch.Tensor) else mu
    M.lerp_(G, 1 - mu)                                              # m <- mu m + (1-mu) g
    N = G.lerp_(M, mu)                                              # n = g + mu (m - g): Nesterov look-ahead
    O = polar_express(N, ns_steps, bf16)                            # (K, rows, cols), bf16 or fp32
    U = O * (R.to(O.dtype) / O.norm(dim=(-2, -1), keepdim=True).clamp_min(1e-10))   # ||U_k||_F = R_k
    # W' = W - eta U: a tensor eta as the release rounds it (eta and eta U in U's dtype), a float eta in fp32
    W = W - lr.to(U.dtype) * U if isinstance(lr, torch.Tensor) else W.sub(U, alpha=lr)
    return W * (R.to(W.dtype) / W.norm(dim=(-2, -1), keepdim=True).clamp_min(1e-10))  # retract: R W' / ||W'||_F


# As the release: one fused graph per stack shape, its LR and momentum passed as 0-d CPU tensors (a new float would
# recompile); fullgraph, so a graph break is an error, never a silent fallback to eager. Dynamo keeps its graphs on
# the function's code object and allows 8 per code object (recompile_limit; past it, fullgraph fails): one shared
# compiled muonh_update died after 8 shapes in a process that built models of 3 widths (issue 25). So every stack
# signature gets its own copy of the code object, compiled once: one graph each, never a recompile, any number of
# shapes, and each graph the same as before (same specialisation, so the same kernels and the same bits).
_COMPILED = {}      # (shape, dtype, device, ns_steps, bf16) -> compiled muonh_update, shared by every optimizer


def _compiled_update(W, ns_steps, bf16):
    """The compiled muonh_update for stacks like W (K, rows, cols), built on first use."""
    key = (tuple(W.shape), W.dtype, W.device, ns_steps, bf16)
    if key not in _COMPILED:
        f = muonh_update
        fresh = type(f)(f.__code__.replace(), f.__globals__, f.__name__, f.__defaults__)   # a new code object
        _COMPILED[key] = torch.compile(fresh, dynamic=False, fullgraph=True)
    return _COMPILED[key]


# -----------------------------------------------------------------------------
# The optimizer: one object, MuonH groups + AdamW groups, so one state_dict holds everything
#
# Distributed step (optimizer.md §4). The release has no DDP: its optimizer reduce-scatters every same-shape gradient
# stack, so rank k receives the mean gradients of whole matrices [k c, (k+1) c), orthogonalises only those, and
# all-gathers the results. nanoloop keeps DDP in train.py, and DDP has already all-reduced every gradient during the
# backward (bucket by bucket, overlapped with it). An all-reduce is a reduce-scatter plus an all-gather, so every
# rank already holds the mean gradients of the matrices it owns and simply slices them ("all-reduce + slice"): no
# gradient traffic of the optimizer's own, no no_sync bookkeeping, AdamW untouched. Sharding then saves what it is
# for: each rank runs 1/W of the Polar Express FLOPs and keeps 1/W of the momenta and radii. Against a replicated
# optimizer it adds one fp32 all-gather of the matrices per step (launched per stack, overlapping the next stack and
# AdamW; its receive buffers are one transient param-sized copy); against the release, that is one all-gather of
# gradient volume more, hidden under the backward. It is exact by construction: the owner computes from the same
# mean gradient and the same weights what the replicated optimizer computes, and the all-gather copies bits
# (tests/test_optim.py: 2 and 3 gloo ranks vs 1 process and vs the replicated optimizer: bit-identical on CPU).
# Ownership: a stack of K matrices is padded to P = ceil(K / W) W slots and rank k owns [k c, (k+1) c) ∩ [0, K),
# c = P / W, as the release. K < W (the single W_inject) leaves ranks idle: correct, just unbalanced. With W = 1
# the one rank owns every matrix and no collective runs: the replicated optimizer, on the same code path.

class MuonHAdamW(torch.optim.Optimizer):
    """MuonH on "muonh" groups, AdamW on "adamw" groups; one step(), one state_dict().

    Each group dict: params, kind ("muonh" | "adamw"), lr, and optionally name, momentum/ns_steps (MuonH),
    betas/eps (AdamW). initial_lr is set to lr. State per parameter:
      MuonH: R (0-d fp32, ||W||_F at the first step, never recomputed so rounding cannot random-walk the radius),
             momentum_buffer (like W), step (0-d fp32 on CPU).
      AdamW: exp_avg, exp_avg_sq (like the param), step (0-d fp32 on CPU), as torch.optim.AdamW.
    No weight decay anywhere (first-order no-op on the sphere, HyperP Thm 1; paper §4.1), no gradient clipping,
    no NorMuon second moment (the release's docstring mentions one; its kernel has none).
    Few ops per step (issue 19): a stack's momenta, radii and steps live in one stacked tensor whose slices ARE the
    per-parameter state (_packed), so a same-shape stack costs one stack of W and of G, one muonh_update (compiled to
    a fused kernel on CUDA: compile=None means "if the matrices are on CUDA"), one foreach copy back; AdamW is one
    foreach op per formula term per group. runs/op_count.py counts them.

    shard=True under an initialised torch.distributed splits MuonH over the default group's ranks (the design note
    above): MuonH state then exists only for owned matrices. Without a process group, or with shard=False, every rank
    owns every matrix: the replicated optimizer, with no collective anywhere. Sharded, every rank must call step()
    and state_dict() (collectives) with identical, already averaged gradients, which DDP provides.
    """

    def __init__(self, param_groups, shard=True, polar_bf16=None, compile=None):
        self.polar_bf16 = polar_bf16    # Polar Express in bf16: None = on CUDA only (see polar_express)
        groups = []
        for i, g in enumerate(param_groups):
            g = {**GROUP_DEFAULTS[g["kind"]], "name": f"{g['kind']}{i}", **g, "params": list(g["params"])}
            # MuonH orthogonalises matrices; gains and vectors belong to AdamW (model.param_groups sorts them)
            assert g["kind"] == "adamw" or all(p.ndim == 2 for p in g["params"]), "MuonH takes only 2-D matrices"
            # R = ||W_0||_F = 0 (a fork's zero-initialised nn.Linear; App. C.1 has none) and MuonH could never move
            # the matrix: refused here, on every rank alike and before any state exists, not in the first step.
            for p in g["params"] if g["kind"] == "muonh" else []:
                r = torch.linalg.vector_norm(p.detach()).item()
                if not (math.isfinite(r) and r > 0):
                    raise ValueError(f"group {g['name']!r}: a {p.shape[0]}x{p.shape[1]} matrix has Frobenius norm {r}; "
                                     "MuonH needs R = ||W_0||_F > 0")
            groups.append(dict(g, initial_lr=g["lr"]))
        super().__init__(groups, defaults={})   # raises if a parameter appears in two groups
        distributed = shard and dist.is_available() and dist.is_initialized()
        self.rank, self.world = (dist.get_rank(), dist.get_world_size()) if distributed else (0, 1)
        # The ownership plan, fixed here and identical on every rank: per group, its same-shape MuonH stacks.
        self._stacks = [self._plan(g) if g["kind"] == "muonh" else [] for g in self.param_groups]
        self._not_owned = {id(p) for stacks in self._stacks for params, lo, hi, _ in stacks
                           for i, p in enumerate(params) if not lo <= i < hi}
        self._packs = {}         # (state key, param ids) -> (stacked tensor, its slices handed out as the state)
        cuda = any(p.is_cuda for g in self.param_groups if g["kind"] == "muonh" for p in g["params"])
        self._compiled = cuda if compile is None else compile
        self._tensor_scalars = self._compiled or bool(polar_bf16) or (polar_bf16 is None and cuda)
        self._mu_t, self._lr_t = torch.tensor(0.0), torch.tensor(0.0)

    def _plan(self, group):
        """[(params, lo, hi, c)] per same-shape stack of a MuonH group: this rank owns params[lo:hi], c per rank.

        Stacking same-shape matrices (Q, K, V, O, fc, proj, inject of all blocks) makes each Polar Express iteration
        one batched matmul per shape; norms stay per slice, so it equals running every matrix on its own."""
        buckets = {}
        for p in group["params"]:
            buckets.setdefault((tuple(p.shape), p.dtype, p.device), []).append(p)
        plan = []
        for params in buckets.values():
            c = -(-len(params) // self.world)                      # ceil(K / W) slots per rank
            lo = min(self.rank * c, len(params))
            plan.append((params, lo, min(lo + c, len(params)), c))
        return plan

    @torch.no_grad()
    def step(self, closure=None):
        with torch.enable_grad():
            loss = closure() if closure is not None else None
        gathers = []        # MuonH all-gathers in flight while the next stack and AdamW compute
        for group, stacks in zip(self.param_groups, self._stacks):
            if group["kind"] == "muonh":
                for stack in stacks:                               # one fused update per same-shape stack
                    gathers += self._step_muonh(group, *stack)
            else:
                self._step_adamw(group)                            # replicated: small tensors, every rank
        for handle, full, params, lo, hi in gathers:               # finish: copy in the matrices others own
            handle.wait()
            for i, p in enumerate(params):
                if not lo <= i < hi:
                    p.copy_(full[i])
        return loss

    def _step_muonh(self, group, params, lo, hi, c):
        """MuonH on the owned matrices params[lo:hi] of one same-shape stack (their gradients are already the mean
        over ranks: DDP), then launch the all-gather of the owned chunk. Returns the pending gathers ([] if W = 1)."""
        if all(p.grad is None for p in params):                    # same on every rank: DDP grads every param
            return []
        own = params[lo:hi]
        rdt = torch.promote_types(params[0].dtype, torch.float32)             # R in fp32 (fp64 for fp64 params)
        act = [p for p in own if p.grad is not None]
        for p in [q for q in act if not self.state[q]]:     # first step: cache R from the init weights, zero momentum
            self.state[p].update(R=torch.linalg.vector_norm(p, dtype=rdt), momentum_buffer=torch.zeros_like(p),
                                 step=torch.tensor(0.0))
        if act:
            W = torch.stack(act)                                               # (k, rows, cols), k <= c owned
            G = torch.stack([p.grad for p in act])                             # (k, rows, cols) mean gradients
            M, R, S = (self._packed(act, key) for key in ("momentum_buffer", "R", "step"))   # (k, ...) state
            S.add_(1)
            mu, lr = group["momentum"], group["lr"]
            if self._tensor_scalars:                 # 0-d CPU tensors: the release's rounding, one compiled graph
                mu, lr = self._mu_t.fill_(mu), self._lr_t.fill_(lr)
            bf16 = W.is_cuda if self.polar_bf16 is None else self.polar_bf16
            update = _compiled_update(W, group["ns_steps"], bf16) if self._compiled else muonh_update
            W = update(G, W, M, R.view(-1, 1, 1), mu, lr, group["ns_steps"], bf16)
            torch._foreach_copy_(act, list(W.unbind(0)))                       # the weights take the new values
        if self.world == 1:                  # owns the whole stack: nothing to gather (the replicated optimizer)
            return []
        # Every rank sends its c owned slots (zero-padded past K) and receives the whole padded stack.
        send = torch.stack(own + [torch.zeros_like(params[0])] * (c - len(own)))         # (c, rows, cols)
        full = send.new_empty((c * self.world, *params[0].shape))                      # (P, rows, cols)
        return [(dist.all_gather_into_tensor(full, send, async_op=True), full, params, lo, hi)]

    def _step_adamw(self, group):
        """AdamW exactly as torch.optim.AdamW's single-tensor path computes it (decoupled WD = 0, so no decay term),
        one foreach op per term for the whole group (on CPU torch loops the same per-tensor kernels: same bits)."""
        beta1, beta2 = group["betas"]
        live = [p for p in group["params"] if p.grad is not None]
        if not live:
            return
        for p in [q for q in live if not self.state[q]]:                    # first step: zero moments
            self.state[p].update(step=torch.tensor(0.0), exp_avg=torch.zeros_like(p), exp_avg_sq=torch.zeros_like(p))
        steps = self._packed(live, "step")                                   # (n,) fp32 on CPU
        ts = steps.add_(1).tolist()                                          # no device sync: steps live on CPU
        m, v = ([self.state[p][k] for p in live] for k in ("exp_avg", "exp_avg_sq"))
        g = [p.grad for p in live]
        torch._foreach_lerp_(m, g, 1 - beta1)                                # first moment
        torch._foreach_mul_(v, beta2)
        torch._foreach_addcmul_(v, g, g, value=1 - beta2)                    # second moment
        denom = torch._foreach_sqrt(v)
        torch._foreach_div_(denom, [math.sqrt(1 - beta2 ** t) for t in ts])  # bias corrections
        torch._foreach_add_(denom, group["eps"])
        torch._foreach_addcdiv_(live, m, denom, [-group["lr"] / (1 - beta1 ** t) for t in ts])

    def _packed(self, params, key):
        """The state[key] of params as ONE stacked tensor (k, ...) whose slices are the state tensors themselves, so
        an in-place op on it updates every parameter's state (and state_dict sees it). Built on first use; rebuilt
        (one copy) whenever a state tensor was replaced, e.g. by load_state_dict."""
        views = [self.state[p][key] for p in params]
        pack = self._packs.get((key, *map(id, params)))
        if pack is None or any(a is not b for a, b in zip(pack[1], views)):
            buf = torch.stack(views)
            pack = self._packs[(key, *map(id, params))] = (buf, buf.unbind(0))
            for p, view in zip(params, pack[1]):
                self.state[p][key] = view
        return pack[0]

    def state_dict(self):
        """torch's state_dict, in the replicated format whatever the world size: every MuonH matrix's R, momentum
        and step, gathered from their owners (a collective when sharded; every rank gets the full state).

        So a checkpoint does not depend on the world size it was written at: load_state_dict at any world size keeps
        the part it owns. The full momenta exist on every rank only during this call (one param-sized copy)."""
        sd = super().state_dict()                  # AdamW and owned MuonH state; positions index the params
        if self.world == 1:
            return sd
        index = {id(p): i for i, p in enumerate(p for g in self.param_groups for p in g["params"])}
        for params, lo, hi, c in (stack for stacks in self._stacks for stack in stacks):
            p0 = params[0]
            M = torch.zeros((c, *p0.shape), dtype=p0.dtype, device=p0.device)     # (c, rows, cols) owned momenta
            meta = torch.zeros((c, 3), dtype=torch.float64, device=p0.device)     # (has state, R, step): fp64
            for j, s in enumerate(self.state.get(p) for p in params[lo:hi]):     # holds fp32 R and counts exactly
                if s:
                    M[j] = s["momentum_buffer"]
                    meta[j, 0], meta[j, 1], meta[j, 2] = 1.0, s["R"], s["step"]
            M_all, meta_all = M.new_empty((c * self.world, *p0.shape)), meta.new_empty((c * self.world, 3))
            dist.all_gather_into_tensor(M_all, M)
            dist.all_gather_into_tensor(meta_all, meta)
            meta_all = meta_all.cpu()
            rdt = torch.promote_types(p0.dtype, torch.float32)
            for i, p in enumerate(params):
                sd["state"].pop(index[id(p)], None)
                if meta_all[i, 0]:                  # same keys, dtypes and devices as the replicated optimizer's
                    sd["state"][index[id(p)]] = {"R": meta_all[i, 1].to(device=p.device, dtype=rdt),
                                                 "momentum_buffer": M_all[i].clone(),
                                                 "step": meta_all[i, 2].to(torch.float32)}
        sd["state"] = dict(sorted(sd["state"].items()))
        return sd

    def load_state_dict(self, state_dict):
        """As torch's, but refuses a group layout that does not match, keeps R in fp32, and keeps only the MuonH
        state of owned matrices (any full-format state_dict loads at any world size, including replicated ones).

        torch casts every floating state tensor to its parameter's dtype on load; R must stay fp32 (a bf16 radius
        would move the sphere), so it is restored from the saved tensor afterwards.
        """
        saved = state_dict["param_groups"]
        mine, theirs = ([(g.get("name"), g.get("kind")) for g in groups] for groups in (self.param_groups, saved))
        if mine != theirs:
            raise ValueError(f"optimizer state_dict has a different group layout: {theirs} vs {mine}")
        ids = [i for g in saved for i in g["params"]]
        params = [p for g in self.param_groups for p in g["params"]]
        keep = {pid: state_dict["state"][pid] for pid, p in zip(ids, params)
                if pid in state_dict["state"] and id(p) not in self._not_owned}
        super().load_state_dict({**state_dict, "state": keep})
        for pid, p in zip(ids, params):
            R = keep.get(pid, {}).get("R")
            if R is not None:                       # fp32 (fp64 for fp64 params), as the first step made it
                self.state[p]["R"] = R.detach().to(p.device, torch.promote_types(p.dtype, torch.float32)).clone()


def build_optimizer(groups, lrs, shard=True, polar_bf16=None, compile=None):
    """One MuonHAdamW over the model's labelled groups (LoopedGPT.param_groups()) with peak LRs from hyperp_lrs.

    "matrix" -> MuonH at lrs["muonh_lr"]; "wte", "lm_head", "norm", "hc" -> AdamW at lrs["<name>_lr"].
    Empty groups are skipped (e.g. no "hc" without hyperconnections; none at all is torch's ValueError). Under DDP
    build it on every rank; shard splits MuonH over the ranks (MuonHAdamW), shard=False keeps a replicated optimizer.
    """
    assert set(groups) <= set(GROUPS), f"group names are {list(GROUPS)}"
    param_groups = [dict(name=name, kind=kind, params=list(groups[name]), lr=lrs[lr_key])   # fixed order, so
                    for name, (kind, lr_key) in GROUPS.items() if groups.get(name)]         # checkpoints line up
    return MuonHAdamW(param_groups, shard=shard, polar_bf16=polar_bf16, compile=compile)
