"""
runs/op_count.py -- aten ops per optimizer step and per whole train step, on CPU (issue 19 §3; a benchmark, no test).

The model is what `train.py --scale S --n-loops R` builds (default s = 2, r = 4: the paper's 2-4-2 layout, l_eff 20,
aspect 64 -> d = 128, linear injection, vocab 32,001); only the batch (2 rows) and T (64) are small: the op count
depends on neither, nor on the width -- at s = 6 a step launches as many kernels as at s = 10, each doing less.
fp32, eager: the CPU numerics. One warm-up step first (the optimizer's first step initialises its state), then one
profiled optimizer.step() and one profiled fwd + bwd + step + zero_grad.
Two figures each: every aten op the profiler records ("all": nested ones too, e.g. the cat inside a stack, or the
per-tensor kernels a foreach op loops over on CPU) and the top-level ones, dispatched from Python (on CUDA each is
roughly one kernel launch; a foreach or compiled op is one multi-tensor kernel).
Run:  python runs/op_count.py                           (this checkout's optim.py)
      PYTHONPATH=/path/to/other/checkout python runs/op_count.py      (e.g. main's, for the before figure)
      python runs/op_count.py --compile     the CUDA path's structure (bf16, one compiled update per stack) on CPU:
                                            inductor's C++ build takes ~1 min on 2 cores
"""
import os, sys

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.append(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))   # repo root AFTER PYTHONPATH
import common, model, optim  # noqa: E402


def count(fn):
    """(all aten ops, top-level aten ops) that fn() dispatches."""
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()
    ops = [e for e in prof.events() if e.name.startswith("aten::")]

    def nested(e):                          # inside another aten op (cpu_parent climbs the recorded call tree)
        up = e.cpu_parent
        return up is not None and (up.name.startswith("aten::") or nested(up))
    return len(ops), sum(not nested(e) for e in ops)


def main(argv=None):
    """The CLI: one warm-up step, then the two profiled counts, printed (the flags are checked when parsed)."""
    p = common.Parser(prog="runs/op_count.py", description="aten ops per optimizer step and per train step (CPU).")
    p.add_argument("--compile", action="store_true", help="count the compiled bf16 MuonH path (the CUDA default)")
    p.add_argument("--scale", type=common.number(int, "[1, 64]"), default=2, help="width s (counts do not depend on s)")
    p.add_argument("--n-loops", type=common.number(int, "[1, 16]"), default=4, help="r (the grid's 1, 2, 4, 8)")
    a = p.parse_args(argv)
    torch.manual_seed(0)
    torch.set_num_threads(1)
    # Measured (issue 25): s = 6 and s = 10 at r = 1 both 4,293 top-level ops per train step (r = 8: 4,610); what
    # the width changes is the work per kernel (GEMMs ~ d^2 per token, norms and adds ~ d), not their number
    try:                                 # a width or r the model cannot build (d % head_dim, r | 16): one line
        cfg = model.ModelConfig(scale=a.scale, n_loops=a.n_loops, seq_len=64)
    except ValueError as err:
        common.fail("runs/op_count.py", err)
    net = model.LoopedGPT(cfg)
    groups = net.param_groups()          # what the optimizer holds: the "matrix" group is MuonH, the rest AdamW
    # (compile= only with --compile: another checkout's build_optimizer, for a before figure, may not take it)
    opt = optim.build_optimizer(groups, optim.hyperp_lrs(cfg.d_model, cfg.n_loops, tokens=10 ** 8),
                                **(dict(polar_bf16=True, compile=True) if a.compile else dict(polar_bf16=False)))
    # One batch of random tokens: the ops dispatched do not depend on the token values
    x = torch.randint(0, cfg.vocab_size, (2, cfg.seq_len + 1), generator=torch.Generator().manual_seed(1))

    def train_step():
        net(x[:, :-1], x[:, 1:]).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    train_step()                                                # warm-up: optimizer state is created here
    whole_all, whole_top = count(train_step)                    # fwd + bwd + step + zero_grad
    net(x[:, :-1], x[:, 1:]).backward()
    step_all, step_top = count(opt.step)                        # the optimizer step alone
    print(f"op count | {optim.__file__} | s={a.scale} r={a.n_loops} d={cfg.d_model} layout "
          f"{'-'.join(map(str, cfg.partition))}, {len(groups['matrix'])} MuonH matrices, "
          f"{sum(len(v) for k, v in groups.items() if k != 'matrix')} AdamW tensors | CPU "
          f"{'bf16, compiled MuonH update' if a.compile else 'fp32 eager'}")
    print(f"  optimizer.step():     {step_all:5d} aten ops ({step_top} top-level)")
    print(f"  whole train step:     {whole_all:5d} aten ops ({whole_top} top-level)")


if __name__ == "__main__":
    main()
