"""
checkpoint.py -- checkpoints: train.py's ckpt.pt and the authors' release directories, checked before use, and
train.py's run folder (what it holds, its atomic writes).

    read_checkpoint   a torch file -> its dict (weights_only: never unpickles code), the entries eval/train read checked
    load_weights      a state dict into a model, only if names, shapes and finiteness fit exactly
    model_bytes       what building a ModelConfig allocates, from the config alone (check_memory refuses too large)
    load_checkpoint   a run dir, a .pt file or a release dir -> (model in eval mode, checkpoint dict); the authors'
                      model_<step>.pt + meta_<step>.json mapped onto LoopedGPT exactly
    need              the one-line refusal (train.py's too)
    out_dir_state     train.py's run folder: fresh / resume / finished, decided by rank 0, checked, claimed
    save, trim_log    train.py's atomic writes of ckpt.pt / done.json, and its log cut back to the checkpoint
What a checkpoint holds is written by train.py's main. Every refusal here is a one-line ValueError naming the file;
the tools turn it into "prog: error: ..." and exit 2.
Test:  pytest tests/test_release_ckpt.py tests/test_hostile_eval.py tests/test_hostile_train.py
"""
import dataclasses, json, os, re, warnings

import torch
import torch.distributed as dist

import flops
from common import atomic_write, check_record, claim, first_line, identity_diff, print0, read_json, require
from model import LoopedGPT, ModelConfig


def need(ok, why: str) -> None:
    """Refuse unless ok: a ValueError whose one line the tools print before exiting 2 (README "Guarantees", rule 5)."""
    if not ok:
        raise ValueError(why)


# -----------------------------------------------------------------------------
# nanoloop's own checkpoints (train.py's out_dir/ckpt.pt)

# The entries read from a ckpt.pt, each (type, range) as common.check_record takes them: a hand-edited file is one
# line, never a traceback or a wrong default (eval_tokens: train.py's --eval-tokens limit, -1 = the whole split).
# model_config is checked by ModelConfig itself (the same check as train.py's flags).
CKPT_FIELDS = {"model": (dict, None), "model_config": (dict, None), "tokenizer_hash": (str, None),
               "train_config": (dict, None)}
TRAIN_FIELDS = {"data": (str, None), "tokenizer": (str, None), "eval_tokens": (int, "[-1, inf)")}


def read_checkpoint(path, keys=("model", "model_config")) -> dict:
    """A torch checkpoint (a run's ckpt.pt or any .pt path) -> its dict, with `keys` present and checked (by
    default what eval needs; train.py's resume asks for more).

    weights_only=True always: a checkpoint is tensors and plain types, and unpickling anything else could run
    arbitrary code, so such a file is refused (never "retry with weights_only=False"). The _orig_mod. / module.
    prefixes of torch.compile / DDP are stripped from "model". Whether model_config builds a ModelConfig is asked
    where one is built (load_checkpoint), whether the weights fit it load_weights' question."""
    # absent, a folder, a FIFO (torch.load on a FIFO would wait for a writer forever)
    need(os.path.isfile(path), f"{path} is not a plain file: no checkpoint there (a FIFO, a folder or a broken link?)")
    need(os.path.getsize(path), f"{path} is empty (0 bytes): an interrupted copy? Use another checkpoint")
    try:
        with warnings.catch_warnings():                           # old pickle protocols warn before failing
            warnings.simplefilter("ignore")
            ck = torch.load(path, map_location="cpu", weights_only=True)
    # truncated zip, random bytes, an I/O error, or a pickle of other objects (UnpicklingError: refused, as loading
    # it could run code); torch's own text after its first sentence is advice to unpickle anyway: cut
    except Exception as e:
        raise ValueError(f"{path} is not a PyTorch checkpoint of tensors and plain types, or is truncated or corrupt "
                         f"(refused; {type(e).__name__}: {first_line(str(e).split('. ')[0])[:120]})") from None
    need(isinstance(ck, dict), f"{path} holds a {type(ck).__name__}, not a checkpoint dict")
    missing = [k for k in keys if k not in ck]
    need(not missing, f"{path} has no {missing} entry (keys: {sorted(ck)}): not a complete train.py checkpoint")
    check_record(ck, CKPT_FIELDS, path)
    check_record(ck.get("train_config") or {}, TRAIN_FIELDS, path, "train_config.")
    if "model" in ck:        # torch.compile wraps a module as _orig_mod, DDP as module: their keys carry the prefix
        ck["model"] = {re.sub(r"^(_orig_mod\.)?(module\.)?", "", str(k)): v for k, v in ck["model"].items()}
    return ck


def load_weights(model, state, source, names=None):
    """model.load_state_dict(state) after checking that state fits the model exactly, else a one-line ValueError.

    A missing, unknown or non-float tensor, a wrong shape, or a NaN / inf value is named, never a silently random,
    truncated or poisoned layer (load_state_dict would raise a many-line RuntimeError, or load the NaNs). bf16
    tensors are upcast exactly. source: the file, for the message; names: key -> the name to show."""
    want = {k: tuple(v.shape) for k, v in model.state_dict().items()}      # persistent tensors only (no RoPE)
    name = lambda k: str((names or {}).get(k, k))
    is_float = lambda v: isinstance(v, torch.Tensor) and v.is_floating_point()
    fits = [k for k in want if is_float(state.get(k)) and tuple(state[k].shape) == want[k]]
    problems = [f"{len(ks)} {what}: {', '.join(map(name, ks[:4]))}{' ...' if len(ks) > 4 else ''}" for what, ks in (
        ("missing", [k for k in want if k not in state]),
        ("unknown", [k for k in state if k not in want]),
        ("not a float tensor", [k for k in want if k in state and not is_float(state[k])]),
        ("with another shape", [f"{name(k)} {tuple(state[k].shape)} vs {want[k]}"
                                for k in want if is_float(state.get(k)) and k not in fits]),
        ("holding NaN or inf", [k for k in fits if not torch.isfinite(state[k]).all()])) if ks]
    need(not problems, f"{source}: the weights do not match the model config: {'; '.join(problems)}")
    model.load_state_dict(state)
    return model


# -----------------------------------------------------------------------------
# Memory: a hand-edited sequence_len 1e8 or vocab_size 1e10 is one line up front, never the allocator's
# RuntimeError (or the OOM killer) halfway through building the model.

def model_bytes(cfg) -> tuple:
    """(host bytes, device bytes) that building and loading LoopedGPT(cfg) allocates before any forward: the fp32
    weights (the non-embedding parameters flops.py counts, plus wte and lm_head), held twice on the host (the
    checkpoint's state dict and the model), and the RoPE tables (10 T x D/2 entries each, built in fp64 on the
    host: ~32 bytes an entry there, 8 on the device)."""
    # via the one ModelConfig -> accounting mapping
    n_once, n_rec = flops.param_split(**flops.accounting_args(cfg))
    n_params, rope = n_once + n_rec + 2 * cfg.vocab_padded * cfg.d_model, 10 * cfg.seq_len * (cfg.head_dim // 2)
    return 8 * n_params + 32 * rope, 4 * n_params + 8 * rope


def device_memory(device) -> tuple:
    """(bytes, what): CUDA's total memory, else the physical RAM; NANOLOOP_MEMORY_CAP (bytes) caps it (a smaller
    device, simulated: the tests' hook for the memory refusals and train.py's device-batch pick)."""
    have, what = (os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"), "physical RAM") if device.type != "cuda" \
        else (torch.cuda.get_device_properties(device).total_memory, torch.cuda.get_device_name(device))
    cap = os.environ.get("NANOLOOP_MEMORY_CAP")
    return (min(have, int(float(cap))), f"NANOLOOP_MEMORY_CAP={cap}") if cap else (have, what)


def check_memory(cfg, device, source) -> None:
    """Refuse, naming the size, a model whose weights cannot fit in physical RAM (and, on CUDA, the GPU)."""
    for size, (have, where) in zip(model_bytes(cfg), map(device_memory, map(torch.device, ("cpu", device)))):
        need(size <= have, f"{source}: this model (d_model {cfg.d_model}, vocab {cfg.vocab_size:,}, seq_len "
             f"{cfg.seq_len:,}) needs ~{size / 2 ** 30:,.1f} GiB for its weights and RoPE tables, more than the "
             f"{have / 2 ** 30:,.1f} GiB of {where}: a wrong config?")


# -----------------------------------------------------------------------------
# The authors' release checkpoints (kschwethelm/looped-lm-scaling, nanochat/checkpoint_manager.py at v0.1.0)
# DIR/model_<step:06d>.pt: the GPT's state_dict; DIR/meta_<step:06d>.json: {"step", "val_loss", "model_config":
# the GPTConfig fields, "user_config": the CLI args, ...}. Mapped onto LoopedGPT exactly; anything nanoloop cannot
# express is an error, never an approximation.

RELEASE_INJECTION = {"inject_init_prelude": "linear", "additive": "additive", "passthrough": "passthrough",
                     "hyperconnect": "hyper"}
RELEASE_EVAL_TOKENS = 34_560 * 2048       # the release's fixed validation set, 70.8M tokens (data.md §4)
# The meta's model_config fields: (type, range), the ranges those of the flag each maps to (train.py's LIMITS:
# sequence_len -> --seq-len, n_prelude -> --n-layers-prelude, ...); sizes are bounded by check_memory too. The first
# ten are needed (shape or function); the last four have the release GPTConfig's defaults (release_config):
# bptt_k only affects training, size is only a label (d is n_embd), num_lanes only shapes the hyperconnection
# tensors (checked), logit_softcap is Table 4's 15.
RELEASE_FIELDS = {"sequence_len": (int, "[1, 1e9]"), "vocab_size": (int, "[2, 1e9]"), "n_head": (int, "[1, 1e9]"),
                  "n_kv_head": (int, "[1, 1e9]"), "n_embd": (int, "[1, 1e9]"), "n_prelude": (int, "[0, 1e9]"),
                  "n_recur_block": (int, "[1, 1e9]"), "n_coda": (int, "[0, 1e9]"), "num_recur": (int, "[1, 16]"),
                  "input_injection": (str, None), "size": (int, None), "bptt_k": (int, None),
                  "num_lanes": (int, "[2, 1e9]"), "logit_softcap": ((int, float), "(0, 10000]")}
# The weights' release names -> nanoloop's: a block's (after transformer.{prelude,recur,coda}.i.) and top-level ones
RELEASE_NAMES = {"n1.weight": "norm_attn.weight", "n3.weight": "norm_mlp.weight", "lane_alpha": "hc_alpha",
                 "transformer.wte.weight": "wte.weight", "lane_mixing": "hc_mix", "lane_beta": "hc_beta"}
RELEASE_META = {"step": (int, "[0, inf)"), "val_loss": ((int, float), "[0, inf)"), "model_config": (dict, None),
                "user_config": (dict, None)}              # the meta's own keys, for common.read_json


def release_config(meta, meta_path) -> ModelConfig:
    """The meta's model_config -> the ModelConfig it describes (mapping in load_checkpoint); where names the file.

    Every field is checked against RELEASE_FIELDS (type, range; none unknown, the first ten present) and completed
    with the GPTConfig defaults: a hand-edited field is one line naming the file and the key."""
    require(meta, ["model_config"], meta_path)
    mc, where = meta["model_config"], f"{meta_path}: model_config"
    for what, fields in (("unknown", sorted(set(mc) - set(RELEASE_FIELDS))),
                         ("missing", [k for k in tuple(RELEASE_FIELDS)[:10] if k not in mc])):
        need(not fields, f"{where}: {what} fields {fields} (a newer or older release?)")
    check_record(mc, RELEASE_FIELDS, meta_path, "model_config.")
    c = dict(dict(size=None, bptt_k=None, num_lanes=2, logit_softcap=15.0), **mc)   # the GPTConfig defaults
    injection = RELEASE_INJECTION.get(c["input_injection"])
    need(injection, f"{where}: input_injection {c['input_injection']!r} not in {sorted(RELEASE_INJECTION)}")
    p, l, co, r, d, H = c["n_prelude"], c["n_recur_block"], c["n_coda"], c["num_recur"], c["n_embd"], c["n_head"]
    # nanoloop's attention has one key/value head per query head; n_head must divide the width exactly
    need(c["n_kv_head"] == H, f"{where}: grouped-query attention (n_kv_head {c['n_kv_head']} != n_head {H})")
    need(d % H == 0, f"{where}: n_embd {d} is not a multiple of n_head {H}")
    # nanoloop's r = 1 baseline is 0-L-0 with no injection: a release's r = 1 with a prelude, coda, inject layer or
    # lanes has tensors that model lacks, refused by load_weights
    # The width label: d = aspect x scale exactly. The run's own aspect ratio when the meta records it and it
    # divides d (odd s rounds d up: s=15 -> 1024 = 16 x 64), else 64 (the paper's), else one head per unit
    # (d // H always divides d).
    user, size = meta.get("user_config") or {}, c["size"] if c["size"] and c["size"] > 0 else None
    candidates = (user.get("aspect_ratio"), d // size if size and d % size == 0 else None, 64, d // H)
    aspect = next(a for a in candidates if type(a) is int and a > 0 and d % a == 0)
    try:
        return ModelConfig(scale=d // aspect, aspect_ratio=aspect, n_loops=r, n_layers_eff=p + r * l + co,
                           n_layers_prelude=p, n_layers_coda=co, head_dim=d // H, vocab_size=c["vocab_size"],
                           seq_len=c["sequence_len"], injection=injection, hc_lanes=c["num_lanes"] if injection ==
                           "hyper" else 2, n_loops_bwd=c["bptt_k"] if 1 <= (c["bptt_k"] or 0) < r else None,
                           logit_softcap=float(c["logit_softcap"]))
    except ValueError as e:
        raise ValueError(f"{where}: a layout nanoloop cannot express ({e})") from None


def load_checkpoint(path, device="cpu", step=None):
    """(model in eval mode, checkpoint dict) from a nanoloop run (out_dir or a .pt path) or an authors' release
    directory (or one of its model_<step>.pt files), one path for both: the config checked, the model sized
    (check_memory) before it is built, the weights checked as they are loaded (load_weights). A release's dict is
    shaped like train.py's (model_config, a train_config with the release's 70.8M val tokens) plus "release": its
    meta with "step" set. step: the release step (default the latest), an error for a nanoloop run.

    A release directory holds model_<step:06d>.pt + meta_<step:06d>.json and no ckpt.pt. The mapping (release ->
    nanoloop; every fact from the release's gpt.py / base_train.py at v0.1.0):
      config   n_embd -> d_model = aspect_ratio x scale; head_dim = n_embd / n_head; num_recur -> n_loops;
               n_prelude / n_recur_block / n_coda -> the layout, n_layers_eff = p + r l + c; input_injection ->
               injection (inject_init_prelude = linear, hyperconnect = hyper); num_lanes -> hc_lanes; bptt_k < r ->
               n_loops_bwd; sequence_len -> seq_len; vocab_size, logit_softcap as they are.
               An odd s: the release rounds d up to a multiple of head_dim (s=15: 960 -> 1024), so d != 64 s; the
               model is kept exact (d_model = 1024) and labelled scale = d / aspect_ratio (16 x 64).
               r = 1 must be 0-L-0 passthrough (or additive, the same function at r = 1): nanoloop's baseline.
               Refused: GQA (n_kv_head != n_head), r not dividing 16, r = 1 with a prelude / coda / inject layer /
               lanes, unknown or missing config fields, a model too large for this machine (check_memory).
      weights  transformer.wte -> wte (bf16 on CUDA runs: upcast, exact); transformer.{prelude,recur,coda}.i ->
               the same blocks, n1 / n3 -> norm_attn / norm_mlp; lane_alpha / lane_mixing / lane_beta -> hc_alpha /
               hc_mix / hc_beta; inject, norm_emb, norm_recur, norm_final, lm_head unchanged; a leading _orig_mod.
               (torch.compile) is dropped. Strict: an unknown, missing, misshapen or non-finite tensor is an error.
      RoPE     the release rotates each pair (x_j, x_{j+D/2}) by -theta, nanoloop by +theta. Negating the second-half
               output rows of every head of c_q and c_k gives q', k' = the release's q, k with their second halves
               negated; QK-norm and every q.k are unchanged by that, so attention is the release's exactly. The
               release's bf16-rounded tables are installed too (RoPE buffers are not in a state dict, so train.py
               --init-from keeps nanoloop's own and its resumes stay bitwise).
    """
    m = os.path.isfile(path) and re.fullmatch(r"model_(\d+)\.pt", os.path.basename(path))
    root = os.path.dirname(os.path.abspath(path)) if m else path
    # a release: one of its files, or a folder of model_<digits>.pt (an alias such as model_pre_warmdown.pt is no
    # step) without a ckpt.pt
    found = os.listdir(root) if m or (os.path.isdir(path) and not os.path.isfile(os.path.join(path, CKPT_NAME))) else []
    steps = {int(f[1]): os.path.join(root, f[0]) for f in map(re.compile(r"model_(\d+)\.pt").fullmatch, found) if f}
    if not steps:                                                 # a nanoloop run: its out_dir or a .pt file
        need(step is None, f"--step selects a step of a release directory (model_<step>.pt); {path} is a nanoloop run")
        path, names = os.path.join(path, CKPT_NAME) if os.path.isdir(path) else path, None
        ck = read_checkpoint(path)
        try:                                 # an unknown field is a TypeError naming it; a bad value a ValueError
            cfg = ModelConfig(**ck["model_config"])
        except (TypeError, ValueError) as e:
            raise ValueError(f"{path}: invalid model_config: {first_line(e)}") from None
        check_memory(cfg, device, path)
        state = ck["model"]
    else:
        need(not m or step in (None, int(m[1])), f"--step {step} contradicts the file name {m and m[0]}")
        step = int(m[1]) if m else max(steps) if step is None else step
        need(step in steps, f"{root} has no step {step}; steps: {sorted(steps)}")
        meta_path, path = os.path.join(root, f"meta_{step:06d}.json"), steps[step]
        meta = read_json(meta_path, RELEASE_META)                 # absent, a FIFO, torn: one line naming it
        need(meta.get("step") in (None, step),                   # a meta copied from another step
             f"{meta_path}: key 'step' is {meta.get('step')}, but it sits beside model_{step:06d}.pt")
        cfg = release_config(meta, meta_path)
        check_memory(cfg, device, meta_path)                      # before the weights are read or the model built
        state, names = {}, {}                                     # under nanoloop's names; theirs, for messages
        for k, v in read_checkpoint(path, keys=()).items():      # the safe reader: a flat state dict here
            name = re.sub(r"^_orig_mod\.", "", str(k))
            blk = re.fullmatch(r"transformer\.((?:prelude|recur|coda)\.\d+\.)(.+)", name)
            # a nanoloop state dict would get its RoPE rows flipped
            need(blk or not name.startswith(("wte.", "hc_", "prelude.", "recur.", "coda.")), f"{path} holds nanoloop "
                 f"names ({name}): not a release state dict; save it as a ckpt.pt")
            new = blk[1] + RELEASE_NAMES.get(blk[2], blk[2]) if blk else RELEASE_NAMES.get(name, name)
            need(new not in state, f"{path}: two tensors map to {new} ({names.get(new)}, {k})")
            state[new], names[new] = v, k
        ck = dict(model_config=dataclasses.asdict(cfg), release=dict(meta, step=step),
                  train_config=dict(eval_tokens=RELEASE_EVAL_TOKENS))
    model = load_weights(LoopedGPT(cfg), state, path, names)     # a release's bf16 wte (CUDA runs) -> fp32: exact
    if "release" in ck:
        H, D = cfg.n_head, cfg.head_dim
        with torch.no_grad():                                     # the RoPE direction (docstring)
            for lin in [m for blk in model.blocks() for m in (blk.attn.c_q, blk.attn.c_k)]:
                lin.weight.view(H, D, cfg.d_model)[:, D // 2:] *= -1   # (H, D, d): second-half output rows of a head
        # the release's tables: angles in fp32, rounded to bf16 and kept there (gpt.py _precompute_rotary_embeddings);
        # nanoloop's own are fp64-computed fp32, so with the release's a loaded model computes the release's function
        # to fp32 rounding
        inv_freq = 1.0 / (cfg.rope_base ** (torch.arange(0, D, 2, dtype=torch.float32) / D))         # (D/2,)
        angles = torch.outer(torch.arange(model.rope_cos.size(0), dtype=torch.float32), inv_freq)  # (n_pos, D/2)
        model.rope_cos.copy_(angles.cos().bfloat16().float())
        model.rope_sin.copy_(angles.sin().bfloat16().float())
        print0(f"release checkpoint {root} step {step}: d={cfg.d_model} r={cfg.n_loops} layout "
               f"{'-'.join(map(str, cfg.partition))} {cfg.injection} | their val_loss {meta.get('val_loss')}")
    return model.to(device).eval(), ck


# -----------------------------------------------------------------------------
# train.py's run folder: what it holds decides fresh / resume / finished; its files are written atomically

CKPT_NAME, DONE_NAME, LOG_NAME = "ckpt.pt", "done.json", "log.jsonl"   # the run's checkpoint, record and log
# What a run folder may hold besides them without --overwrite: runs/slurm.sh's tee'd log, eval.py's result, the
# files of an older train.py (its ledger and lock), nanoloop markers (.nanoloop-*) and temporaries (.*.tmp)
RUN_NAMES = (CKPT_NAME, DONE_NAME, LOG_NAME, "train.log", "eval.json", ".nanoloop-owned.json", "train.lock")
# What a resume reads besides the identity (an older checkpoint without it is "a different run", never a crash)
RESUME_KEYS = ("model", "optimizer", "loader", "rng", "step", "val_loss", "wall_time_s", "tokenizer_hash",
               "model_config", "train_config")


def out_dir_state(tc, cfg, identity: dict, defaults: dict, rank: int, world: int) -> tuple:
    """("finished", done.json's record), ("resume", ckpt.pt's dict) or ("fresh", None). Rank 0 alone decides: it
    reads what out_dir holds (a 0-byte or torn file is one line), which must be this run's (rule 1: identity_diff,
    a field missing = its `defaults` value) and needs --resume, then claims out_dir for writing (not for --plan, nor
    to hand a finished run back). It broadcasts the status, the record and any refusal, so every rank stops with the
    same line; the other ranks read the checkpoint it checked from the folder every rank must see (the launcher's
    job: runs/slurm.sh, a shared filesystem)."""
    done_path, ckpt_path = (os.path.join(tc.out_dir, n) for n in (DONE_NAME, CKPT_NAME))
    look = lambda: "finished" if os.path.lexists(done_path) else "resume" if os.path.lexists(ckpt_path) else "fresh"
    status, held, err = None, None, None
    if rank == 0:                            # a refusal is caught and broadcast: no rank waits in a collective
        try:
            status = look()
            path = done_path if status == "finished" else ckpt_path
            # --resume continues the run (or hands a finished one's record back)
            need(status == "fresh" or tc.resume or tc.plan, f"{path} exists: pass --resume, or pick another --out-dir")
            if status == "finished":
                try:
                    held = read_json(path, {"val_loss": (float, "(0, inf)"), "identity": (dict, None)})
                    require(held, ("val_loss", "steps", "tokens"), path)
                except ValueError as e:      # a 0-byte, torn or foreign done.json
                    raise ValueError(f"{e}; not a train.py record: move it away to train again") from None
            elif status == "resume":         # one-line ValueErrors naming the file
                held = read_checkpoint(path, RESUME_KEYS)
            diff = identity_diff(held.get("identity"), identity, defaults) if held else []
            need(not diff, f"{path} is the record of a different run (recorded vs now: {'; '.join(diff[:4])}"
                 f"{'; ...' if len(diff) > 4 else ''}); pick another --out-dir, or rerun with its flags")
            if status == "resume":           # its weights fit the model (names, shapes, finite values): checked on
                with torch.device("meta"), warnings.catch_warnings():   # a model without memory, before the claim
                    warnings.simplefilter("ignore")                       # (the loads are no-ops)
                    load_weights(LoopedGPT(cfg), held["model"], path)
            if not tc.plan and status != "finished":
                # out_dir holds train.py's files (or nothing), or --overwrite was given; claim refuses a 2nd writer
                names = os.listdir(tc.out_dir) if os.path.isdir(tc.out_dir) else []
                ours = all(n in RUN_NAMES or n.startswith(".nanoloop-") or n.endswith(".tmp") for n in names)
                log = os.path.join(tc.out_dir, LOG_NAME)         # the log is appended to: a plain file or nothing
                need(os.path.isfile(log) or not os.path.lexists(log), f"{log} is not a file; move it away")
                claim(tc.out_dir, "train", None, tc.overwrite or ours, "--out-dir")
                # a trainer that checkpointed or finished between the look above and the claim: refuse, not clobber
                need(look() == status, f"another trainer wrote {tc.out_dir} while this one started; rerun")
        except ValueError as e:
            err = str(e)
    if world > 1:                            # one small collective, before any work
        box = [status, err, held if status == "finished" else None]
        dist.broadcast_object_list(box, src=0)
        status, err, held = box[0], box[1], held if rank == 0 else box[2]
    need(err is None, err)
    return status, read_checkpoint(ckpt_path, RESUME_KEYS) if rank and status == "resume" else held


def save(path: str, data) -> None:
    """Write one of the run's own files (ckpt.pt, done.json) atomically: a full disk or a kill leaves the previous
    file (or none) and at most a temporary nobody reads. A failure is one line naming the file and the cause."""
    try:
        atomic_write(path, data)
    except (OSError, RuntimeError) as err:   # torch.save wraps ENOSPC in a RuntimeError: the errno in its chain
        e = err
        while e is not None and not (isinstance(e, OSError) and e.errno):
            e = e.__cause__ or e.__context__
        raise OSError(f"could not write {path}: {os.strerror(e.errno) if e else first_line(err)}; any previous "
                      "version is kept. Free space, then rerun with --resume") from None


def trim_log(log_path: str, upto: int) -> None:
    """Keep the lines of log.jsonl whose step is <= upto (the rest is about to be redone), rewritten atomically. A
    kill mid-append leaves at most a cut-short tail after the last newline: dropped, with a message (rule 3). Any
    other line that is not a train.py record means the file is not this run's log: an error naming it and the line;
    the file is untouched."""
    lines = open(log_path, "rb").read().split(b"\n") if os.path.exists(log_path) else [b""]
    if lines[-1]:
        print0(f"{log_path}: dropped a torn last line ({lines[-1][:40]!r}), the trace of a kill mid-write")
    kept = []
    for i, ln in enumerate(lines[:-1], 1):
        try:
            kept += [ln.decode() + "\n"] if int(json.loads(ln)["step"]) <= upto else []
        except (ValueError, KeyError, TypeError):   # not JSON (or not UTF-8), not an object, no integer step
            raise ValueError(f"{log_path} line {i} is not a train.py record ({ln[:60]!r}); move it away") from None
    atomic_write(log_path, "".join(kept))
