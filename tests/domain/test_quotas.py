"""What a tenant's quotas keep, in the domain alone, on a clock the test moves (the Clock port,
tests/support/clock.py): the tokens it spent per minute over the last day (TokenLedger) and the
handles it created in the last minute (SpawnWindow)."""

from __future__ import annotations

from agentruntime_server.domain.tenancy.quotas import SpawnWindow, TokenLedger

from tests.support.clock import FakeClock


async def test_tokens_count_for_a_day_per_tenant_then_go_minute_by_minute() -> None:
    clock = FakeClock()
    ledger = TokenLedger(clock)
    first = ledger.spend("acme", 100)
    assert ledger.spend("acme", 20) == first  # the same minute: one bucket
    await clock.advance(3600)
    ledger.spend("acme", 5)
    ledger.spend("globex", 7)
    assert (ledger.spent("acme"), ledger.spent("globex"), ledger.spent("nobody")) == (125, 7, 0)
    await clock.advance(24 * 3600 - 3600)  # a day after the first minute
    assert ledger.spent("acme") == 5
    await clock.advance(3600)
    assert (ledger.spent("acme"), ledger.spent("globex")) == (0, 0)


async def test_a_ledger_loaded_from_the_store_counts_what_was_spent_before() -> None:
    clock = FakeClock()
    minute = int(clock.time() // 60)
    ledger = TokenLedger(clock)
    ledger.load("acme", [(minute - 24 * 60, 1000, 7), (minute - 10, 30, 300), (minute, 12, 5)])  # the first one a day old
    assert (ledger.spent("acme"), ledger.spent_micros("acme")) == (42, 305)


async def test_handles_created_are_admitted_up_to_the_quota_in_any_rolling_minute() -> None:
    clock = FakeClock()
    window = SpawnWindow(clock)
    assert [window.admit("acme", 3) for _ in range(4)] == [True, True, True, False]
    assert window.admit("globex", 3)  # a quota per tenant
    await clock.advance(59.9)
    assert not window.admit("acme", 3)
    await clock.advance(0.2)  # the first three are a minute old now
    assert [window.admit("acme", 3) for _ in range(4)] == [True, True, True, False]


async def test_a_tenants_spawn_window_is_forgotten_a_minute_after_its_last_spawn() -> None:
    """Tenants of JWTs are as many as an issuer names: nothing kept for one outlives its use."""
    clock = FakeClock()
    window = SpawnWindow(clock)
    assert window.admit("acme", 2) and window.admit("acme", 2) and not window.admit("acme", 2)
    assert window.admit("globex", 2)
    await clock.advance(30)
    window.forget_idle()
    assert window.tenants == 2 and not window.admit("acme", 2)  # within the minute: kept, and still counting
    await clock.advance(31)
    window.forget_idle()
    assert window.tenants == 0
    assert window.admit("acme", 2)
