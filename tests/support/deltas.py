"""Reading a runtime's Watch with deltas, as a UI would."""

from __future__ import annotations

from dataclasses import dataclass, field

import grpc
from agentruntime.v1 import agent_runtime_pb2 as pb
from agentruntime.v1 import agent_runtime_pb2_grpc as pb_grpc


@dataclass
class Watched:
    """What one Watch with deltas sent, in order, up to the handle's result (or a cut)."""

    responses: list[pb.WatchResponse] = field(default_factory=list)

    @property
    def deltas(self) -> list[pb.Delta]:
        return [r.delta for r in self.responses if r.HasField("delta")]

    @property
    def events(self) -> list[pb.Event]:
        return [r.event for r in self.responses if r.HasField("event")]

    def of(self, handle_id: str) -> list[pb.Delta]:
        return [d for d in self.deltas if d.handle_id == handle_id]

    @property
    def result(self) -> pb.TaskResult | None:
        results = [e.result for e in self.events if e.HasField("result")]
        return results[-1] if results else None


def joined(deltas: list[pb.Delta], turn: int | None = None) -> str:
    """The text a UI shows: the pieces in order, a reset clearing its turn's so far."""
    texts: dict[int, str] = {}
    for delta in deltas:
        if turn is not None and delta.turn != turn:
            continue
        piece = delta.WhichOneof("piece")
        if piece == "reset":
            texts[delta.turn] = ""
        elif piece == "text":
            texts[delta.turn] = texts.get(delta.turn, "") + delta.text
    return "".join(texts[key] for key in sorted(texts))


async def watch(
    stub: pb_grpc.AgentRuntimeAsyncStub,
    runtime_id: str,
    handle_id: str,
    after: int = 0,
    *,
    cut_after_deltas: int | None = None,
    timeout: float = 60,
) -> Watched:
    """Watch with deltas from `after` until `handle_id`'s result event, or until
    `cut_after_deltas` deltas came (the watcher goes away mid-turn)."""
    watched = Watched()
    call = stub.Watch(pb.WatchRequest(runtime_id=runtime_id, after_seq=after, deltas=True), timeout=timeout)
    try:
        async for response in call:
            watched.responses.append(response)
            if cut_after_deltas is not None and len(watched.deltas) >= cut_after_deltas:
                break
            event = response.event
            if response.HasField("event") and event.handle_id == handle_id and event.HasField("result"):
                break
    except grpc.aio.AioRpcError:
        if cut_after_deltas is None:
            raise
    finally:
        call.cancel()
    return watched
