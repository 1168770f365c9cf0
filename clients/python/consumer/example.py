"""A user's program on the released client: the consumer test (make consumer-test) installs the
wheel into a fresh virtualenv, type-checks this file with `mypy --strict` and runs it against
the server in AGENTRUNTIME_ADDR. It exits non-zero unless every figure is the expected one."""

from __future__ import annotations

import asyncio
import os
import sys
from datetime import timedelta

from agentruntime import AgentRuntimeError, Client, SyncClient
from agentruntime.v1 import agent_runtime_pb2 as pb
from google.protobuf import json_format

TOKENS = 11


def agents() -> list[pb.AgentDef]:
    reply = pb.ScriptedReply(text="hello from the scripted model", tokens=TOKENS, delay=timedelta(milliseconds=20))
    return [pb.AgentDef(name="greeter", description="says hello", script=pb.Script(replies=[reply]))]


def budget_answer(request_id: str) -> pb.Answer:
    """Grants a `budget` Request three more turns: the Struct given as a dict, as protobuf takes it."""
    return pb.Answer(id=request_id, ok=True, data={"extend": {"max_turns": 3}})


def check(what: str, got: object, want: object) -> None:
    if got != want:
        sys.exit(f"consumer example: {what} is {got!r}, expected {want!r}")


async def with_async_client(address: str) -> str:
    async with Client(address, keepalive=30.0) as client:
        runtime_id = await client.create_runtime(agents())
        result = await client.run(runtime_id, "greeter", "say hello")
        check("status", pb.Status.Name(result.status), "STATUS_DONE")
        check("total_tokens", result.total_tokens, TOKENS)
        check("turns", result.turns, 1)
        print(f"async: {result.handle_id} {pb.Status.Name(result.status)} turns={result.turns} tokens={result.total_tokens}")
        try:
            await client.inspect(runtime_id, "root/nobody.1")
        except AgentRuntimeError as error:
            info = error.resource_info
            check("is_not_found", error.is_not_found, True)
            check("resource", (info.resource_type, info.resource_name) if info else None, ("handle", "root/nobody.1"))
            print(f"async: NOT_FOUND as expected ({error.code.name}, {info.resource_type if info else ''})")
        else:
            sys.exit("consumer example: Inspect of a missing handle succeeded")
        return runtime_id


def with_sync_client(address: str, runtime_id: str) -> None:
    with SyncClient(address) as client:
        handle = client.spawn(runtime_id, "greeter", budget=pb.Budget(max_turns=2, max_wall_time=timedelta(seconds=30)))
        client.wake(runtime_id, handle, "again")
        result = client.wait(runtime_id, handle)
        check("own_tokens", result.own_tokens, TOKENS)
        views = list(client.iter_handles(runtime_id, page_size=1))
        check("handles", [view.handle_id for view in views], ["root/greeter.1", "root/greeter.2"])
        status = pb.Status.Name(result.status)
        print(f"sync: {handle} {status} own_tokens={result.own_tokens}; {len(views)} handles listed page by page")
        client.delete_runtime(runtime_id)


def main() -> None:
    address = os.environ.get("AGENTRUNTIME_ADDR", "127.0.0.1:50051")
    check("answer data", json_format.MessageToDict(budget_answer("r1").data), {"extend": {"max_turns": 3.0}})
    runtime_id = asyncio.run(with_async_client(address))
    with_sync_client(address, runtime_id)
    print("consumer example: ok")


if __name__ == "__main__":
    main()
