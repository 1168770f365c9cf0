/// <reference types="@agentruntime/client/node-globals" />
/**
 * The consumer test's program (make consumer-test copies it into a fresh project that depends
 * on the released tarball): a scripted run, its figures checked, and a typed NOT_FOUND.
 */
import {
  Status,
  StatusSchema,
  createClient,
  describeError,
  errorDetails,
  grpcCodeName,
  isNotFound,
  type AgentDefInit,
} from "@agentruntime/client";

const agents: AgentDefInit[] = [
  { name: "greeter", description: "answers at once", script: { replies: [{ text: "hello, consumer", tokens: 42n }] } },
];

const client = createClient(process.env.AGENTRUNTIME_ADDR ?? "127.0.0.1:50051");
const problems: string[] = [];
try {
  const runtimeId = await client.createRuntime(agents);
  const result = await client.run(runtimeId, "greeter", "say hello"); // spawn + wake + wait
  const status = StatusSchema.value[result.status]?.name ?? String(result.status);
  console.log(
    `run: status=${status} text=${JSON.stringify(result.text)} turns=${result.turns} own_tokens=${result.ownTokens} total_tokens=${result.totalTokens}`,
  );
  if (result.status !== Status.DONE) problems.push(`status ${status}, expected STATUS_DONE`);
  if (result.text !== "hello, consumer") problems.push(`text ${JSON.stringify(result.text)}`);
  if (result.turns !== 1n) problems.push(`turns ${result.turns}, expected 1`);
  if (result.ownTokens !== 42n || result.totalTokens !== 42n) problems.push("tokens, expected 42 own and total");

  try {
    await client.inspect(runtimeId, "root/nobody.1");
    problems.push("inspect of a missing handle succeeded");
  } catch (error) {
    if (!isNotFound(error)) throw error;
    const info = errorDetails(error).resourceInfo;
    console.log(`inspect: ${grpcCodeName(error.code)} resource_type=${info?.resourceType} resource_name=${info?.resourceName}`);
    if (info?.resourceName !== "root/nobody.1") problems.push(`ResourceInfo ${JSON.stringify(info?.resourceName)}`);
  }
  await client.deleteRuntime(runtimeId);
} catch (error) {
  problems.push(`unexpected error: ${describeError(error)}`);
} finally {
  client.disconnect();
}
if (problems.length > 0) {
  console.error(`consumer (ESM): FAIL: ${problems.join("; ")}`);
  process.exitCode = 1;
} else {
  console.log("consumer (ESM): ok");
}
