"""torchrun worker for tests/test_eval.py: val_loss and one continuation task, sharded over the ranks (gloo, CPU).

Usage: torchrun --standalone --nproc_per_node=2 tests/ddp_eval_worker.py DATA_DIR WEIGHTS.pt N_TOKENS TOK.model OUT.json
Every rank loads the same weights; rank 0 writes {"world", "val_loss", "task"} to OUT.json.
"""
import json
import sys

import torch
import torch.distributed as dist

import data
import eval as E
from common import init_dist
from model import LoopedGPT, ModelConfig


def main():
    data_dir, weights, n_tokens, tok_path, out = sys.argv[1:6]
    rank, world, device = init_dist()
    ck = torch.load(weights, map_location="cpu", weights_only=True)
    cfg = ModelConfig(**ck["model_config"])
    model = LoopedGPT(cfg)
    model.load_state_dict(ck["model"])
    # val rows: this rank's contiguous shard, in device batches of 4 (the 1-rank test uses the same batch size)
    loader = data.PackedLoader(data_dir, "val", seq_len=cfg.seq_len, batch_rows=4 * world, device_batch=4,
                               rank=rank, world=world, device=device)
    loss = E.val_loss(model, loader, int(n_tokens))
    tok = data.load_tokenizer(tok_path)
    items = E.primitive_tasks(24)["var_assign_d0_math"]
    task = E.evaluate_task(model.eval(), tok, items, shots=1, seq_len=cfg.seq_len, rank=rank, world=world)
    if rank == 0:
        with open(out, "w") as f:
            json.dump({"world": world, "val_loss": loss, "task": task}, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
