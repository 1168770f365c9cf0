"""ForkRuntime and ReplayRuntime at the edge: checked, converted, handed to the domain's
branches (domain/runtime/branches.py), and the replay's diffs converted back."""

from __future__ import annotations

import functools

from agentruntime.v1 import agent_runtime_pb2 as pb

from ..domain.errors import FieldViolation, InvalidArgument
from ..domain.limits import MAX_WAIT_TIMEOUT
from ..domain.runtime.branches import Branches, replay_settled
from ..domain.runtime.forks import ForkChanges
from ..domain.runtime.replays import RootDiff, diffs
from ..domain.runtime.service import RuntimeService
from ..domain.vocabulary import UnrecordedCalls
from . import convert
from .definitions_memo import DecodedDefinitions
from .edge import Context, edge, require, tenant
from .request_ids import request_key

MAX_CHANGES = 100  # messages or answers one fork may change


class ForkAndReplay:
    """The servicer's ForkRuntime and ReplayRuntime (a part of AgentRuntimeServicer)."""

    service: RuntimeService
    definitions: DecodedDefinitions

    @functools.cached_property
    def branches(self) -> Branches:
        return Branches(self.service)

    @edge
    async def ForkRuntime(self, request: pb.ForkRuntimeRequest, context: Context) -> pb.ForkRuntimeResponse:
        key = request_key(request)
        require(source_runtime_id=request.source_runtime_id)
        found: list[FieldViolation] = []
        agents, decoding = self.definitions.decode(tenant(), request.agents) if request.agents else ((), [])
        found.extend(decoding)
        if len(request.messages) > MAX_CHANGES or len(request.answers) > MAX_CHANGES:
            found.append(FieldViolation("messages", f"a fork changes at most {MAX_CHANGES} messages and answers"))
        messages = []
        for index, change in enumerate(request.messages):
            if not change.handle_id:
                found.append(FieldViolation(f"messages[{index}].handle_id", "is required"))
            messages.append((change.handle_id, change.text))
        if len({handle_id for handle_id, _ in messages}) < len(messages):
            found.append(FieldViolation("messages", "names a handle twice"))
        answers = []
        for index, answer in enumerate(request.answers):
            if not answer.id:
                found.append(FieldViolation(f"answers[{index}].id", "is required"))
            answers.append(convert.answer_from_proto(answer))
        if found and not request.agents:
            raise InvalidArgument(found)
        changes = ForkChanges(agents, tuple(messages), tuple(answers))
        runtime = await self.branches.fork(
            request.source_runtime_id, request.at_seq, request.runtime_id, changes, found, tenant(), key
        )
        origin = runtime.tree.origin
        return pb.ForkRuntimeResponse(
            runtime_id=runtime.id,
            fork_seq=origin[1] if origin else 0,
            held_handle_ids=[handle.id for handle in runtime.tree.held],
        )

    @edge
    async def ReplayRuntime(self, request: pb.ReplayRuntimeRequest, context: Context) -> pb.ReplayRuntimeResponse:
        key = request_key(request, waits=True)
        require(source_runtime_id=request.source_runtime_id)
        found: list[FieldViolation] = []
        timeout = None
        if request.HasField("timeout"):
            timeout = convert.duration_seconds(request.timeout, "timeout", found)
            if timeout is not None and not 0 <= timeout <= MAX_WAIT_TIMEOUT:
                found.append(FieldViolation("timeout", f"must be between 0 and {MAX_WAIT_TIMEOUT / 3600:g} hours"))
        unrecorded = UnrecordedCalls.RECORDED_ONLY
        if request.unrecorded_calls:
            try:
                unrecorded = UnrecordedCalls(request.unrecorded_calls)
            except ValueError:
                found.append(FieldViolation("unrecorded_calls", "not an UnrecordedCalls value"))
        agents, decoding = self.definitions.decode(tenant(), request.agents) if request.agents else ((), [])
        found.extend(decoding)
        if found and not request.agents:
            raise InvalidArgument(found)
        runtime = await self.branches.replay(
            request.source_runtime_id, agents, unrecorded, request.runtime_id, found, tenant(), key
        )
        remaining = context.time_remaining()
        if remaining is not None:  # answered before the caller's deadline, however long the replay
            remaining = max(remaining - 1.0, 0.0) if remaining > 2.0 else remaining / 2
            timeout = remaining if timeout is None else min(timeout, remaining)
        settled = await replay_settled(runtime, timeout)
        found_diffs = diffs(runtime)
        for diff in found_diffs:
            for result in (diff.recorded, diff.replayed):
                if result is not None:
                    await convert.prepare_output(result)
        return pb.ReplayRuntimeResponse(
            runtime_id=runtime.id,
            diffs=[_diff_to_proto(diff) for diff in found_diffs],
            settled=settled,
            changed_count=sum(bool(diff.changed) for diff in found_diffs),
        )


def _diff_to_proto(diff: RootDiff) -> pb.ReplayDiff:
    message = pb.ReplayDiff(
        handle_id=diff.handle_id,
        recorded_calls=[pb.ReplayCall(handle_id=h, name=n, arguments_json=a) for h, n, a in diff.recorded_calls],
        replayed_calls=[pb.ReplayCall(handle_id=h, name=n, arguments_json=a) for h, n, a in diff.replayed_calls],
        changed=list(diff.changed),
    )
    if diff.recorded is not None:
        message.recorded.CopyFrom(convert.result_to_proto(diff.recorded))
    if diff.replayed is not None:
        message.replayed.CopyFrom(convert.result_to_proto(diff.replayed))
    return message
