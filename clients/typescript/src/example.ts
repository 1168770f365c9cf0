/**
 * The seed scenario: a scripted coordinator delegates once to a scripted worker; the
 * coordinator's total_tokens is the whole tree's bill (100 + 100 own, 400 the worker's).
 *
 *   AGENTRUNTIME_ADDR=127.0.0.1:50051 npm run example
 */

import { StatusSchema, createClient, describeError, type AgentDefInit } from "./index.js";

const agents: AgentDefInit[] = [
  {
    name: "coordinator",
    description: "splits the work",
    team: ["worker"],
    script: {
      replies: [
        {
          toolCalls: [{ name: "task", argumentsJson: JSON.stringify({ agent: "worker", prompt: "look around" }) }],
          tokens: 100n,
        },
        { text: "coordinated", tokens: 100n },
      ],
    },
  },
  {
    name: "worker",
    description: "does the work",
    script: { replies: [{ text: "found it", tokens: 400n }] },
  },
];

const client = createClient(process.env.AGENTRUNTIME_ADDR || "127.0.0.1:50051");
try {
  const runtimeId = await client.createRuntime(agents);
  const result = await client.run(runtimeId, "coordinator", "map the repo");
  const status = StatusSchema.value[result.status]?.name ?? String(result.status);
  console.log(
    `status=${status} total_tokens=${result.totalTokens} own_tokens=${result.ownTokens} turns=${result.turns}`,
  );
} catch (error) {
  console.error(describeError(error));
  process.exitCode = 1;
}
