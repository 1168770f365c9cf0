"""The file a SQLite store lives in, and its disk: a file and a directory it creates are
owner-only, and an I/O error on a disk with no room left is a full disk."""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

ROOM = 1 << 20  # bytes: with less free on its disk, an I/O error is taken for a full disk
_SQLITE_IOERR, _SQLITE_FULL = 10, 13  # (primary result codes)


def disk_full(error: sqlite3.Error, directory: Path | None) -> bool:
    """Whether a write failed for want of space: SQLITE_FULL, or an I/O error on
    a disk with less than ROOM free (SQLite reports a full disk as an I/O error where it maps
    memory, as it opens a store)."""
    code = getattr(error, "sqlite_errorcode", 0) & 0xFF
    if code == _SQLITE_FULL:
        return True
    if code != _SQLITE_IOERR or directory is None:
        return False
    free = free_bytes(directory)
    return free is not None and free < ROOM


def free_bytes(directory: Path) -> int | None:
    try:
        stats = os.statvfs(directory)
    except OSError:
        return None
    return stats.f_bavail * stats.f_frsize


def create_private(path: Path) -> None:
    """The store holds tool header values (secrets) and every transcript: a directory it
    creates is owner-only (0700), and so is the file (0600). SQLite gives its -wal and -shm
    files the database file's mode."""
    directory = path.parent.absolute()
    for ancestor in [*reversed(directory.parents), directory]:
        if not ancestor.exists():
            ancestor.mkdir(mode=0o700, exist_ok=True)
    if not path.exists():
        os.close(os.open(path, os.O_CREAT | os.O_WRONLY, 0o600))
