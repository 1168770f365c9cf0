"""A blocking client beside the asyncio one, for scripts and synchronous services.

`SyncClient` runs an asyncio `Client` on an event loop of its own, in a daemon thread: the
same calls with the same arguments, the same waiting, retries and errors
(`AgentRuntimeError`), one implementation. Calls may come from any thread.

    with SyncClient("127.0.0.1:50051") as client:
        runtime_id = client.create_runtime(agents)
        result = client.run(runtime_id, "coordinator", "map the repo")"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator, Mapping, Sequence
from types import TracebackType
from typing import Any, TypeVar

from google.protobuf.message import Message

from agentruntime.v1 import agent_runtime_pb2 as pb

from .client import Client

T = TypeVar("T")

# A worker tool's handler for the blocking client: it runs in a thread of its own, so it
# may block (the client's loop goes on serving other calls meanwhile).
SyncToolHandler = Callable[[dict[str, Any], "pb.WorkerCall"], str]


class SyncClient:
    def __init__(self, target: str, **options: Any) -> None:
        """`options`: as Client's (token, tls, root_certificates, client_cert, client_key, timeout,
        keepalive, keepalive_timeout, keepalive_without_calls, interceptors, channel_options,
        retries, retry_window)."""
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="agentruntime-client", daemon=True)
        self._thread.start()
        self._closing = False
        self._client: Client = self._run(self._open(target, options))

    @staticmethod
    async def _open(target: str, options: dict[str, Any]) -> Client:
        return Client(target, **options)  # its channel belongs to the loop it is made on

    def _run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        future = asyncio.run_coroutine_threadsafe(coroutine, self._loop)
        try:
            return future.result()
        except BaseException:
            future.cancel()  # Ctrl-C in the caller: the call stops too
            raise

    def __enter__(self) -> SyncClient:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None) -> None:
        self.close_channel()

    def close_channel(self) -> None:
        """Ends every call still under way (a serve_tools, a watch) and closes the channel."""
        if self._loop.is_closed():
            return
        self._closing = True
        self._run(self._shutdown())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()

    async def _shutdown(self) -> None:
        others = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
        for task in others:
            task.cancel()
        await asyncio.gather(*others, return_exceptions=True)
        await self._client.close_channel()

    @property
    def metadata(self) -> tuple[tuple[str, str], ...]:
        return self._client.metadata

    @property
    def channel_options(self) -> tuple[tuple[str, Any], ...]:
        return self._client.channel_options

    @property
    def retries(self) -> bool:
        return self._client.retries

    @property
    def retry_window(self) -> float:
        return self._client.retry_window

    def call(self, method: str, request: Message, *, timeout: float | None = None) -> Any:
        """Any unary RPC by its name, retried, with a request id when it takes one (Client.call)."""
        return self._run(self._client.call(method, request, timeout=timeout))

    def create_runtime(self, agents: Sequence[pb.AgentDef], runtime_id: str = "", *, request_id: str | None = None) -> str:
        return self._run(self._client.create_runtime(agents, runtime_id, request_id=request_id))

    def spawn(
        self, runtime_id: str, agent: str, parent: str = "root", budget: pb.Budget | None = None, *, request_id: str | None = None
    ) -> str:
        return self._run(self._client.spawn(runtime_id, agent, parent, budget, request_id=request_id))

    def post(
        self, runtime_id: str, handle_id: str, text: str, channel: str = "", sender: str = "", *, request_id: str | None = None
    ) -> int:
        return self._run(self._client.post(runtime_id, handle_id, text, channel, sender, request_id=request_id))

    def wake(self, runtime_id: str, handle_id: str, prompt: str = "", *, request_id: str | None = None) -> bool:
        return self._run(self._client.wake(runtime_id, handle_id, prompt, request_id=request_id))

    def wait(self, runtime_id: str, handle_id: str, timeout: float | None = None) -> pb.TaskResult:
        return self._run(self._client.wait(runtime_id, handle_id, timeout))

    def resume(self, runtime_id: str, answer: pb.Answer, *, request_id: str | None = None) -> pb.TaskResult:
        return self._run(self._client.resume(runtime_id, answer, request_id=request_id))

    def run(
        self,
        runtime_id: str,
        agent: str,
        prompt: str,
        parent: str = "root",
        *,
        spawn_request_id: str | None = None,
        wake_request_id: str | None = None,
    ) -> pb.TaskResult:
        ids = {"spawn_request_id": spawn_request_id, "wake_request_id": wake_request_id}
        return self._run(self._client.run(runtime_id, agent, prompt, parent, **ids))

    def interrupt(self, runtime_id: str, handle_id: str, *, request_id: str | None = None) -> bool:
        return self._run(self._client.interrupt(runtime_id, handle_id, request_id=request_id))

    def close(self, runtime_id: str, handle_id: str, force: bool = False, *, request_id: str | None = None) -> list[str]:
        return self._run(self._client.close(runtime_id, handle_id, force, request_id=request_id))

    def inspect(self, runtime_id: str, handle_id: str) -> pb.HandleView:
        return self._run(self._client.inspect(runtime_id, handle_id))

    def list_page(self, runtime_id: str, page_size: int = 0, page_token: str = "") -> pb.ListResponse:
        return self._run(self._client.list_page(runtime_id, page_size, page_token))

    def list_handles(self, runtime_id: str) -> list[pb.HandleView]:
        return self._run(self._client.list_handles(runtime_id))

    def transcript_page(
        self, runtime_id: str, handle_id: str, page_size: int = 0, page_token: str = ""
    ) -> pb.GetTranscriptResponse:
        return self._run(self._client.transcript_page(runtime_id, handle_id, page_size, page_token))

    def transcript(self, runtime_id: str, handle_id: str) -> list[pb.Message]:
        return self._run(self._client.transcript(runtime_id, handle_id))

    def list_runtimes_page(self, page_size: int = 0, page_token: str = "", *, forks_of: str = "") -> pb.ListRuntimesResponse:
        return self._run(self._client.list_runtimes_page(page_size, page_token, forks_of=forks_of))

    def list_runtimes(self, *, forks_of: str = "") -> list[pb.RuntimeSummary]:
        return self._run(self._client.list_runtimes(forks_of=forks_of))

    def fork_runtime(
        self,
        source_runtime_id: str,
        at_seq: int,
        *,
        runtime_id: str = "",
        agents: Sequence[pb.AgentDef] = (),
        messages: Sequence[pb.ForkMessage] = (),
        answers: Sequence[pb.Answer] = (),
        request_id: str | None = None,
    ) -> pb.ForkRuntimeResponse:
        """A fork of the runtime at event `at_seq`, as Client.fork_runtime makes it."""
        fork = self._client.fork_runtime(
            source_runtime_id,
            at_seq,
            runtime_id=runtime_id,
            agents=agents,
            messages=messages,
            answers=answers,
            request_id=request_id,
        )
        return self._run(fork)

    def replay_runtime(
        self,
        source_runtime_id: str,
        *,
        agents: Sequence[pb.AgentDef] = (),
        unrecorded_calls: pb.UnrecordedCalls.ValueType = pb.UNRECORDED_CALLS_UNSPECIFIED,
        runtime_id: str = "",
        request_id: str | None = None,
        timeout: float | None = None,
    ) -> pb.ReplayRuntimeResponse:
        """The replay's diffs once it has settled, as Client.replay_runtime waits for them."""
        replay = self._client.replay_runtime(
            source_runtime_id,
            agents=agents,
            unrecorded_calls=unrecorded_calls,
            runtime_id=runtime_id,
            request_id=request_id,
            timeout=timeout,
        )
        return self._run(replay)

    def delete_runtime(self, runtime_id: str, force: bool = False, *, request_id: str | None = None) -> None:
        self._run(self._client.delete_runtime(runtime_id, force, request_id=request_id))

    def iter_handles(self, runtime_id: str, page_size: int = 0) -> Iterator[pb.HandleView]:
        return self._iterate(self._client.iter_handles(runtime_id, page_size))

    def iter_transcript(self, runtime_id: str, handle_id: str, page_size: int = 0) -> Iterator[pb.Message]:
        return self._iterate(self._client.iter_transcript(runtime_id, handle_id, page_size))

    def iter_runtimes(self, page_size: int = 0, *, forks_of: str = "") -> Iterator[pb.RuntimeSummary]:
        return self._iterate(self._client.iter_runtimes(page_size, forks_of=forks_of))

    def watch(self, runtime_id: str, after_seq: int = 0, *, max_retries: int = 5, backoff: float = 1.0) -> Iterator[pb.Event]:
        """The runtime's events, as Client.watch gives them (reconnecting from the last seq);
        leaving the loop (break) closes the stream."""
        return self._iterate(self._client.watch(runtime_id, after_seq, max_retries=max_retries, backoff=backoff))

    def watch_with_deltas(
        self, runtime_id: str, after_seq: int = 0, *, max_retries: int = 5, backoff: float = 1.0
    ) -> Iterator[pb.Event | pb.Delta]:
        """The runtime's events and its models' deltas, as Client.watch_with_deltas gives them."""
        return self._iterate(self._client.watch_with_deltas(runtime_id, after_seq, max_retries=max_retries, backoff=backoff))

    def stream_run(
        self,
        runtime_id: str,
        agent: str,
        prompt: str,
        parent: str = "root",
        *,
        spawn_request_id: str | None = None,
        wake_request_id: str | None = None,
        max_retries: int = 5,
        backoff: float = 1.0,
    ) -> Iterator[pb.Delta | pb.TaskResult]:
        """The fresh handle's deltas, then its result, as Client.stream_run gives them."""
        ids = {"spawn_request_id": spawn_request_id, "wake_request_id": wake_request_id}
        items = self._client.stream_run(runtime_id, agent, prompt, parent, **ids, max_retries=max_retries, backoff=backoff)
        return self._iterate(items)

    def _iterate(self, items: AsyncIterator[T]) -> Iterator[T]:
        """An async iterator of the client's loop as a blocking one: each item is fetched on
        the loop when the caller's loop asks; leaving the loop early closes the async one."""

        async def following() -> tuple[bool, T | None]:
            try:
                return True, await anext(items)
            except StopAsyncIteration:
                return False, None

        try:
            while True:
                more, item = self._run(following())
                if not more:
                    return
                yield item  # type: ignore[misc]  # `more` says it is a T
        except concurrent.futures.CancelledError:
            if not self._closing:  # closing the client ends the stream quietly
                raise
        finally:
            closing = getattr(items, "aclose", None)
            if closing is not None and not self._loop.is_closed():
                self._run(closing())

    def serve_tools(self, queue: str, handlers: Mapping[str, SyncToolHandler], *, max_concurrent_calls: int = 10) -> None:
        """Serves worker tools until interrupted (Ctrl-C) or refused; each handler runs in a
        thread of its own (see Client.serve_tools)."""

        def threaded(handler: SyncToolHandler) -> Callable[[dict[str, Any], pb.WorkerCall], Coroutine[Any, Any, str]]:
            async def call(arguments: dict[str, Any], worker_call: pb.WorkerCall) -> str:
                return await asyncio.to_thread(handler, arguments, worker_call)

            return call

        wrapped = {name: threaded(handler) for name, handler in handlers.items()}
        try:
            self._run(self._client.serve_tools(queue, wrapped, max_concurrent_calls=max_concurrent_calls))
        except concurrent.futures.CancelledError:
            if not self._closing:  # closing the client ends serving quietly; anything else is news
                raise
