"""What a tenant's quotas keep, in the domain alone, on a clock the test moves: the tokens it
spent per minute over the last day (TokenLedger) and the handles it created in the last minute
(SpawnWindow)."""

from __future__ import annotations

import pytest
from agentruntime_server.domain.tenancy import quotas
from agentruntime_server.domain.tenancy.quotas import SpawnWindow, TokenLedger

from tests.support.fakes import Clock, clock

__all__ = ["clock"]  # the fixture of tests/support/fakes.py, used here


def test_tokens_count_for_a_day_per_tenant_then_go_minute_by_minute(clock: Clock) -> None:
    ledger = TokenLedger()
    first = ledger.spend("acme", 100)
    assert ledger.spend("acme", 20) == first  # the same minute: one bucket
    clock.advance(3600)
    ledger.spend("acme", 5)
    ledger.spend("globex", 7)
    assert (ledger.spent("acme"), ledger.spent("globex"), ledger.spent("nobody")) == (125, 7, 0)
    clock.advance(24 * 3600 - 3600)  # a day after the first minute
    assert ledger.spent("acme") == 5
    clock.advance(3600)
    assert (ledger.spent("acme"), ledger.spent("globex")) == (0, 0)


def test_a_ledger_loaded_from_the_store_counts_what_was_spent_before(clock: Clock) -> None:
    minute = int(clock.now // 60)
    ledger = TokenLedger()
    ledger.load("acme", [(minute - 24 * 60, 1000, 7), (minute - 10, 30, 300), (minute, 12, 5)])  # the first one a day old
    assert (ledger.spent("acme"), ledger.spent_micros("acme")) == (42, 305)


def test_handles_created_are_admitted_up_to_the_quota_in_any_rolling_minute(clock: Clock) -> None:
    window = SpawnWindow()
    assert [window.admit("acme", 3) for _ in range(4)] == [True, True, True, False]
    assert window.admit("globex", 3)  # a quota per tenant
    clock.advance(59.9)
    assert not window.admit("acme", 3)
    clock.advance(0.2)  # the first three are a minute old now
    assert [window.admit("acme", 3) for _ in range(4)] == [True, True, True, False]


def test_a_tenants_spawn_window_is_forgotten_a_minute_after_its_last_spawn(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tenants of JWTs are as many as an issuer names: nothing kept for one outlives its use."""
    now = [1000.0]
    monkeypatch.setattr(quotas.time, "monotonic", lambda: now[0])
    window = SpawnWindow()
    assert window.admit("acme", 2) and window.admit("acme", 2) and not window.admit("acme", 2)
    assert window.admit("globex", 2)
    now[0] += 30
    window.forget_idle()
    assert window.tenants == 2 and not window.admit("acme", 2)  # within the minute: kept, and still counting
    now[0] += 31
    window.forget_idle()
    assert window.tenants == 0
    assert window.admit("acme", 2)
