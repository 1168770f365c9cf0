package dev.agentruntime.example;

import dev.agentruntime.client.AgentRuntimeClient;
import dev.agentruntime.client.AgentRuntimeException;
import dev.agentruntime.v1.AgentDef;
import dev.agentruntime.v1.Script;
import dev.agentruntime.v1.ScriptedReply;
import dev.agentruntime.v1.ScriptedToolCall;
import dev.agentruntime.v1.TaskResult;
import java.util.List;

/**
 * The seed scenario: a scripted coordinator delegates once to a scripted worker; the
 * coordinator's total_tokens is the whole tree's bill (100 + 100 own, 400 the worker's).
 *
 * <pre>
 *   AGENTRUNTIME_ADDR=127.0.0.1:50051 make example
 * </pre>
 */
public final class SeedExample {
  private SeedExample() {}

  public static void main(String[] args) {
    List<AgentDef> agents = List.of(
        AgentDef.newBuilder()
            .setName("coordinator")
            .setDescription("splits the work")
            .addTeam("worker")
            .setScript(Script.newBuilder()
                .addReplies(ScriptedReply.newBuilder()
                    .addToolCalls(ScriptedToolCall.newBuilder()
                        .setName("task")
                        .setArgumentsJson("{\"agent\": \"worker\", \"prompt\": \"look around\"}"))
                    .setTokens(100))
                .addReplies(ScriptedReply.newBuilder().setText("coordinated").setTokens(100)))
            .build(),
        AgentDef.newBuilder()
            .setName("worker")
            .setDescription("does the work")
            .setScript(Script.newBuilder()
                .addReplies(ScriptedReply.newBuilder().setText("found it").setTokens(400)))
            .build());

    String address = System.getenv().getOrDefault("AGENTRUNTIME_ADDR", "127.0.0.1:50051");
    int exitCode = 0;
    try (AgentRuntimeClient client = AgentRuntimeClient.newBuilder(address).build()) {
      String runtimeId = client.createRuntime(agents);
      TaskResult result = client.run(runtimeId, "coordinator", "map the repo");
      System.out.printf("status=%s total_tokens=%d own_tokens=%d turns=%d%n",
          result.getStatus().name(), result.getTotalTokens(), result.getOwnTokens(), result.getTurns());
    } catch (AgentRuntimeException error) {
      System.err.println(error.getMessage());
      exitCode = 1;
    }
    System.exit(exitCode);
  }
}
