/**
 * The TypeScript conformance runner: every vector in tests/vectors against AGENTRUNTIME_ADDR.
 * The format is tests/vectors/README.md; the behaviour mirrors clients/python/conformance/run.py.
 *
 *   AGENTRUNTIME_ADDR=127.0.0.1:50051 node dist/conformance/run.js
 *
 * AGENTRUNTIME_VECTORS overrides the vector directory.
 */

import { spawn } from "node:child_process";
import { randomBytes } from "node:crypto";
import { readdirSync, readFileSync } from "node:fs";
import { join, resolve } from "node:path";
import { fileURLToPath } from "node:url";

import {
  create,
  equals,
  fromJson,
  type DescEnum,
  type DescMessage,
  type JsonObject,
  type JsonValue,
  type Message as ProtoMessage,
} from "@bufbuild/protobuf";
import { durationFromMs } from "@bufbuild/protobuf/wkt";
import { ConnectError, type Interceptor } from "@connectrpc/connect";

import {
  AgentDefSchema,
  AnswerSchema,
  BadRequestSchema,
  BudgetSchema,
  CloseResponseSchema,
  ErrorInfoSchema,
  FailureReasonSchema,
  HandleStateSchema,
  LimitSchema,
  OutputError,
  PostResponseSchema,
  ResourceInfoSchema,
  TaskResultSchema,
  Status,
  StatusSchema,
  ToolOutputSchema,
  TrustSchema,
  UnrecordedCallsSchema,
  createClient,
  describeError,
  grpcCodeName,
  outputAs,
  outputJson,
  type AgentDef,
  type AgentRuntimeClient,
  type Answer as AnswerMessage,
  type ClientOptions,
  type Cost,
  type Event,
  type Failure,
  type HandleView,
  type ForkMessageInit,
  type ForkRuntimeResponse,
  type Message,
  type ReplayCall,
  type ReplayDiff,
  type Request,
  type TaskResult,
  type ToolHandler,
  type Usage,
} from "../index.js";

/** This package's directory (dist/conformance/run.js → ../..). */
const PACKAGE_DIR = fileURLToPath(new URL("../../", import.meta.url));
const VECTORS = process.env.AGENTRUNTIME_VECTORS
  ? resolve(process.env.AGENTRUNTIME_VECTORS)
  : resolve(PACKAGE_DIR, "..", "..", "tests", "vectors");

/** What a step produced, as plain values keyed like the vectors' `expect` (int64 stay bigint). */
type Actual = { [key: string]: Value };
type Value = string | number | bigint | boolean | null | Value[] | Actual;

type Step = { [key: string]: JsonValue };
type Vector = { name?: string; agents: JsonValue[]; steps: Step[]; workers?: JsonValue };

class Mismatch extends Error {
  override name = "Mismatch";
}

const VERBS = [
  "spawn",
  "wake",
  "wait",
  "resume",
  "list",
  "transcript",
  "post",
  "close",
  "inspect",
  "list_runtimes",
  "delete_runtime",
  "create_runtime",
  "interrupt",
  "watch",
  "stream_run",
  "fork",
  "replay",
] as const;

/** The verbs that may carry `request_id` and `repeat` (README: Request ids and repeats). */
const MUTATING = ["spawn", "post", "wake", "resume", "interrupt", "close", "create_runtime", "delete_runtime"];

/** A step's `request_id`: at most 40 characters of [A-Za-z0-9_-], sent after the run's token. */
const REQUEST_ID = /^[A-Za-z0-9_-]{0,40}$/;

/** The arguments a wait step may carry (README: Waiting, restarts and watching). */
const WAIT_OPTIONS = ["handle", "client_timeout_ms", "restart_server_after_ms"];

/** The arguments a stream_run step may carry. */
const STREAM_RUN_ARGS = ["agent", "prompt", "parent"];

/** The arguments a fork step may carry, and a replay step (README: Forks and replays). */
const FORK_ARGS = ["at_seq", "agents", "messages", "answer"];
const REPLAY_ARGS = ["agents", "unrecorded_calls"];

/** The README's deadline for every call, Wait included. */
const CALL_TIMEOUT_MS = 60_000;
/** An inspect step with "poll" re-reads every POLL_EVERY_MS, for at most POLL_FOR_MS. */
const POLL_EVERY_MS = 50;
const POLL_FOR_MS = 10_000;

/** The page_token that means the next_page_token of the last step of the same verb that succeeded. */
const NEXT = "$next";

/** The proto name of an enum value (`STATUS_DONE`, not the generated TS name `DONE`). */
function enumName(schema: DescEnum, value: number): string {
  return schema.value[value]?.name ?? String(value);
}

/**
 * The runner's own type for a typed result's output (v_typed_output, README: `decoded`), decoded
 * by the client's `outputAs` with `classification` as its validator.
 */
interface Classification {
  label: string;
  confidence: number;
  tags: string[];
}

/** A hand-written validator of Classification: the value, or an OutputError naming where it does not fit. */
function classification(value: unknown): Classification {
  if (!isObject(value)) throw new OutputError("expected an object", { path: "$" });
  for (const key of Object.keys(value)) {
    if (!["label", "confidence", "tags"].includes(key)) throw new OutputError("an unknown field", { path: `$.${key}` });
  }
  const { label, confidence, tags } = value;
  if (typeof label !== "string") throw new OutputError(`expected a string, got ${show(label)}`, { path: "$.label" });
  if (typeof confidence !== "number") {
    throw new OutputError(`expected a number, got ${show(confidence)}`, { path: "$.confidence" });
  }
  if (!Array.isArray(tags)) throw new OutputError(`expected a list, got ${show(tags)}`, { path: "$.tags" });
  const strings = tags.map((tag, i) => {
    if (typeof tag !== "string") throw new OutputError(`expected a string, got ${show(tag)}`, { path: `$.tags[${i}]` });
    return tag;
  });
  return { label, confidence, tags: strings };
}

/** A wait step's `decoded`: the output through `outputAs` into a Classification, as plain fields. */
function decodedFields(where: string, result: TaskResult): Actual {
  let decoded: Classification;
  try {
    decoded = outputAs(result, classification);
  } catch (error) {
    if (!(error instanceof OutputError)) throw error;
    throw new Mismatch(`${where}.decoded: ${error.message}`);
  }
  return { label: decoded.label, confidence: decoded.confidence, tags: [...decoded.tags] };
}

function resultFields(result: TaskResult): Actual {
  const pending = result.pending;
  return {
    handle_id: result.handleId,
    text: result.text,
    // JSON, compared whole (EXACT); null: unset.
    output: outputJson(result) ?? null,
    is_error: result.isError,
    status: enumName(StatusSchema, result.status),
    limit: enumName(LimitSchema, result.limit),
    turns: result.turns,
    total_tokens: result.totalTokens,
    own_tokens: result.ownTokens,
    ...billFields(result),
    tool_calls: result.toolCalls,
    pending: {
      kind: pending?.kind ?? "",
      path: [...(pending?.path ?? [])],
      call_names: (pending?.calls ?? []).map((call) => call.name),
    },
    failure: result.failure ? failureFields(result.failure) : null,
  };
}

function failureFields(failure: Failure): Actual {
  return {
    reason: enumName(FailureReasonSchema, failure.reason),
    provider: failure.provider,
    http_status: failure.httpStatus,
    retryable: failure.retryable,
    detail: failure.detail,
  };
}

/**
 * A TaskResult's or HandleView's usage and cost (in a fork, what was inherited at the cut too); an
 * unset message reads as its zeros.
 */
function billFields(carrier: TaskResult | HandleView): Actual {
  return {
    own_usage: usageFields(carrier.ownUsage),
    total_usage: usageFields(carrier.totalUsage),
    inherited_usage: usageFields(carrier.inheritedUsage),
    own_cost: costFields(carrier.ownCost),
    total_cost: costFields(carrier.totalCost),
    inherited_cost: costFields(carrier.inheritedCost),
  };
}

function usageFields(usage: Usage | undefined): Actual {
  return {
    input_tokens: usage?.inputTokens ?? 0n,
    cache_read_tokens: usage?.cacheReadTokens ?? 0n,
    cache_write_tokens: usage?.cacheWriteTokens ?? 0n,
    output_tokens: usage?.outputTokens ?? 0n,
    reasoning_tokens: usage?.reasoningTokens ?? 0n,
    total_tokens: usage?.totalTokens ?? 0n,
    estimated: usage?.estimated ?? false,
  };
}

function costFields(cost: Cost | undefined): Actual {
  return { micros: cost?.micros ?? 0n, currency: cost?.currency ?? "", priced: cost?.priced ?? false };
}

function viewFields(view: HandleView): Actual {
  return {
    state: enumName(HandleStateSchema, view.state),
    turns: view.turns,
    own_tokens: view.ownTokens,
    total_tokens: view.totalTokens,
    ...billFields(view),
    tool_calls: view.toolCalls,
    pending_kind: view.pendingKind,
    inbox_size: view.inboxSize,
  };
}

function messageFields(message: Message): Actual {
  return { role: message.role, trust: enumName(TrustSchema, message.trust), content: message.content };
}

function isObject(value: unknown): value is { [key: string]: JsonValue } {
  return typeof value === "object" && value !== null && !Array.isArray(value);
}

/** The keys of `expect` whose value is compared whole as JSON (not only the keys given). */
const EXACT = new Set(["output", "decoded"]);

/** JSON equality: numbers by value, objects with the same keys (in any order), lists in order. */
function jsonEqual(got: Value, want: JsonValue): boolean {
  if (Array.isArray(want)) {
    return Array.isArray(got) && got.length === want.length && want.every((item, i) => jsonEqual(got[i] as Value, item));
  }
  if (isObject(want)) {
    if (typeof got !== "object" || got === null || Array.isArray(got)) return false;
    const keys = Object.keys(want);
    return (
      Object.keys(got).length === keys.length &&
      keys.every((key) => Object.hasOwn(got, key) && jsonEqual(got[key] as Value, want[key] as JsonValue))
    );
  }
  return got === want;
}

/**
 * Equality of an actual value and an expected JSON value, types strictly (a number never
 * equals a boolean or a string); int64 fields (bigint) compare numerically with numbers.
 */
function equal(got: Value, want: JsonValue): boolean {
  if (typeof got === "bigint") {
    return typeof want === "number" && Number.isInteger(want) && got === BigInt(want);
  }
  if (Array.isArray(got)) {
    return Array.isArray(want) && got.length === want.length && got.every((item, i) => equal(item, want[i] as JsonValue));
  }
  return got === want;
}

/** Renders a value as Python's repr does, so FAIL lines read the same in every runner. */
function show(value: Value | JsonValue | undefined): string {
  if (value === undefined || value === null) return "None";
  if (typeof value === "bigint" || typeof value === "number") return String(value);
  if (typeof value === "boolean") return value ? "True" : "False";
  if (typeof value === "string") {
    const text = value.replace(/\\/g, "\\\\").replace(/\n/g, "\\n");
    if (value.includes("'") && !value.includes('"')) return `"${text}"`;
    return `'${text.replace(/'/g, "\\'")}'`;
  }
  if (Array.isArray(value)) return `[${value.map((item) => show(item)).join(", ")}]`;
  return `{${Object.entries(value)
    .map(([key, item]) => `${show(key)}: ${show(item as Value | JsonValue)}`)
    .join(", ")}}`;
}

function check(where: string, actual: Actual, expected: { [key: string]: JsonValue }): void {
  for (const [key, want] of Object.entries(expected)) {
    if (key.endsWith("_contains") && !Object.hasOwn(actual, key)) {
      // `<field>_contains`: the actual <field> is a string holding this substring.
      const field = key.slice(0, -"_contains".length);
      const got = Object.hasOwn(actual, field) ? actual[field] : undefined;
      if (typeof want !== "string") {
        throw new Mismatch(`${where}.${key}: expected a string to look for, got ${show(want)}`);
      }
      if (typeof got !== "string" || !got.includes(want)) {
        throw new Mismatch(`${where}.${key}: expected a ${field} containing ${show(want)}, got ${show(got)}`);
      }
      continue;
    }
    if (!Object.hasOwn(actual, key)) {
      throw new Mismatch(`${where}.${key}: expected ${show(want)}, got nothing (no such entry)`);
    }
    const got = actual[key] as Value;
    if (EXACT.has(key)) {
      if (!jsonEqual(got, want)) throw new Mismatch(`${where}.${key}: expected ${show(want)}, got ${show(got)}`);
    } else if (isObject(want)) {
      if (typeof got !== "object" || got === null || Array.isArray(got)) {
        throw new Mismatch(`${where}.${key}: expected ${show(want)}, got ${show(got)}`);
      }
      check(`${where}.${key}`, got as Actual, want);
    } else if (Array.isArray(want) && Array.isArray(got) && [...got, ...want].some((item) => isObject(item))) {
      // A list of objects (a transcript's `messages`): entry i checks object i, only its keys.
      if (want.length > got.length) {
        throw new Mismatch(`${where}.${key}: expected at least ${want.length} entries, got ${got.length}`);
      }
      for (const [i, item] of want.entries()) {
        const entry = got[i] as Value;
        if (!isObject(item) || !isObject(entry)) {
          throw new Mismatch(`${where}.${key}[${i}]: expected ${show(item)}, got ${show(entry)}`);
        }
        check(`${where}.${key}[${i}]`, entry as Actual, item);
      }
    } else if (!equal(got, want)) {
      throw new Mismatch(`${where}.${key}: expected ${show(want)}, got ${show(got)}`);
    }
  }
}

function args(step: Step, verb: string): { [key: string]: JsonValue } {
  const value = step[verb];
  return isObject(value) ? value : {};
}

function str(value: JsonValue | undefined, fallback = ""): string {
  return typeof value === "string" ? value : fallback;
}

/**
 * A list or transcript step's page_size and page_token, `"$next"` replaced by `next`: the
 * next_page_token of the last step of the same verb that succeeded (undefined: none yet).
 */
function pageArgs(where: string, a: JsonValue | undefined, next: string | undefined): [number, string] {
  if (!isObject(a)) throw new Mismatch(`${where}: the step's arguments must be an object, got ${show(a)}`);
  const size = "page_size" in a ? a.page_size : 0;
  const token = "page_token" in a ? a.page_token : "";
  if (typeof size !== "number" || !Number.isInteger(size) || size < -(2 ** 31) || size >= 2 ** 31) {
    throw new Mismatch(`${where}: page_size must be an int32, got ${show(size)}`);
  }
  if (typeof token !== "string") throw new Mismatch(`${where}: page_token must be a string, got ${show(token)}`);
  if (token !== NEXT) return [size, token];
  if (next === undefined) {
    throw new Mismatch(`${where}: page_token $next, but no earlier step of this verb returned a next_page_token`);
  }
  return [size, next];
}

/** A step's arguments, which must be an object. */
function objectArgs(where: string, step: Step, verb: string): { [key: string]: JsonValue } {
  const value = step[verb];
  if (!isObject(value)) throw new Mismatch(`${where}: the step's arguments must be an object, got ${show(value)}`);
  return value;
}

/** A string argument: required when there is no fallback. */
function strArg(where: string, a: { [key: string]: JsonValue }, key: string, fallback?: string): string {
  if (!(key in a)) {
    if (fallback === undefined) throw new Mismatch(`${where}: missing argument ${show(key)}`);
    return fallback;
  }
  const value = a[key];
  if (typeof value !== "string") throw new Mismatch(`${where}: ${key} must be a str, got ${show(value)}`);
  return value;
}

function boolArg(where: string, a: { [key: string]: JsonValue }, key: string): boolean {
  if (!(key in a)) return false;
  const value = a[key];
  if (typeof value !== "boolean") throw new Mismatch(`${where}: ${key} must be a bool, got ${show(value)}`);
  return value;
}

function trustArg(where: string, a: { [key: string]: JsonValue }): number {
  const name = strArg(where, a, "trust", "TRUST_UNSPECIFIED");
  const value = TrustSchema.values.find((candidate) => candidate.name === name);
  if (!value) throw new Mismatch(`${where}: trust ${show(name)} is not a value of Trust`);
  return value.number;
}

/**
 * A create_runtime step's `agents`: a list of AgentDef in proto3 JSON, parsed as the vector's
 * own `agents` are. A missing or wrongly typed one is a broken vector, a Mismatch.
 */
function agentDefs(where: string, a: { [key: string]: JsonValue }): AgentDef[] {
  if (!("agents" in a)) throw new Mismatch(`${where}: missing argument ${show("agents")}`);
  const list = a.agents;
  if (!Array.isArray(list)) throw new Mismatch(`${where}: agents must be a list, got ${show(list)}`);
  return list.map((agent, i) => {
    try {
      return fromJson(AgentDefSchema, agent);
    } catch (error) {
      throw new Mismatch(`${where}: agents[${i}] is not an AgentDef: ${describeError(error)}`);
    }
  });
}

/**
 * Every page of ListRuntimes (of `page_size` each): whether this vector's runtime is among them
 * and, when it is, its summary's counts, its fork_seq and whether it was forked from `forkSource`
 * (the runtime the vector's last fork forked; undefined: none).
 */
async function listRuntimes(
  client: AgentRuntimeClient,
  runtimeId: string,
  forkSource: string | undefined,
  where: string,
  step: Step,
): Promise<Actual> {
  const a = objectArgs(where, step, "list_runtimes");
  const size = "page_size" in a ? a.page_size : 0;
  if (typeof size !== "number" || !Number.isInteger(size) || size < -(2 ** 31) || size >= 2 ** 31) {
    throw new Mismatch(`${where}: page_size must be an int32, got ${show(size)}`);
  }
  const outcome: Actual = { contains_this_runtime: false };
  let token = "";
  for (;;) {
    const page = await client.listRuntimesPage(size, token);
    for (const summary of page.runtimes) {
      if (summary.runtimeId !== runtimeId) continue;
      outcome.contains_this_runtime = true;
      outcome.this_runtime = {
        handle_count: summary.handleCount,
        running_count: summary.runningCount,
        suspended_count: summary.suspendedCount,
        total_tokens: summary.totalTokens,
        total_cost: costFields(summary.totalCost),
        fork_seq: summary.forkSeq,
        forked_from_source: forkSource !== undefined && summary.forkedFrom === forkSource,
      };
    }
    token = page.nextPageToken;
    if (token === "") return outcome;
  }
}

const sleep = (ms: number) => new Promise((done) => setTimeout(done, ms));

/**
 * One Inspect; with "poll", re-reads until the step's expect holds (a refused Inspect, such as
 * NOT_FOUND before the handle is spawned, does not hold yet), at most POLL_FOR_MS.
 */
async function inspect(client: AgentRuntimeClient, runtimeId: string, where: string, step: Step): Promise<Actual> {
  const a = objectArgs(where, step, "inspect");
  const handle = strArg(where, a, "handle");
  if (!boolArg(where, a, "poll")) return viewFields(await client.inspect(runtimeId, handle));
  const expected = step.expect;
  if (!isObject(expected) || "expect_error" in step) {
    throw new Mismatch(`${where}: a polling inspect needs an expect object and no expect_error`);
  }
  const deadline = Date.now() + POLL_FOR_MS;
  for (;;) {
    try {
      const outcome = viewFields(await client.inspect(runtimeId, handle));
      check(where, outcome, expected);
      return outcome;
    } catch (error) {
      if (!(error instanceof Mismatch || error instanceof ConnectError)) throw error;
      if (Date.now() >= deadline) {
        const why = error instanceof Mismatch ? error.message : describeError(error);
        throw new Mismatch(`${where}: still not as expected after polling for ${POLL_FOR_MS / 1000} s: ${why}`);
      }
    }
    await sleep(POLL_EVERY_MS);
  }
}

/** A non-negative integer argument in ms (absent: undefined); anything else is a broken vector. */
function millisArg(where: string, a: { [key: string]: JsonValue }, key: string): number | undefined {
  if (!(key in a)) return undefined;
  const value = a[key];
  if (typeof value !== "number" || !Number.isSafeInteger(value) || value < 0) {
    throw new Mismatch(`${where}: ${key} must be a non-negative integer, got ${show(value)}`);
  }
  return value;
}

/**
 * The restart hook (README: Waiting, restarts and watching), `afterMs` from now:
 * `sh -c "$AGENTRUNTIME_RESTART_HOOK"`; it rejects (a Mismatch) when the hook is missing or
 * exits non-zero. `cancel` stops the pause before the hook starts (the hook itself is let finish).
 */
function restartServer(afterMs: number, cancel: AbortSignal): Promise<void> {
  const hook = process.env.AGENTRUNTIME_RESTART_HOOK;
  if (!hook) {
    return Promise.reject(
      new Mismatch("restart_server_after_ms needs AGENTRUNTIME_RESTART_HOOK (scripts/with-server.sh sets it)"),
    );
  }
  return new Promise<void>((done, fail) => {
    const timer = setTimeout(() => {
      cancel.removeEventListener("abort", onCancel);
      const child = spawn("sh", ["-c", hook], { stdio: "inherit" });
      child.on("error", (error) => fail(new Mismatch(`the restart hook did not start: ${error.message}`)));
      child.on("exit", (code, signal) => {
        if (code === 0) done();
        else fail(new Mismatch(`the restart hook exited with ${code ?? signal}`));
      });
    }, afterMs);
    const onCancel = () => {
      clearTimeout(timer);
      done();
    };
    cancel.addEventListener("abort", onCancel, { once: true });
  });
}

/** The connection settings of the runner's client (TLS, token) from the environment, for a second client. */
let connection: { address: string; options: ClientOptions } | undefined;

/**
 * The client's wait helper, through a client with a short default deadline (`client_timeout_ms`)
 * and across a server restart (`restart_server_after_ms`) when the step asks (README: Waiting,
 * restarts and watching), like the Python runner's `_wait`.
 */
async function waitStep(client: AgentRuntimeClient, runtimeId: string, where: string, step: Step): Promise<TaskResult> {
  const a = objectArgs(where, step, "wait");
  const unknown = Object.keys(a)
    .filter((key) => !WAIT_OPTIONS.includes(key))
    .sort();
  if (unknown.length > 0) throw new Mismatch(`${where}: unknown wait arguments ${show(unknown)}`);
  const handle = strArg(where, a, "handle");
  const clientTimeout = millisArg(where, a, "client_timeout_ms");
  const restartAfter = millisArg(where, a, "restart_server_after_ms");
  const cancel = new AbortController();
  const restart = restartAfter === undefined ? undefined : restartServer(restartAfter, cancel.signal);
  restart?.catch(() => undefined); // awaited below; never an unhandled rejection meanwhile
  try {
    let result: TaskResult;
    if (clientTimeout === undefined) {
      result = await client.wait(runtimeId, handle);
    } else {
      if (connection === undefined) throw new Error("the runner's connection settings are not set");
      // A second client on the same connection settings whose default per-call deadline is
      // client_timeout_ms; closed after the step.
      const short = createClient(connection.address, { ...connection.options, timeoutMs: clientTimeout });
      try {
        result = await short.wait(runtimeId, handle);
      } finally {
        short.disconnect();
      }
    }
    if (restart !== undefined) await restart; // the hook's own failure fails the step, even when the wait got through
    return result;
  } finally {
    cancel.abort(); // a hook not started yet never starts (its promise then resolves)
  }
}

/** An event as the vectors write it: `handle_id payload` (and the state of a state_changed). */
function eventString(event: Event): string {
  const kind = event.payload.case ?? "";
  const name = kind.replace(/[A-Z]/g, (letter) => `_${letter.toLowerCase()}`); // stateChanged → state_changed
  let text = `${event.handleId} ${name}`;
  if (event.payload.case === "stateChanged") text += ` ${enumName(HandleStateSchema, event.payload.value.state)}`;
  return text;
}

/**
 * The client's watch helper from the first event to `handle`'s first result (CALL_TIMEOUT_MS for
 * the whole step); the seqs must run 1, 2, 3, ... (README: Waiting, restarts and watching).
 */
async function watchStep(client: AgentRuntimeClient, runtimeId: string, where: string, step: Step): Promise<Actual> {
  const handle = strArg(where, objectArgs(where, step, "watch"), "handle");
  const events: string[] = [];
  const stop = new AbortController();
  const timer = setTimeout(() => stop.abort(), CALL_TIMEOUT_MS);
  try {
    for await (const event of client.watch(runtimeId, 0, { signal: stop.signal })) {
      if (event.seq !== BigInt(events.length + 1)) {
        throw new Mismatch(`${where}: event seq ${event.seq} after ${events.length} events (a gap or a repeat)`);
      }
      events.push(eventString(event));
      if (event.payload.case === "result" && event.handleId === handle) {
        return { count: events.length, events };
      }
    }
  } finally {
    clearTimeout(timer);
  }
  // The iteration ends only when aborted, that is at the step's deadline.
  throw new Mismatch(
    `${where}: no result event of ${handle} within ${CALL_TIMEOUT_MS / 1000}s; events: ${show(events)}`,
  );
}

/**
 * The client's stream-run helper (README: Waiting, restarts and watching): the text pieces it
 * hands over joined in order (a reset empties what was joined of its turn) and counted, and the
 * result's fields (CALL_TIMEOUT_MS for the whole step).
 */
async function streamRunStep(client: AgentRuntimeClient, runtimeId: string, where: string, step: Step): Promise<Actual> {
  const a = objectArgs(where, step, "stream_run");
  const unknown = Object.keys(a)
    .filter((key) => !STREAM_RUN_ARGS.includes(key))
    .sort();
  if (unknown.length > 0) throw new Mismatch(`${where}: unknown stream_run arguments ${show(unknown)}`);
  const agent = strArg(where, a, "agent");
  const prompt = strArg(where, a, "prompt");
  const parent = strArg(where, a, "parent", "root");
  const turns = new Map<bigint, string[]>(); // each turn's text pieces since its last reset, in turn order
  let textDeltas = 0;
  const stop = new AbortController();
  const timer = setTimeout(() => stop.abort(), CALL_TIMEOUT_MS);
  try {
    for await (const item of client.streamRun(runtimeId, agent, prompt, parent, { signal: stop.signal })) {
      if (item.result !== undefined) {
        return { ...resultFields(item.result), joined: joinTurns(turns), text_deltas: textDeltas };
      }
      const piece = item.delta.piece;
      if (piece.case === "reset") turns.set(item.delta.turn, []);
      if (piece.case !== "text") continue;
      textDeltas += 1;
      const pieces = turns.get(item.delta.turn) ?? [];
      pieces.push(piece.value);
      turns.set(item.delta.turn, pieces);
    }
  } catch (error) {
    if (!stop.signal.aborted) throw error;
  } finally {
    clearTimeout(timer);
  }
  throw new Mismatch(
    `${where}: no result within ${CALL_TIMEOUT_MS / 1000}s; ${textDeltas} text deltas so far, joined: ${show(joinTurns(turns))}`,
  );
}

/** A step's arguments other than `allowed` are a broken vector. */
function onlyArgs(where: string, verb: string, a: { [key: string]: JsonValue }, allowed: string[]): void {
  const unknown = Object.keys(a)
    .filter((key) => !allowed.includes(key))
    .sort();
  if (unknown.length > 0) throw new Mismatch(`${where}: unknown ${verb} arguments ${show(unknown)}`);
}

/**
 * A fork step (README: Forks and replays): the client's forkRuntime of this vector's runtime at
 * `at_seq`, with `agents`, `messages` and `answer` (built as a resume step's Answer, for the last
 * pending Request) as the one entry of `answers`; a generated fork id, the client's request id.
 */
async function forkStep(
  client: AgentRuntimeClient,
  runtimeId: string,
  where: string,
  step: Step,
  lastPending: Request | undefined,
): Promise<ForkRuntimeResponse> {
  const a = objectArgs(where, step, "fork");
  onlyArgs(where, "fork", a, FORK_ARGS);
  if (!("at_seq" in a)) throw new Mismatch(`${where}: missing argument ${show("at_seq")}`);
  const atSeq = a.at_seq;
  if (typeof atSeq !== "number" || !Number.isSafeInteger(atSeq)) {
    throw new Mismatch(`${where}: at_seq must be an integer, got ${show(atSeq)}`);
  }
  const agents = "agents" in a ? agentDefs(where, a) : [];
  const list = "messages" in a ? a.messages : [];
  if (!Array.isArray(list)) throw new Mismatch(`${where}: messages must be a list, got ${show(list)}`);
  const messages: ForkMessageInit[] = list.map((entry, i) => {
    if (!isObject(entry)) throw new Mismatch(`${where}: messages[${i}] must be an object, got ${show(entry)}`);
    const at = `${where}: messages[${i}]`;
    onlyArgs(at, "message", entry, ["handle_id", "text"]);
    return { handleId: strArg(at, entry, "handle_id"), text: strArg(at, entry, "text") };
  });
  let answers: AnswerMessage[] = [];
  if ("answer" in a) {
    if (!isObject(a.answer)) throw new Mismatch(`${where}: answer must be an object, got ${show(a.answer)}`);
    answers = [answerArg(`${where}: answer`, a.answer, lastPending)];
  }
  return client.forkRuntime(runtimeId, atSeq, { agents, messages, answers });
}

/**
 * A replay step (README: Forks and replays): the client's replayRuntime of this vector's runtime
 * (which stays the vector's) with `agents` and `unrecorded_calls`, waited on until settled
 * (CALL_TIMEOUT_MS at most); its changed_count, the number of its diffs and each diff by handle id.
 */
async function replayStep(client: AgentRuntimeClient, runtimeId: string, where: string, step: Step): Promise<Actual> {
  const a = objectArgs(where, step, "replay");
  onlyArgs(where, "replay", a, REPLAY_ARGS);
  const agents = "agents" in a ? agentDefs(where, a) : [];
  const name = strArg(where, a, "unrecorded_calls", "UNRECORDED_CALLS_UNSPECIFIED");
  const unrecorded = UnrecordedCallsSchema.values.find((candidate) => candidate.name === name);
  if (!unrecorded) throw new Mismatch(`${where}: unrecorded_calls ${show(name)} is not a value of UnrecordedCalls`);
  const response = await client.replayRuntime(runtimeId, {
    agents,
    unrecordedCalls: unrecorded.number,
    timeoutMs: CALL_TIMEOUT_MS,
  });
  if (!response.settled) {
    throw new Mismatch(`${where}: the replay ${response.runtimeId} had not settled after ${CALL_TIMEOUT_MS / 1000} s`);
  }
  const diffs: Actual = Object.create(null) as Actual;
  for (const diff of response.diffs) diffs[diff.handleId] = diffFields(diff);
  return { changed_count: response.changedCount, count: response.diffs.length, diffs };
}

/** A ReplayDiff as a replay step's expect reads it; an unset TaskResult reads as its defaults. */
function diffFields(diff: ReplayDiff): Actual {
  const names = (calls: ReplayCall[]) => calls.map((call) => call.name);
  return {
    changed: [...diff.changed],
    recorded: resultFields(diff.recorded ?? create(TaskResultSchema)),
    replayed: resultFields(diff.replayed ?? create(TaskResultSchema)),
    recorded_calls: names(diff.recordedCalls),
    replayed_calls: names(diff.replayedCalls),
  };
}

/** The text of every turn, in the order the turns began. */
function joinTurns(turns: Map<bigint, string[]>): string {
  return [...turns.values()].map((pieces) => pieces.join("")).join("");
}

/** The worker handlers of tests/vectors/README.md (Workers), the same in every language. */
const WORKER_HANDLERS: Record<string, ToolHandler> = {
  upper: (a) => textArg(a).replace(/[a-z]+/g, (letters) => letters.toUpperCase()),
  reverse: (a) => Array.from(textArg(a)).reverse().join(""),
};

function textArg(a: Record<string, unknown>): string {
  if (typeof a.text !== "string") throw new Error(`the text argument must be a string, got ${JSON.stringify(a.text) ?? "nothing"}`);
  return a.text;
}

/**
 * A vector's running workers: `stop` aborts them, waits until they have ended and returns why
 * one failed on its own while the vector ran (undefined: none did).
 */
interface Workers {
  stop(): Promise<string | undefined>;
}

/**
 * The vector's `workers` (README: Workers), each started with serveTools on the runner's client
 * and registered before this returns (each within CALL_TIMEOUT_MS). A broken entry is a Mismatch
 * before any worker starts; a worker that fails to register stops the ones already started.
 */
async function startWorkers(client: AgentRuntimeClient, entries: JsonValue | undefined): Promise<Workers> {
  const list = entries ?? [];
  if (!Array.isArray(list)) throw new Mismatch(`workers: must be a list, got ${show(list)}`);
  const specs = list.map((entry, i) => {
    const where = `workers[${i}]`;
    if (!isObject(entry)) throw new Mismatch(`${where}: must be an object, got ${show(entry)}`);
    const queue = strArg(where, entry, "queue");
    const tools = entry.tools;
    if (!Array.isArray(tools) || !tools.every((name) => typeof name === "string")) {
      throw new Mismatch(`${where}: tools must be a list of strings, got ${show(tools)}`);
    }
    const unknown = (tools as string[]).filter((name) => !Object.hasOwn(WORKER_HANDLERS, name));
    if (unknown.length > 0) throw new Mismatch(`${where}: no handler for ${show(unknown)} (a broken vector)`);
    const limit = "max_concurrent_calls" in entry ? entry.max_concurrent_calls : 1;
    if (typeof limit !== "number" || !Number.isInteger(limit) || limit < 1) {
      throw new Mismatch(`${where}: max_concurrent_calls must be a positive integer, got ${show(limit)}`);
    }
    const handlers = Object.fromEntries((tools as string[]).map((name) => [name, WORKER_HANDLERS[name] as ToolHandler]));
    return { where, queue, handlers, limit };
  });
  const stopping = new AbortController();
  const running: Promise<void>[] = [];
  const workers: Workers = {
    async stop() {
      stopping.abort();
      const outcomes = await Promise.allSettled(running);
      const failed = outcomes.find((outcome) => outcome.status === "rejected");
      return failed ? describeError(failed.reason) : undefined;
    },
  };
  try {
    for (const { where, queue, handlers, limit } of specs) {
      let registered!: () => void;
      const ready = new Promise<void>((resolve) => {
        registered = resolve;
      });
      const serving = client.serveTools(queue, handlers, {
        maxConcurrentCalls: limit,
        signal: stopping.signal,
        onRegistered: () => registered(),
      });
      running.push(serving);
      let timer: NodeJS.Timeout | undefined;
      const timeout = new Promise<never>((_, reject) => {
        timer = setTimeout(
          () => reject(new Mismatch(`${where}: not registered within ${CALL_TIMEOUT_MS / 1000} s`)),
          CALL_TIMEOUT_MS,
        );
      });
      // serveTools settles before registering only when it is refused.
      const ended = serving.then(
        () => {
          throw new Mismatch(`${where}: the worker ended before it was registered`);
        },
        (error: unknown) => {
          throw new Mismatch(`${where}: the worker failed: ${describeError(error)}`);
        },
      );
      try {
        await Promise.race([ready, timeout, ended]);
      } finally {
        clearTimeout(timer);
        ended.catch(() => undefined); // settles later, when the worker is stopped
      }
    }
  } catch (error) {
    await workers.stop();
    throw error;
  }
  return workers;
}

async function runVector(client: AgentRuntimeClient, vector: Vector): Promise<void> {
  const workers = await startWorkers(client, vector.workers);
  let failed: string | undefined;
  try {
    await runSteps(client, vector);
  } finally {
    failed = await workers.stop();
  }
  if (failed !== undefined) throw new Mismatch(`workers: a worker failed during the vector: ${failed}`);
}

/**
 * An expect_error's `reason` (ErrorInfo), `resource` (ResourceInfo type and name) and
 * `violations` (the BadRequest's field_violations' fields, in order): tests/vectors/README.md,
 * Expectations. A key of the wrong type is a broken vector, a Mismatch.
 */
function checkDetails(where: string, error: ConnectError, want: { [key: string]: JsonValue }): void {
  if ("reason" in want) {
    if (typeof want.reason !== "string") {
      throw new Mismatch(`${where}: expect_error.reason must be a string, got ${show(want.reason)}`);
    }
    const got = error.findDetails(ErrorInfoSchema)[0]?.reason ?? "";
    if (got !== want.reason) {
      throw new Mismatch(`${where}: expected ErrorInfo reason ${show(want.reason)}, got ${show(got)}`);
    }
  }
  if ("resource" in want) {
    const expected = want.resource;
    if (
      !isObject(expected) ||
      Object.keys(expected).some((key) => key !== "type" && key !== "name") ||
      typeof expected.type !== "string" ||
      typeof expected.name !== "string"
    ) {
      throw new Mismatch(
        `${where}: expect_error.resource must be an object {"type", "name"} of strings, got ${show(expected)}`,
      );
    }
    const info = error.findDetails(ResourceInfoSchema)[0];
    const got: Actual | null = info ? { type: info.resourceType, name: info.resourceName } : null;
    if (got === null || got.type !== expected.type || got.name !== expected.name) {
      throw new Mismatch(`${where}: expected ResourceInfo ${show(expected)}, got ${show(got)}`);
    }
  }
  if ("violations" in want) {
    const expected = want.violations;
    if (!Array.isArray(expected) || !expected.every((field) => typeof field === "string")) {
      throw new Mismatch(`${where}: expect_error.violations must be a list of strings, got ${show(expected)}`);
    }
    const request = error.findDetails(BadRequestSchema)[0];
    const got = request ? request.fieldViolations.map((violation) => violation.field) : null;
    if (got === null || !equal(got, expected)) {
      throw new Mismatch(`${where}: expected BadRequest fields ${show(expected)}, got ${show(got)}`);
    }
  }
}

/**
 * The response messages of the runner's client, recorded by an interceptor: a repeated step
 * compares the whole responses of its two calls (README: Request ids and repeats), which the thin
 * methods reduce to one field. Only unary calls are recorded (never a worker's or a watch's stream).
 */
class Responses {
  private readonly last = new Map<string, { schema: DescMessage; message: ProtoMessage }>();

  readonly interceptor: Interceptor = (next) => async (request) => {
    const response = await next(request);
    if (!response.stream) this.last.set(request.method.name, { schema: request.method.output, message: response.message });
    return response;
  };

  /** The response of the last successful `method` call (its last attempt's), taken once. */
  take(method: string): { schema: DescMessage; message: ProtoMessage } {
    const found = this.last.get(method);
    if (found === undefined) throw new Error(`no ${method} response was recorded`);
    this.last.delete(method);
    return found;
  }
}

const responses = new Responses();

/**
 * What a step's call produced: `outcome` keyed like `expect`, the whole `response` (a mutating
 * call's), the runtime a create_runtime made, the Request a resume left pending.
 */
interface Sent {
  outcome: Actual;
  response?: { schema: DescMessage; message: ProtoMessage };
  created?: string;
  pending?: Request;
}

/** A step's call answered: what it produced, or the error it failed with. */
type Answer = ({ ok: true } & Sent) | { ok: false; error: ConnectError };

/** Makes `call` once; a ConnectError is an answer too, anything else (a Mismatch) is thrown. */
async function answer(call: () => Promise<Sent>): Promise<Answer> {
  try {
    return { ok: true, ...(await call()) };
  } catch (error) {
    if (!(error instanceof ConnectError)) throw error;
    return { ok: false, error };
  }
}

/**
 * A step's `request_id` (as sent: `<token>-<request_id>`) and `repeat`; either on a verb that is
 * not mutating, a `repeat` without a `request_id`, or a value of another type is a broken vector.
 */
function requestIdArgs(where: string, step: Step, verb: string, token: string): { requestId?: string; repeat: boolean } {
  const hasId = "request_id" in step;
  const hasRepeat = "repeat" in step;
  if ((hasId || hasRepeat) && !MUTATING.includes(verb)) {
    throw new Mismatch(`${where}: request_id and repeat go with a mutating verb, not ${show(verb)}`);
  }
  let requestId: string | undefined;
  if (hasId) {
    const given = step.request_id;
    if (typeof given !== "string" || !REQUEST_ID.test(given)) {
      throw new Mismatch(`${where}: request_id must be a string of at most 40 of [A-Za-z0-9_-], got ${show(given)}`);
    }
    requestId = `${token}-${given}`;
  }
  if (!hasRepeat) return { requestId, repeat: false };
  if (typeof step.repeat !== "boolean") throw new Mismatch(`${where}: repeat must be a bool, got ${show(step.repeat)}`);
  if (!hasId) throw new Mismatch(`${where}: repeat needs a request_id`);
  return { requestId, repeat: step.repeat };
}

/** The two answers of a repeated step must be alike: equal whole responses, or one code and message. */
function checkAlike(where: string, first: Answer, second: Answer): void {
  if (first.ok && second.ok) {
    const [a, b] = [first.response, second.response];
    if (a === undefined || b === undefined || a.schema !== b.schema || !equals(a.schema, a.message, b.message)) {
      throw new Mismatch(`${where}: the repeat was answered ${show(second.outcome)}, the first call ${show(first.outcome)}`);
    }
    return;
  }
  if (!first.ok && !second.ok) {
    if (first.error.code !== second.error.code || first.error.rawMessage !== second.error.rawMessage) {
      throw new Mismatch(
        `${where}: the repeat failed with ${describeError(second.error)}, the first call with ${describeError(first.error)}`,
      );
    }
    return;
  }
  const said = (one: Answer) => (one.ok ? "succeeded" : `failed with ${describeError(one.error)}`);
  throw new Mismatch(`${where}: the first call ${said(first)}, its repeat ${said(second)}`);
}

/** A step's expect (or expect_error) checked on one answer (tests/vectors/README.md, Expectations). */
function checkAnswer(where: string, step: Step, got: Answer): void {
  if (!got.ok) {
    const error = got.error;
    if (!("expect_error" in step)) throw new Mismatch(`${where}: unexpected error ${describeError(error)}`);
    const want = args(step, "expect_error");
    if (grpcCodeName(error.code) !== want.code) {
      throw new Mismatch(`${where}: expected ${str(want.code)}, got ${describeError(error)}`);
    }
    if ("limit" in want) {
      const info = error.findDetails(ErrorInfoSchema)[0];
      const limit = info?.metadata["limit"];
      if (limit !== want.limit) {
        throw new Mismatch(`${where}: expected ErrorInfo limit ${str(want.limit)}, got ${limit ?? "None"}`);
      }
    }
    checkDetails(where, error, want);
    return;
  }
  if ("expect_error" in step) {
    throw new Mismatch(`${where}: expected ${str(args(step, "expect_error").code)}, but the call succeeded`);
  }
  if ("expect" in step) check(where, got.outcome, args(step, "expect"));
}

async function runSteps(client: AgentRuntimeClient, vector: Vector): Promise<void> {
  const agents = vector.agents.map((agent) => fromJson(AgentDefSchema, agent));
  // This vector's runtime: the one created here, then the fork of the last fork step (README:
  // Forks and replays), forked from `forkSource`.
  let runtimeId = await client.createRuntime(agents);
  let forkSource: string | undefined;
  // The prefix of this run's request ids: the server is shared, and a CreateRuntime's request
  // id is recorded per tenant, so no two runs may share one.
  const token = randomBytes(8).toString("hex");
  let lastPending: Request | undefined;
  // The next_page_token of the last list / transcript step that succeeded, for "$next".
  let nextList: string | undefined;
  let nextTranscript: string | undefined;
  for (const [index, step] of vector.steps.entries()) {
    const where = `step ${index + 1}`;
    const verbs = VERBS.filter((verb) => verb in step);
    if (verbs.length !== 1) throw new Mismatch(`${where}: a step has exactly one verb, got ${show(verbs)}`);
    const verb = verbs[0] as string;
    const { requestId, repeat } = requestIdArgs(where, step, verb, token);
    // The request id of a mutating call: the step's, or (as the client does by default) a fresh one.
    const options = { requestId };
    if (MUTATING.includes(verb)) {
      const call = prepareMutation(client, runtimeId, where, step, verb, options, lastPending);
      const first = await answer(call);
      const answers = [first];
      if (repeat) answers.push(await answer(call));
      // Leave no runtime behind that a create_runtime step made (once, after both answers).
      const created = new Set(answers.flatMap((one) => (one.ok && one.created !== undefined ? [one.created] : [])));
      for (const id of created) {
        try {
          await client.deleteRuntime(id, false);
        } catch (error) {
          throw new Mismatch(`${where}: deleting the runtime it created: ${describeError(error)}`);
        }
      }
      if (answers.length === 2) checkAlike(where, first, answers[1] as Answer);
      for (const one of answers) checkAnswer(where, step, one);
      if (first.ok && first.pending !== undefined) lastPending = first.pending;
      continue;
    }
    const got = await answer(async () => {
      if ("wait" in step) {
        const result = await waitStep(client, runtimeId, where, step);
        if (result.status === Status.PENDING) lastPending = result.pending;
        const outcome = resultFields(result);
        if ("decoded" in args(step, "expect")) outcome.decoded = decodedFields(where, result);
        return { outcome };
      }
      if ("list" in step) {
        const [pageSize, pageToken] = pageArgs(where, step.list, nextList);
        const page = await client.listPage(runtimeId, pageSize, pageToken);
        nextList = page.nextPageToken;
        const byId: Actual = Object.create(null) as Actual;
        for (const view of page.handles) byId[view.handleId] = viewFields(view);
        return { outcome: { count: page.handles.length, handles: byId, next_page_token_empty: page.nextPageToken === "" } };
      }
      if ("transcript" in step) {
        const [pageSize, pageToken] = pageArgs(where, step.transcript, nextTranscript);
        const a = args(step, "transcript");
        const page = await client.transcriptPage(runtimeId, str(a.handle), pageSize, pageToken);
        nextTranscript = page.nextPageToken;
        return {
          outcome: {
            count: page.messages.length,
            roles: page.messages.map((message) => message.role),
            messages: page.messages.map(messageFields),
            next_page_token_empty: page.nextPageToken === "",
          },
        };
      }
      if ("list_runtimes" in step) return { outcome: await listRuntimes(client, runtimeId, forkSource, where, step) };
      if ("fork" in step) {
        const fork = await forkStep(client, runtimeId, where, step, lastPending);
        // Every later step acts on the fork; the runtime it was forked from is its source.
        forkSource = runtimeId;
        runtimeId = fork.runtimeId;
        return { outcome: { fork_seq: fork.forkSeq, held: [...fork.heldHandleIds] } };
      }
      if ("replay" in step) return { outcome: await replayStep(client, runtimeId, where, step) };
      if ("watch" in step) return { outcome: await watchStep(client, runtimeId, where, step) };
      if ("stream_run" in step) return { outcome: await streamRunStep(client, runtimeId, where, step) };
      return { outcome: await inspect(client, runtimeId, where, step) };
    });
    checkAnswer(where, step, got);
  }
}

/**
 * The call of a mutating step, its arguments read (a broken one is a Mismatch now) and its request
 * built once, so that a repeat sends the same request: `request_id` (README: Request ids and
 * repeats) or, without one, a fresh id per call, as the client draws by default.
 */
function prepareMutation(
  client: AgentRuntimeClient,
  runtimeId: string,
  where: string,
  step: Step,
  verb: string,
  options: { requestId?: string },
  lastPending: Request | undefined,
): () => Promise<Sent> {
  switch (verb) {
    case "spawn": {
      const a = args(step, "spawn");
      const budget = "budget" in a ? fromJson(BudgetSchema, a.budget as JsonValue) : undefined;
      return async () => {
        const handleId = await client.spawn(runtimeId, str(a.agent), str(a.parent), budget, options);
        return { outcome: { handle_id: handleId }, response: responses.take("Spawn") };
      };
    }
    case "wake": {
      const a = args(step, "wake");
      return async () => {
        await client.wake(runtimeId, str(a.handle), str(a.prompt), options);
        return { outcome: {}, response: responses.take("Wake") };
      };
    }
    case "resume": {
      const reply = answerArg(where, args(step, "resume"), lastPending);
      return async () => {
        const result = await client.resume(runtimeId, reply, options);
        const pending = result.status === Status.PENDING ? result.pending : undefined;
        return { outcome: resultFields(result), response: responses.take("Resume"), ...(pending ? { pending } : {}) };
      };
    }
    case "post": {
      // Through client.call: the thin post takes no trust or coalesce_key.
      const a = objectArgs(where, step, "post");
      const request = {
        runtimeId,
        handleId: strArg(where, a, "handle"),
        text: strArg(where, a, "text"),
        sender: strArg(where, a, "sender", ""),
        channel: strArg(where, a, "channel", ""),
        trust: trustArg(where, a),
        coalesceKey: strArg(where, a, "coalesce_key", ""),
      };
      return async () => {
        const response = await client.call("post", request, options);
        return { outcome: { inbox_size: response.inboxSize }, response: { schema: PostResponseSchema, message: response } };
      };
    }
    case "close": {
      // Through client.call: the thin close takes no grace.
      const a = objectArgs(where, step, "close");
      const request = { runtimeId, handleId: strArg(where, a, "handle"), force: boolArg(where, a, "force") };
      const graceMs = "grace_ms" in a ? a.grace_ms : undefined;
      if (graceMs !== undefined && (typeof graceMs !== "number" || !Number.isSafeInteger(graceMs))) {
        throw new Mismatch(`${where}: grace_ms must be an integer, got ${show(graceMs)}`);
      }
      const grace = typeof graceMs === "number" ? durationFromMs(graceMs) : undefined;
      return async () => {
        const response = await client.call("close", { ...request, grace }, options);
        return {
          outcome: { closed: [...response.closedHandleIds], count: response.closedHandleIds.length },
          response: { schema: CloseResponseSchema, message: response },
        };
      };
    }
    case "interrupt": {
      const handle = strArg(where, objectArgs(where, step, "interrupt"), "handle");
      return async () => {
        const interrupted = await client.interrupt(runtimeId, handle, options);
        return { outcome: { interrupted }, response: responses.take("Interrupt") };
      };
    }
    case "delete_runtime": {
      const force = boolArg(where, objectArgs(where, step, "delete_runtime"), "force");
      return async () => {
        await client.deleteRuntime(runtimeId, force, options);
        return { outcome: {}, response: responses.take("DeleteRuntime") };
      };
    }
    case "create_runtime": {
      const defs = agentDefs(where, objectArgs(where, step, "create_runtime"));
      // Another runtime than the vector's, deleted once the step has its answers.
      return async () => {
        const created = await client.createRuntime(defs, "", options);
        return { outcome: {}, response: responses.take("CreateRuntime"), created };
      };
    }
    default:
      throw new Error(`not a mutating verb: ${verb}`);
  }
}

/**
 * The Answer a resume step's arguments make (and a fork step's `answer`) for the last pending
 * Request: its `id` unless the step gives one, `outputs[i]` a ToolOutput for its `calls[i]`,
 * `data` (an object) as the Answer's Struct.
 */
function answerArg(where: string, a: { [key: string]: JsonValue }, lastPending: Request | undefined): AnswerMessage {
  const calls = lastPending?.calls ?? [];
  const outputs = Array.isArray(a.outputs) ? a.outputs : [];
  if ("data" in a && !isObject(a.data)) throw new Mismatch(`${where}: data must be an object, got ${show(a.data)}`);
  return create(AnswerSchema, {
    id: str(a.id) || (lastPending?.id ?? ""),
    ok: a.ok === true,
    reason: str(a.reason),
    ...(isObject(a.data) ? { data: a.data as JsonObject } : {}),
    outputs: outputs.map((text, i) => {
      const call = calls[i];
      if (!call) throw new Mismatch(`${where}: outputs[${i}] has no call in the last pending Request`);
      return create(ToolOutputSchema, { callId: call.id, output: str(text) });
    }),
  });
}

/** `Mismatch: why`, `ConnectError: CODE: message`, `SyntaxError: ...`, as Python's `Type: problem`. */
function reason(error: unknown): string {
  if (error instanceof Mismatch) return `Mismatch: ${error.message}`;
  if (error instanceof ConnectError) return `ConnectError: ${describeError(error)}`;
  if (error instanceof Error) return `${error.name}: ${error.message}`;
  return String(error);
}

function vectorFiles(): string[] {
  try {
    // File-name order, by code unit like Python's sorted() of ASCII names.
    return readdirSync(VECTORS, { withFileTypes: true })
      .filter((entry) => entry.isFile() && entry.name.endsWith(".json"))
      .map((entry) => entry.name)
      .sort();
  } catch {
    return []; // a missing directory has no vectors, as Python's glob says
  }
}

async function main(): Promise<number> {
  const address = process.env.AGENTRUNTIME_ADDR || "127.0.0.1:50051";
  const files = vectorFiles();
  if (files.length === 0) {
    // Zero vectors is a misconfiguration, not a pass.
    console.error(`conformance: no vectors in ${VECTORS}`);
    return 2;
  }
  // TLS and the token from the environment (tests/vectors/README.md); unset or empty: left out.
  const env = (name: string): string | undefined => process.env[name] || undefined;
  let client: AgentRuntimeClient;
  try {
    const options: ClientOptions = {
      caFile: env("AGENTRUNTIME_CA_FILE"),
      clientCertificateFile: env("AGENTRUNTIME_CLIENT_CERT_FILE"),
      clientKeyFile: env("AGENTRUNTIME_CLIENT_KEY_FILE"),
      token: env("AGENTRUNTIME_TOKEN"),
      interceptors: [responses.interceptor],
    };
    client = createClient(address, options);
    connection = { address, options };
  } catch (error) {
    console.error(`conformance: ${describeError(error)}`);
    return 2;
  }
  let passed = 0;
  let failed = 0;
  for (const file of files) {
    const name = file.slice(0, -".json".length); // the file's stem, as the Python runner prints
    try {
      const vector = JSON.parse(readFileSync(join(VECTORS, file), "utf8")) as Vector;
      await runVector(client, vector);
      passed += 1;
      console.log(`ok   ${name}`);
    } catch (error) {
      failed += 1;
      console.log(`FAIL ${name}: ${reason(error)}`);
    }
  }
  console.log(`conformance: ${passed} passed, ${failed} failed`);
  return failed > 0 ? 1 : 0;
}

process.exitCode = await main();
