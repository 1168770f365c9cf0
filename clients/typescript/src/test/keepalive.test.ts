// ClientOptions.keepalive -> the options of Connect's Http2SessionManager.

import assert from "node:assert/strict";
import { describe, it } from "node:test";

import { DEFAULT_KEEPALIVE, sessionOptions } from "../keepalive.js";

describe("sessionOptions", () => {
  it("PINGs after 60 s of silence, 20 s to answer, not on an idle connection, by default", () => {
    const expected = { pingIntervalMs: 60_000, pingTimeoutMs: 20_000, pingIdleConnection: false };
    assert.deepEqual(sessionOptions(undefined), expected);
    assert.deepEqual(sessionOptions({}), expected);
    assert.deepEqual({ ...DEFAULT_KEEPALIVE }, expected);
  });

  it("is Connect's own default (no PINGs) for keepalive: false", () => {
    assert.equal(sessionOptions(false), undefined);
  });

  it("keeps the defaults of the fields not given", () => {
    assert.deepEqual(sessionOptions({ pingTimeoutMs: 5_000 }), {
      pingIntervalMs: 60_000,
      pingTimeoutMs: 5_000,
      pingIdleConnection: false,
    });
    // A field present but undefined (e.g. from an unset environment variable) is one not given.
    assert.deepEqual(sessionOptions({ pingIntervalMs: undefined, pingIdleConnection: undefined }), {
      pingIntervalMs: 60_000,
      pingTimeoutMs: 20_000,
      pingIdleConnection: false,
    });
  });

  it("passes every field given", () => {
    const given = { pingIntervalMs: 30_000, pingTimeoutMs: 10_000, pingIdleConnection: true, idleConnectionTimeoutMs: 120_000 };
    assert.deepEqual(sessionOptions(given), given);
    assert.deepEqual(sessionOptions({ pingIntervalMs: Number.POSITIVE_INFINITY }), {
      pingIntervalMs: Number.POSITIVE_INFINITY,
      pingTimeoutMs: 20_000,
      pingIdleConnection: false,
    });
  });

  it("refuses a duration that is not a positive number, naming the field", () => {
    for (const [name, ms] of [
      ["pingIntervalMs", 0],
      ["pingIntervalMs", -1],
      ["pingTimeoutMs", Number.NaN],
      ["idleConnectionTimeoutMs", 0],
    ] as const) {
      assert.throws(() => sessionOptions({ [name]: ms }), {
        name: "RangeError",
        message: `keepalive.${name} must be a positive number of ms, got ${String(ms)} (keepalive: false turns PINGs off)`,
      });
    }
  });
});
