"""torchrun worker for tests/test_cluster.py: each rank runs train.main from its own folder BASE/node<rank>, so a
relative --out-dir names a different directory per rank, as node-local disks would. Usage: BASE TRAIN_ARGS..."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import train  # noqa: E402

rank = int(os.environ["RANK"])
os.chdir(os.path.join(sys.argv[1], f"node{rank}"))
try:
    train.main(*train.parse_args(sys.argv[2:]))
except ValueError as err:
    # one write() of the whole line: both ranks share the pipe, and print() may split text and newline
    os.write(1, f"rank {rank} error: {err}\n".encode())
    sys.exit(3)
