package example.consumer;

import com.google.rpc.ResourceInfo;
import dev.agentruntime.client.AgentRuntimeClient;
import dev.agentruntime.client.AgentRuntimeException;
import dev.agentruntime.v1.AgentDef;
import dev.agentruntime.v1.Script;
import dev.agentruntime.v1.ScriptedReply;
import dev.agentruntime.v1.Status;
import dev.agentruntime.v1.TaskResult;
import java.util.List;

/**
 * A user's program on the released client: a runtime with one scripted agent, a run (Spawn + Wake
 * + Wait), its figures checked, and a typed error (Inspect of a handle that does not exist:
 * NOT_FOUND, with the ResourceInfo naming it). Exits 0 only when all of it is as expected.
 */
public final class ConsumerCheck {
  private ConsumerCheck() {}

  public static void main(String[] args) {
    String address = System.getenv("AGENTRUNTIME_ADDR");
    if (address == null || address.isEmpty()) {
      System.err.println("consumer: AGENTRUNTIME_ADDR is not set");
      System.exit(2);
    }
    AgentDef greeter = AgentDef.newBuilder()
        .setName("greeter")
        .setDescription("says hello once")
        .setScript(Script.newBuilder()
            .addReplies(ScriptedReply.newBuilder().setText("hello from the release").setTokens(42)))
        .build();

    AgentRuntimeClient.Builder builder = AgentRuntimeClient.newBuilder(address);
    String token = System.getenv("AGENTRUNTIME_TOKEN");
    if (token != null && !token.isEmpty()) {
      builder.bearerToken(token);
    }
    boolean ok = true;
    try (AgentRuntimeClient client = builder.build()) {
      String runtimeId = client.createRuntime(List.of(greeter));
      TaskResult result = client.run(runtimeId, "greeter", "say hello");
      System.out.printf("consumer: status=%s text=%s turns=%d own_tokens=%d total_tokens=%d%n",
          result.getStatus().name(), result.getText(), result.getTurns(), result.getOwnTokens(),
          result.getTotalTokens());
      if (result.getStatus() != Status.STATUS_DONE || !result.getText().equals("hello from the release")
          || result.getTurns() != 1 || result.getOwnTokens() != 42 || result.getTotalTokens() != 42) {
        System.out.println("consumer: FAIL expected STATUS_DONE, 'hello from the release', 1 turn, 42 tokens");
        ok = false;
      }

      try {
        client.inspect(runtimeId, "root/nobody.1");
        System.out.println("consumer: FAIL inspect of root/nobody.1 succeeded");
        ok = false;
      } catch (AgentRuntimeException error) {
        ResourceInfo resource = error.resourceInfo().orElse(ResourceInfo.getDefaultInstance());
        System.out.printf("consumer: caught %s (isNotFound=%s) resource_type=%s resource_name=%s%n",
            error.code(), error.isNotFound(), resource.getResourceType(), resource.getResourceName());
        if (!error.isNotFound() || !error.resourceInfo().isPresent()
            || !resource.getResourceName().contains("root/nobody.1")) {
          System.out.println("consumer: FAIL expected NOT_FOUND with a ResourceInfo naming root/nobody.1");
          ok = false;
        }
      }
      client.deleteRuntime(runtimeId);
    } catch (AgentRuntimeException error) {
      System.out.println("consumer: FAIL " + error.getMessage());
      ok = false;
    }
    System.exit(ok ? 0 : 1);
  }
}
