"""Shared pytest fixtures: tiny prepared corpora and a 2-rank torchrun launcher (CPU, gloo)."""
import os
import random
import subprocess
import sys

import pytest

# Tiny test shapes run faster on one thread than on two, and the suite stays quick on a loaded 2-core box.
os.environ.setdefault("OMP_NUM_THREADS", "1")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)  # the project is flat top-level files, not a package


@pytest.fixture(scope="session")
def tiny_data(tmp_path_factory):
    """A tiny packed corpus (vocab 128, seq_len 32) with a repetitive structure a model can learn.

    Documents are short random walks over a small alphabet, written through data.prepare_docs so the layout is
    exactly what `python data.py prepare` writes. Returns the directory.
    """
    import data
    rng = random.Random(0)
    docs = []
    for _ in range(600):
        n = rng.randint(5, 60)
        start = rng.randint(2, 120)
        docs.append([2 + (start + 3 * i) % 126 for i in range(n)])   # arithmetic progressions mod 126: learnable
    out = tmp_path_factory.mktemp("tiny_data")
    data.prepare_docs(docs, str(out), seq_len=32, vocab_size=128, bos_id=1,
                      tokenizer_hash="synthetic-test", val_docs=60, seed=0, source="tests/conftest.py synthetic")
    return str(out)


def run_torchrun(args, nproc=2, timeout=240, env=None):
    """Run `torchrun --standalone --nproc_per_node=N <args>` from the repo root; return CompletedProcess."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}", *args]
    full_env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=ROOT)
    full_env.update(env or {})
    proc = subprocess.run(cmd, cwd=ROOT, env=full_env, capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise AssertionError(f"torchrun failed ({proc.returncode}):\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}")
    return proc
