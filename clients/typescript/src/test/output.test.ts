// outputJson / outputAs: a TaskResult's typed output as JSON, or through a validator into a type
// of the caller's, and the path an OutputError names when the validator refuses it.

import assert from "node:assert/strict";
import { describe, it } from "node:test";

import { create, fromJson, type JsonValue } from "@bufbuild/protobuf";
import { ValueSchema } from "@bufbuild/protobuf/wkt";

import { OutputError, Status, TaskResultSchema, outputAs, outputJson, type TaskResult } from "../index.js";
import { formatPath, pathOf } from "../output.js";

const ANSWER = { label: "bug", confidence: 0.75, tags: ["crash", "ui"] };

function done(output: JsonValue): TaskResult {
  return create(TaskResultSchema, {
    status: Status.DONE,
    text: JSON.stringify(output),
    output: fromJson(ValueSchema, output),
  });
}

interface Classification {
  label: "bug" | "feature" | "question";
  confidence: number;
  tags: string[];
}

/** A hand-written validator that throws an error with its own `path`. */
function classification(value: unknown): Classification {
  const fail = (path: string, message: string) => Object.assign(new Error(message), { path });
  if (typeof value !== "object" || value === null || Array.isArray(value)) throw fail("$", "expected an object");
  const { label, confidence, tags } = value as Record<string, unknown>;
  if (label !== "bug" && label !== "feature" && label !== "question") throw fail("$.label", "not a label");
  if (typeof confidence !== "number") throw fail("$.confidence", "expected a number");
  if (!Array.isArray(tags)) throw fail("$.tags", "expected a list");
  tags.forEach((tag, i) => {
    if (typeof tag !== "string") throw fail(`$.tags[${i}]`, "expected a string");
  });
  return { label, confidence, tags: tags as string[] };
}

/** The OutputError `call` throws. */
function outputError(call: () => unknown): OutputError {
  try {
    call();
  } catch (error) {
    assert.ok(error instanceof OutputError, `expected an OutputError, got ${String(error)}`);
    return error;
  }
  assert.fail("no error was thrown");
}

describe("outputJson", () => {
  it("is the output as plain JSON", () => {
    assert.deepEqual(outputJson(done(ANSWER)), ANSWER);
    assert.deepEqual(outputJson(done([1, "two", null, { three: true }])), [1, "two", null, { three: true }]);
  });

  it("is undefined when the result carries no output", () => {
    assert.equal(outputJson(create(TaskResultSchema, { status: Status.DONE, text: "plain text" })), undefined);
    assert.equal(outputJson(create(TaskResultSchema, { status: Status.INCOMPLETE })), undefined);
  });

  it("refuses a Value with no kind, naming the whole output", () => {
    const result = create(TaskResultSchema, { status: Status.DONE, output: create(ValueSchema) });
    const error = outputError(() => outputJson(result));
    assert.equal(error.path, "$");
    assert.match(error.message, /^the result's output is not JSON: /);
  });
});

describe("outputAs", () => {
  it("returns what the validator returns", () => {
    const decoded: Classification = outputAs(done(ANSWER), classification);
    assert.deepEqual(decoded, ANSWER);
    assert.equal(outputAs(done(ANSWER), (value) => (value as Classification).tags.length), 2);
  });

  it("takes a type guard: true is the value, false a refusal of the whole", () => {
    const isClassification = (value: unknown): value is Classification =>
      typeof value === "object" && value !== null && "label" in value;
    const decoded: Classification = outputAs(done(ANSWER), isClassification);
    assert.deepEqual(decoded, ANSWER);
    const error = outputError(() => outputAs(done([1, 2]), isClassification));
    assert.equal(error.path, "$");
    assert.equal(error.message, "the output does not fit: the type guard refused it");
  });

  it("names the path the validator's error gives, and keeps that error as the cause", () => {
    const error = outputError(() => outputAs(done({ ...ANSWER, confidence: "high" }), classification));
    assert.equal(error.path, "$.confidence");
    assert.equal(error.message, "the output at $.confidence does not fit: expected a number");
    assert.ok(error.cause instanceof Error);
    assert.equal(error.cause.message, "expected a number");
    assert.equal(outputError(() => outputAs(done({ ...ANSWER, tags: ["a", 2] }), classification)).path, "$.tags[1]");
  });

  it("reads a zod-like error's first issue (path of keys and indexes, its message)", () => {
    const zodLike = Object.assign(new Error('[{"code":"too_big", ...}]'), {
      issues: [
        { path: ["tags", 0], message: "Expected string, received number" },
        { path: ["confidence"], message: "Number must be less than or equal to 1" },
      ],
    });
    const error = outputError(() =>
      outputAs(done(ANSWER), () => {
        throw zodLike;
      }),
    );
    assert.equal(error.path, "$.tags[0]");
    assert.equal(error.message, "the output at $.tags[0] does not fit: Expected string, received number (and 1 more)");
    assert.equal(error.cause, zodLike);
  });

  it("reads a valibot-like error's first issue (path items with a key)", () => {
    const valibotLike = Object.assign(new Error("Invalid type"), {
      issues: [{ path: [{ type: "object", key: "meta" }, { type: "object", key: "a b" }], message: "Invalid type" }],
    });
    const error = outputError(() =>
      outputAs(done(ANSWER), () => {
        throw valibotLike;
      }),
    );
    assert.equal(error.path, '$.meta["a b"]');
  });

  it("says no path when the validator's error has none", () => {
    const error = outputError(() =>
      outputAs(done(ANSWER), () => {
        throw new TypeError("nope");
      }),
    );
    assert.equal(error.path, undefined);
    assert.equal(error.message, "the output does not fit: nope");
  });

  it("refuses a result with no output, saying so, without calling the validator", () => {
    let called = false;
    const validate = (value: unknown) => {
      called = true;
      return value;
    };
    const error = outputError(() => outputAs(create(TaskResultSchema, { status: Status.INCOMPLETE, text: "It is a bug." }), validate));
    assert.equal(called, false);
    assert.equal(error.path, undefined);
    assert.equal(
      error.message,
      "the result has no output (status STATUS_INCOMPLETE): only a STATUS_DONE result of an agent with an output_schema carries one",
    );
  });
});

describe("pathOf / formatPath", () => {
  it("formats keys from the root $", () => {
    assert.equal(formatPath([]), "$");
    assert.equal(formatPath(["tags", 1, "name"]), "$.tags[1].name");
    assert.equal(formatPath(["a-b", "", "_ok$"]), '$["a-b"][""]._ok$');
  });

  it("takes an error's own path as a $ path, a dotted path or a list of keys", () => {
    assert.equal(pathOf({ path: "$.x" }), "$.x");
    assert.equal(pathOf({ path: "x.y" }), "$.x.y");
    assert.equal(pathOf({ path: "" }), "$");
    assert.equal(pathOf({ path: ["x", 2] }), "$.x[2]");
    assert.equal(pathOf({ issues: [] }), undefined);
    assert.equal(pathOf("a string"), undefined);
  });
});
