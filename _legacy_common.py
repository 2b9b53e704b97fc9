r"""
common.py -- the plumbing every nanoloop tool shares, written once (in the spirit of nanochat's common.py).

No research logic lives here, and no torch at load time (fit.py and flops.py import this file; torch is imported
inside init_dist only). Each of the README's "Guarantees" that is plumbing has exactly one home:

  one parser, one error path   Parser (one-line errors, exit 2), fail(), checked numbers (number, check_number,
                               parse_bool), add_dataclass_flags (a flat CLI generated from a dataclass)
  one atomic writer            atomic_write (exclusive temp, fsync, rename), stale_temps
  one owner per file           check_owned / write_owned: a tool replaces only what it wrote for the same request
                               (an ownership ledger per folder), claim_dir for a folder a script owns whole
  one reader                   read_json: a JSON object, its keys' types and ranges checked, one-line errors
  one writer per run folder    acquire_lock / release_lock (flock, or an exclusive lock file where flock is missing)
  dist setup                   init_dist, print0

Shell scripts reach the same mechanisms through `python common.py claim-dir DIR TOOL REQUEST [--overwrite]`.
"""
import argparse
import contextlib
import dataclasses
import errno
import fcntl
import hashlib
import inspect
import json
import math
import os
import re
import socket
import sys
import typing

# -----------------------------------------------------------------------------
# One error path: every user error is one line "prog: error: why", exit status 2, before any work is done.


class Parser(argparse.ArgumentParser):
    """argparse whose errors are one line: the usage block argparse prints first would bury the culprit. --help
    still prints everything; abbreviations are off, so every unknown or misspelt flag is an error."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {first_line(message)} (see --help)\n")


def first_line(text) -> str:
    """The first non-empty line of an error text (a multi-line message would break the one-line rule)."""
    return next((ln.strip() for ln in str(text).splitlines() if ln.strip()), "unknown error")


class Refusal(SystemExit):
    """SystemExit with status 2 that also carries its one-line message: the shell sees the status and the line on
    stderr, and a caller in the same process (a test, a notebook, mini.sh's workers) reads it from str(exception)."""

    def __init__(self, message: str):
        super().__init__(2)
        self.message = message

    def __str__(self):
        return self.message


def fail(prog: str, err) -> typing.NoReturn:
    """Exit with the one-line error of err (a ValueError / OSError raised by a check), status 2."""
    line = f"{prog}: error: {first_line(err)}"
    print(line, file=sys.stderr, flush=True)
    raise Refusal(line)


# -----------------------------------------------------------------------------
# Checked numbers: one notation for a range, "[lo, hi]" with ( ) for open ends and inf, shared by config
# validation (check_number) and every CLI flag (number), so a limit cannot differ between the two.


def check_number(v, interval: str, what: str = "") -> typing.Optional[str]:
    """None if v is a finite number inside interval (None passes: Optional fields use it), else why not."""
    if v is None:
        return None
    about = f" ({what})" if what else ""
    # bool is an int subclass in Python: True would pass as 1, so a JSON `true` in a numeric field is refused
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return f"must be a number in {interval}{about}, got {v!r}"
    if not math.isfinite(v):
        return f"must be a finite number in {interval}{about}, got {v}"
    # "[0, inf)" -> (0.0, inf): float() reads "inf" and "-inf", so an open-ended range needs no special case
    lo, hi = (float(b) for b in interval[1:-1].split(","))
    # nan fails every comparison, which is why finiteness is checked first; the brackets decide the end points
    if v < lo or v > hi or (interval[0] == "(" and v == lo) or (interval[-1] == ")" and v == hi):
        return f"must be in {interval}{about}, got {v:g}"
    return None


def parse_bool(text: str) -> bool:
    """The spellings a shell user types for a boolean flag; anything else is an error, never a silent False."""
    v = {"1": True, "true": True, "yes": True, "on": True, "0": False, "false": False, "no": False, "off": False}
    if text.lower() not in v:
        raise argparse.ArgumentTypeError(f"expected true/false, got {text!r}")
    return v[text.lower()]


def number(kind, interval: str = "(-inf, inf)", what: str = ""):
    """argparse type: kind (int or float) parsed, then checked against interval; nan and inf are refused when the
    flag is parsed, naming it, instead of surfacing later as a NaN loss or a 0-hour plan."""

    def parse(text):
        # int() first: it is exact for any length, where float() would round 2**53 + 1; an int may also be written in
        # exact float notation (--tokens 47e9, --batch-tokens 2.62144e5). A float's range (and finiteness) check is
        # check_number's, so "inf" parses here and is refused just below.
        v = None
        with contextlib.suppress(ValueError):
            v = int(text) if kind is int else float(text)
        with contextlib.suppress(ValueError):
            if v is None and kind is int and float(text).is_integer():     # False for inf and nan
                v = int(float(text))
        if v is None:
            raise argparse.ArgumentTypeError(f"expected {'an integer' if kind is int else 'a number'}, got {text!r}")
        why = check_number(v, interval, what)
        if why:
            raise argparse.ArgumentTypeError(why)
        return v
    parse.__name__ = kind.__name__                 # argparse names the type in its "invalid value" errors
    return parse


def _field_comments(cls) -> dict:
    """field name -> its trailing source comment, so --help shows every default with its provenance."""
    try:
        src = inspect.getsource(cls)
    except (OSError, TypeError):
        return {}
    # "    name: type = default   # comment" -> {name: comment}; % doubled because argparse %-formats help texts
    found = (re.match(r"\s+(\w+)\s*:[^=#]+=[^#]*#\s*(.+)$", line) for line in src.splitlines())
    return {m.group(1): m.group(2).strip().replace("%", "%%") for m in found if m}


def add_dataclass_flags(parser: argparse.ArgumentParser, cls, limits: dict) -> None:
    """One --flag per field of the flat dataclass cls (style B5): its type, default and source comment, numbers
    checked against limits[name] = (interval, what) when parsed. Optional fields take "none"/"auto" for None;
    a bare boolean flag means true."""
    hints, notes = typing.get_type_hints(cls), _field_comments(cls)
    group = parser.add_argument_group(cls.__name__)
    for f in dataclasses.fields(cls):
        tp, optional = hints[f.name], False
        if typing.get_origin(tp) is typing.Union:                  # Optional[X] = Union[X, None]
            tp, optional = next(a for a in typing.get_args(tp) if a is not type(None)), True
        conv = number(tp, *limits.get(f.name, ())) if tp in (int, float) else {bool: parse_bool, str: str}[tp]
        if optional:
            conv = (lambda c: lambda v: None if v.lower() in ("none", "auto") else c(v))(conv)
            conv.__name__ = tp.__name__
        kw = dict(type=conv, default=f.default, help=f"{notes.get(f.name, '')} (default: {f.default})")
        if tp is bool:
            kw.update(nargs="?", const=True, metavar="BOOL")
        group.add_argument("--" + f.name.replace("_", "-"), dest=f.name, **kw)


def check_fields(obj, limits: dict) -> None:
    """Every numeric field of a config dataclass against limits; a ValueError naming the flag."""
    for f in dataclasses.fields(obj):
        if f.name in limits:
            why = check_number(getattr(obj, f.name), *limits[f.name])
            if why:
                raise ValueError(f"--{f.name.replace('_', '-')} {why}")


# -----------------------------------------------------------------------------
# One reader: every JSON record (done.json, fit.json, eval.json, release metas) comes through read_json.


def read_json(path: str, schema: typing.Optional[dict] = None) -> dict:
    """The JSON object in path; a ValueError naming the file (and the key) for anything else.

    schema maps key -> (types, interval or None): a present key must have one of the types (bool is never a
    number), and a number must lie in the interval -- the same limits the CLI applies, so a hand-edited record
    cannot carry a value no flag could. Keys are checked when present; callers require what they need."""
    # Every way a file can fail to be a record maps to one line naming it: a torn write (JSONDecodeError), binary
    # junk (UnicodeDecodeError), a pathological number or nesting (ValueError, RecursionError), an unreadable path.
    try:
        with open(path, "rb") as fh:
            obj = json.loads(fh.read())
    except json.JSONDecodeError as err:
        raise ValueError(f"{path}:{err.lineno}: not valid JSON ({err.msg}, column {err.colno})") from None
    except UnicodeDecodeError as err:
        raise ValueError(f"{path}: not UTF-8 text (byte {err.start})") from None
    except (ValueError, RecursionError) as err:       # a 5,000-digit integer, or nesting deeper than the stack
        raise ValueError(f"{path}: not a JSON record ({first_line(err)})") from None
    except OSError as err:
        raise ValueError(f"{path}: cannot read ({err.strerror})") from None
    if not isinstance(obj, dict):
        raise ValueError(f"{path}: expected a JSON object, got {type(obj).__name__}")
    check_record(obj, schema or {}, path)
    return obj


def check_record(obj: dict, schema: dict, where: str, prefix: str = "") -> None:
    """read_json's key check, also for a record nested inside a file (a checkpoint's dicts, a meta's model_config):
    a present key must have one of its types (bool is never a number) and lie in its interval; one line naming
    the file and the key (prefix + key)."""
    for key, (types, interval) in schema.items():
        v = obj.get(key)
        if v is None:                                  # absent, or null: the caller's require() decides
            continue
        types = types if isinstance(types, tuple) else (types,)
        if not isinstance(v, types) or (isinstance(v, bool) and bool not in types):
            raise ValueError(f"{where}: key {prefix + key!r} must be {'/'.join(t.__name__ for t in types)}, got "
                             f"{type(v).__name__} {v!r:.40}")
        why = check_number(v, interval) if interval and isinstance(v, (int, float)) else None
        if why:
            raise ValueError(f"{where}: key {prefix + key!r} {why}")


def require(obj: dict, keys, path: str) -> None:
    """Every key in keys present (and not None) in the record read from path; else one line naming them."""
    missing = [k for k in keys if obj.get(k) is None]
    if missing:
        raise ValueError(f"{path}: missing {', '.join(missing)} (not a complete record of this tool)")


def identity_diff(a: dict, b: dict) -> list:
    """The fields on which two run identities differ, as "name: a vs b" (train.run_identity builds them; every
    tool that asks "is this the same run?" -- resume, a finished run handed back, a sweep's skip, fit.py, eval.py
    -- asks it here). An empty list means the same run."""
    if not isinstance(a, dict) or not isinstance(b, dict):
        return ["identity: missing (a record or checkpoint without one predates this check)"]
    return [f"{k}: {a.get(k)!r} vs {b.get(k)!r}" for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]


# -----------------------------------------------------------------------------
# One atomic writer: the real name only ever holds a complete file.


def _fsync(path: str) -> None:
    # by path, so one helper serves the temporary (its bytes on disk before the rename makes them the real file)
    # and the folder (the rename itself on disk); O_RDONLY is enough for fsync on Linux, also for a folder
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fresh_temp(folder: str, base: str) -> str:
    """An empty ".BASE.<8 hex>.tmp" in folder that did not exist before: O_EXCL never opens a pre-existing path,
    O_NOFOLLOW never a link, so a name planted in the folder can neither be clobbered nor written through."""
    for _ in range(100):                                   # a fresh random name; retry on a clash
        tmp = os.path.join(folder, f".{base}.{os.urandom(4).hex()}.tmp")
        with contextlib.suppress(FileExistsError):         # 0o666 & ~umask, as a plain open() gives
            os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o666))
            return tmp
    raise FileExistsError(f"could not create a fresh temporary file in {folder}")


def atomic_write(path: str, data) -> None:
    """Write data (bytes, str, or a callable write(tmp_path)) to path through a temporary, fsync, rename.

    The temporary is created exclusively in the target's folder (_fresh_temp), so the rename never crosses a
    filesystem. A Python-level failure (an error, ENOSPC, Ctrl-C) removes it; a kill -9 can leave one, which never
    shadows the real file and which stale_temps() finds. fsync before the rename, so a power loss cannot reorder
    data and rename; the folder is fsync'd after it where the OS allows."""
    folder = os.path.dirname(path) or "."
    tmp = _fresh_temp(folder, os.path.basename(path))
    try:
        if callable(data):                                 # torch.save(state, tmp) and other writers that want a path
            data(tmp)
        else:
            with open(tmp, "wb") as fh:
                fh.write(data.encode() if isinstance(data, str) else data)
        _fsync(tmp)
        os.replace(tmp, path)                              # readers see the old file or the new one
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(tmp)
        raise
    # Some filesystems refuse to open or fsync a folder; the file is complete either way, only the rename's
    # durability across a power loss is then the OS's to give
    with contextlib.suppress(OSError):
        _fsync(folder)


def stale_temps(folder: str) -> list:
    """Paths of atomic_write temporaries (.NAME.<8 hex>.tmp) in folder: what a kill mid-write left."""
    try:
        names = sorted(os.listdir(folder))
    except OSError:
        return []
    pat = re.compile(r"\..+\.[0-9a-f]{8}\.tmp")
    return [os.path.join(folder, n) for n in names if pat.fullmatch(n)]


def write_failure(err: BaseException, path: str) -> str:
    """A one-line reason for a failed write of path: the errno text of any error in the chain (torch.save wraps
    it in a RuntimeError), else the first line of the message with the free space."""
    e = err
    while e is not None:
        if isinstance(e, OSError) and e.errno:
            return os.strerror(e.errno)
        e = e.__cause__ or e.__context__
    try:
        st = os.statvfs(os.path.dirname(path) or ".")
        return f"{first_line(err) or type(err).__name__} ({st.f_bavail * st.f_frsize:,} bytes free)"
    except OSError:
        return first_line(err)


def check_dir_writable(path: str, flag: str) -> None:
    """path must be a folder, or creatable as one: its nearest existing ancestor a writable folder. One line else."""
    if not str(path).strip():
        raise ValueError(f"{flag} is empty: name a folder")
    if os.path.lexists(path) and not os.path.isdir(path):
        raise ValueError(f"{flag} {path!r} is a file, not a folder")
    top = os.path.abspath(path)
    while not os.path.lexists(top):
        top = os.path.dirname(top)
    if not os.path.isdir(top):
        raise ValueError(f"{flag} {path!r}: {top} is a file, so the folder cannot be created")
    if not os.access(top, os.W_OK | os.X_OK):
        raise ValueError(f"{flag} {path!r}: {top} is not writable; pick a folder you can write to")


# -----------------------------------------------------------------------------
# One owner per file (README "Guarantees", rules 2-3). A tool may write a path that does not exist, a path it
# wrote itself for this same request, or a path the user passed --overwrite for; nothing else. What "wrote it
# itself" means is kept in a ledger per folder, LEDGER, written by write_owned: name -> (request key, inode, size,
# mtime). A file someone replaced or edited since (another inode, size or mtime) is no longer the tool's.

LEDGER = ".nanoloop-owned.json"


def request_key(tool: str, request) -> str:
    """A short stable hash of (tool, request): the same invocation gives the same key in every process."""
    blob = json.dumps([tool, request], sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def _ledger(folder: str) -> dict:
    """The folder's ledger, {name: [request key, inode, size, mtime_ns]}; an absent or unreadable ledger is empty,
    which only ever makes a tool more careful (nothing counts as its own)."""
    try:
        return read_json(os.path.join(folder, LEDGER))
    except ValueError:
        return {}


def _stamp(path: str) -> list:
    # inode + size + mtime: a file copied, moved or edited over ours changes at least one of them, and reading
    # three numbers costs nothing next to hashing a multi-GB checkpoint at every save
    st = os.stat(path)
    return [st.st_ino, st.st_size, st.st_mtime_ns]


def owner_of(path: str) -> typing.Optional[str]:
    """The request key that wrote path, if the ledger says so and the file is still the one written; else None."""
    entry = _ledger(os.path.dirname(path) or ".").get(os.path.basename(path))
    try:
        return entry[0] if entry and os.path.isfile(path) and entry[1:] == _stamp(path) else None
    except OSError:
        return None


def check_owned(paths, key: str, overwrite: bool = False, flag: str = "--out") -> None:
    """Before any work: every existing path in paths must be ours for this request (key), or --overwrite given.
    A folder or a link in the way is refused even with --overwrite (we never write through or over one)."""
    # Checked for every path before the first is written, so a refusal never leaves half a request's outputs behind;
    # lexists, not exists: a dangling link is something in the way too
    for path in paths:
        if not os.path.lexists(path):
            continue
        if os.path.islink(path) or not os.path.isfile(path):
            raise ValueError(f"{flag}: {path} is {'a link' if os.path.islink(path) else 'not a file'}; "
                             "it is never replaced: move it away")
        if not overwrite and owner_of(path) != key:
            why = "by another request" if owner_of(path) else "by someone else (or edited since)"
            raise ValueError(f"{flag}: {path} exists and was written {why}; pass --overwrite to replace it, "
                             "or choose another path")


def write_owned(path: str, data, key: str) -> None:
    """atomic_write, then record path as written by key in its folder's ledger (itself written atomically)."""
    # The file first, then its ledger entry: a kill in between leaves a file the ledger does not claim, which only
    # makes the next run more careful (it asks for --overwrite), never lets it replace something it did not write
    atomic_write(path, data)
    folder = os.path.dirname(path) or "."
    # The ledger is read, updated and renamed over: two writers in one folder (two fit.py runs) would each drop
    # the other's entries, so the update holds an exclusive flock on the ledger file itself -- not on the folder,
    # which a script may hold for its whole run (runs/mini.sh locks its OUT). The rename replaces the locked inode,
    # so a writer that waited re-opens until it holds the ledger now in place (as acquire_lock does). Where flock
    # is unsupported the update goes ahead unlocked, as before: at worst a later run asks for --overwrite.
    led_path = os.path.join(folder, LEDGER)
    while True:
        fd = os.open(led_path, os.O_RDONLY | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o666)
        with contextlib.suppress(OSError):
            fcntl.flock(fd, fcntl.LOCK_EX)
        with contextlib.suppress(FileNotFoundError):
            if os.path.samestat(os.fstat(fd), os.stat(led_path)):
                break
        os.close(fd)
    try:
        led = _ledger(folder)                              # an empty file (just created) reads as an empty ledger
        led[os.path.basename(path)] = [key] + _stamp(path)
        atomic_write(led_path, json.dumps(led, indent=0, sort_keys=True) + "\n")
    finally:
        os.close(fd)


def claim_dir(folder: str, tool: str, request, overwrite: bool = False, flag: str = "OUT") -> str:
    """A folder one tool owns whole (runs/mini.sh's OUT, runs/bench.sh's OUT): adopted if absent or empty, resumed
    if its marker names this same tool and request, refused otherwise (unless overwrite: then re-marked; nothing
    is deleted). Returns "fresh", "resume" or "overwrite"."""
    # A folder-wide marker, not the per-file ledger: a script's OUT fills with files written by many tools (train.py,
    # fit.py, ...), and what the script owns is the folder as a whole, which the marker's request key names
    check_dir_writable(folder, flag)
    mark, key = os.path.join(folder, f".nanoloop-{tool}"), request_key(tool, request)
    names = sorted(os.listdir(folder)) if os.path.isdir(folder) else []
    if names and os.path.isfile(mark):
        with open(mark, errors="replace") as fh:
            if fh.read().strip() == key:
                return "resume"
    state = "fresh" if not names else "overwrite" if overwrite else None
    if state is None:
        owned = "another request of " + tool if os.path.isfile(mark) else "files this tool did not make"
        raise ValueError(f"{flag} {folder} holds {owned} ({', '.join(names[:3])}{', ...' if len(names) > 3 else ''})"
                         f"; choose an empty or new folder, or pass --overwrite to adopt it")
    os.makedirs(folder, exist_ok=True)
    atomic_write(mark, key + "\n")
    return state


# -----------------------------------------------------------------------------
# One writer per run folder: a lock held for the whole write. flock where the filesystem has it; where it does not
# (Lustre without -o flock, NFS mounted nolock: flock fails with ENOLCK / EOPNOTSUPP), an exclusive lock file
# whose holder is judged alive by pid on the same host (a lock of a dead same-host holder is taken over).

LOCK_RE = re.compile(r"pid (\d+) host (\S+)")


def _holder_alive(text: str) -> bool:
    """Without flock, whether the lock's holder ("pid P host H") still runs: signal 0 tests a pid on this host."""
    m = LOCK_RE.fullmatch(text)
    if not m or m.group(2) != socket.gethostname():
        return True                                 # another host's holder cannot be checked: assume it lives
    try:
        with contextlib.suppress(PermissionError):   # a live process of another user
            os.kill(int(m.group(1)), 0)
    except ProcessLookupError:
        return False
    return True


def acquire_lock(folder: str, name: str = "train.lock") -> int:
    """Make folder and take its writer lock; return the lock's fd (release with release_lock).

    The lock file holds "pid P host H". A live holder makes this fail with a message naming it; a killed holder's
    lock is taken over, and said so. Creating the folder and the lock also probes that folder is writable."""
    path, me = os.path.join(folder, name), f"pid {os.getpid()} host {socket.gethostname()}"
    # Why a loop: open, read the holder, lock -- and only then is the file known to be the one at the path; a holder
    # that released meanwhile removed it (release_lock), so the lock would be on an unlinked inode: open it anew.
    # Why not O_EXCL alone: it cannot tell a live holder from a killed one; flock does (the kernel drops a dead
    # process's lock), and the pid text covers the filesystems without flock.
    try:
        os.makedirs(folder, exist_ok=True)
        while True:
            # O_NOFOLLOW: a link planted at the lock's name is never followed into someone else's file
            fd = os.open(path, os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o666)
            previous, why = os.read(fd, 256).decode(errors="replace").strip(), None
            if previous and not LOCK_RE.fullmatch(previous):
                why = f"{path} exists and was not written by nanoloop ({previous[:60]!r}); move it away"
            else:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    why = (f"{folder} is being written by another process ({previous or 'no id yet'}; lock {path}): "
                           "one writer per folder. Wait for it, stop it, or pick another folder")
                except OSError as err:
                    if err.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL):
                        raise
                    if previous and previous != me and _holder_alive(previous):     # no flock: judge by pid
                        why = (f"{folder} is locked by {previous} (lock {path}; this filesystem has no flock, so a "
                               "lock of another host cannot be checked): if that process is gone, delete the lock "
                               "file and rerun")
            if why:
                os.close(fd)
                raise ValueError(why)
            with contextlib.suppress(FileNotFoundError):   # the holder we waited on may have removed the file
                if os.path.samestat(os.fstat(fd), os.stat(path)):
                    break
            os.close(fd)                                    # ... so lock anew
        if previous and previous != me:
            print0(f"{path}: taking over the lock of {previous}, which no longer runs (a killed run left it)")
        os.ftruncate(fd, 0)
        os.pwrite(fd, (me + "\n").encode(), 0)
        os.fsync(fd)
    except OSError as err:
        raise OSError(f"{folder!r} is not usable: {err.strerror or err} ({err.filename or path}); pick a writable "
                      "folder with free space") from None
    return fd


def release_lock(fd: int, folder: str, name: str = "train.lock") -> None:
    """Remove the lock file, then drop the flock (closing the fd): the next writer finds no holder."""
    with contextlib.suppress(OSError):            # already gone: a takeover or a hand removal
        os.remove(os.path.join(folder, name))
    os.close(fd)


# -----------------------------------------------------------------------------
# Distributed setup (style B8): torchrun sets RANK / LOCAL_RANK / WORLD_SIZE; plain `python x.py` does not.


def init_dist():
    """Returns (rank, world, device). gloo on CPU, so torchrun ranks really synchronise."""
    import torch
    import torch.distributed as dist
    # Imported here, not at the top: fit.py and flops.py import this module and must never pay for (or need) torch
    if "RANK" not in os.environ:
        return 0, 1, torch.device("cuda" if torch.cuda.is_available() else "cpu")
    local = int(os.environ["LOCAL_RANK"])                  # GPU index on this node
    device = torch.device("cuda", local) if torch.cuda.is_available() else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if not dist.is_initialized():
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    return dist.get_rank(), dist.get_world_size(), device


def print0(*args, **kwargs):
    """print on rank 0 only (RANK is unset in a plain single-process run)."""
    if int(os.environ.get("RANK", "0")) == 0:
        kwargs.setdefault("flush", True)
        print(*args, **kwargs)


# -----------------------------------------------------------------------------
# The shell's door to the same mechanisms (runs/*.sh): claim-dir.

if __name__ == "__main__":
    # One verb for now: runs/mini.sh and runs/bench.sh claim their OUT through it, so the shell scripts and the
    # Python tools refuse a foreign folder by the same rule and with the same one-line message.
    p = Parser(prog="common.py", description="plumbing for runs/*.sh")
    sub = p.add_subparsers(dest="cmd", required=True, parser_class=Parser)
    c = sub.add_parser("claim-dir", help="adopt / resume / refuse a folder a script owns whole")
    c.add_argument("folder")
    c.add_argument("tool")
    c.add_argument("request", help="what this invocation asks for (any string; same string = same request)")
    c.add_argument("--overwrite", action="store_true")
    a = p.parse_args()
    try:
        print(claim_dir(a.folder, a.tool, a.request, a.overwrite))
    except (ValueError, OSError) as err:
        fail(f"runs ({a.tool})", err)
