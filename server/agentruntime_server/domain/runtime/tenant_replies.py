"""The answers of the calls that create or delete a runtime with a request id (CreateRuntime,
ForkRuntime, ReplayRuntime, DeleteRuntime): kept per tenant in the store, with the effect's
write, since the runtime they name may not exist yet, or no more (docs/request-ids.md)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from ..errors import RequestIdReused, RequestIdTaken
from ..ports import Services, TenantReply
from .request_ids import OneAtATime, RequestKey

PRUNE_REPLIES_EVERY = 60.0  # seconds: a tenant's expired answers go at most this often


class TenantReplies:
    def __init__(self, services: Services) -> None:
        self.services = services
        self.served = OneAtATime()  # such calls with request ids, one at a time per tenant and id
        self._pruned = 0.0

    async def earlier(self, tenant: str, scope: str, rpc: str, request: RequestKey) -> TenantReply | None:
        """The answer kept for the request id, if it is recent enough to count; the same id
        with another request is refused."""
        ttl = self.services.limits.request_id_ttl
        now = self.services.clock.time()
        earlier = await self.services.store.reply(tenant, scope, request.id)
        if earlier is not None and earlier.at < now - ttl:
            await self._prune(now, force=True)  # so that the id can be kept again
            earlier = None
        elif now - self._pruned > PRUNE_REPLIES_EVERY:
            await self._prune(now)
        if earlier is not None and not request.matches(rpc, earlier.rpc, earlier.digest):
            raise RequestIdReused(request.id, rpc)
        return earlier

    async def _prune(self, now: float, force: bool = False) -> None:
        if force or now - self._pruned > PRUNE_REPLIES_EVERY:
            self._pruned = now
            await self.services.store.forget_replies_before(now - self.services.limits.request_id_ttl)

    async def created_once(self, rpc: str, tenant: str, request: RequestKey, create: Callable[[], Awaitable[str]]) -> str:
        """The id of the runtime a call creates, or of the one its request id's first call
        created: `create` keeps its answer with the runtime it writes."""
        async with self.served.turn(f"{tenant}\n{request.id}"):
            while True:
                earlier = await self.earlier(tenant, "", rpc, request)
                if earlier is not None:
                    return earlier.runtime_id
                try:
                    return await create()
                except RequestIdTaken:
                    continue  # another replica kept this id first, since the look above: its answer
