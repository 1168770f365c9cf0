"""A schema judge's worker process: `python -m agentruntime_server.process.schema_worker`.

It reads checks from its standard input and writes verdicts to its standard output, one at a
time, with the same code the event loop uses for cheap checks (domain/definitions/schemas.py), so a verdict
does not depend on where it was reached. The server (schema_judges.py) kills it when a check
spends its time budget and starts another; its memory is capped so that no check can take the
host's. It imports no more than the schema code, and is given no secret.

A check: two 4-byte big-endian lengths, then the schema's JSON text and the instance's (UTF-8,
lone surrogates passed through). A verdict: a status byte (VALID, PROBLEM, FAULT), a 4-byte
length, and the text (the problem, or the fault's kind). Before the first check it writes READY."""

from __future__ import annotations

import collections
import json
import resource
import struct
import sys
from typing import BinaryIO

READY = b"R"
VALID, PROBLEM, FAULT = 0, 1, 2
HEADER = struct.Struct(">II")
VERDICT = struct.Struct(">BI")
MEMORY_LIMIT = 1 << 30  # bytes of address space: a check that needs more is a fault
SCHEMAS_KEPT = 64


def main() -> None:
    try:
        resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))
    except (ValueError, OSError):  # a lower hard limit is kept as it is
        pass
    sys.setrecursionlimit(10_000)  # the validators recurse with the schema and the instance
    from ..domain.definitions.schemas import ArgumentsSchema

    compiled: collections.OrderedDict[str, ArgumentsSchema] = collections.OrderedDict()
    reader, writer = sys.stdin.buffer, sys.stdout.buffer
    writer.write(READY)  # imported: from here on a check's time is the check's own
    writer.flush()
    while True:
        header = _read(reader, HEADER.size)
        if header is None:
            return
        schema_size, instance_size = HEADER.unpack(header)
        body = _read(reader, schema_size + instance_size)
        if body is None:
            return
        schema_text = body[:schema_size].decode("utf-8", "surrogatepass")
        instance_text = body[schema_size:].decode("utf-8", "surrogatepass")
        try:
            schema = compiled.get(schema_text)
            if schema is None:
                schema = compiled[schema_text] = ArgumentsSchema(json.loads(schema_text))
                if len(compiled) > SCHEMAS_KEPT:
                    compiled.popitem(last=False)
            compiled.move_to_end(schema_text)
            problem = schema.problem(json.loads(instance_text))
            status, text = (VALID, "") if problem is None else (PROBLEM, problem)
        except Exception as exc:  # RecursionError, MemoryError, a keyword applied to what it does not expect
            status, text = FAULT, type(exc).__name__
        data = text.encode("utf-8", "surrogatepass")
        writer.write(VERDICT.pack(status, len(data)) + data)
        writer.flush()


def _read(reader: BinaryIO, size: int) -> bytes | None:
    data = reader.read(size)
    return data if len(data) == size else None


if __name__ == "__main__":
    main()
