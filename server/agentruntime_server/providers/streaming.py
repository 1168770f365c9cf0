"""Streamed replies (docs/streaming.md): server-sent events read as they arrive, each piece
handed to the turn's stream, and the whole reply rebuilt as the API would have sent it in one
body, so that `parse` reads a streamed reply exactly as a whole one (truncation, refusals,
usage, thinking blocks).

The SSE decoder is ours: both providers' SDKs carry their own (openai's `SSEDecoder`,
anthropic's), and the libraries that stand alone read from a file or an httpx response, not
from the pieces our HTTP client hands over as they come."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

import msgspec

from ..domain.ports import ReplyStream

_decode = msgspec.json.Decoder().decode
FRAME = 0.02  # seconds: a streamed reply's pieces go to watchers at most this often (50 a second)


def _json(data: str) -> Any:
    try:
        return _decode(data)
    except msgspec.MsgspecError:
        return json.loads(data)  # what msgspec refuses and providers send (a lone surrogate escape)


class SseDecoder:
    """The event-stream format (WHATWG HTML, server-sent events): lines ending in LF (or
    CRLF), `event:` and `data:` fields, comments from `:`, an event dispatched at a blank
    line. Bytes in, as they come; each whole event to `on_event(name, data)`."""

    __slots__ = ("_buffer", "_data", "_event", "_on_event")

    def __init__(self, on_event: Callable[[str, str], None]) -> None:
        self._buffer = bytearray()
        self._event = ""
        self._data: list[str] = []
        self._on_event = on_event

    def feed(self, chunk: bytes) -> None:
        buffer = self._buffer
        buffer += chunk
        start = 0
        if not self._data and not self._event and b"\r" not in buffer:
            # The usual shape, an event a `data:` line: taken whole, without going line by line.
            while True:
                end = buffer.find(b"\n\n", start)
                if end < 0 or not buffer.startswith(b"data: ", start) or buffer.find(b"\n", start, end) >= 0:
                    break
                self._on_event("", buffer[start + 6 : end].decode("utf-8", "replace"))
                start = end + 2
        while True:
            end = buffer.find(b"\n", start)
            if end < 0:
                break
            line = bytes(buffer[start:end]).rstrip(b"\r").decode("utf-8", "replace")
            start = end + 1
            self._line(line)
        del buffer[:start]

    def _line(self, line: str) -> None:
        if not line:
            if self._data:
                data = "\n".join(self._data)
                self._data = []
                event, self._event = self._event, ""
                self._on_event(event, data)
            else:
                self._event = ""
            return
        if line.startswith(":"):
            return  # a comment (a keep-alive)
        name, _, value = line.partition(":")
        if value.startswith(" "):
            value = value[1:]
        if name == "data":
            self._data.append(value)
        elif name == "event":
            self._event = value


class StreamedReply:
    """One streamed reply being read: `feed` takes the body's pieces (it never raises: what
    goes wrong is kept in `problem` and the rest is ignored); `payload` is then the reply as a
    whole body, `error` the provider's error object if it sent one mid-stream."""

    def __init__(self, stream: ReplyStream) -> None:
        self.stream = stream
        self.error: Any = None  # the provider's error object, sent as an event
        self.problem: Exception | None = None  # what made the stream unreadable
        self.ended = False  # its end event came
        self._sse = SseDecoder(self._event)
        # Pieces held, joined while they are of one kind (and one call), and handed over at most
        # once a FRAME: a provider's events are a token or two each, and each delta costs a
        # gRPC message to every watcher (about 300 µs of the server's CPU at 20 streams). The
        # first piece after a quiet FRAME goes at once: the first delta of a turn never waits.
        self._held: list[Any] = []  # [kind, call index, name, [pieces]]
        self.max_chars = 1 << 20  # of the reply's pieces, all told: past it the reply is a bad one
        self._chars = 0
        self._loop = asyncio.get_running_loop()
        self._released = -FRAME
        self._timer: asyncio.TimerHandle | None = None

    def feed(self, chunk: bytes) -> None:
        if self.problem is not None or self.error is not None:
            return
        try:
            self._sse.feed(chunk)
        except (ValueError, KeyError, IndexError, TypeError, AttributeError, OverflowError, RecursionError) as exc:
            self.problem = exc
        if self._held and self._timer is None:
            due = self._released + FRAME
            if self._loop.time() >= due:
                self._release()
            else:
                self._timer = self._loop.call_at(due, self._release)

    def close(self, flush: bool) -> None:
        """The exchange is over: what is held goes now (`flush`), or never (a failed attempt,
        which a reset voids)."""
        if self._timer is not None:
            self._timer.cancel()
        if flush:
            self._release()
        self._held = []

    def _hold(self, kind: str, piece: str, call: int = -1, name: str = "") -> None:
        self._chars += len(piece) + len(name)
        if self._chars > self.max_chars:
            raise ValueError(f"the reply is over {self.max_chars} characters")
        held = self._held
        if held and held[-1][0] == kind and held[-1][1] == call and not name:
            held[-1][3].append(piece)
        else:
            held.append([kind, call, name, [piece]])

    def _text(self, piece: str) -> None:
        self._hold("text", piece)

    def _thinking(self, piece: str) -> None:
        self._hold("thinking", piece)

    def _tool_call(self, index: int, name: str, arguments: str) -> None:
        self._hold("tool_call", arguments, index, name)

    def _release(self) -> None:
        self._timer = None
        self._released = self._loop.time()
        stream = self.stream
        for kind, call, name, pieces in self._held:
            joined = "".join(pieces)
            if kind == "text":
                stream.text(joined)
            elif kind == "thinking":
                stream.thinking(joined)
            else:
                stream.tool_call(call, name, joined)
        self._held = []

    def _event(self, name: str, data: str) -> None:
        raise NotImplementedError

    def payload(self) -> dict[str, Any]:
        raise NotImplementedError

    @property
    def complete(self) -> bool:
        """Its end came: a stream cut short is a fault, retried."""
        raise NotImplementedError


class ChatCompletionStream(StreamedReply):
    """`chat.completion.chunk` objects (`stream: true` with `stream_options.include_usage`),
    then `[DONE]`; an `{"error": ...}` object in their place is the provider's error."""

    def __init__(self, stream: ReplyStream) -> None:
        super().__init__(stream)
        self._content: list[str] = []
        self._refusal: list[str] = []
        self._calls: dict[int, dict[str, Any]] = {}
        self._finish: Any = None
        self._usage: Any = None

    def _event(self, name: str, data: str) -> None:
        if self.error is not None or self.ended:
            return
        if data.strip() == "[DONE]":
            self.ended = True
            return
        chunk = _json(data)
        if not isinstance(chunk, dict):
            raise ValueError("a stream chunk is not an object")
        if chunk.get("error"):
            self.error = chunk["error"]
            return
        for choice in chunk.get("choices") or ():
            if choice.get("index", 0) != 0:
                continue
            self._delta(choice.get("delta") or {})
            if choice.get("finish_reason"):
                self._finish = choice["finish_reason"]
        if chunk.get("usage"):
            self._usage = chunk["usage"]

    def _delta(self, delta: dict[str, Any]) -> None:
        content, refusal = delta.get("content"), delta.get("refusal")
        if isinstance(content, str) and content:
            self._content.append(content)
            self._text(content)
        if isinstance(refusal, str) and refusal:
            self._refusal.append(refusal)
            self._text(refusal)  # a refusal is the reply's text in the transcript
        for call in delta.get("tool_calls") or ():
            index = int(call.get("index", 0))
            entry = self._calls.setdefault(index, {"id": "", "name": "", "arguments": []})
            if call.get("id"):
                entry["id"] = call["id"]
            function = call.get("function") or {}
            name, arguments = function.get("name") or "", function.get("arguments") or ""
            if not isinstance(name, str) or not isinstance(arguments, str):
                raise ValueError("a tool call's name or arguments is not a string")
            entry["name"] += name
            entry["arguments"].append(arguments)
            self._tool_call(sorted(self._calls).index(index), name, arguments)

    def payload(self) -> dict[str, Any]:
        calls = [
            {"id": entry["id"], "type": "function", "function": {"name": entry["name"], "arguments": "".join(entry["arguments"])}}
            for _, entry in sorted(self._calls.items())
        ]
        message: dict[str, Any] = {"role": "assistant", "content": "".join(self._content) or None}
        if calls:
            message["tool_calls"] = calls
        if self._refusal:
            message["refusal"] = "".join(self._refusal)
        return {"choices": [{"index": 0, "message": message, "finish_reason": self._finish}], "usage": self._usage}

    @property
    def complete(self) -> bool:
        """`[DONE]` came, or (from servers that leave it out) a finish reason."""
        return self.ended or self._finish is not None


class MessageStream(StreamedReply):
    """Anthropic's message events: message_start, content_block_start / delta / stop (text,
    input JSON, thinking and signature deltas), message_delta (the stop reason and the usage so
    far), message_stop, ping, and `error`."""

    def __init__(self, stream: ReplyStream) -> None:
        super().__init__(stream)
        self._blocks: dict[int, dict[str, Any]] = {}
        self._inputs: dict[int, list[str]] = {}
        self._call_of: dict[int, int] = {}  # block index -> the call's place among the reply's tool calls
        self._usage: dict[str, Any] = {}
        self._stop: Any = None

    def _event(self, name: str, data: str) -> None:
        if self.error is not None or self.ended:
            return
        event = _json(data)
        if not isinstance(event, dict):
            raise ValueError("an event is not an object")
        kind = event.get("type") or name
        if kind == "message_start":
            message = event["message"]
            self._usage.update(_figures(message.get("usage")))
            self._stop = message.get("stop_reason") or self._stop
        elif kind == "content_block_start":
            self._start(int(event["index"]), dict(event["content_block"]))
        elif kind == "content_block_delta":
            self._piece(int(event["index"]), event["delta"])
        elif kind == "message_delta":
            self._stop = (event.get("delta") or {}).get("stop_reason") or self._stop
            self._usage.update(_figures(event.get("usage")))
        elif kind == "message_stop":
            self.ended = True
        elif kind == "error":
            self.error = event.get("error") or {"type": "error", "message": "an error event"}

    def _start(self, index: int, block: dict[str, Any]) -> None:
        self._blocks[index] = block
        kind = block.get("type")
        if kind == "text" and block.get("text"):
            self._text(block["text"])
        elif kind == "thinking" and block.get("thinking"):
            self._thinking(block["thinking"])
        elif kind == "tool_use":
            self._inputs[index] = []
            self._call_of[index] = len(self._call_of)
            self._tool_call(self._call_of[index], str(block.get("name") or ""), "")

    def _piece(self, index: int, delta: dict[str, Any]) -> None:
        block = self._blocks[index]
        kind = delta.get("type")
        if kind == "text_delta":
            block["text"] = block.get("text", "") + _string(delta["text"])
            self._text(delta["text"])
        elif kind == "input_json_delta":
            self._inputs[index].append(_string(delta["partial_json"]))
            self._tool_call(self._call_of[index], "", delta["partial_json"])
        elif kind == "thinking_delta":
            block["thinking"] = block.get("thinking", "") + _string(delta["thinking"])
            self._thinking(delta["thinking"])
        elif kind == "signature_delta":
            block["signature"] = block.get("signature", "") + _string(delta["signature"])

    def payload(self) -> dict[str, Any]:
        content = []
        for index, block in sorted(self._blocks.items()):
            if index in self._inputs:
                pieces = "".join(self._inputs[index])
                block = {**block, "input": json.loads(pieces) if pieces.strip() else block.get("input") or {}}
            content.append(block)
        return {"type": "message", "content": content, "stop_reason": self._stop, "usage": self._usage}

    @property
    def complete(self) -> bool:
        return self.ended


def _figures(usage: Any) -> dict[str, Any]:
    """A usage object's figures that are set: message_delta's are cumulative and may leave
    out those message_start gave."""
    return {key: value for key, value in (usage or {}).items() if value is not None}


def _string(value: Any) -> str:
    if not isinstance(value, str):
        raise ValueError("a delta's piece is not a string")
    return value
