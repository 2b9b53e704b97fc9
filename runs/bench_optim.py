"""
runs/bench_optim.py -- seconds per MuonH step for the matrices of one model, on this CPU (a benchmark, not a test).

Moved out of optim.py (issue 18: benchmarks leave the core files). runs/bench.sh calls it twice: once on 1 rank,
once under torchrun with 2 gloo ranks, where the step is sharded (each rank orthogonalises the matrices it owns and
all-gathers the rest; the time includes that).
Run:  python runs/bench_optim.py [--scale 10] [--n-loops 1] [--bench-steps 3]
      torchrun --standalone --nproc_per_node=2 runs/bench_optim.py --scale 4
"""
import os, sys, time

import torch
import torch.distributed as dist

sys.path.append(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))   # the repo root, after PYTHONPATH
import common, flops, optim  # noqa: E402


def bench(d_model=640, n_loops=1, steps=3, seed=0):
    """Seconds per MuonH step (CPU, fp32) for every matrix of one model: 6 shapes per block, plus W_inject if r > 1.

    Under an initialised process group (torchrun) every rank draws the same gradients (what DDP leaves behind)."""
    n_blocks, d = sum(flops.layout(n_loops)), d_model                # 0-20-0, or 2-(16/r)-2 unique blocks (§3.1)
    # The block's matrices as model.py holds them (out, in): one stack of 4 K per (d, d) shape after grouping (c_q,
    # c_k, c_v, attn.c_proj; then mlp.c_fc, mlp.c_proj). Looped models (r > 1) add the single W_inject (d, 2 d): a
    # stack of K = 1, which sharding cannot split
    shapes = ([(d, d)] * 4 + [(4 * d, d), (d, 4 * d)]) * n_blocks + [(d, 2 * d)] * (n_loops > 1)
    # Fan-in init (App. C.1) and random gradients: the step's cost does not depend on the values, only on the shapes
    gen = torch.Generator().manual_seed(seed)
    params = [torch.nn.Parameter(torch.randn(*s, generator=gen) / s[1] ** 0.5) for s in shapes]
    for p in params:
        p.grad = torch.randn(p.shape, generator=gen)
    # One MuonH group, as build_optimizer makes it; sharded over the ranks when a process group is up
    opt = optim.MuonHAdamW([dict(kind="muonh", name="matrix", params=params, lr=optim.MUONH_LR)])
    opt.step()                                                  # warm-up: caches R, allocates momenta
    # Timed steps: the gradients stay as they are (the step does not consume them), so every step does the same work
    times, cpu = [], []
    for _ in range(steps):
        if opt.world > 1:
            dist.barrier()                                      # all ranks start the timed step together
        t0, c0 = time.perf_counter(), time.process_time()
        opt.step()
        times.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)                    # this rank's CPU time: robust on a shared machine
    # Mean and min wall seconds (min: the least disturbed step on a shared machine), and this rank's CPU seconds
    return dict(n_matrices=len(params), n_blocks=n_blocks, seconds_per_step=sum(times) / steps, min_seconds=min(times),
                cpu_seconds_per_step=sum(cpu) / steps, threads=torch.get_num_threads(), world=opt.world, rank=opt.rank)


def main(argv=None):
    """CLI: parse (one-line errors, exit 2), join the gloo group under torchrun, time, print one line on rank 0."""
    p = common.Parser(prog="runs/bench_optim.py", description="MuonH step time over an s-scale model's matrices (CPU).")
    p.add_argument("--scale", type=common.number(int, "(0, inf)"), default=10, help="width scale s (d_model = 64 s)")
    p.add_argument("--n-loops", type=common.number(int), choices=(1, 2, 4, 8, 16), default=1, help="r (must divide 16)")
    p.add_argument("--bench-steps", type=common.number(int, "(0, inf)"), default=3, help="timed steps after a warm-up")
    a = p.parse_args(argv)
    d = flops.ASPECT_RATIO * a.scale                           # d_model = 64 s, as model.py computes it (§3.1)
    # torchrun sets WORLD_SIZE: sharded MuonH over gloo CPU ranks, because this is a CPU benchmark (runs/bench.sh §2b)
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        dist.init_process_group("gloo")
    r = bench(d, a.n_loops, a.bench_steps)
    if dist.is_initialized():                                   # collective-free: safe on every rank
        dist.destroy_process_group()
    if r["rank"] == 0:                                          # one line per run: runs/bench.sh parses it
        # "s/step" and "CPU ... s" are the two numbers runs/bench.sh reads to form its 1-rank / 2-rank ratio
        ranks = f"{r['world']} ranks (sharded, gloo)" if r["world"] > 1 else "1 rank"
        print(f"MuonH step, CPU fp32, d_model {d}, r={a.n_loops}: {r['n_matrices']} matrices "
              f"({r['n_blocks']} blocks x 6 shapes{' + inject' if a.n_loops > 1 else ''}) | {ranks} | "
              f"{r['seconds_per_step']:.3f} s/step (mean of {a.bench_steps}, min {r['min_seconds']:.3f}; "
              f"rank-0 CPU {r['cpu_seconds_per_step']:.3f} s) | {r['threads']} threads per rank")
    return r


if __name__ == "__main__":
    main()
