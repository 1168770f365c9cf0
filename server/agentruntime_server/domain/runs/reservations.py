"""Reservations (docs/budgets.md#reservations): before a model turn starts, what it may spend
is held against every budget that caps it (max_tokens and max_cost of the handle and of each
ancestor: budget.unaffordable) and against its tenant's quotas of tokens and cost per day. A
turn whose reservation does not fit does not start. When the reply is journaled the real
figures count and the reservation is released; a turn that fails or is cancelled releases it.

The estimate: the request's input at about four characters a token (what compaction counts),
priced at the dearest of the model's input rates (base, cache read, cache write), plus the
output cap at the output rate. With the cap sent to the provider, a reply cannot pass its
output part: what the turns in flight may pass a budget by is their input estimate's error.

Bookkeeping in memory only, never journaled (the journal is the record of what was spent):
after a restart no turn holds anything, and a turn run again reserves again."""

from __future__ import annotations

from ..billing.prices import Price, micros
from ..billing.usage import Tokens
from ..journal.handle import Handle
from ..ports import ReplyBound
from ..tenancy.quotas import Tenancy


def estimate(input_tokens: int, bound: ReplyBound, price: Price | None) -> tuple[int, int]:
    """(tokens, micros) a turn is reserved: its input estimate and output cap, and their cost
    (0 when no price covers the model: only priced calls count towards max_cost and quotas)."""
    output = bound.output_cap or 0
    if price is None:
        return input_tokens + output, 0
    dearest = max(price.input, price.cache_read, price.cache_write)
    if dearest == price.input:
        tokens = Tokens(input=input_tokens, output=output)
    elif dearest == price.cache_write:
        tokens = Tokens(cache_write=input_tokens, output=output)
    else:
        tokens = Tokens(cache_read=input_tokens, output=output)
    return input_tokens + output, micros(price, tokens)


class Reservation:
    """One turn's hold: on its handle's lineage (`held_tokens`, `held_micros` of each node count
    the turns under way in its subtree) and, when `tenancy` is given, on its tenant's quotas."""

    __slots__ = ("_held", "_tenancy", "_tenant", "micros", "tokens")

    def __init__(self, handle: Handle, tokens: int, micros: int, hold_budgets: bool) -> None:
        self.tokens = tokens
        self.micros = micros
        self._held: Handle | None = handle if hold_budgets else None  # its lineage holds it (a parent never changes)
        node: Handle | None = self._held
        while node is not None:  # on every reserved turn: a plain loop, not a generator
            node.held_tokens += tokens
            node.held_micros += micros
            node = node.parent
        self._tenancy: Tenancy | None = None
        self._tenant = ""

    def held_by(self, tenancy: Tenancy, tenant: str) -> None:
        """The tenant's quotas hold it too (Tenancy.reserve took it)."""
        self._tenancy, self._tenant = tenancy, tenant

    def release_budgets(self) -> None:
        """The reply is journaled (its figures count now), or the turn ended without one."""
        node, self._held = self._held, None
        while node is not None:
            node.held_tokens -= self.tokens
            node.held_micros -= self.micros
            node = node.parent

    def release(self) -> None:
        """All of it (idempotent): the reply is journaled and its spend counted by the tenant's
        ledger, or the turn failed or was cancelled."""
        self.release_budgets()
        tenancy, self._tenancy = self._tenancy, None
        if tenancy is not None:
            tenancy.release(self._tenant, self.tokens, self.micros)
