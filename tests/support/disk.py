"""A small disk of its own: a tmpfs of a given size mounted on a test's directory (mounting
needs root, as in CI; elsewhere the test is skipped and says why), filled to the last byte
by a ballast file, and given room again by deleting it or by growing the disk."""

from __future__ import annotations

import contextlib
import errno
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest


@contextlib.contextmanager
def small_disk(directory: Path, size: str) -> Iterator[Path]:
    directory.mkdir(parents=True, exist_ok=True)
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(directory)], capture_output=True, text=True
    )
    if mounted.returncode != 0:
        pytest.skip(f"a small disk is a tmpfs mounted for the test, which needs root: {mounted.stderr.strip()}")
    try:
        yield directory
    finally:
        subprocess.run(["umount", "--lazy", str(directory)], check=True)


def grow(directory: Path, size: str) -> None:
    """The disk gets bigger (as when an operator adds space), nothing on it touched."""
    subprocess.run(["mount", "-o", f"remount,size={size}", str(directory)], check=True)


def fill(directory: Path) -> Path:
    """A file that takes every byte left on the disk; delete it to give them back."""
    ballast = directory / "ballast"
    chunk = b"\0" * 4096
    with ballast.open("wb", buffering=0) as out:
        while True:
            try:
                out.write(chunk)
            except OSError as exc:
                if exc.errno != errno.ENOSPC:
                    raise
                break
    return ballast
