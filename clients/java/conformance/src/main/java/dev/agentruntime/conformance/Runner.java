package dev.agentruntime.conformance;

import com.google.gson.JsonArray;
import com.google.gson.JsonElement;
import com.google.gson.JsonNull;
import com.google.gson.JsonObject;
import com.google.gson.JsonParser;
import com.google.gson.JsonPrimitive;
import com.google.protobuf.Descriptors.EnumValueDescriptor;
import com.google.protobuf.InvalidProtocolBufferException;
import com.google.protobuf.Struct;
import com.google.protobuf.Value;
import com.google.protobuf.util.Durations;
import com.google.protobuf.util.JsonFormat;
import com.google.rpc.ErrorInfo;
import dev.agentruntime.client.AgentRuntimeClient;
import dev.agentruntime.client.AgentRuntimeException;
import dev.agentruntime.client.OutputException;
import dev.agentruntime.client.Outputs;
import dev.agentruntime.client.ToolHandler;
import dev.agentruntime.client.ToolWorker;
import dev.agentruntime.client.WatchStream;
import dev.agentruntime.v1.AgentDef;
import dev.agentruntime.v1.Answer;
import dev.agentruntime.v1.Budget;
import dev.agentruntime.v1.CloseRequest;
import dev.agentruntime.v1.CloseResponse;
import dev.agentruntime.v1.Cost;
import dev.agentruntime.v1.Delta;
import dev.agentruntime.v1.Event;
import dev.agentruntime.v1.Failure;
import dev.agentruntime.v1.ForkMessage;
import dev.agentruntime.v1.ForkRuntimeResponse;
import dev.agentruntime.v1.GetTranscriptResponse;
import dev.agentruntime.v1.HandleView;
import dev.agentruntime.v1.ListResponse;
import dev.agentruntime.v1.ListRuntimesResponse;
import dev.agentruntime.v1.Message;
import dev.agentruntime.v1.PostRequest;
import dev.agentruntime.v1.PostResponse;
import dev.agentruntime.v1.ReplayCall;
import dev.agentruntime.v1.ReplayDiff;
import dev.agentruntime.v1.ReplayRuntimeResponse;
import dev.agentruntime.v1.Request;
import dev.agentruntime.v1.RuntimeSummary;
import dev.agentruntime.v1.Status;
import dev.agentruntime.v1.TaskResult;
import dev.agentruntime.v1.ToolCall;
import dev.agentruntime.v1.ToolOutput;
import dev.agentruntime.v1.Trust;
import dev.agentruntime.v1.UnrecordedCalls;
import dev.agentruntime.v1.Usage;
import io.grpc.Context;
import java.io.File;
import java.io.IOException;
import java.io.UncheckedIOException;
import java.math.BigDecimal;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.security.SecureRandom;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.TreeSet;
import java.util.concurrent.Executors;
import java.util.concurrent.ScheduledExecutorService;
import java.util.concurrent.ScheduledFuture;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.TimeoutException;
import java.util.stream.Collectors;
import java.util.stream.Stream;

/**
 * The Java conformance runner: every vector in tests/vectors (see its README) against the server
 * at {@code AGENTRUNTIME_ADDR}, in file-name order; one line per vector, then
 * {@code conformance: N passed, M failed}; exit status 1 when any failed.
 *
 * <p>The vector directory is {@code AGENTRUNTIME_VECTORS}, else the system property
 * {@code agentruntime.vectors} (the POM sets it for {@code mvn exec:java}), else
 * {@code ../../tests/vectors} relative to the working directory (clients/java).
 */
public final class Runner {
  private Runner() {}

  /** A vector's expectation that did not hold; its message is the FAIL line's reason. */
  static final class Mismatch extends Exception {
    private static final long serialVersionUID = 1L;

    Mismatch(String message) {
      super(message);
    }
  }

  public static void main(String[] args) {
    String address = envOr("AGENTRUNTIME_ADDR", "127.0.0.1:50051");
    Path dir = vectorDirectory();
    List<Path> files;
    try (Stream<Path> listing = Files.list(dir)) {
      files = listing
          .filter(p -> p.getFileName().toString().endsWith(".json") && Files.isRegularFile(p))
          .sorted((a, b) -> a.getFileName().toString().compareTo(b.getFileName().toString()))
          .collect(Collectors.toList());
    } catch (IOException e) {
      System.out.println("conformance: cannot read the vectors in " + dir + ": " + e);
      System.exit(2);
      return;
    }
    if (files.isEmpty()) {
      // Zero vectors is a misconfiguration, not a pass.
      System.out.println("conformance: no *.json vectors in " + dir);
      System.exit(2);
      return;
    }

    int passed = 0;
    int failed = 0;
    try (AgentRuntimeClient client = connect(address)) {
      for (Path file : files) {
        String name = file.getFileName().toString();
        try {
          JsonObject vector = JsonParser.parseString(Files.readString(file, StandardCharsets.UTF_8)).getAsJsonObject();
          if (vector.has("name")) {
            name = vector.get("name").getAsString();
          }
          runVector(client, vector);
          passed++;
          System.out.println("ok   " + name);
        } catch (Mismatch mismatch) {
          failed++;
          System.out.println("FAIL " + name + ": " + mismatch.getMessage());
        } catch (AgentRuntimeException error) {
          // CreateRuntime refused the vector's agents (outside any step).
          failed++;
          System.out.println("FAIL " + name + ": create runtime: " + error.getMessage());
        } catch (IOException | RuntimeException error) {
          // A malformed vector (bad JSON, a missing argument, ...) fails it instead of the run.
          failed++;
          System.out.println("FAIL " + name + ": malformed vector: " + error);
        }
      }
    }
    System.out.println("conformance: " + passed + " passed, " + failed + " failed");
    System.out.flush();
    System.exit(failed > 0 ? 1 : 0);
  }

  /**
   * The client, with TLS and the token from the environment (tests/vectors/README.md):
   * AGENTRUNTIME_CA_FILE, AGENTRUNTIME_CLIENT_CERT_FILE with AGENTRUNTIME_CLIENT_KEY_FILE, and
   * AGENTRUNTIME_TOKEN; each unset or empty variable leaves its option out.
   */
  private static AgentRuntimeClient connect(String address) {
    return connect(address, CALL_TIMEOUT);
  }

  /** {@link #connect(String)} with this default per-call deadline. */
  static AgentRuntimeClient connect(String address, java.time.Duration timeout) {
    return secure(AgentRuntimeClient.newBuilder(address).defaultTimeout(timeout)).build();
  }

  /** The environment's TLS, mTLS and token settings on {@code builder}; an unreadable file exits 2. */
  static AgentRuntimeClient.Builder secure(AgentRuntimeClient.Builder builder) {
    String ca = envOr("AGENTRUNTIME_CA_FILE", "");
    String cert = envOr("AGENTRUNTIME_CLIENT_CERT_FILE", "");
    String key = envOr("AGENTRUNTIME_CLIENT_KEY_FILE", "");
    String token = envOr("AGENTRUNTIME_TOKEN", "");
    try {
      if (!ca.isEmpty()) {
        builder.trustCertificates(new File(ca));
      }
      if (!cert.isEmpty() || !key.isEmpty()) {
        builder.clientCertificate(new File(cert), new File(key));
      }
    } catch (UncheckedIOException e) {
      System.out.println("conformance: " + e.getMessage());
      System.exit(2);
    }
    return builder.bearerToken(token);
  }

  private static String envOr(String name, String fallback) {
    String value = System.getenv(name);
    return value == null || value.isEmpty() ? fallback : value;
  }

  private static Path vectorDirectory() {
    String fromEnv = System.getenv("AGENTRUNTIME_VECTORS");
    if (fromEnv != null && !fromEnv.isEmpty()) {
      return Paths.get(fromEnv);
    }
    String fromProperty = System.getProperty("agentruntime.vectors");
    if (fromProperty != null && !fromProperty.isEmpty()) {
      return Paths.get(fromProperty);
    }
    return Paths.get("..", "..", "tests", "vectors");
  }

  /** The page_token that means the next_page_token of the last step of the same verb that succeeded. */
  private static final String NEXT = "$next";

  private static final List<String> VERBS =
      List.of("spawn", "wake", "wait", "resume", "list", "transcript", "post", "close", "inspect",
          "list_runtimes", "delete_runtime", "create_runtime", "interrupt", "watch", "stream_run", "fork", "replay");

  /** The arguments a wait step may have (README: Waiting, restarts and watching). */
  private static final List<String> WAIT_OPTIONS = List.of("handle", "client_timeout_ms", "restart_server_after_ms");

  /** The arguments a stream_run step may have (README: Waiting, restarts and watching). */
  private static final List<String> STREAM_RUN_OPTIONS = List.of("agent", "prompt", "parent");

  /** The arguments a fork step and a replay step may have (README: Forks and replays). */
  private static final List<String> FORK_OPTIONS = List.of("at_seq", "agents", "messages", "answer");
  private static final List<String> REPLAY_OPTIONS = List.of("agents", "unrecorded_calls");

  /** The README's deadline for every call, Wait included. */
  private static final java.time.Duration CALL_TIMEOUT = java.time.Duration.ofSeconds(60);

  /** An inspect step with "poll" re-reads every POLL_EVERY_MS, for at most POLL_FOR_MS. */
  private static final long POLL_EVERY_MS = 50;
  private static final long POLL_FOR_MS = 10_000;

  /** The README's worker handlers (section Workers), the same in every language. */
  private static final Map<String, ToolHandler> WORKER_HANDLERS = Map.of(
      "upper", (arguments, call) -> upperAscii(textArgument(arguments)),
      "reverse", (arguments, call) -> new StringBuilder(textArgument(arguments)).reverse().toString());

  /** A worker handler's {@code text} argument, which must be a string. */
  private static String textArgument(Map<String, Object> arguments) {
    Object text = arguments.get("text");
    if (!(text instanceof String)) {
      throw new IllegalArgumentException("the text argument must be a string, got " + text);
    }
    return (String) text;
  }

  /** Upper-cases the ASCII letters, whatever the default locale. */
  private static String upperAscii(String text) {
    StringBuilder upper = new StringBuilder(text.length());
    for (int i = 0; i < text.length(); i++) {
      char c = text.charAt(i);
      upper.append(c >= 'a' && c <= 'z' ? (char) (c - 'a' + 'A') : c);
    }
    return upper.toString();
  }

  /**
   * Runs a vector: its workers (README: Workers) are started and registered before its first step,
   * and stopped after its last one, whether it passed or not.
   */
  static void runVector(AgentRuntimeClient client, JsonObject vector)
      throws Mismatch, InvalidProtocolBufferException {
    List<ToolWorker> workers = new ArrayList<>();
    try {
      startWorkers(client, vector, workers);
      runSteps(client, vector);
    } finally {
      workers.forEach(ToolWorker::close);
    }
  }

  /** Starts the vector's workers with the client's serveTools, adding each to {@code started}. */
  private static void startWorkers(AgentRuntimeClient client, JsonObject vector, List<ToolWorker> started)
      throws Mismatch {
    JsonElement entries = vector.get("workers");
    if (entries == null) {
      return;
    }
    if (!entries.isJsonArray()) {
      throw new Mismatch("workers: must be a list, got " + pyRepr(entries));
    }
    for (JsonElement element : entries.getAsJsonArray()) {
      if (!element.isJsonObject()) {
        throw new Mismatch("workers: an entry must be an object, got " + pyRepr(element));
      }
      JsonObject entry = element.getAsJsonObject();
      String queue = stringArg("workers", entry, "queue", null);
      JsonElement tools = entry.get("tools");
      if (tools == null || !tools.isJsonArray()) {
        throw new Mismatch("workers: tools must be a list, got " + pyRepr(tools));
      }
      Map<String, ToolHandler> handlers = new LinkedHashMap<>();
      JsonArray unknown = new JsonArray();
      for (JsonElement tool : tools.getAsJsonArray()) {
        if (!tool.isJsonPrimitive() || !tool.getAsJsonPrimitive().isString()) {
          throw new Mismatch("workers: a tool name must be a str, got " + pyRepr(tool));
        }
        ToolHandler handler = WORKER_HANDLERS.get(tool.getAsString());
        if (handler == null) {
          unknown.add(tool);
        } else {
          handlers.put(tool.getAsString(), handler);
        }
      }
      if (unknown.size() > 0) {
        throw new Mismatch("workers: no handler for " + pyRepr(unknown) + " (a broken vector)");
      }
      int limit = 1;
      if (entry.has("max_concurrent_calls")) {
        JsonElement value = entry.get("max_concurrent_calls");
        try {
          limit = new BigDecimal(value.getAsJsonPrimitive().getAsString()).intValueExact();
        } catch (RuntimeException notAnInt) {
          throw new Mismatch("workers: max_concurrent_calls must be an integer, got " + pyRepr(value));
        }
      }
      ToolWorker worker;
      try {
        worker = client.serveTools(queue, handlers, limit);
      } catch (IllegalArgumentException refused) {
        throw new Mismatch("workers: " + refused.getMessage());
      }
      started.add(worker);
      try {
        worker.awaitRegistered(CALL_TIMEOUT);
      } catch (AgentRuntimeException refused) {
        throw new Mismatch("workers: the server refused the worker of " + pyRepr(new JsonPrimitive(queue)) + ": "
            + refused.getMessage());
      } catch (TimeoutException late) {
        throw new Mismatch("workers: the worker of " + pyRepr(new JsonPrimitive(queue)) + " was not registered within "
            + CALL_TIMEOUT.toSeconds() + " s");
      } catch (InterruptedException e) {
        Thread.currentThread().interrupt();
        throw new Mismatch("workers: interrupted while waiting for the registration");
      }
    }
  }

  /** The verbs whose step may carry a request_id and repeat (README: Request ids and repeats). */
  private static final List<String> MUTATING =
      List.of("spawn", "post", "wake", "resume", "interrupt", "close", "create_runtime", "delete_runtime");

  /** A step's request_id: at most 40 characters of [A-Za-z0-9_-]. */
  private static final java.util.regex.Pattern REQUEST_ID = java.util.regex.Pattern.compile("[A-Za-z0-9_-]{1,40}");

  private static final SecureRandom RANDOM = new SecureRandom();

  /**
   * What a vector's steps share: its runtime (after a fork step, the fork), the runtime its last
   * fork forked, the last PENDING Request, the "$next" tokens, its request id token.
   */
  private static final class VectorState {
    String runtimeId;
    /** The runtime the vector's last fork step forked (null: none yet): list_runtimes' forked_from_source. */
    String forkSource;
    /** 16 random hex digits, drawn once per vector run: the prefix of its steps' request ids. */
    final String token = String.format("%016x", RANDOM.nextLong());
    Request lastPending;
    // The next_page_token of the last list / transcript step that succeeded (null: none yet), for "$next".
    String nextList;
    String nextTranscript;

    VectorState(String runtimeId) {
      this.runtimeId = runtimeId;
    }
  }

  /**
   * A step's answer: {@code response}, what the call returned (compared by equality when the step
   * is repeated), and {@code outcome}, the fields its expect checks (null: nothing to expect).
   */
  private static final class Reply {
    final Object response;
    final JsonObject outcome;

    Reply(Object response, JsonObject outcome) {
      this.response = response;
      this.outcome = outcome;
    }
  }

  private static void runSteps(AgentRuntimeClient client, JsonObject vector)
      throws Mismatch, InvalidProtocolBufferException {
    List<AgentDef> agents = new ArrayList<>();
    for (JsonElement agent : vector.getAsJsonArray("agents")) {
      AgentDef.Builder builder = AgentDef.newBuilder();
      JsonFormat.parser().merge(agent.toString(), builder);
      agents.add(builder.build());
    }
    VectorState state = new VectorState(client.createRuntime(agents, ""));
    JsonArray steps = vector.getAsJsonArray("steps");
    for (int index = 0; index < steps.size(); index++) {
      JsonObject step = steps.get(index).getAsJsonObject();
      String where = "step " + (index + 1);
      JsonArray verbs = new JsonArray();
      VERBS.stream().filter(step::has).forEach(verbs::add);
      if (verbs.size() != 1) {
        throw new Mismatch(where + ": a step has exactly one verb, got " + pyRepr(verbs));
      }
      String verb = verbs.get(0).getAsString();
      String requestId = requestIdArg(where, step, verb);
      boolean repeat = repeatArg(where, step, requestId);
      String sentId = requestId == null ? null : state.token + "-" + requestId;
      // A create_runtime step deletes what it created at once, unless it is repeated: then once, after both.
      Object first = answer(() -> perform(client, state, where, step, verb, sentId, !repeat));
      checkAnswer(where, step, first);
      if (repeat) {
        Object second = answer(() -> perform(client, state, where, step, verb, sentId, false));
        if (verb.equals("create_runtime")) {
          deleteCreated(client, where, first, second);
        }
        alike(where, first, second);
        checkAnswer(where + " (repeated)", step, second);
      }
    }
  }

  /** Deletes the runtime a repeated create_runtime step made (once: both answers name the same one when alike). */
  private static void deleteCreated(AgentRuntimeClient client, String where, Object first, Object second) throws Mismatch {
    java.util.Set<String> created = new java.util.LinkedHashSet<>();
    for (Object answer : List.of(first, second)) {
      if (answer instanceof Reply) {
        created.add((String) ((Reply) answer).response);
      }
    }
    for (String runtimeId : created) {
      try {
        client.deleteRuntime(runtimeId, false);
      } catch (AgentRuntimeException error) {
        throw new Mismatch(where + ": deleting the created runtime " + runtimeId + ": " + error.getMessage());
      }
    }
  }

  /** A step's call that may be refused. */
  private interface StepCall {
    Reply call() throws Mismatch, InvalidProtocolBufferException;
  }

  /** The step's Reply, or the AgentRuntimeException that refused it. */
  private static Object answer(StepCall call) throws Mismatch, InvalidProtocolBufferException {
    try {
      return call.call();
    } catch (AgentRuntimeException error) {
      return error;
    }
  }

  /** A repeated step's two answers must be alike: equal responses, or the same code and message. */
  private static void alike(String where, Object first, Object second) throws Mismatch {
    if (first instanceof Reply && second instanceof Reply) {
      Object a = ((Reply) first).response;
      Object b = ((Reply) second).response;
      if (!java.util.Objects.equals(a, b)) {
        throw new Mismatch(where + ": the repeat was answered " + b + ", the first call " + a);
      }
      return;
    }
    if (first instanceof AgentRuntimeException && second instanceof AgentRuntimeException) {
      AgentRuntimeException a = (AgentRuntimeException) first;
      AgentRuntimeException b = (AgentRuntimeException) second;
      if (a.code() != b.code() || !a.description().equals(b.description())) {
        throw new Mismatch(where + ": the repeat failed with " + b.getMessage() + ", the first call with " + a.getMessage());
      }
      return;
    }
    throw new Mismatch(where + ": the first call " + describe(first) + ", the repeat " + describe(second));
  }

  private static String describe(Object answer) {
    return answer instanceof AgentRuntimeException ? "failed with " + ((AgentRuntimeException) answer).getMessage()
        : "succeeded";
  }

  /** A step's request_id: null when absent; a broken vector on a verb that takes none, or when it is not such a string. */
  private static String requestIdArg(String where, JsonObject step, String verb) throws Mismatch {
    JsonElement value = step.get("request_id");
    if (value == null) {
      return null;
    }
    if (!MUTATING.contains(verb)) {
      throw new Mismatch(where + ": request_id on a " + verb + " step (a broken vector)");
    }
    if (!isString(value) || !REQUEST_ID.matcher(value.getAsString()).matches()) {
      throw new Mismatch(where + ": request_id must be a str of at most 40 characters of [A-Za-z0-9_-], got "
          + pyRepr(value) + " (a broken vector)");
    }
    return value.getAsString();
  }

  /** A step's repeat: false when absent; a broken vector when it is not a boolean, or true without a request_id. */
  private static boolean repeatArg(String where, JsonObject step, String requestId) throws Mismatch {
    boolean repeat = boolArg(where, step, "repeat");
    if (repeat && requestId == null) {
      throw new Mismatch(where + ": repeat needs a request_id (a broken vector)");
    }
    return repeat;
  }

  /** Checks one answer against the step's expect or expect_error. */
  private static void checkAnswer(String where, JsonObject step, Object answer) throws Mismatch {
    if (answer instanceof AgentRuntimeException) {
      AgentRuntimeException error = (AgentRuntimeException) answer;
      if (!step.has("expect_error")) {
        throw new Mismatch(where + ": unexpected error " + error.getMessage());
      }
      JsonObject want = step.getAsJsonObject("expect_error");
      String wantCode = want.get("code").getAsString();
      if (!error.code().name().equals(wantCode)) {
        throw new Mismatch(where + ": expected " + wantCode + ", got " + error.getMessage());
      }
      if (want.has("limit")) {
        String limit = error.detail(ErrorInfo.class)
            .filter(info -> info.containsMetadata("limit"))
            .map(info -> info.getMetadataOrThrow("limit"))
            .orElse(null);
        String wantLimit = want.get("limit").getAsString();
        if (!wantLimit.equals(limit)) {
          throw new Mismatch(where + ": expected ErrorInfo limit " + wantLimit + ", got "
              + (limit == null ? "None" : limit));
        }
      }
      checkDetails(where, error, want);
      return;
    }
    if (step.has("expect_error")) {
      throw new Mismatch(where + ": expected " + step.getAsJsonObject("expect_error").get("code").getAsString()
          + ", but the call succeeded");
    }
    if (step.has("expect")) {
      JsonObject outcome = ((Reply) answer).outcome;
      if (outcome == null) {
        throw new Mismatch(where + ": this verb has nothing to expect");
      }
      JsonObject expect = step.getAsJsonObject("expect").deepCopy();
      // A wait's output and decoded value are compared whole (check compares an object's expected keys only).
      for (String key : WHOLE) {
        if (outcome.has(key) && expect.has(key)) {
          JsonElement want = expect.remove(key);
          JsonElement got = outcome.get(key);
          if (!jsonEquals(got, want)) {
            throw new Mismatch(where + "." + key + ": expected " + pyRepr(want) + ", got " + pyRepr(got));
          }
        }
      }
      check(where, outcome, expect);
    }
  }

  /** The expect keys of a wait compared whole, as JSON. */
  private static final List<String> WHOLE = List.of("output", "decoded");

  /** A wait's {@code decoded}: the three fields {@code v_typed_output} expects, in a type of the runner's own. */
  record Decoded(String label, double confidence, List<String> tags) {}

  /** The result's output decoded by the client's helper into {@link Decoded}, as JSON to compare. */
  private static JsonObject decoded(String where, TaskResult result) throws Mismatch {
    Decoded value;
    try {
      value = Outputs.outputAs(result, Decoded.class);
    } catch (OutputException error) {
      throw new Mismatch(where + ".decoded: " + error.getMessage());
    }
    JsonObject fields = new JsonObject();
    fields.addProperty("label", value.label());
    fields.addProperty("confidence", value.confidence());
    JsonArray tags = new JsonArray();
    if (value.tags() != null) {
      value.tags().forEach(tags::add);
    }
    fields.add("tags", value.tags() == null ? JsonNull.INSTANCE : tags);
    return fields;
  }

  /**
   * Makes the step's call: {@code requestId} (null: the client's own) on a mutating verb. A
   * create_runtime deletes the runtime it made when {@code deleteCreated}. The Reply's response is
   * the whole response message's content: each thin method returns its response's only field (a
   * Post and a Close return the whole message).
   */
  private static Reply perform(AgentRuntimeClient client, VectorState state, String where, JsonObject step, String verb,
      String requestId, boolean deleteCreated) throws Mismatch, InvalidProtocolBufferException {
    String runtimeId = state.runtimeId;
    JsonObject outcome = new JsonObject();
    switch (verb) {
      case "spawn": {
        JsonObject args = step.getAsJsonObject("spawn");
        Budget budget = null;
        if (args.has("budget")) {
          Budget.Builder builder = Budget.newBuilder();
          JsonFormat.parser().merge(args.get("budget").toString(), builder);
          budget = builder.build();
        }
        String handleId = client.spawn(
            runtimeId, args.get("agent").getAsString(), args.get("parent").getAsString(), budget, requestId);
        outcome.addProperty("handle_id", handleId);
        return new Reply(handleId, outcome);
      }
      case "wake": {
        JsonObject args = step.getAsJsonObject("wake");
        boolean queued = client.wake(runtimeId, args.get("handle").getAsString(), stringOr(args, "prompt", ""), requestId);
        return new Reply(queued, null);
      }
      case "wait": {
        TaskResult result = waitStep(client, runtimeId, where, step);
        if (result.getStatus() == Status.STATUS_PENDING) {
          state.lastPending = result.getPending();
        }
        JsonObject fields = resultFields(result);
        if (step.has("expect") && step.getAsJsonObject("expect").has("decoded")) {
          fields.add("decoded", decoded(where, result));
        }
        return new Reply(result, fields);
      }
      case "resume": {
        Answer answer = answerArg(where, step.getAsJsonObject("resume"), state.lastPending);
        TaskResult result = client.resume(runtimeId, answer, requestId);
        if (result.getStatus() == Status.STATUS_PENDING) {
          state.lastPending = result.getPending();
        }
        return new Reply(result, resultFields(result));
      }
      case "list": {
        JsonObject args = step.getAsJsonObject("list");
        ListResponse page = client.listPage(runtimeId, pageSize(where, args), pageToken(where, args, state.nextList));
        state.nextList = page.getNextPageToken();
        JsonObject handles = new JsonObject();
        for (HandleView view : page.getHandlesList()) {
          handles.add(view.getHandleId(), viewFields(view));
        }
        outcome.addProperty("count", page.getHandlesCount());
        outcome.add("handles", handles);
        outcome.addProperty("next_page_token_empty", page.getNextPageToken().isEmpty());
        return new Reply(page, outcome);
      }
      case "transcript": {
        JsonObject args = step.getAsJsonObject("transcript");
        GetTranscriptResponse page = client.transcriptPage(runtimeId, args.get("handle").getAsString(),
            pageSize(where, args), pageToken(where, args, state.nextTranscript));
        state.nextTranscript = page.getNextPageToken();
        JsonArray roles = new JsonArray();
        JsonArray messages = new JsonArray();
        for (Message message : page.getMessagesList()) {
          roles.add(message.getRole());
          messages.add(messageFields(message));
        }
        outcome.addProperty("count", page.getMessagesCount());
        outcome.add("roles", roles);
        outcome.add("messages", messages);
        outcome.addProperty("next_page_token_empty", page.getNextPageToken().isEmpty());
        return new Reply(page, outcome);
      }
      case "post": {
        JsonObject args = objectArgs(where, step, "post");
        String trustName = stringArg(where, args, "trust", "TRUST_UNSPECIFIED");
        EnumValueDescriptor trust = Trust.getDescriptor().findValueByName(trustName);
        if (trust == null) {
          throw new Mismatch(where + ": trust " + pyRepr(new JsonPrimitive(trustName)) + " is not a value of Trust");
        }
        PostRequest request = PostRequest.newBuilder()
            .setRuntimeId(runtimeId)
            .setHandleId(stringArg(where, args, "handle", null))
            .setText(stringArg(where, args, "text", null))
            .setSender(stringArg(where, args, "sender", ""))
            .setChannel(stringArg(where, args, "channel", ""))
            .setTrust(Trust.valueOf(trust))
            .setCoalesceKey(stringArg(where, args, "coalesce_key", ""))
            .setRequestId(requestId == null ? "" : requestId) // empty: the client generates one
            .build();
        PostResponse response = client.post(request);
        outcome.addProperty("inbox_size", response.getInboxSize());
        return new Reply(response, outcome);
      }
      case "close": {
        JsonObject args = objectArgs(where, step, "close");
        CloseRequest.Builder request = CloseRequest.newBuilder()
            .setRuntimeId(runtimeId)
            .setHandleId(stringArg(where, args, "handle", null))
            .setForce(boolArg(where, args, "force"))
            .setRequestId(requestId == null ? "" : requestId); // empty: the client generates one
        if (args.has("grace_ms")) {
          request.setGrace(Durations.fromMillis(graceMs(where, args.get("grace_ms"))));
        }
        CloseResponse response = client.close(request.build());
        JsonArray closed = new JsonArray();
        response.getClosedHandleIdsList().forEach(closed::add);
        outcome.add("closed", closed);
        outcome.addProperty("count", response.getClosedHandleIdsCount());
        return new Reply(response, outcome);
      }
      case "interrupt": {
        String handle = stringArg(where, objectArgs(where, step, "interrupt"), "handle", null);
        boolean interrupted = client.interrupt(runtimeId, handle, requestId);
        outcome.addProperty("interrupted", interrupted);
        return new Reply(interrupted, outcome);
      }
      case "inspect":
        return new Reply(null, inspect(client, runtimeId, where, step));
      case "list_runtimes":
        return new Reply(null, listRuntimes(client, state, where, step));
      case "delete_runtime": {
        JsonObject args = objectArgs(where, step, "delete_runtime");
        client.deleteRuntime(runtimeId, boolArg(where, args, "force"), requestId);
        return new Reply(null, null);
      }
      case "create_runtime": {
        JsonObject args = objectArgs(where, step, "create_runtime");
        JsonElement definitions = args.get("agents");
        if (definitions == null) {
          throw new Mismatch(where + ": missing argument " + pyRepr(new JsonPrimitive("agents")));
        }
        if (!definitions.isJsonArray()) {
          throw new Mismatch(where + ": agents must be a list, got " + pyRepr(definitions));
        }
        List<AgentDef> created = new ArrayList<>();
        for (JsonElement definition : definitions.getAsJsonArray()) {
          if (!definition.isJsonObject()) {
            throw new Mismatch(where + ": an agent must be an object, got " + pyRepr(definition));
          }
          AgentDef.Builder builder = AgentDef.newBuilder();
          JsonFormat.parser().merge(definition.toString(), builder);
          created.add(builder.build());
        }
        // Another runtime than the vector's (generated id): leave none behind.
        String createdId = client.createRuntime(created, "", requestId);
        if (deleteCreated) {
          client.deleteRuntime(createdId, false);
        }
        return new Reply(createdId, null);
      }
      case "watch":
        return new Reply(null, watchStep(client, runtimeId, where, step));
      case "stream_run":
        return streamRunStep(client, runtimeId, where, step);
      case "fork":
        return forkStep(client, state, where, step);
      case "replay":
        return replayStep(client, runtimeId, where, step);
      default:
        throw new Mismatch(where + ": unknown verb in " + pyRepr(sortedKeys(step)));
    }
  }

  /**
   * A resume step's Answer (also a fork step's {@code answer}): for the Request of the last
   * STATUS_PENDING result the vector saw ({@code lastPending}), its id unless {@code id} is given,
   * {@code ok}, {@code reason}, {@code data} and {@code outputs} (one per call of that Request).
   */
  private static Answer answerArg(String where, JsonObject args, Request lastPending)
      throws Mismatch, InvalidProtocolBufferException {
    List<ToolCall> calls = lastPending == null ? List.of() : lastPending.getCallsList();
    String id = stringOr(args, "id", "");
    if (id.isEmpty()) {
      id = lastPending == null ? "" : lastPending.getId();
    }
    Answer.Builder answer = Answer.newBuilder()
        .setId(id)
        .setOk(args.has("ok") && args.get("ok").getAsBoolean())
        .setReason(stringOr(args, "reason", ""));
    if (args.has("data")) {
      if (!args.get("data").isJsonObject()) {
        throw new Mismatch(where + ": data must be an object, got " + pyRepr(args.get("data")));
      }
      Struct.Builder data = Struct.newBuilder();
      JsonFormat.parser().merge(args.get("data").toString(), data);
      answer.setData(data);
    }
    if (args.has("outputs")) {
      JsonArray outputs = args.getAsJsonArray("outputs");
      if (outputs.size() > calls.size()) {
        throw new Mismatch(where + ": " + outputs.size() + " outputs for a Request with "
            + calls.size() + " calls");
      }
      for (int i = 0; i < outputs.size(); i++) {
        answer.addOutputs(ToolOutput.newBuilder()
            .setCallId(calls.get(i).getId())
            .setOutput(outputs.get(i).getAsString()));
      }
    }
    return answer.build();
  }

  /** A step's arguments that must all be among {@code known} (else a broken vector). */
  private static void knownArgs(String where, String verb, JsonObject args, List<String> known) throws Mismatch {
    JsonArray unknown = new JsonArray();
    new TreeSet<>(args.keySet()).stream().filter(key -> !known.contains(key)).forEach(unknown::add);
    if (unknown.size() > 0) {
      throw new Mismatch(where + ": unknown " + verb + " arguments " + pyRepr(unknown));
    }
  }

  /** A step's {@code agents} argument: absent, an empty list; else a list of AgentDef objects in proto3 JSON. */
  private static List<AgentDef> agentsArg(String where, JsonObject args) throws Mismatch, InvalidProtocolBufferException {
    JsonElement definitions = args.get("agents");
    List<AgentDef> agents = new ArrayList<>();
    if (definitions == null) {
      return agents;
    }
    if (!definitions.isJsonArray()) {
      throw new Mismatch(where + ": agents must be a list, got " + pyRepr(definitions));
    }
    for (JsonElement definition : definitions.getAsJsonArray()) {
      if (!definition.isJsonObject()) {
        throw new Mismatch(where + ": an agent must be an object, got " + pyRepr(definition));
      }
      AgentDef.Builder builder = AgentDef.newBuilder();
      JsonFormat.parser().merge(definition.toString(), builder);
      agents.add(builder.build());
    }
    return agents;
  }

  /**
   * The client's fork helper on this vector's runtime (README: Forks and replays): at {@code at_seq},
   * with the step's {@code agents}, {@code messages} and {@code answer} (built as a resume step's,
   * for the last PENDING Request), a generated fork id and the client's own request id. Once it is
   * created the fork is the vector's runtime, and the runtime it forked its source.
   */
  private static Reply forkStep(AgentRuntimeClient client, VectorState state, String where, JsonObject step)
      throws Mismatch, InvalidProtocolBufferException {
    JsonObject args = objectArgs(where, step, "fork");
    knownArgs(where, "fork", args, FORK_OPTIONS);
    JsonElement seq = args.get("at_seq");
    if (seq == null) {
      throw new Mismatch(where + ": missing argument " + pyRepr(new JsonPrimitive("at_seq")));
    }
    long atSeq;
    try {
      String text = seq.getAsJsonPrimitive().getAsString();
      if (!seq.getAsJsonPrimitive().isNumber() || text.contains(".") || text.contains("e") || text.contains("E")) {
        throw new NumberFormatException(text);
      }
      atSeq = new BigDecimal(text).longValueExact();
    } catch (RuntimeException notAnInteger) {
      throw new Mismatch(where + ": at_seq must be an integer, got " + pyRepr(seq));
    }
    List<AgentDef> agents = agentsArg(where, args);
    List<ForkMessage> messages = new ArrayList<>();
    JsonElement entries = args.get("messages");
    if (entries != null) {
      if (!entries.isJsonArray()) {
        throw new Mismatch(where + ": messages must be a list, got " + pyRepr(entries));
      }
      for (JsonElement entry : entries.getAsJsonArray()) {
        if (!entry.isJsonObject()) {
          throw new Mismatch(where + ": a message must be an object {\"handle_id\", \"text\"}, got " + pyRepr(entry));
        }
        JsonObject message = entry.getAsJsonObject();
        knownArgs(where, "fork message", message, List.of("handle_id", "text"));
        messages.add(ForkMessage.newBuilder()
            .setHandleId(stringArg(where, message, "handle_id", null))
            .setText(stringArg(where, message, "text", null))
            .build());
      }
    }
    List<Answer> answers = new ArrayList<>();
    if (args.has("answer")) {
      JsonElement answer = args.get("answer");
      if (!answer.isJsonObject()) {
        throw new Mismatch(where + ": answer must be an object of resume's arguments, got " + pyRepr(answer));
      }
      answers.add(answerArg(where, answer.getAsJsonObject(), state.lastPending));
    }
    ForkRuntimeResponse forked = client.forkRuntime(state.runtimeId, atSeq, agents, messages, answers, "", null);
    state.forkSource = state.runtimeId;
    state.runtimeId = forked.getRuntimeId();
    JsonObject outcome = new JsonObject();
    outcome.addProperty("fork_seq", forked.getForkSeq());
    JsonArray held = new JsonArray();
    forked.getHeldHandleIdsList().forEach(held::add);
    outcome.add("held", held);
    return new Reply(forked, outcome);
  }

  /**
   * The client's replay helper on this vector's runtime (README: Forks and replays), which repeats
   * ReplayRuntime with one request id until it is settled: {@code changed_count}, {@code count} (the
   * diffs) and {@code diffs}, by root handle id: {@code changed}, {@code recorded} and
   * {@code replayed} (as a wait's result), and the names of {@code recorded_calls} and
   * {@code replayed_calls}. The vector's runtime stays the same.
   */
  private static Reply replayStep(AgentRuntimeClient client, String runtimeId, String where, JsonObject step)
      throws Mismatch, InvalidProtocolBufferException {
    JsonObject args = objectArgs(where, step, "replay");
    knownArgs(where, "replay", args, REPLAY_OPTIONS);
    List<AgentDef> agents = agentsArg(where, args);
    String unrecordedName = stringArg(where, args, "unrecorded_calls", "UNRECORDED_CALLS_UNSPECIFIED");
    EnumValueDescriptor unrecorded = UnrecordedCalls.getDescriptor().findValueByName(unrecordedName);
    if (unrecorded == null) {
      throw new Mismatch(where + ": unrecorded_calls " + pyRepr(new JsonPrimitive(unrecordedName))
          + " is not a value of UnrecordedCalls");
    }
    ReplayRuntimeResponse replayed = client.replayRuntime(runtimeId, agents, UnrecordedCalls.valueOf(unrecorded));
    JsonObject diffs = new JsonObject();
    for (ReplayDiff diff : replayed.getDiffsList()) {
      JsonObject fields = new JsonObject();
      JsonArray changed = new JsonArray();
      diff.getChangedList().forEach(changed::add);
      fields.add("changed", changed);
      fields.add("recorded", resultFields(diff.getRecorded()));
      fields.add("replayed", resultFields(diff.getReplayed()));
      fields.add("recorded_calls", callNames(diff.getRecordedCallsList()));
      fields.add("replayed_calls", callNames(diff.getReplayedCallsList()));
      diffs.add(diff.getHandleId(), fields);
    }
    JsonObject outcome = new JsonObject();
    outcome.addProperty("changed_count", replayed.getChangedCount());
    outcome.addProperty("count", replayed.getDiffsCount());
    outcome.add("diffs", diffs);
    return new Reply(replayed, outcome);
  }

  private static JsonArray callNames(List<ReplayCall> calls) {
    JsonArray names = new JsonArray();
    calls.forEach(call -> names.add(call.getName()));
    return names;
  }

  /** A wait step's millisecond argument: a non-negative integer, or null when absent. */
  private static Long millis(String where, JsonObject args, String key) throws Mismatch {
    JsonElement value = args.get(key);
    if (value == null) {
      return null;
    }
    if (value.isJsonPrimitive() && value.getAsJsonPrimitive().isNumber()) {
      String text = value.getAsString();
      if (!text.contains(".") && !text.contains("e") && !text.contains("E")) {
        try {
          long millis = new BigDecimal(text).longValueExact();
          if (millis >= 0) {
            return millis;
          }
        } catch (ArithmeticException notALong) {
          // reported below
        }
      }
    }
    throw new Mismatch(where + ": " + key + " must be a non-negative integer, got " + pyRepr(value));
  }

  /**
   * The restart hook (README: Waiting, restarts and watching), run {@code afterMs} from its start on
   * a thread of its own.
   */
  private static final class RestartHook {
    private final Thread thread;
    private volatile String failure; // null: the hook exited 0 (once the thread has ended)

    RestartHook(String hook, long afterMs) {
      thread = new Thread(() -> {
        try {
          Thread.sleep(afterMs);
        } catch (InterruptedException e) {
          failure = "the restart hook was cancelled";
          return;
        }
        try {
          Process process = new ProcessBuilder("sh", "-c", hook).inheritIO().start();
          int status = waitUninterruptibly(process);
          failure = status == 0 ? null : "the restart hook exited with " + status;
        } catch (IOException e) {
          failure = "the restart hook could not be started: " + e.getMessage();
        }
      }, "restart-hook");
      thread.setDaemon(true);
      thread.start();
    }

    /** A hook that has not started yet is cancelled; one under way is let finish (never half a restart). */
    void cancel() {
      thread.interrupt();
    }

    /** Waits for the hook to end; null when it exited 0, else why it failed. */
    String await() {
      boolean interrupted = false;
      while (true) {
        try {
          thread.join();
          break;
        } catch (InterruptedException e) {
          interrupted = true;
        }
      }
      if (interrupted) {
        Thread.currentThread().interrupt();
      }
      return failure;
    }

    private static int waitUninterruptibly(Process process) {
      while (true) {
        try {
          return process.waitFor();
        } catch (InterruptedException e) {
          // finish the restart under way
        }
      }
    }
  }

  /**
   * The client's wait helper ({@code waitFor}, no timeout), through a second client on the same
   * connection settings whose default per-call deadline is {@code client_timeout_ms}, and across
   * a server restart {@code restart_server_after_ms} into the wait, when the step asks
   * (README: Waiting, restarts and watching).
   */
  private static TaskResult waitStep(AgentRuntimeClient client, String runtimeId, String where, JsonObject step)
      throws Mismatch {
    JsonObject args = objectArgs(where, step, "wait");
    JsonArray unknown = new JsonArray();
    new TreeSet<>(args.keySet()).stream().filter(key -> !WAIT_OPTIONS.contains(key)).forEach(unknown::add);
    if (unknown.size() > 0) {
      throw new Mismatch(where + ": unknown wait arguments " + pyRepr(unknown));
    }
    String handle = stringArg(where, args, "handle", null);
    Long clientTimeout = millis(where, args, "client_timeout_ms");
    Long restartAfter = millis(where, args, "restart_server_after_ms");
    RestartHook restart = null;
    if (restartAfter != null) {
      String hook = envOr("AGENTRUNTIME_RESTART_HOOK", "");
      if (hook.isEmpty()) {
        throw new Mismatch("restart_server_after_ms needs AGENTRUNTIME_RESTART_HOOK (scripts/with-server.sh sets it)");
      }
      restart = new RestartHook(hook, restartAfter);
    }
    boolean waited = false;
    try {
      TaskResult result;
      if (clientTimeout == null) {
        result = client.waitFor(runtimeId, handle);
      } else {
        try (AgentRuntimeClient shortDeadline = connect(envOr("AGENTRUNTIME_ADDR", "127.0.0.1:50051"),
            java.time.Duration.ofMillis(clientTimeout))) {
          result = shortDeadline.waitFor(runtimeId, handle);
        }
      }
      waited = true;
      if (restart != null) {
        // The hook's own failure fails the step, even when the wait got through.
        String failure = restart.await();
        if (failure != null) {
          throw new Mismatch(where + ": " + failure);
        }
      }
      return result;
    } finally {
      if (restart != null && !waited) {
        restart.cancel();
        restart.await();
      }
    }
  }

  /** An event as the README writes it: handle id, payload field name, and a state_changed's state. */
  static String eventString(Event event) {
    String kind = "";
    if (event.getPayloadCase() != Event.PayloadCase.PAYLOAD_NOT_SET) {
      kind = Event.getDescriptor().findFieldByNumber(event.getPayloadCase().getNumber()).getName();
    }
    String text = event.getHandleId() + " " + kind;
    if (event.getPayloadCase() == Event.PayloadCase.STATE_CHANGED) {
      text += " " + event.getStateChanged().getState().name();
    }
    return text;
  }

  /**
   * The client's watch helper on this vector's runtime from its first event to {@code handle}'s
   * first result, within {@link #CALL_TIMEOUT}; the seqs must be 1, 2, 3 ... without a gap or a repeat.
   */
  private static JsonObject watchStep(AgentRuntimeClient client, String runtimeId, String where, JsonObject step)
      throws Mismatch {
    String handle = stringArg(where, objectArgs(where, step, "watch"), "handle", null);
    JsonArray events = new JsonArray();
    try (WatchStream stream = client.watch(runtimeId, 0)) {
      // Closing the stream from the timer ends hasNext() with false: the step's deadline.
      ScheduledFuture<?> deadline = TIMER.schedule(stream::close, CALL_TIMEOUT.toMillis(), TimeUnit.MILLISECONDS);
      try {
        while (stream.hasNext()) {
          Event event = stream.next();
          if (event.getSeq() != events.size() + 1) {
            throw new Mismatch(where + ": event seq " + event.getSeq() + " after " + events.size()
                + " events (a gap or a repeat)");
          }
          events.add(eventString(event));
          if (event.getPayloadCase() == Event.PayloadCase.RESULT && event.getHandleId().equals(handle)) {
            JsonObject outcome = new JsonObject();
            outcome.addProperty("count", events.size());
            outcome.add("events", events);
            return outcome;
          }
        }
      } finally {
        deadline.cancel(false);
      }
    }
    throw new Mismatch(where + ": no result event of " + handle + " within " + CALL_TIMEOUT.toSeconds() + "s; events: "
        + pyRepr(events));
  }

  /**
   * The client's stream-run helper within {@link #CALL_TIMEOUT} (a Context deadline: the helper's
   * Spawn, Wake and Watch all end with it): the result's fields, and {@code joined} (the handle's
   * text pieces in order, a reset emptying what was joined of its turn) and {@code text_deltas}
   * (how many text pieces were handed over).
   */
  private static Reply streamRunStep(AgentRuntimeClient client, String runtimeId, String where, JsonObject step)
      throws Mismatch {
    JsonObject args = objectArgs(where, step, "stream_run");
    JsonArray unknown = new JsonArray();
    new TreeSet<>(args.keySet()).stream().filter(key -> !STREAM_RUN_OPTIONS.contains(key)).forEach(unknown::add);
    if (unknown.size() > 0) {
      throw new Mismatch(where + ": unknown stream_run arguments " + pyRepr(unknown));
    }
    String agent = stringArg(where, args, "agent", null);
    String prompt = stringArg(where, args, "prompt", null);
    String parent = stringArg(where, args, "parent", "root");
    List<Delta> deltas = new ArrayList<>();
    TaskResult result;
    try (Context.CancellableContext deadline =
        Context.current().withDeadlineAfter(CALL_TIMEOUT.toMillis(), TimeUnit.MILLISECONDS, TIMER)) {
      result = deadline.call(() -> client.streamRun(runtimeId, agent, prompt, parent, deltas::add));
    } catch (RuntimeException e) {
      throw e; // a refusal (AgentRuntimeException) is the step's answer
    } catch (Exception e) {
      throw new IllegalStateException(e); // streamRun throws nothing checked
    }
    for (Delta delta : deltas) {
      if (!delta.getHandleId().equals(result.getHandleId())) {
        throw new Mismatch(where + ": a delta of " + delta.getHandleId() + " in the stream of " + result.getHandleId());
      }
    }
    JsonObject outcome = resultFields(result);
    outcome.addProperty("joined", joinText(deltas));
    outcome.addProperty("text_deltas", deltas.stream().filter(d -> d.getPieceCase() == Delta.PieceCase.TEXT).count());
    return new Reply(result, outcome);
  }

  /** The text pieces joined in order, turn by turn; a reset empties what was joined of its turn. */
  static String joinText(List<Delta> deltas) {
    Map<Long, StringBuilder> turns = new LinkedHashMap<>();
    for (Delta delta : deltas) {
      StringBuilder turn = turns.computeIfAbsent(delta.getTurn(), t -> new StringBuilder());
      if (delta.getPieceCase() == Delta.PieceCase.RESET) {
        turn.setLength(0);
      } else if (delta.getPieceCase() == Delta.PieceCase.TEXT) {
        turn.append(delta.getText());
      }
    }
    return turns.values().stream().map(StringBuilder::toString).collect(Collectors.joining());
  }

  /** The watch steps' deadline timer (a daemon thread). */
  private static final ScheduledExecutorService TIMER = Executors.newSingleThreadScheduledExecutor(runnable -> {
    Thread thread = new Thread(runnable, "watch-deadline");
    thread.setDaemon(true);
    return thread;
  });

  /**
   * An expect_error's {@code reason} (the ErrorInfo's, "" when there is none), {@code resource}
   * (the ResourceInfo's type and name) and {@code violations} (the BadRequest's fields, in order):
   * tests/vectors/README.md, Expectations. A key of the wrong type is a broken vector (a Mismatch).
   */
  static void checkDetails(String where, AgentRuntimeException error, JsonObject want) throws Mismatch {
    if (want.has("reason")) {
      JsonElement wantReason = want.get("reason");
      if (!isString(wantReason)) {
        throw new Mismatch(where + ": expect_error reason must be a str, got " + pyRepr(wantReason) + " (a broken vector)");
      }
      String reason = error.errorInfo().map(ErrorInfo::getReason).orElse("");
      if (!reason.equals(wantReason.getAsString())) {
        throw new Mismatch(where + ": expected ErrorInfo reason " + pyRepr(wantReason) + ", got "
            + pyRepr(new JsonPrimitive(reason)));
      }
    }
    if (want.has("resource")) {
      JsonElement wantResource = want.get("resource");
      if (!wantResource.isJsonObject() || !wantResource.getAsJsonObject().keySet().equals(java.util.Set.of("type", "name"))
          || !isString(wantResource.getAsJsonObject().get("type"))
          || !isString(wantResource.getAsJsonObject().get("name"))) {
        throw new Mismatch(where + ": expect_error resource must be an object {\"type\": str, \"name\": str}, got "
            + pyRepr(wantResource) + " (a broken vector)");
      }
      JsonObject got = error.resourceInfo().map(info -> {
        JsonObject fields = new JsonObject();
        fields.addProperty("type", info.getResourceType());
        fields.addProperty("name", info.getResourceName());
        return fields;
      }).orElse(null);
      if (got == null || !got.equals(wantResource)) {
        throw new Mismatch(where + ": expected ResourceInfo " + pyRepr(wantResource) + ", got " + pyRepr(got));
      }
    }
    if (want.has("violations")) {
      JsonElement wantViolations = want.get("violations");
      boolean strings = wantViolations.isJsonArray();
      if (strings) {
        for (JsonElement item : wantViolations.getAsJsonArray()) {
          strings &= isString(item);
        }
      }
      if (!strings) {
        throw new Mismatch(where + ": expect_error violations must be a list of str, got " + pyRepr(wantViolations)
            + " (a broken vector)");
      }
      JsonArray got = error.badRequest().map(request -> {
        JsonArray fields = new JsonArray();
        request.getFieldViolationsList().forEach(violation -> fields.add(violation.getField()));
        return fields;
      }).orElse(null);
      if (got == null || !got.equals(wantViolations)) {
        throw new Mismatch(where + ": expected BadRequest fields " + pyRepr(wantViolations) + ", got " + pyRepr(got));
      }
    }
  }

  private static boolean isString(JsonElement value) {
    return value != null && value.isJsonPrimitive() && value.getAsJsonPrimitive().isString();
  }

  /**
   * One Inspect; with "poll", re-reads until the step's expect holds (a refused Inspect, such as
   * NOT_FOUND before the handle is spawned, does not hold yet), at most POLL_FOR_MS.
   */
  private static JsonObject inspect(AgentRuntimeClient client, String runtimeId, String where, JsonObject step)
      throws Mismatch {
    JsonObject args = objectArgs(where, step, "inspect");
    String handle = stringArg(where, args, "handle", null);
    if (!boolArg(where, args, "poll")) {
      return viewFields(client.inspect(runtimeId, handle));
    }
    JsonElement expected = step.get("expect");
    if (expected == null || !expected.isJsonObject() || step.has("expect_error")) {
      throw new Mismatch(where + ": a polling inspect needs an expect object and no expect_error");
    }
    long deadline = System.nanoTime() + TimeUnit.MILLISECONDS.toNanos(POLL_FOR_MS);
    while (true) {
      String problem;
      try {
        JsonObject outcome = viewFields(client.inspect(runtimeId, handle));
        check(where, outcome, expected.getAsJsonObject());
        return outcome;
      } catch (Mismatch mismatch) {
        problem = mismatch.getMessage();
      } catch (AgentRuntimeException refused) {
        problem = refused.getMessage();
      }
      if (System.nanoTime() >= deadline) {
        throw new Mismatch(where + ": still not as expected after polling for " + (POLL_FOR_MS / 1000) + " s: " + problem);
      }
      try {
        Thread.sleep(POLL_EVERY_MS);
      } catch (InterruptedException e) {
        Thread.currentThread().interrupt();
        throw new Mismatch(where + ": interrupted while polling");
      }
    }
  }

  /**
   * Every page of ListRuntimes (of {@code page_size} each): whether this vector's runtime is among
   * them and, when it is, its summary's counts.
   */
  private static JsonObject listRuntimes(AgentRuntimeClient client, VectorState state, String where, JsonObject step)
      throws Mismatch {
    String runtimeId = state.runtimeId;
    int size = pageSize(where, objectArgs(where, step, "list_runtimes"));
    JsonObject outcome = new JsonObject();
    outcome.addProperty("contains_this_runtime", false);
    String token = "";
    do {
      ListRuntimesResponse page = client.listRuntimesPage(size, token);
      for (RuntimeSummary summary : page.getRuntimesList()) {
        if (!summary.getRuntimeId().equals(runtimeId)) {
          continue;
        }
        JsonObject counts = new JsonObject();
        counts.addProperty("handle_count", summary.getHandleCount());
        counts.addProperty("running_count", summary.getRunningCount());
        counts.addProperty("suspended_count", summary.getSuspendedCount());
        counts.addProperty("total_tokens", summary.getTotalTokens());
        counts.add("total_cost", costFields(summary.getTotalCost()));
        counts.addProperty("fork_seq", summary.getForkSeq());
        counts.addProperty("forked_from_source",
            state.forkSource != null && summary.getForkedFrom().equals(state.forkSource));
        outcome.addProperty("contains_this_runtime", true);
        outcome.add("this_runtime", counts);
      }
      token = page.getNextPageToken();
    } while (!token.isEmpty());
    return outcome;
  }

  /** A step's arguments, which must be an object. */
  private static JsonObject objectArgs(String where, JsonObject step, String verb) throws Mismatch {
    JsonElement value = step.get(verb);
    if (!value.isJsonObject()) {
      throw new Mismatch(where + ": the step's arguments must be an object, got " + pyRepr(value));
    }
    return value.getAsJsonObject();
  }

  /** A string argument; {@code fallback} when absent, and required when there is none. */
  private static String stringArg(String where, JsonObject args, String key, String fallback) throws Mismatch {
    JsonElement value = args.get(key);
    if (value == null) {
      if (fallback == null) {
        throw new Mismatch(where + ": missing argument " + pyRepr(new JsonPrimitive(key)));
      }
      return fallback;
    }
    if (!value.isJsonPrimitive() || !value.getAsJsonPrimitive().isString()) {
      throw new Mismatch(where + ": " + key + " must be a str, got " + pyRepr(value));
    }
    return value.getAsString();
  }

  /** A boolean argument, false when absent. */
  private static boolean boolArg(String where, JsonObject args, String key) throws Mismatch {
    JsonElement value = args.get(key);
    if (value == null) {
      return false;
    }
    if (!value.isJsonPrimitive() || !value.getAsJsonPrimitive().isBoolean()) {
      throw new Mismatch(where + ": " + key + " must be a bool, got " + pyRepr(value));
    }
    return value.getAsBoolean();
  }

  /** A close step's grace_ms: a whole number of milliseconds. */
  private static long graceMs(String where, JsonElement value) throws Mismatch {
    if (value.isJsonPrimitive() && value.getAsJsonPrimitive().isNumber()) {
      String text = value.getAsString();
      if (!text.contains(".") && !text.contains("e") && !text.contains("E")) {
        try {
          return new BigDecimal(text).longValueExact();
        } catch (ArithmeticException notALong) {
          // reported below
        }
      }
    }
    throw new Mismatch(where + ": grace_ms must be an integer, got " + pyRepr(value));
  }

  /** A list or transcript step's page_size: an int32, 0 (the server's default) when absent. */
  private static int pageSize(String where, JsonObject args) throws Mismatch {
    JsonElement value = args.get("page_size");
    if (value == null) {
      return 0;
    }
    if (value.isJsonPrimitive() && value.getAsJsonPrimitive().isNumber()) {
      try {
        return new BigDecimal(value.getAsString()).intValueExact();
      } catch (ArithmeticException notAnInt32) {
        // reported below
      }
    }
    throw new Mismatch(where + ": page_size must be an int32, got " + pyRepr(value));
  }

  /**
   * A list or transcript step's page_token, empty when absent; {@code "$next"} is {@code next}, the
   * next_page_token of the last step of the same verb that succeeded ({@code null}: none yet).
   */
  private static String pageToken(String where, JsonObject args, String next) throws Mismatch {
    JsonElement value = args.get("page_token");
    if (value == null) {
      return "";
    }
    if (!value.isJsonPrimitive() || !value.getAsJsonPrimitive().isString()) {
      throw new Mismatch(where + ": page_token must be a string, got " + pyRepr(value));
    }
    String token = value.getAsString();
    if (!token.equals(NEXT)) {
      return token;
    }
    if (next == null) {
      throw new Mismatch(where + ": page_token $next, but no earlier step of this verb returned a next_page_token");
    }
    return next;
  }

  private static String stringOr(JsonObject args, String key, String fallback) {
    JsonElement value = args.get(key);
    return value == null || value.isJsonNull() ? fallback : value.getAsString();
  }

  private static JsonObject resultFields(TaskResult result) {
    JsonObject fields = new JsonObject();
    fields.addProperty("handle_id", result.getHandleId());
    fields.addProperty("text", result.getText());
    fields.addProperty("is_error", result.getIsError());
    fields.addProperty("status", result.getStatus().name());
    fields.addProperty("limit", result.getLimit().name());
    fields.addProperty("turns", result.getTurns());
    fields.addProperty("total_tokens", result.getTotalTokens());
    fields.addProperty("own_tokens", result.getOwnTokens());
    fields.add("own_usage", usageFields(result.getOwnUsage()));
    fields.add("total_usage", usageFields(result.getTotalUsage()));
    fields.add("own_cost", costFields(result.getOwnCost()));
    fields.add("total_cost", costFields(result.getTotalCost()));
    fields.add("inherited_usage", usageFields(result.getInheritedUsage()));
    fields.add("inherited_cost", costFields(result.getInheritedCost()));
    fields.addProperty("tool_calls", result.getToolCalls());
    JsonObject pending = new JsonObject();
    pending.addProperty("kind", result.getPending().getKind());
    JsonArray path = new JsonArray();
    result.getPending().getPathList().forEach(path::add);
    pending.add("path", path);
    JsonArray callNames = new JsonArray();
    result.getPending().getCallsList().forEach(call -> callNames.add(call.getName()));
    pending.add("call_names", callNames);
    fields.add("pending", pending);
    fields.add("failure", result.hasFailure() ? failureFields(result.getFailure()) : JsonNull.INSTANCE);
    // The structured output as JSON (JsonFormat, not the client's helper); unset is null.
    fields.add("output", result.hasOutput() ? outputJson(result.getOutput()) : JsonNull.INSTANCE);
    return fields;
  }

  private static JsonElement outputJson(Value output) {
    try {
      return JsonParser.parseString(JsonFormat.printer().print(output));
    } catch (InvalidProtocolBufferException error) {
      throw new IllegalStateException("the output does not print as JSON: " + error.getMessage(), error);
    }
  }

  private static JsonObject failureFields(Failure failure) {
    JsonObject fields = new JsonObject();
    fields.addProperty("reason", failure.getReason().name());
    fields.addProperty("provider", failure.getProvider());
    fields.addProperty("http_status", failure.getHttpStatus());
    fields.addProperty("retryable", failure.getRetryable());
    fields.addProperty("detail", failure.getDetail());
    return fields;
  }

  // An unset Usage or Cost reads as its zeros (the generated getter's default instance).
  private static JsonObject usageFields(Usage usage) {
    JsonObject fields = new JsonObject();
    fields.addProperty("input_tokens", usage.getInputTokens());
    fields.addProperty("cache_read_tokens", usage.getCacheReadTokens());
    fields.addProperty("cache_write_tokens", usage.getCacheWriteTokens());
    fields.addProperty("output_tokens", usage.getOutputTokens());
    fields.addProperty("reasoning_tokens", usage.getReasoningTokens());
    fields.addProperty("total_tokens", usage.getTotalTokens());
    fields.addProperty("estimated", usage.getEstimated());
    return fields;
  }

  private static JsonObject costFields(Cost cost) {
    JsonObject fields = new JsonObject();
    fields.addProperty("micros", cost.getMicros());
    fields.addProperty("currency", cost.getCurrency());
    fields.addProperty("priced", cost.getPriced());
    return fields;
  }

  private static JsonObject viewFields(HandleView view) {
    JsonObject fields = new JsonObject();
    fields.addProperty("state", view.getState().name());
    fields.addProperty("turns", view.getTurns());
    fields.addProperty("own_tokens", view.getOwnTokens());
    fields.addProperty("total_tokens", view.getTotalTokens());
    fields.add("own_usage", usageFields(view.getOwnUsage()));
    fields.add("total_usage", usageFields(view.getTotalUsage()));
    fields.add("own_cost", costFields(view.getOwnCost()));
    fields.add("total_cost", costFields(view.getTotalCost()));
    fields.add("inherited_usage", usageFields(view.getInheritedUsage()));
    fields.add("inherited_cost", costFields(view.getInheritedCost()));
    fields.addProperty("tool_calls", view.getToolCalls());
    fields.addProperty("pending_kind", view.getPendingKind());
    fields.addProperty("inbox_size", view.getInboxSize());
    return fields;
  }

  private static JsonObject messageFields(Message message) {
    JsonObject fields = new JsonObject();
    fields.addProperty("role", message.getRole());
    fields.addProperty("trust", message.getTrust().name());
    fields.addProperty("content", message.getContent());
    return fields;
  }

  /** Both are lists and either holds an object (a transcript's {@code messages}). */
  private static boolean listOfObjects(JsonElement got, JsonElement want) {
    if (!got.isJsonArray() || !want.isJsonArray()) {
      return false;
    }
    for (JsonElement item : got.getAsJsonArray()) {
      if (item.isJsonObject()) {
        return true;
      }
    }
    for (JsonElement item : want.getAsJsonArray()) {
      if (item.isJsonObject()) {
        return true;
      }
    }
    return false;
  }

  /** Checks only the expected keys, each for equality; nested objects recursively. */
  static void check(String where, JsonObject actual, JsonObject expected) throws Mismatch {
    for (Map.Entry<String, JsonElement> entry : expected.entrySet()) {
      String key = entry.getKey();
      JsonElement want = entry.getValue();
      JsonElement got = actual.get(key);
      if (got == null && key.endsWith("_contains")) {
        // `<field>_contains`: the actual <field> is a string holding this substring.
        String field = key.substring(0, key.length() - "_contains".length());
        JsonElement value = actual.get(field);
        if (!want.isJsonPrimitive() || !want.getAsJsonPrimitive().isString()) {
          throw new Mismatch(where + "." + key + ": expected a string to look for, got " + pyRepr(want));
        }
        if (value == null || !value.isJsonPrimitive() || !value.getAsJsonPrimitive().isString()
            || !value.getAsString().contains(want.getAsString())) {
          throw new Mismatch(where + "." + key + ": expected a " + field + " containing " + pyRepr(want)
              + ", got " + pyRepr(value));
        }
        continue;
      }
      if (got == null) {
        throw new Mismatch(where + "." + key + ": expected " + pyRepr(want) + ", got nothing (no such "
            + (want.isJsonObject() ? "entry" : "field") + ")");
      }
      if (want.isJsonObject()) {
        if (!got.isJsonObject()) {
          throw new Mismatch(where + "." + key + ": expected " + pyRepr(want) + ", got " + pyRepr(got));
        }
        check(where + "." + key, got.getAsJsonObject(), want.getAsJsonObject());
      } else if (listOfObjects(got, want)) {
        // A list of objects: entry i checks object i, only its keys.
        JsonArray gotList = got.getAsJsonArray();
        JsonArray wantList = want.getAsJsonArray();
        if (wantList.size() > gotList.size()) {
          throw new Mismatch(where + "." + key + ": expected at least " + wantList.size() + " entries, got "
              + gotList.size());
        }
        for (int i = 0; i < wantList.size(); i++) {
          String at = where + "." + key + "[" + i + "]";
          if (!wantList.get(i).isJsonObject() || !gotList.get(i).isJsonObject()) {
            throw new Mismatch(at + ": expected " + pyRepr(wantList.get(i)) + ", got " + pyRepr(gotList.get(i)));
          }
          check(at, gotList.get(i).getAsJsonObject(), wantList.get(i).getAsJsonObject());
        }
      } else if (!jsonEquals(got, want)) {
        throw new Mismatch(where + "." + key + ": expected " + pyRepr(want) + ", got " + pyRepr(got));
      }
    }
  }

  /** JSON equality with numbers compared by value (600 equals 600.0), strings, booleans, lists and objects strictly. */
  static boolean jsonEquals(JsonElement a, JsonElement b) {
    if (a.isJsonPrimitive() && b.isJsonPrimitive()) {
      JsonPrimitive x = a.getAsJsonPrimitive();
      JsonPrimitive y = b.getAsJsonPrimitive();
      if (x.isNumber() && y.isNumber()) {
        return new BigDecimal(x.getAsString()).compareTo(new BigDecimal(y.getAsString())) == 0;
      }
      if (x.isNumber() || y.isNumber()) {
        return false;
      }
      return x.equals(y);
    }
    if (a.isJsonObject() && b.isJsonObject()) {
      JsonObject x = a.getAsJsonObject();
      JsonObject y = b.getAsJsonObject();
      if (!x.keySet().equals(y.keySet())) {
        return false;
      }
      for (String key : x.keySet()) {
        if (!jsonEquals(x.get(key), y.get(key))) {
          return false;
        }
      }
      return true;
    }
    if (a.isJsonArray() && b.isJsonArray()) {
      JsonArray x = a.getAsJsonArray();
      JsonArray y = b.getAsJsonArray();
      if (x.size() != y.size()) {
        return false;
      }
      for (int i = 0; i < x.size(); i++) {
        if (!jsonEquals(x.get(i), y.get(i))) {
          return false;
        }
      }
      return true;
    }
    return a.equals(b);
  }

  private static JsonArray sortedKeys(JsonObject object) {
    JsonArray keys = new JsonArray();
    new TreeSet<>(object.keySet()).forEach(keys::add);
    return keys;
  }

  /** Renders a value as the Python runner's repr does, so FAIL lines read the same in every runner. */
  static String pyRepr(JsonElement value) {
    if (value == null || value.isJsonNull()) {
      return "None";
    }
    if (value.isJsonArray()) {
      List<String> items = new ArrayList<>();
      value.getAsJsonArray().forEach(item -> items.add(pyRepr(item)));
      return "[" + String.join(", ", items) + "]";
    }
    if (value.isJsonObject()) {
      List<String> items = new ArrayList<>();
      for (Map.Entry<String, JsonElement> entry : value.getAsJsonObject().entrySet()) {
        items.add(pyRepr(new JsonPrimitive(entry.getKey())) + ": " + pyRepr(entry.getValue()));
      }
      return "{" + String.join(", ", items) + "}";
    }
    JsonPrimitive primitive = value.getAsJsonPrimitive();
    if (primitive.isBoolean()) {
      return primitive.getAsBoolean() ? "True" : "False";
    }
    if (primitive.isNumber()) {
      return primitive.getAsString();
    }
    String text = primitive.getAsString();
    if (text.contains("'") && !text.contains("\"")) {
      return "\"" + text.replace("\\", "\\\\") + "\"";
    }
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'").replace("\n", "\\n") + "'";
  }
}
