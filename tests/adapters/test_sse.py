"""The server-sent events decoder a streamed model reply is read with: the same events
however the stream is cut into pieces, CRLF or LF, comments, multi-line data."""

from __future__ import annotations

import itertools

from agentruntime_server.providers.streaming import SseDecoder
from hypothesis import given
from hypothesis import strategies as st

STREAM = (
    b": a comment, a keep-alive\n\n"
    b'data: {"a": 1}\n\n'
    b"event: ping\ndata: {}\n\n"
    b"data: first line\ndata: second line\n\n"
    b'event: message_stop\r\ndata: {"type": "message_stop"}\r\n\r\n'
    b"data:no space\n\n"
    b"retry: 1000\nid: 7\ndata: [DONE]\n\n"
)
EVENTS = [
    ("", '{"a": 1}'),
    ("ping", "{}"),
    ("", "first line\nsecond line"),
    ("message_stop", '{"type": "message_stop"}'),
    ("", "no space"),
    ("", "[DONE]"),
]


def decoded(pieces: list[bytes]) -> list[tuple[str, str]]:
    events: list[tuple[str, str]] = []
    decoder = SseDecoder(lambda name, data: events.append((name, data)))
    for piece in pieces:
        decoder.feed(piece)
    return events


def test_a_whole_stream_decodes_to_its_events() -> None:
    assert decoded([STREAM]) == EVENTS


@given(st.lists(st.integers(min_value=0, max_value=len(STREAM)), max_size=12))
def test_any_cut_of_the_stream_decodes_to_the_same_events(cuts: list[int]) -> None:
    bounds = [0, *sorted(cuts), len(STREAM)]
    assert decoded([STREAM[a:b] for a, b in itertools.pairwise(bounds)]) == EVENTS


def test_an_event_not_yet_ended_by_a_blank_line_waits() -> None:
    assert decoded([b'data: {"partial": true}\n']) == []
