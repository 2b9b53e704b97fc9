"""
tests/ddp_optim_worker.py -- a few optimizer steps of a tiny LoopedGPT, on 1 process or under torchrun DDP.

Used by tests/test_optim.py (issue 3 item 6, issue 13 §1): under torchrun the optimizer shards MuonH (each rank owns
whole matrices, all-gathers the updates), and W ranks stepping on DDP-averaged gradients must end with the weights
and the optimizer state of 1 process stepping on the same global batch; a checkpoint written at one world size must
resume at another. GLOBAL_ROWS = 6 so that 1, 2 and 3 ranks split every global batch evenly.
Precision: the all-reduce sums the gradients in another order than one process's backward (about 1e-7 relative in
fp32), and AdamW with eps = 1e-10 divides by |g| elementwise: for near-zero gradient entries that rounding noise
becomes a visible step (measured: ~1e-4 in wte after 5 fp32 steps). fp64 removes the rounding and leaves only the
semantics, which must agree to 1e-9 (they agree to ~1e-13), so the exact comparisons run in fp64. One fp32 step
remains inside an fp64 model: model.py computes the loss on fp32 logits, so a token mean's 1/N is rounded to fp32.
1/96 (6 rows) and 1/32 (3 ranks x 2 rows) round differently (1/3 is no power of 2): a 3e-8 relative gradient scale,
which AdamW on rare wte rows turns into 1e-5. So the 1-process reference splits each global batch the way the ranks
do (`micro`: micro-batches whose gradients are averaged in the parameter dtype, as DDP averages ranks).
Run:  torchrun --standalone --nproc_per_node=2 tests/ddp_optim_worker.py OUT_DIR [RESUME_CKPT ...]
      writes OUT_DIR/rank{k}.pt (weights, gathered optimizer state, owned MuonH states per run) and OUT_DIR/ckpt.pt
      (the fp64 sharded run after SAVE_AT steps); each RESUME_CKPT is resumed here to STEPS in fp64.
"""
import os
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from model import LoopedGPT, ModelConfig
from optim import build_optimizer, hyperp_lrs, lr_multiplier, set_lr_multiplier

STEPS = 5            # optimizer steps
SAVE_AT = 3          # the checkpoint (ckpt.pt) is written after this many steps
GLOBAL_ROWS = 6      # rows per optimizer step, all ranks together (the global batch); 1, 2 and 3 ranks divide it
SEQ_LEN = 16
VOCAB = 64


def tiny_config():
    # d = 32, 1-2-1 looped layout at r = 2 (l_eff = 4), linear injection: every MuonH shape incl. W_inject (K = 1,
    # so some ranks own no inject matrix), and stacks of K = 12 (d x d) and 3 (4d x d, d x 4d): 3 ranks split 3 evenly,
    # 2 ranks split it 2 + 1 (padded)
    return ModelConfig(scale=1, aspect_ratio=32, head_dim=16, n_loops=2, n_layers_eff=4, n_layers_prelude=1,
                       n_layers_coda=1, vocab_size=VOCAB, seq_len=SEQ_LEN)


def global_batches():
    """(STEPS, GLOBAL_ROWS, SEQ_LEN + 1) tokens, identical on every rank (fixed seed)."""
    gen = torch.Generator().manual_seed(1234)
    return torch.randint(0, VOCAB, (STEPS, GLOBAL_ROWS, SEQ_LEN + 1), generator=gen)


def train(rank=0, world=1, dtype=torch.float64, shard=True, resume=None, save=None, micro=(1, 1)):
    """Train to STEPS; rank k takes the k-th contiguous slice of each global batch.

    shard: MuonH sharded over the ranks (False: the replicated optimizer on every rank). resume: a checkpoint path
    to continue from; save: where rank 0 writes the checkpoint after SAVE_AT steps (every rank gathers the state).
    micro (1 process only): micro-batches per step before / from SAVE_AT, i.e. the world size the run emulates.
    Returns {"weights", "optim" (the full state_dict), "owned" (MuonH matrices with state on this rank)}."""
    if any(GLOBAL_ROWS % (world * m) for m in micro) or (world > 1 and micro != (1, 1)):
        raise ValueError(f"world {world} x micro-batches {micro} must divide {GLOBAL_ROWS} rows (micro: 1 process)")
    torch.manual_seed(0)                                   # same init on every rank (DDP also broadcasts rank 0's)
    model = LoopedGPT(tiny_config()).to(dtype)
    cfg = model.cfg
    # D = 1e8 tokens (a tenth of D_ref) gives eta_MuonH = 0.029, a realistic short-horizon LR
    lrs = hyperp_lrs(cfg.d_model, cfg.n_loops, tokens=10 ** 8)
    opt = build_optimizer(model.param_groups(), lrs, shard=shard)
    start = 0
    if resume is not None:                                 # a checkpoint from any world size
        ckpt = torch.load(resume, weights_only=True)
        model.load_state_dict(ckpt["model"])
        opt.load_state_dict(ckpt["optim"])
        start = ckpt["step"]
    net = DDP(model) if world > 1 else model               # DDP averages the gradients over ranks
    rows = GLOBAL_ROWS // world
    for step, batch in enumerate(global_batches()):
        if step < start:
            continue
        local = batch[rank * rows:(rank + 1) * rows]       # (rows, SEQ_LEN + 1): this rank's slice
        set_lr_multiplier(opt, lr_multiplier(step, STEPS))
        m = micro[step >= SAVE_AT]
        for part in local.chunk(m):                        # (rows / m, SEQ_LEN + 1) each
            net(part[:, :-1], part[:, 1:]).backward()      # mean over its tokens; DDP mean of means = global mean
        if m > 1:
            for p in model.parameters():
                p.grad.div_(m)                             # the mean over micro-batches, as DDP's over ranks
        opt.step()
        opt.zero_grad(set_to_none=True)
        if save is not None and step + 1 == SAVE_AT:
            state = opt.state_dict()                       # a collective when sharded: every rank calls it
            if rank == 0:
                torch.save({"model": model.state_dict(), "optim": state, "step": SAVE_AT}, save)
    owned = sum(bool(opt.state.get(p)) for p in model.param_groups()["matrix"])
    return {"weights": {k: v.detach().clone() for k, v in model.state_dict().items()}, "optim": opt.state_dict(),
            "owned": owned}


if __name__ == "__main__":
    out_dir, resumes = sys.argv[1], sys.argv[2:]
    dist.init_process_group("gloo")                        # CPU: gloo (torchrun sets RANK / WORLD_SIZE / MASTER_*)
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.set_num_threads(1)
    runs = {"sharded_float64": train(rank, world, torch.float64, save=os.path.join(out_dir, "ckpt.pt")),
            "sharded_float32": train(rank, world, torch.float32),
            "replicated_float32": train(rank, world, torch.float32, shard=False)}
    for path in resumes:
        runs[f"resumed:{path}"] = train(rank, world, torch.float64, resume=path)
    torch.save(runs, os.path.join(out_dir, f"rank{rank}.pt"))
    dist.barrier()
    dist.destroy_process_group()
