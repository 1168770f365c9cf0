/// <reference types="@agentruntime/client/node-globals" />
// The CommonJS build: compiled to require.cjs, which require()s the package (its "require" export).
import agentruntime = require("@agentruntime/client");

async function main(): Promise<number> {
  const client = agentruntime.createClient(process.env.AGENTRUNTIME_ADDR ?? "127.0.0.1:50051");
  try {
    const runtimeId = await client.createRuntime([
      { name: "echo", description: "answers", script: { replies: [{ text: "from require", tokens: 5n }] } },
    ]);
    const result = await client.run(runtimeId, "echo", "hi");
    const status = agentruntime.StatusSchema.value[result.status]?.name;
    console.log(`require: status=${status} total_tokens=${result.totalTokens}`);
    try {
      await client.inspect("rt-does-not-exist", "root/echo.1");
      return 1;
    } catch (error) {
      if (!(error instanceof agentruntime.ConnectError) || error.code !== agentruntime.Code.NotFound) throw error;
    }
    await client.deleteRuntime(runtimeId);
    return result.status === agentruntime.Status.DONE && result.totalTokens === 5n ? 0 : 1;
  } finally {
    client.disconnect();
  }
}

main().then(
  (code) => {
    console.log(code === 0 ? "consumer (CommonJS): ok" : "consumer (CommonJS): FAIL");
    process.exitCode = code;
  },
  (error: unknown) => {
    console.error(`consumer (CommonJS): FAIL: ${agentruntime.describeError(error)}`);
    process.exitCode = 1;
  },
);
