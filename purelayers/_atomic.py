"""Atomic file writes that leave nothing behind, even when the writer is killed.

A file is written as ``.NAME.HOST.PID.HEX.tmp/NAME`` next to its target ``NAME``: a
private folder, named after the target, the machine and the writing process, holding
the one temporary file. The ``safetensors`` package's own atomic write (a ``.tmpXXXXXX`` file renamed
into place) then happens inside that folder, so a crash at any moment leaves at most
that one folder, recognizably the target's. Each writer holds an ``flock`` on its folder
for as long as it exists, taken before the folder gets its ``.tmp`` name (it is made as
``....new`` and renamed once locked); the next write to the same target removes the
``.tmp`` folders on this machine whose lock is free, whatever their process ids say (a
restarted container's writer often has the killed one's pid), and the rare ``.new``
folder of a writer killed before it locked, once that pid is gone. Never another
target's, another machine's, another live writer's, or one of its own.

The written file gets the mode an ordinary ``open(path, "w")`` gives under the process
umask (not ``mkstemp``'s 0600), read off a placeholder the folder is created with.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import shutil
import socket
import stat
from collections.abc import Iterator
from pathlib import Path

try:
    import fcntl
except ImportError:  # not POSIX: no locks, and stale folders are left alone
    fcntl = None


def _host() -> str:
    """This machine's name as it may stand in a file name."""
    return re.sub(r"[^A-Za-z0-9-]", "-", socket.gethostname()) or "host"


def _pattern(name: str = ".+") -> re.Pattern[str]:
    """This host's temporaries of the target file ``name`` (a regex): groups ``name``,
    the pid and the suffix (``tmp``, or ``new`` before the lock is taken). Another
    host's pids and locks (a shared file system) say nothing here, so its folders are
    never touched."""
    host = re.escape(_host())
    return re.compile(
        rf"\.(?P<name>{name})\.{host}\.(?P<pid>\d+)\.[0-9a-f]{{8}}\.(?P<kind>tmp|new)"
    )


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # exists, owned by someone else
        return True
    return True


def remove_stale(target: Path, names: str | None = None) -> list[Path]:
    """Remove the temporary folders that killed writers of ``target`` left (of every
    file in its folder whose name fully matches the regex ``names``, where given);
    returns them."""
    if fcntl is None or not target.parent.is_dir():
        return []
    removed = []
    pattern = _pattern(re.escape(target.name) if names is None else names)
    for entry in target.parent.iterdir():
        match = pattern.fullmatch(entry.name)
        if match is None or (match["kind"] == "new" and _alive(int(match["pid"]))):
            continue
        try:
            fd = os.open(entry, os.O_RDONLY)
        except OSError:
            continue  # removed meanwhile, or not ours to open
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            continue  # its writer still holds it
        try:
            shutil.rmtree(entry, ignore_errors=True)
            removed.append(entry)
        finally:
            os.close(fd)
    return removed


class Temporary:
    """The private folder and temporary file one write of ``target`` goes through.

    ``file`` is the path to write; ``finish()`` fsyncs it and gives it the umask's mode;
    ``commit()`` renames it over ``target``; ``close()`` (or leaving the ``with`` block) removes the
    folder and whatever is left in it.
    """

    def __init__(self, target: Path):
        self.target = target
        remove_stale(target)
        tag = f"{_host()}.{os.getpid()}.{secrets.token_hex(4)}"
        self.folder = target.parent / f".{target.name}.{tag}.new"
        self._fd = None
        # Until the lock is taken, the folder is kept from cleaners by its process id
        # (alive); it is renamed to its ``.tmp`` name once locked, and from then on the
        # lock alone keeps it.
        os.mkdir(self.folder, 0o700)
        try:
            if fcntl is not None:
                self._fd = os.open(self.folder, os.O_RDONLY)
                fcntl.flock(self._fd, fcntl.LOCK_EX)
            locked = self.folder.with_suffix(".tmp")
            os.rename(self.folder, locked)
            self.folder = locked
            self.file = self.folder / target.name
            os.close(os.open(self.file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
            self._mode = stat.S_IMODE(os.stat(self.file).st_mode)  # 0o666 less the umask
        except BaseException:
            self.close()
            raise

    def finish(self) -> None:
        with open(self.file, "rb+") as f:
            os.fsync(f.fileno())
        os.chmod(self.file, self._mode)

    def commit(self) -> None:
        os.replace(self.file, self.target)

    def close(self) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> Temporary:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def sync_dir(folder: Path) -> None:
    """Make renames in ``folder`` durable (POSIX); a no-op where folders cannot be opened."""
    with contextlib.suppress(OSError):
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


@contextlib.contextmanager
def folder_lock(folder: Path) -> Iterator[None]:
    """An exclusive ``flock`` on ``folder`` itself (no lock file left in it) for the
    block: writers that commit several files into one folder run one at a time, each
    reading what the previous one committed. A no-op where ``flock`` is missing."""
    if fcntl is None:
        yield
        return
    fd = os.open(folder, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


@contextlib.contextmanager
def temporaries(targets: list[Path]) -> Iterator[list[Temporary]]:
    """One ``Temporary`` per target, all closed (folders removed) on the way out."""
    with contextlib.ExitStack() as stack:
        yield [stack.enter_context(Temporary(t)) for t in targets]
