"""
tests/ddp_optim_worker.py -- a few optimizer steps of a tiny LoopedGPT, on 1 process or under torchrun DDP.

Used by tests/test_optim.py (acceptance item 6 of issue 3): the optimizer is replicated, so W ranks stepping on
DDP-all-reduced gradients must end with the weights of 1 process stepping on the same global batch.
It trains twice, in fp64 and in fp32. The all-reduce sums the gradients in another order than one process's
backward (about 1e-7 relative in fp32), and AdamW with eps = 1e-10 divides by |g| elementwise: for near-zero
gradient entries that rounding noise becomes a visible step (measured: ~1e-4 in wte after 5 fp32 steps).
fp64 removes the rounding and leaves only the semantics, which must agree to 1e-5 (they agree to ~1e-13).
Run:  torchrun --standalone --nproc_per_node=2 tests/ddp_optim_worker.py OUT_DIR   (writes OUT_DIR/rank{k}.pt)
"""
import os
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from model import LoopedGPT, ModelConfig
from optim import build_optimizer, hyperp_lrs, lr_multiplier, set_lr_multiplier

STEPS = 5            # optimizer steps
GLOBAL_ROWS = 4      # rows per optimizer step, all ranks together (the global batch)
SEQ_LEN = 16
VOCAB = 64


def tiny_config():
    # d = 32, 1-2-1 looped layout at r = 2 (l_eff = 4), linear injection: every MuonH shape incl. W_inject
    return ModelConfig(scale=1, aspect_ratio=32, head_dim=16, n_loops=2, n_layers_eff=4, n_layers_prelude=1,
                       n_layers_coda=1, vocab_size=VOCAB, seq_len=SEQ_LEN)


def global_batches():
    """(STEPS, GLOBAL_ROWS, SEQ_LEN + 1) tokens, identical on every rank (fixed seed)."""
    gen = torch.Generator().manual_seed(1234)
    return torch.randint(0, VOCAB, (STEPS, GLOBAL_ROWS, SEQ_LEN + 1), generator=gen)


def train(rank=0, world=1, dtype=torch.float64):
    """Train STEPS steps; rank k takes the k-th contiguous slice of each global batch. Returns the weights."""
    if GLOBAL_ROWS % world:
        raise ValueError(f"world size {world} must divide the global batch of {GLOBAL_ROWS} rows")
    torch.manual_seed(0)                                   # same init on every rank (DDP also broadcasts rank 0's)
    model = LoopedGPT(tiny_config()).to(dtype)
    cfg = model.cfg
    # D = 1e8 tokens (a tenth of D_ref) gives eta_MuonH = 0.029, a realistic short-horizon LR
    lrs = hyperp_lrs(cfg.d_model, cfg.n_loops, tokens=10 ** 8)
    opt = build_optimizer(model.param_groups(), lrs)
    net = DDP(model) if world > 1 else model               # DDP averages the gradients over ranks
    rows = GLOBAL_ROWS // world
    for step, batch in enumerate(global_batches()):
        local = batch[rank * rows:(rank + 1) * rows]       # (rows, SEQ_LEN + 1): this rank's slice
        set_lr_multiplier(opt, lr_multiplier(step, STEPS))
        loss = net(local[:, :-1], local[:, 1:])            # mean over local tokens; DDP mean of means = global mean
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


if __name__ == "__main__":
    out_dir = sys.argv[1]
    dist.init_process_group("gloo")                        # CPU: gloo (torchrun sets RANK / WORLD_SIZE / MASTER_*)
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.set_num_threads(1)
    weights = {str(dt).split(".")[1]: train(rank, world, dt) for dt in (torch.float64, torch.float32)}
    torch.save(weights, os.path.join(out_dir, f"rank{rank}.pt"))     # {"float64": state_dict, "float32": ...}
    dist.barrier()
    dist.destroy_process_group()
