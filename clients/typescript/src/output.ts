/**
 * Typed results: a TaskResult's `output` (the answer of an agent with an `output_schema`,
 * validated by the server against it) as plain JSON, or through a validator of the caller's into
 * a type of their own.
 */

import { toJson, type JsonValue } from "@bufbuild/protobuf";
import { ValueSchema } from "@bufbuild/protobuf/wkt";

import { StatusSchema, type TaskResult } from "./gen/agentruntime/v1/agent_runtime_pb.js";

/**
 * A result's output that could not be had or did not fit: the result carries none, or the
 * validator refused it. `path` says where, when known: `$` (the whole output), `$.confidence`,
 * `$.tags[1]`; the validator's own error is the `cause`.
 */
export class OutputError extends Error {
  override name = "OutputError";
  /** Where the output did not fit (`$.confidence`), or undefined when the validator did not say. */
  readonly path: string | undefined;

  constructor(message: string, options: { path?: string; cause?: unknown } = {}) {
    super(message, options.cause === undefined ? undefined : { cause: options.cause });
    this.path = options.path;
  }
}

/**
 * The result's output as a plain JSON value (an object or an array, as the agent's
 * `output_schema` says), or undefined when the result carries none: the agent has no
 * `output_schema`, or the status is not STATUS_DONE.
 *
 * ```ts
 * const answer = outputJson(await client.run(runtimeId, "classifier", issue));
 * ```
 */
export function outputJson(result: TaskResult): JsonValue | undefined {
  if (result.output === undefined) return undefined;
  try {
    return toJson(ValueSchema, result.output);
  } catch (error) {
    // A Value with no kind set, or a number JSON cannot hold: not what the server sends.
    throw new OutputError(`the result's output is not JSON: ${messageOf(error)}`, { path: "$", cause: error });
  }
}

/**
 * The result's output through `validate`, a function that returns the value as a `T` or throws:
 * zod's `(v) => schema.parse(v)`, valibot's `(v) => v.parse(schema, v)`, or a hand-written one.
 * A type guard (`(v: unknown) => v is T`) fits too: its `false` is a refusal of the whole output.
 *
 * Throws an OutputError when the result carries no output (the agent has no `output_schema`, or
 * the status is not STATUS_DONE), or when the validator refuses it: its message and `path` name
 * where, read from the validator's error (zod's and valibot's first issue's `path`, or an error's
 * own `path`: a string like `$.tags[0]` or a list of keys), and the validator's error is the
 * `cause`.
 *
 * ```ts
 * const Classification = z.object({ label: z.enum(["bug", "feature"]), confidence: z.number() });
 * const { label, confidence } = outputAs(result, (v) => Classification.parse(v));
 * ```
 */
export function outputAs<T>(result: TaskResult, guard: (value: unknown) => value is T): T;
export function outputAs<T>(result: TaskResult, validate: (value: unknown) => T): T;
export function outputAs<T>(result: TaskResult, validate: (value: unknown) => T | boolean): T {
  const value = outputJson(result);
  if (value === undefined) {
    const status = StatusSchema.value[result.status]?.name ?? String(result.status);
    throw new OutputError(
      `the result has no output (status ${status}): only a STATUS_DONE result of an agent with an output_schema carries one`,
    );
  }
  let validated: T | boolean;
  try {
    validated = validate(value);
  } catch (error) {
    const path = pathOf(error);
    const where = path === undefined ? "the output" : `the output at ${path}`;
    throw new OutputError(`${where} does not fit: ${messageOf(error)}`, { path, cause: error });
  }
  // The output is an object or an array, never a boolean: a boolean is a type guard's answer.
  if (validated === false) throw new OutputError("the output does not fit: the type guard refused it", { path: "$" });
  return (validated === true ? value : validated) as T;
}

function isRecord(value: unknown): value is Record<string, unknown> {
  return typeof value === "object" && value !== null;
}

/** The first issue of a zod or valibot error, or undefined. */
function firstIssue(error: unknown): Record<string, unknown> | undefined {
  if (!isRecord(error) || !Array.isArray(error.issues)) return undefined;
  const issue: unknown = error.issues[0];
  return isRecord(issue) ? issue : undefined;
}

/** Where a validator's error says the value did not fit, as `$.a[0].b`, or undefined. */
export function pathOf(error: unknown): string | undefined {
  if (!isRecord(error)) return undefined;
  const own = error.path;
  if (typeof own === "string") return own.startsWith("$") ? own : own === "" ? "$" : `$.${own}`;
  if (Array.isArray(own)) return formatPath(own);
  const issue = firstIssue(error);
  if (issue !== undefined && Array.isArray(issue.path)) return formatPath(issue.path);
  return undefined;
}

const IDENTIFIER = /^[A-Za-z_$][A-Za-z0-9_$]*$/;

/**
 * Keys as a path from the root `$`: a number is an index (`[1]`), an identifier a member
 * (`.label`), any other key a quoted member (`["a b"]`); valibot's path items are objects whose
 * `key` is the key.
 */
export function formatPath(keys: readonly unknown[]): string {
  let path = "$";
  for (const item of keys) {
    const key = isRecord(item) && "key" in item ? item.key : item;
    if (typeof key === "number") path += `[${key}]`;
    else if (typeof key === "string" && IDENTIFIER.test(key)) path += `.${key}`;
    else path += `[${JSON.stringify(typeof key === "symbol" ? key.toString() : String(key))}]`;
  }
  return path;
}

/** A validator error's message: its first issue's (zod's own message lists every issue as JSON). */
function messageOf(error: unknown): string {
  const issue = firstIssue(error);
  if (issue !== undefined && typeof issue.message === "string") {
    const more = (error as { issues: unknown[] }).issues.length - 1;
    return more > 0 ? `${issue.message} (and ${more} more)` : issue.message;
  }
  return error instanceof Error ? error.message : String(error);
}
