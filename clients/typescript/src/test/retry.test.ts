// The caps on every delay the client hands to setTimeout: past 2^31-1 ms Node fires it at once,
// so an uncapped pause becomes a busy loop and an uncapped deadline expires before the call.

import assert from "node:assert/strict";
import { describe, it } from "node:test";

import { durationFromMs } from "@bufbuild/protobuf/wkt";
import { Code, ConnectError } from "@connectrpc/connect";

import { RetryInfoSchema } from "../gen/google/rpc/error_details_pb.js";
import {
  MAX_TIMER_MS,
  RESUME_RETRY,
  RETRY_BACKOFF,
  SAFE_RETRY,
  WAIT_MARGIN_MS,
  WAIT_RETRY,
  WAIT_SLICE_MS,
  deadlineMs,
  doubledBackoff,
  isDropped,
  isRetryable,
  jitteredBackoff,
  retryDelayMs,
  waitSliceMs,
} from "../retry.js";
import { WATCH_MAX_BACKOFF_MS } from "../watch.js";

const HUGE_FAILURES = [1_000, 1_024, 1_025, 1e6, 2 ** 53, Number.POSITIVE_INFINITY];

describe("doubledBackoff (the Watch and serveTools reconnect pauses)", () => {
  it("doubles the Watch's 1 s per failure up to 30 s", () => {
    const pauses = Array.from({ length: 8 }, (_, failures) => doubledBackoff(1_000, failures, WATCH_MAX_BACKOFF_MS));
    assert.deepEqual(pauses, [1_000, 2_000, 4_000, 8_000, 16_000, 30_000, 30_000, 30_000]);
    assert.equal(WATCH_MAX_BACKOFF_MS, 30_000);
  });

  it("stays at the cap for any number of failures", () => {
    for (const failures of HUGE_FAILURES) {
      assert.equal(doubledBackoff(1_000, failures, WATCH_MAX_BACKOFF_MS), 30_000, `failures ${failures}`);
      assert.equal(doubledBackoff(250, failures, 10_000), 10_000, `serveTools, failures ${failures}`);
    }
  });

  it("never exceeds setTimeout's 2^31-1 ms, whatever the cap", () => {
    assert.equal(MAX_TIMER_MS, 2_147_483_647);
    for (const cap of [2 ** 31, 2 ** 40, Number.MAX_SAFE_INTEGER, Number.POSITIVE_INFINITY]) {
      for (const failures of [0, 30, 64, ...HUGE_FAILURES]) {
        const pause = doubledBackoff(250, failures, cap);
        assert.ok(pause <= MAX_TIMER_MS, `cap ${cap}, failures ${failures}: ${pause}`);
      }
    }
    assert.equal(doubledBackoff(250, 1e6, Number.POSITIVE_INFINITY), MAX_TIMER_MS);
  });

  it("is a number, not NaN, for a zero base after many failures", () => {
    for (const failures of HUGE_FAILURES) assert.equal(doubledBackoff(0, failures, 10_000), 0);
  });
});

describe("jitteredBackoff (the pauses between retries)", () => {
  it("draws from [0, initial * 2^(n-1)] up to maxBackoffMs, for any number of failures", (t) => {
    for (const policy of [RETRY_BACKOFF, SAFE_RETRY, RESUME_RETRY, WAIT_RETRY]) {
      t.mock.method(Math, "random", () => 0);
      assert.equal(jitteredBackoff(policy, 1), 0);
      // Just under 1, Math.random's largest: the ceiling itself, to the float.
      t.mock.method(Math, "random", () => 1 - Number.EPSILON);
      assert.ok(Math.abs(jitteredBackoff(policy, 1) - policy.initialBackoffMs) < 1e-9);
      assert.ok(Math.abs(jitteredBackoff(policy, 2) - 2 * policy.initialBackoffMs) < 1e-9);
      for (const failures of [20, ...HUGE_FAILURES]) {
        const pause = jitteredBackoff(policy, failures);
        assert.ok(pause <= policy.maxBackoffMs && pause > policy.maxBackoffMs - 1e-9, `failures ${failures}: ${pause}`);
      }
      t.mock.restoreAll();
    }
  });
});

describe("waitSliceMs (one Wait RPC's server-side timeout)", () => {
  it("is one slice without a caller's timeout", () => {
    assert.equal(waitSliceMs(undefined, 123), WAIT_SLICE_MS);
  });

  it("is what is left of the caller's timeout, at most one slice, never negative", () => {
    assert.equal(waitSliceMs(1_000 + 5_200.4, 1_000), 5_201); // rounded up: never 0 before the end
    assert.equal(waitSliceMs(1_000 + 10 * WAIT_SLICE_MS, 1_000), WAIT_SLICE_MS);
    assert.equal(waitSliceMs(Number.POSITIVE_INFINITY, 1_000), WAIT_SLICE_MS);
    assert.equal(waitSliceMs(1_000, 1_000), 0);
    assert.equal(waitSliceMs(1_000, 9_000), 0);
  });

  it("keeps the RPC's deadline (slice + margin) well within setTimeout's range", () => {
    assert.ok(WAIT_SLICE_MS + WAIT_MARGIN_MS <= MAX_TIMER_MS);
  });
});

describe("deadlineMs (a call's deadline from ClientOptions.timeoutMs)", () => {
  it("is the timeout as given within setTimeout's range", () => {
    assert.equal(deadlineMs(60_000), 60_000);
    assert.equal(deadlineMs(MAX_TIMER_MS), MAX_TIMER_MS);
  });

  it("is 0 (no deadline, for Connect) for 0, a negative timeout or NaN", () => {
    assert.equal(deadlineMs(0), 0);
    assert.equal(deadlineMs(-5), 0);
    assert.equal(deadlineMs(Number.NaN), 0);
  });

  it("caps a longer timeout at 2^31-1 ms instead of a deadline that expires at once", () => {
    assert.equal(deadlineMs(2 ** 31), MAX_TIMER_MS);
    assert.equal(deadlineMs(30 * 24 * 3_600_000), MAX_TIMER_MS); // 30 days
    assert.equal(deadlineMs(Number.POSITIVE_INFINITY), MAX_TIMER_MS);
  });
});

const retryInfo = (code: Code, ms: number) =>
  new ConnectError("refused", code, undefined, [{ desc: RetryInfoSchema, value: { retryDelay: durationFromMs(ms) } }]);

describe("retryDelayMs (RetryInfo's retry_delay)", () => {
  it("is the delay in ms, undefined without RetryInfo or for another error", () => {
    assert.equal(retryDelayMs(retryInfo(Code.Unavailable, 1_500)), 1_500);
    assert.equal(retryDelayMs(new ConnectError("no", Code.Unavailable)), undefined);
    assert.equal(retryDelayMs(new Error("no")), undefined);
  });

  it("is 0 for an empty or negative delay, at most setTimeout's 2^31-1 ms", () => {
    const empty = new ConnectError("refused", Code.Unavailable, undefined, [{ desc: RetryInfoSchema, value: {} }]);
    assert.equal(retryDelayMs(empty), 0);
    assert.equal(retryDelayMs(retryInfo(Code.Unavailable, -5_000)), 0);
    assert.equal(retryDelayMs(retryInfo(Code.Unavailable, 2 ** 40)), MAX_TIMER_MS);
  });
});

describe("isRetryable (what the retry loop retries)", () => {
  it("UNAVAILABLE, CANCELED (not the caller's: told apart before), any code with RetryInfo", () => {
    assert.ok(isRetryable(new ConnectError("x", Code.Unavailable), 0, 0));
    assert.ok(isRetryable(new ConnectError("x", Code.Canceled), 0, 0));
    assert.ok(isRetryable(retryInfo(Code.InvalidArgument, 0), 0, 0));
    assert.ok(!isRetryable(new ConnectError("x", Code.InvalidArgument), 0, 0));
    assert.ok(!isRetryable(new Error("not a status"), 0, 0));
  });

  it("ABORTED only from the transport (a reset connection), never one a server sent", () => {
    const reset = new ConnectError("read ECONNRESET", Code.Aborted, undefined, undefined, new Error("read ECONNRESET"));
    assert.ok(isDropped(reset) && isRetryable(reset, 0, 0));
    assert.ok(!isRetryable(new ConnectError("conflict", Code.Aborted), 0, 0));
  });

  it("DEADLINE_EXCEEDED only once the attempt's own deadline has passed", () => {
    const late = new ConnectError("the operation timed out", Code.DeadlineExceeded);
    assert.ok(isRetryable(late, 1_000, 1_000));
    assert.ok(isRetryable(late, 990, 1_000)); // a timer a little early
    assert.ok(!isRetryable(late, 500, 1_000)); // the server's own, not the attempt's
    assert.ok(!isRetryable(late, 5_000, 0)); // an attempt with no deadline of its own
  });
});
