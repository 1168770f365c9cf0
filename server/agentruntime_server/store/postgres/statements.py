"""The statements of the PostgreSQL store (store/postgres/) that are more than a line, and
how a journal row it reads (`ENTRIES`) becomes an entry again."""

from __future__ import annotations

import zlib

from ...domain.journal import Entry
from .. import payloads

ENTRIES = "SELECT seq, at, first_event, last_event, step FROM journal WHERE runtime_id = $1"


def entry(seq: int, at: float, first_event: int, last_event: int, step: bytes) -> Entry:
    """A row of ENTRIES."""
    return Entry(seq, at, first_event, last_event - first_event + 1, payloads.decode(step))


# One tick's writes: $1 the runtimes written, $2 the epoch each was appended under, $3 this
# replica (NULL: no leases, every runtime is this process's), $4-$9 the journal rows,
# $10-$13 per runtime its running flag and counts (NULL: unchanged), $14 the time, $15-$17
# the tenants' tokens by minute, $18 per runtime the payload bytes it grew by, $19 the
# tenants' cost (micros) by minute, beside $17, $20-$23 per runtime what it spent (NULL: unchanged).
COMMIT = """
WITH mine AS (
    SELECT r.id FROM runtimes r JOIN unnest($1::text[], $2::bigint[]) AS m(id, epoch) ON r.id = m.id
    WHERE $3::text IS NULL OR (r.owner = $3 AND r.epoch = m.epoch)
    ORDER BY r.id COLLATE "C" FOR UPDATE OF r
), appended AS (
    INSERT INTO journal (runtime_id, seq, at, first_event, last_event, step)
    SELECT j.* FROM unnest($4::text[], $5::bigint[], $6::float8[], $7::bigint[], $8::bigint[], $9::bytea[])
        AS j(runtime_id, seq, at, first_event, last_event, step)
    WHERE j.runtime_id IN (SELECT id FROM mine)
), updated AS (
    UPDATE runtimes r SET
        running = COALESCE(u.running, r.running),
        handles = COALESCE(u.handles, r.handles),
        running_handles = COALESCE(u.running_handles, r.running_handles),
        suspended_handles = COALESCE(u.suspended_handles, r.suspended_handles),
        tokens = COALESCE(u.tokens, r.tokens),
        cost_micros = COALESCE(u.cost_micros, r.cost_micros),
        cost_currency = COALESCE(u.cost_currency, r.cost_currency),
        cost_priced = COALESCE(u.cost_priced, r.cost_priced),
        bytes = r.bytes + u.bytes,
        updated_at = $14
    FROM unnest(
        $1::text[], $10::bool[], $11::int[], $12::int[], $13::int[], $18::bigint[],
        $20::bigint[], $21::bigint[], $22::text[], $23::bool[]
    ) AS u(id, running, handles, running_handles, suspended_handles, bytes, tokens, cost_micros, cost_currency, cost_priced)
    WHERE r.id = u.id AND r.id IN (SELECT id FROM mine)
), spent AS (
    INSERT INTO tenant_tokens (tenant, minute, tokens, micros)
    SELECT * FROM unnest($15::text[], $16::bigint[], $17::bigint[], $19::bigint[])
    ON CONFLICT (tenant, minute) DO UPDATE
        SET tokens = tenant_tokens.tokens + excluded.tokens, micros = tenant_tokens.micros + excluded.micros
)
SELECT id FROM mine
"""

# A new runtime and its first journal rows, in one statement: $1-$5 the runtime (id, agents,
# the time, tenant, owner), $6 the tenant's quota of runtimes (0: none), $7-$12 the rows, $13
# the bytes it takes (its definitions and the rows' steps).
# Under a quota it is inserted only while the tenant has fewer (create_runtime holds the
# tenant's lock first); the journal rows go only with it.
# Journal rows already under the id belong to no runtime (its row was just inserted):
# earlier versions could leave a deleted runtime's journal behind (see delete_runtime). They
# go with the create, or the new runtime would inherit them (ALREADY_EXISTS, or a commit
# failing on their seqs): the new rows take the seqs they share (the parts of one statement
# see one snapshot: a delete and an insert of one key would collide), the rest are deleted.
CREATE = """
WITH created AS (
    INSERT INTO runtimes (
        id, agents, created_at, tenant, updated_at, owner, epoch, bytes, forked_from, fork_seq,
        handles, running_handles, suspended_handles, tokens, cost_micros, cost_currency, cost_priced, running
    )
    SELECT $1::text, $2::json, $3::float8, $4::text, $3::float8, $5::text, 1, $13::bigint, $14::text, $15::bigint,
        $16::int, $17::int, $18::int, $19::bigint, $20::bigint, $21::text, $22::boolean, $23::boolean
    WHERE $6::int = 0 OR (SELECT COUNT(*) FROM runtimes WHERE tenant = $4::text) < $6::int
    RETURNING id
), appended AS (
    INSERT INTO journal (runtime_id, seq, at, first_event, last_event, step)
    SELECT j.* FROM unnest($7::text[], $8::bigint[], $9::float8[], $10::bigint[], $11::bigint[], $12::bytea[])
        AS j(runtime_id, seq, at, first_event, last_event, step)
    WHERE EXISTS (SELECT 1 FROM created)
    ON CONFLICT (runtime_id, seq) DO UPDATE SET
        at = excluded.at, first_event = excluded.first_event, last_event = excluded.last_event, step = excluded.step
), orphans AS (
    DELETE FROM journal WHERE runtime_id = $1::text AND seq <> ALL($8::bigint[]) AND EXISTS (SELECT 1 FROM created)
)
SELECT COUNT(*) FROM created
"""
# pg_advisory_xact_lock's first key for a tenant's creates (the second: the tenant's). The
# two-key locks are apart from migrate's one-key lock.
QUOTA_LOCK = 0x71756F74  # "quot"


def tenant_lock(tenant: str) -> int:
    """The tenant as an int4 (tenants that collide share a lock: they only wait on each other)."""
    return zlib.crc32(tenant.encode()) - (1 << 31)


# Retention's test of a runtime `r` (ports.Store.idle_runtimes): nothing running, not written
# since $1 if no handle is suspended or since $2 if one is (NULL: never idle; GREATEST, which
# skips NULLs, bounds the index scan), and held by no live replica but this one, $3 (another
# live one has it in its memory: not deleted under it).
IDLE = (
    "r.updated_at < GREATEST($1::float8, $2::float8) AND NOT r.running"
    " AND r.updated_at < CASE WHEN r.suspended_handles = 0 THEN $1::float8 ELSE $2::float8 END"
    " AND (r.owner IS NULL OR r.owner = $3 OR NOT EXISTS"
    " (SELECT 1 FROM replicas p WHERE p.id = r.owner AND p.expires_at > extract(epoch FROM clock_timestamp())))"
)
DELETE_IF_IDLE = f"""
WITH gone AS (
    DELETE FROM runtimes r WHERE r.id = $4 AND {IDLE} RETURNING r.id
), emptied AS (
    DELETE FROM journal WHERE runtime_id IN (SELECT id FROM gone)
)
SELECT id FROM gone
"""
