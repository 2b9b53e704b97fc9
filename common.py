r"""
common.py -- the plumbing every nanoloop tool shares, written once (as nanochat keeps its common.py).

No research logic, and no torch at load time (fit.py and flops.py import this file; torch is imported inside
init_dist only). Each plumbing rule of the README's "Guarantees" is one light mechanism here:

  one-line errors       Parser, fail(), checked numbers (number, check_number)
  one reader            read_json: a JSON object whose keys pass the same limits as the flags that could set them
  one identity test     identity_diff: a field missing from an older record reads as its default
  atomic files          atomic_write: temporary in the same folder, fsync, rename (or link: never two creators)
  output ownership      claim(folder): a marker per tool and a flock held for the run (one writer per folder);
                        check_new / write_json for a single file: absent, ours by its written_by header, or --overwrite
  dist setup            init_dist, print0
"""
import argparse, contextlib, fcntl, hashlib, json, os, pathlib, stat, sys, typing

# -----------------------------------------------------------------------------
# One error path: every user error is one line "prog: error: why", exit status 2, before any work is done.
class Parser(argparse.ArgumentParser):
    """argparse with one-line errors (a usage block buries the culprit), no abbreviations (a typo is no match)."""
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **{"allow_abbrev": False, **kwargs})
    def error(self, message):
        self.exit(2, f"{self.prog}: error: {first_line(message)} (see --help)\n")

def first_line(text) -> str:
    return next((ln.strip() for ln in str(text).splitlines() if ln.strip()), "unknown error")

def fail(prog: str, err) -> typing.NoReturn:
    """Print prog's one error line, exit with status 2 (SystemExit's code); str() of the exit is the line, for an
    in-process caller (a test, a notebook)."""
    line = f"{prog}: error: {first_line(err)}"
    print(line, file=sys.stderr, flush=True)
    stop = SystemExit(line)
    stop.code = 2
    raise stop

# -----------------------------------------------------------------------------
# Checked numbers. One notation for a range, "[lo, hi]" with ( ) for open ends and inf, shared by the CLI flags
# (number) and by every number read back from a file (read_json), so the two limits cannot drift apart.
def check_number(v, interval: str, what: str = "") -> typing.Optional[str]:
    """None if v is a finite number inside interval (None passes: Optional fields use it), else why not."""
    about = f" ({what})" if what else ""
    # bool is an int in Python (a JSON true is no 1); nan fails every comparison, and an int past float's range
    # (a 400-digit --steps) is no finite number either
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not abs(v) <= sys.float_info.max:
        return f"must be a finite number in {interval}{about}, got {v!r:.40}"
    lo, hi = (float(b) for b in interval[1:-1].split(","))        # float() reads "inf" and "-inf"
    out = v < lo or v > hi or (interval[0] == "(" and v == lo) or (interval[-1] == ")" and v == hi)
    return f"must be in {interval}{about}, got {v:g}" if out else None

def number(kind, interval: str = "(-inf, inf)", what: str = ""):
    """argparse type: int or float, checked against interval when the flag is parsed (nan and inf refused)."""
    def parse(text):
        v = None
        with contextlib.suppress(ValueError):      # int() first: exact at any length
            v = kind(text)
        with contextlib.suppress(ValueError):      # an int may also be written as an exact float, --tokens 47e9
            v = int(float(text)) if v is None and kind is int and float(text).is_integer() else v
        why = check_number(v, interval, what) if v is not None else \
            f"expected {'an integer' if kind is int else 'a number'}, got {text!r}"
        if why:                                    # argparse prints "argument --flag: " + why
            raise argparse.ArgumentTypeError(why)
        return v
    return parse

# -----------------------------------------------------------------------------
# One reader, one identity test.
def read_json(path: str, schema: typing.Optional[dict] = None) -> dict:
    """The JSON object in path, its keys checked against schema (see check_record); one-line ValueError else."""
    try:
        mode = os.stat(path).st_mode
        # only a plain file is read: a FIFO would wait forever, /dev/zero never end
        obj = json.loads(pathlib.Path(path).read_bytes()) if stat.S_ISREG(mode) else None
    except OSError as err:
        raise ValueError(f"{path}: cannot read ({err.strerror})") from None
    except (ValueError, RecursionError) as err:   # torn write, binary junk, a 5,000-digit integer, deep nesting
        raise ValueError(f"{path}: not a JSON record ({first_line(err)})") from None
    if not stat.S_ISREG(mode):
        raise ValueError(f"{path}: is a {'FIFO' if stat.S_ISFIFO(mode) else 'folder or device'}, not a file")
    if not isinstance(obj, dict):
        raise ValueError(f"{path}: expected a JSON object, got {type(obj).__name__}")
    check_record(obj, schema or {}, path)
    return obj

def check_record(obj: dict, schema: dict, where: str, prefix: str = "") -> None:
    """schema maps key -> (types, interval or None): a present key has one of the types (bool is never a number)
    and a number lies in the interval. Absent keys pass; callers require() what they need."""
    for key, (types, interval) in schema.items():
        v, types = obj.get(key), types if isinstance(types, tuple) else (types,)
        if v is not None and (not isinstance(v, types) or (isinstance(v, bool) and bool not in types)):
            why = f"must be {'/'.join(t.__name__ for t in types)}, got {type(v).__name__} {v!r:.40}"
        else:
            why = check_number(v, interval) if interval and isinstance(v, (int, float)) else None
        if why:
            raise ValueError(f"{where}: key {prefix + key!r} {why}")

def require(obj: dict, keys, path: str) -> None:
    missing = [k for k in keys if obj.get(k) is None]
    if missing:
        raise ValueError(f"{path}: missing {', '.join(missing)} (not a complete record of this tool)")

def request_key(tool: str, request) -> str:
    """A short stable name for (tool, request): the same invocation gives the same key in every process."""
    return hashlib.sha256(json.dumps([tool, request], sort_keys=True, default=str).encode()).hexdigest()[:16]

def identity_diff(old: dict, new: dict, defaults: typing.Optional[dict] = None) -> list:
    """Every "is this the same run?" in nanoloop: the fields on which two identities differ, as "name: a vs b".
    A key missing on one side reads as defaults.get(key): a config field added later, whose default keeps the old
    behaviour, leaves every existing run's identity unchanged."""
    if not isinstance(old, dict) or not isinstance(new, dict):
        return ["identity: missing (a record without one predates this check)"]
    a, b = ({k: rec.get(k, (defaults or {}).get(k)) for k in set(old) | set(new)} for rec in (old, new))
    return [f"{k}: {a[k]!r} vs {b[k]!r}" for k in sorted(a) if a[k] != b[k]]

# -----------------------------------------------------------------------------
# Atomic files: the real name only ever holds a complete file.
def atomic_write(path: str, data, replace: bool = True) -> None:
    """Write data (bytes, str, or a callable write(tmp_path) such as torch.save) through a temporary in the same
    folder, fsync, then rename -- or, with replace=False, link: the name must not exist yet, and of two concurrent
    creators exactly one succeeds (the other gets FileExistsError). A kill leaves at most a ".NAME.<hex>.tmp",
    which no tool reads and which never shadows the real file; a Python-level failure removes it."""
    tmp = os.path.join(os.path.dirname(path) or ".", f".{os.path.basename(path)}.{os.urandom(4).hex()}.tmp")
    # O_EXCL | O_NOFOLLOW: a name planted in the folder is never clobbered or written through
    os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o666))
    raw = data.encode() if isinstance(data, str) else data
    write = data if callable(data) else lambda p: pathlib.Path(p).write_bytes(raw)
    try:
        write(tmp)
        with open(tmp, "rb") as fh:
            os.fsync(fh.fileno())                   # the bytes on disk before the name points at them
        (os.replace if replace else os.link)(tmp, path)   # replace: readers see old or new; link: fails if path exists
    finally:
        with contextlib.suppress(OSError):
            os.remove(tmp)

# -----------------------------------------------------------------------------
# Output ownership and one writer per folder (README "Guarantees", rules 2 and 4). A tool writes into a folder it
# created, into one whose marker .nanoloop-TOOL names this tool and this request, or anywhere with --overwrite.
# The marker holds content only (tool and request key), so a folder copied or moved as a whole stays usable; the
# flock on it, held until the process exits, is the one-writer lock (the kernel drops it when a writer is killed).
# A folder the ranks of a multi-node run do not all see is the launcher's to provide (README "Multi-node").
HELD = {}    # folder -> (fd of its flocked marker, its key): kept open for the life of the process

def claim(folder: str, tool: str, request=None, overwrite: bool = False, flag: str = "--out") -> str:
    """Own folder for tool: "fresh" (new or empty), "resume" (its marker names this tool and request; request None:
    any run of this tool, which then decides sameness itself, as train.py does by run identity) or "overwrite".
    A ValueError otherwise, leaving the folder exactly as it was."""
    mark, key = os.path.join(folder, f".nanoloop-{tool}"), f"{tool} {request_key(tool, request)}"
    if HELD.get(os.path.abspath(folder), (0, None))[1] == key:    # claimed already by this process, same request
        return "resume"
    if os.path.islink(mark) or (os.path.lexists(mark) and not os.path.isfile(mark)):
        raise ValueError(f"{flag} {folder}: {mark} is not a plain file; move it away")
    # decide before creating anything, so a refusal leaves the folder (even its mtime) as it was
    made = not os.path.isdir(folder)
    try:
        names = [] if made else sorted(n for n in os.listdir(folder) if n != os.path.basename(mark))
        held = pathlib.Path(mark).read_text(errors="replace").strip() if os.path.exists(mark) else ""
        mine = held == key or (request is None and held.split(" ")[0] == tool)
        state = "resume" if names and mine else "fresh" if not names else "overwrite" if overwrite else None
        if state is None:
            what = f"another request of {tool}" if held.startswith(tool + " ") else "files this tool did not make"
            raise ValueError(f"{flag} {folder} holds {what} ({', '.join(names[:3])}{', ...' if len(names) > 3 else ''}"
                             "); pick a new folder or pass --overwrite")
        os.makedirs(folder, exist_ok=True)
        # O_NOFOLLOW, O_NONBLOCK: a link or FIFO planted at the marker's name meanwhile is an error, never a wait
        fd = os.open(mark, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK, 0o666)
    except OSError as err:
        with contextlib.suppress(OSError):          # a refusal leaves no folder behind
            if made:
                os.rmdir(folder)
        raise ValueError(f"{flag} {folder}: cannot use this folder ({err.strerror})") from None
    with contextlib.suppress(OSError):              # OSError without BlockingIOError: no flock here (NFS nolock)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:                     # the marker and folder are the other writer's: never removed
            os.close(fd)
            raise ValueError(f"{flag} {folder} is being written by another {tool} process: one writer per folder; "
                             "wait for it or pick another folder") from None
    os.ftruncate(fd, 0)                             # the marker names this tool and request from now on
    os.pwrite(fd, (key + "\n").encode(), 0)
    release(folder)                                 # a claim of another request by this process ends here
    HELD[os.path.abspath(folder)] = (fd, key)
    return state

def release(folder: str) -> None:
    """Drop a claim early (the process's exit drops it anyway)."""
    with contextlib.suppress(KeyError):
        os.close(HELD.pop(os.path.abspath(folder))[0])

def check_new(path: str, overwrite: bool = False, flag: str = "--out", tool=None, key=None) -> None:
    """A single output file may be written if it is absent, ours (a JSON whose written_by names tool and key),
    or overwrite was passed. A link, folder or FIFO in the way is never written through, even with overwrite."""
    if os.path.islink(path) or (os.path.lexists(path) and not os.path.isfile(path)):
        raise ValueError(f"{flag} {path} is {'a link' if os.path.islink(path) else 'not a plain file'}; move it away")
    if overwrite or not os.path.lexists(path):
        return
    with contextlib.suppress(ValueError):           # a file we cannot read as our JSON is not ours
        if tool and read_json(path).get("written_by") == {"tool": tool, "key": key}:
            return
    raise ValueError(f"{flag} {path} exists and this request did not write it; pass --overwrite or pick another path")

def write_json(path: str, obj: dict, tool: str, key: str, replace: bool = True) -> None:
    """atomic_write of obj with its written_by header: how a tool marks a file it writes in another's folder."""
    atomic_write(path, json.dumps({**obj, "written_by": {"tool": tool, "key": key}}, indent=1) + "\n", replace)

# -----------------------------------------------------------------------------
# Distributed setup (style B8): torchrun sets RANK / LOCAL_RANK / WORLD_SIZE; plain `python x.py` does not.
def init_dist():
    """Returns (rank, world, device). gloo on CPU, so torchrun ranks really synchronise."""
    import torch                                   # here, not at the top: fit.py and flops.py never need torch
    import torch.distributed as dist
    if "RANK" not in os.environ:
        return 0, 1, torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device("cuda", int(os.environ["LOCAL_RANK"])) if torch.cuda.is_available() else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if not dist.is_initialized():
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    return dist.get_rank(), dist.get_world_size(), device

def print0(*args, **kwargs):
    if int(os.environ.get("RANK", "0")) == 0:
        print(*args, **{"flush": True, **kwargs})

if __name__ == "__main__":
    # The shell's door to claim(): `python common.py claim DIR TOOL REQUEST [--overwrite]` prints fresh, resume or
    # overwrite; runs/*.sh then hold `flock -n` on DIR/.nanoloop-TOOL themselves (this process exits at once).
    args = [a for a in sys.argv[1:] if a != "--overwrite"]
    if len(args) != 4 or args[0] != "claim":
        fail("common.py", "usage: python common.py claim DIR TOOL REQUEST [--overwrite]")
    try:
        print(claim(*args[1:], overwrite="--overwrite" in sys.argv, flag="OUT"))
    except ValueError as err:
        fail(f"runs ({args[2]})", err)
