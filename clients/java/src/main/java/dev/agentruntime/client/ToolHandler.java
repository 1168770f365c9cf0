package dev.agentruntime.client;

import dev.agentruntime.v1.WorkerCall;
import java.util.Map;

/**
 * Runs one worker tool call for {@link AgentRuntimeClient#serveTools}: what it returns is the
 * tool's output; what it throws is an error result carrying the exception's message, for the
 * model to see.
 *
 * <pre>{@code
 * ToolHandler forecast = (arguments, call) -> "sunny in " + arguments.get("city");
 * }</pre>
 *
 * <p>Handlers run on the worker's own threads, up to {@code maxConcurrentCalls} at once, so a
 * handler shared by several tools must be thread safe. An interrupt means the worker is closing.
 */
@FunctionalInterface
public interface ToolHandler {
  /**
   * @param arguments the call's {@code arguments_json}, decoded: JSON objects as {@code Map<String,
   *     Object>}, arrays as {@code List<Object>}, integers as {@code Long}, other numbers as
   *     {@code Double}, plus {@code String}, {@code Boolean} and {@code null}
   * @param call the call as the server sent it: {@code getCall()} has the tool name and the
   *     idempotency key (the same for every attempt of the call), and there are the runtime and
   *     handle ids and the deadline past which the output is not taken
   * @return the output ({@code null} is an empty output)
   */
  String handle(Map<String, Object> arguments, WorkerCall call) throws Exception;
}
