"""A Watch's batches (WatchRequest.batch): the events at hand, converted, in as few responses
as the send limit allows."""

from __future__ import annotations

from agentruntime.v1 import agent_runtime_pb2 as pb

from ..domain.watching.event_log import Event
from . import convert


async def event_to_proto(event: Event) -> pb.Event:
    """An event as a Watch sends it (a result's typed output converted off the loop first)."""
    if event.result is not None:
        await convert.prepare_output(event.result)
    return convert.event_to_proto(event)


async def batched(events: list[Event], most_bytes: int) -> list[pb.WatchResponse]:
    """Events as responses of at most `most_bytes` each (an event larger than that goes alone:
    its limit is its own, as for one event a response)."""
    responses: list[pb.WatchResponse] = []
    batch: list[pb.Event] = []
    size = 0
    for event in events:
        converted = await event_to_proto(event)
        weight = converted.ByteSize() + 8  # (its tag and length in the response)
        if batch and size + weight > most_bytes:
            responses.append(pb.WatchResponse(events=batch))
            batch, size = [], 0
        batch.append(converted)
        size += weight
    responses.append(pb.WatchResponse(events=batch))
    return responses
