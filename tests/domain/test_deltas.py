"""Watching with deltas (watching/deltas.py, watching/event_log.py; docs/streaming.md), on the
fake clock: a scripted reply streams in pieces of `stream_chunk_chars`, `stream_pause` apart,
so a watcher sees each piece when the clock reaches it, in order, then the turn's journaled
end. A watcher that comes late or reconnects mid-turn gets the turn again from index 0, once;
a watcher without deltas sees only events. What the pieces say never contradicts the journal."""

from __future__ import annotations

import dataclasses
from typing import Any

from agentruntime_server.domain.journal.events import Event, EventKind
from agentruntime_server.domain.runtime.runtime import Runtime
from agentruntime_server.domain.vocabulary import ReplyStop, ScriptedReply, Status
from agentruntime_server.domain.watching.deltas import Delta, DeltaKind

from tests.domain.harness import Bench, agent, http_tool, reply
from tests.domain.kit_turns import NEVER_HANGS, Watcher, joined

pytestmark = NEVER_HANGS

TEXT = "Streaming lets a person read an answer while the model is still writing it."  # 75 characters
PIECES = 10  # of 8 characters, the last of 3
DELEGATE = '{"agent": "worker", "prompt": "go"}'


def streamed(text: str = TEXT, chunk: int = 8, pause: float = 0.5, **fields: Any) -> ScriptedReply:
    """A reply streamed in pieces of `chunk` characters, `pause` seconds apart."""
    made: ScriptedReply = reply(text, tokens=19, **fields)
    return dataclasses.replace(made, stream_chunk_chars=chunk, stream_pause=pause)


async def writer(bench: Bench, *replies: ScriptedReply) -> tuple[Runtime, str]:
    runtime = await bench.create(agent("writer", *(replies or (streamed(),))))
    return runtime, await bench.spawn(runtime, "writer")


def seq_of(watcher: Watcher, handle_id: str, kind: EventKind, turn: int = 1) -> int:
    [event] = [e for e in watcher.events if e.handle_id == handle_id and e.kind is kind and (e.turn == turn or not e.turn)]
    return event.seq


def journal_agrees(runtime: Runtime, watcher: Watcher) -> None:
    """Every turn's pieces after its last reset say what its journaled reply says, and come
    between its TURN_STARTED and its TURN_ENDED."""
    for handle in runtime.handles.values():
        for message in (m for m in handle.transcript if m.role == "assistant"):
            pieces = watcher.deltas(handle.id, message.turn)
            resets = [index for index, piece in enumerate(pieces) if piece.kind is DeltaKind.RESET]
            last = pieces[resets[-1] + 1 :] if resets else pieces
            assert joined([p for p in last if p.kind is DeltaKind.TEXT]) == message.content, (handle.id, message.turn)
            calls = [(p.call_index, p.name, p.text) for p in last if p.kind is DeltaKind.TOOL_CALL]
            assert calls == [(i, c.name, c.arguments_json) for i, c in enumerate(message.tool_calls)], (handle.id, calls)
            ended = [e for e in watcher.events if e.handle_id == handle.id and e.kind is EventKind.TURN_ENDED]
            [end] = [e for e in ended if e.turn == message.turn]
            assert all(piece.after_seq < end.seq for piece in pieces)
            order = watcher.items.index(end)
            assert all(watcher.items.index(piece) < order for piece in pieces)


async def test_a_watcher_with_deltas_sees_each_piece_when_the_clock_reaches_it_then_the_turns_end(bench: Bench) -> None:
    runtime, handle_id = await writer(bench)
    watcher = Watcher(runtime)
    await bench.clock.settle()  # subscribed before the turn starts
    await runtime.wake(handle_id, "write")
    await bench.clock.settle()
    for seen in range(1, PIECES):
        assert len(watcher.deltas(handle_id)) == seen  # the clock has not reached the next piece
        await bench.clock.advance(0.5)
    result = await runtime.wait(handle_id, None)
    await bench.clock.settle()
    await watcher.stop()
    pieces = watcher.deltas(handle_id)
    assert [(d.index, d.turn, d.kind) for d in pieces] == [(n, 1, DeltaKind.TEXT) for n in range(PIECES)]
    assert [len(d.text) for d in pieces] == [8] * 9 + [3] and joined(pieces) == TEXT == result.text
    kinds = watcher.kinds(handle_id)
    started = kinds.index("TURN_STARTED")
    assert kinds[started + 1 : started + 1 + PIECES] == ["delta"] * PIECES and kinds[started + 1 + PIECES] == "TURN_ENDED"
    assert {d.after_seq for d in pieces} == {seq_of(watcher, handle_id, EventKind.TURN_STARTED)}  # each names the event before it
    journal_agrees(runtime, watcher)


async def test_a_watcher_without_deltas_sees_only_events_numbered_without_a_gap(bench: Bench) -> None:
    runtime, handle_id = await writer(bench)
    watcher = Watcher(runtime, deltas=False)
    await bench.clock.settle()
    await runtime.wake(handle_id, "write")
    await bench.clock.advance(10)
    await runtime.wait(handle_id, None)
    await bench.clock.settle()
    await watcher.stop()
    assert all(isinstance(item, Event) for item in watcher.items)
    assert [e.seq for e in watcher.events] == list(range(1, len(watcher.events) + 1))
    assert [e.kind for e in watcher.events].count(EventKind.RESULT) == 1


async def test_a_watcher_cut_mid_turn_gets_the_turn_again_from_index_0_once(bench: Bench) -> None:
    runtime, handle_id = await writer(bench)
    first = Watcher(runtime)
    await bench.clock.settle()
    await runtime.wake(handle_id, "write")
    await bench.clock.advance(1.5)
    await first.stop()
    assert [d.index for d in first.deltas(handle_id)] == [0, 1, 2, 3]
    last_seq = first.events[-1].seq

    again = Watcher(runtime, after=last_seq)
    await bench.clock.advance(10)
    await runtime.wait(handle_id, None)
    await bench.clock.settle()
    await again.stop()
    pieces = again.deltas(handle_id)
    assert [d.index for d in pieces] == list(range(PIECES))  # from 0, each once: the kept ones, then the live ones
    assert joined(pieces) == TEXT
    assert [e.seq for e in again.events] == list(range(last_seq + 1, last_seq + 1 + len(again.events)))
    journal_agrees(runtime, again)


async def test_a_turn_streams_though_nobody_watched_when_it_began_and_a_late_watcher_gets_it_from_0(bench: Bench) -> None:
    runtime, handle_id = await writer(bench)
    await runtime.wake(handle_id, "write")
    await bench.clock.advance(2.2)  # five pieces streamed to nobody
    late = Watcher(runtime)
    await bench.clock.settle()
    assert [d.index for d in late.deltas(handle_id)] == [0, 1, 2, 3, 4]
    assert late.kinds(handle_id)[-6:] == ["TURN_STARTED"] + ["delta"] * 5  # in their place after the history
    await bench.clock.advance(10)
    await runtime.wait(handle_id, None)
    await bench.clock.settle()
    await late.stop()
    assert [d.index for d in late.deltas(handle_id)] == list(range(PIECES)) and joined(late.deltas(handle_id)) == TEXT


async def test_every_handle_streams_children_included_and_a_tool_call_is_one_piece(bench: Bench) -> None:
    lead = agent(
        "lead",
        reply(calls=(("task", {"agent": "worker", "prompt": "go"}),)),
        streamed("the lead sums up", chunk=4, pause=0),
        team=("worker",),
    )
    runtime = await bench.create(lead, agent("worker", streamed("the worker's own words", chunk=5)))
    handle_id = await bench.spawn(runtime, "lead")
    watcher = Watcher(runtime)
    await bench.clock.settle()
    await runtime.wake(handle_id, "go")
    await bench.clock.advance(5)
    result = await runtime.wait(handle_id, None)
    await bench.clock.settle()
    await watcher.stop()
    assert result.status is Status.DONE
    [call] = watcher.deltas(handle_id, 1)
    assert (call.kind, call.call_index, call.name, call.text) == (DeltaKind.TOOL_CALL, 0, "task", DELEGATE)
    assert joined(watcher.deltas(f"{handle_id}/worker.1")) == "the worker's own words"
    assert [d.text for d in watcher.deltas(handle_id, 2)] == ["the ", "lead", " sum", "s up"]
    journal_agrees(runtime, watcher)


async def test_a_cut_off_reply_streams_its_cut_text_and_a_failed_turn_streams_nothing(bench: Bench) -> None:
    runtime = await bench.create(
        agent("cut", streamed("The answer is", chunk=5, stop=ReplyStop.MAX_OUTPUT_TOKENS)),
        agent("failing", reply(stop=ReplyStop.PROVIDER_UNAVAILABLE)),
    )
    cut, failing = await bench.spawn(runtime, "cut"), await bench.spawn(runtime, "failing")
    watcher = Watcher(runtime)
    await bench.clock.settle()
    for handle_id in (cut, failing):
        await runtime.wake(handle_id, "go")
    await bench.clock.advance(5)
    assert (await runtime.wait(cut, None)).status is Status.INCOMPLETE
    assert (await runtime.wait(failing, None)).status is Status.ERROR
    await bench.clock.settle()
    await watcher.stop()
    assert joined(watcher.deltas(cut)) == "The answer is"
    assert watcher.deltas(failing) == [] and "TURN_STARTED" in watcher.kinds(failing)
    journal_agrees(runtime, watcher)


async def test_a_turn_run_again_after_an_interrupt_resets_its_stream_and_the_journal_has_the_second_go(bench: Bench) -> None:
    runtime, handle_id = await writer(bench)
    watcher = Watcher(runtime)
    await bench.clock.settle()
    await runtime.wake(handle_id, "write")
    await bench.clock.advance(1)
    await runtime.interrupt(handle_id)  # three pieces out; the turn's reply never comes
    await runtime.wake(handle_id, "write")
    await bench.clock.advance(10)
    result = await runtime.wait(handle_id, None)
    await bench.clock.settle()
    await watcher.stop()
    assert (result.status, result.text, result.usage.turns) == (Status.DONE, TEXT, 1)
    pieces = watcher.deltas(handle_id, 1)
    assert [(d.kind, d.index) for d in pieces[:4]] == [
        (DeltaKind.TEXT, 0),
        (DeltaKind.TEXT, 1),
        (DeltaKind.TEXT, 2),
        (DeltaKind.RESET, 0),
    ]
    assert pieces[3].text == "rerun" and joined(pieces[4:]) == TEXT
    assert [d.index for d in pieces[4:]] == list(range(1, PIECES + 1))
    journal_agrees(runtime, watcher)


async def test_deltas_never_contradict_the_journal_over_turns_with_calls_and_text(bench: Bench) -> None:
    worker = agent(
        "worker",
        streamed("Looking it up: ", chunk=3, pause=0.25, calls=(("lookup", {"q": "rates"}), ("lookup", {"q": "fees"}))),
        streamed("Rates and fees found; here they are, in full.", chunk=7, pause=0.25),
        tools=(http_tool("lookup"),),
    )
    runtime = await bench.create(worker)
    handle_id = await bench.spawn(runtime, "worker")
    watcher = Watcher(runtime)
    await bench.clock.settle()
    await runtime.wake(handle_id, "look")
    await bench.clock.advance(5)
    await runtime.wait(handle_id, None)
    await bench.clock.settle()
    await watcher.stop()
    turn_one = watcher.deltas(handle_id, 1)
    assert [d.kind for d in turn_one] == [DeltaKind.TEXT] * 5 + [DeltaKind.TOOL_CALL] * 2
    assert all(isinstance(piece, Delta) for piece in watcher.deltas(handle_id, 2)) and len(watcher.deltas(handle_id, 2)) == 7
    journal_agrees(runtime, watcher)
