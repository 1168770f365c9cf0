"""Files the authenticators read (the tokens file, a JWKS file), parsed again when they
change: a credential is revoked, or a key rotated, without a restart."""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable
from typing import Any, Generic, TypeVar

from ..settings import StartupError

log = logging.getLogger("agentruntime_server.api.auth")  # what operators filter on for auth, as before

RECHECK_SECONDS = 1.0  # a watched file is looked at (stat) at most this often
MAX_FILE_BYTES = 4 << 20
T = TypeVar("T")
Signature = tuple[int, int, int, int]


def _signature(path: str) -> Signature:
    status = os.stat(path)
    return (status.st_mtime_ns, status.st_size, status.st_ino, status.st_dev)


def _read(path: str) -> bytes:
    with open(path, "rb") as file:
        data = file.read(MAX_FILE_BYTES + 1)
    if len(data) > MAX_FILE_BYTES:
        raise ValueError(f"is larger than {MAX_FILE_BYTES} bytes")
    return data


class WatchedFile(Generic[T]):
    """A file parsed at start (a failure is a StartupError) and parsed again when it changes
    (its mtime, size or inode; looked at once every RECHECK_SECONDS at most). A version that
    cannot be read or parsed keeps the last good value and logs one warning.
    `parse` raises ValueError with a message that never quotes the content."""

    def __init__(self, path: str, setting: str, parse: Callable[[bytes], T]) -> None:
        self.path = path
        self.setting = setting
        self.parse = parse
        try:
            signature = _signature(path)
            self.value = parse(_read(path))
        except OSError as error:
            raise StartupError(f"{setting}: cannot read {path}: {error.strerror or type(error).__name__}") from None
        except ValueError as error:
            raise StartupError(f"{setting}: {path} {error}") from None
        self.signature = signature
        self.checked = time.monotonic()
        self.warned: object = None  # the bad version last warned about: one warning each

    def current(self) -> T:
        now = time.monotonic()
        if now - self.checked < RECHECK_SECONDS:
            return self.value
        self.checked = now
        try:
            signature = _signature(self.path)
            if signature == self.signature:
                self.warned = None  # back as it was: a new problem warns again
                return self.value
            value = self.parse(_read(self.path))
        except OSError as error:
            self._warn(("unreadable", error.errno), f"cannot read it ({error.strerror or type(error).__name__})")
            return self.value
        except ValueError as error:
            self._warn(signature, str(error))
            return self.value
        self.value, self.signature, self.warned = value, signature, None
        log.info("%s: %s changed; reloaded", self.setting, self.path)
        return value

    def _warn(self, version: object, problem: str) -> None:
        if version != self.warned:
            self.warned = version
            log.warning("%s: %s %s; still using the version read before", self.setting, self.path, problem)


def json_file(data: bytes) -> Any:
    """A watched file's JSON; ValueError says why it is not (for the tokens file and a JWKS)."""
    try:
        return json.loads(data.decode("utf-8-sig"))
    except UnicodeDecodeError:
        raise ValueError("is not UTF-8 text") from None
    except json.JSONDecodeError as error:
        raise ValueError(f"is not JSON ({error.msg} at line {error.lineno}, column {error.colno})") from None
