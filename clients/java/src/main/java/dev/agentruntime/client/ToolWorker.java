package dev.agentruntime.client;

import com.google.gson.Gson;
import com.google.gson.GsonBuilder;
import com.google.gson.JsonElement;
import com.google.gson.JsonParseException;
import com.google.gson.Strictness;
import com.google.gson.ToNumberPolicy;
import com.google.gson.reflect.TypeToken;
import com.google.gson.stream.JsonReader;
import com.google.gson.stream.JsonToken;
import dev.agentruntime.v1.AgentRuntimeGrpc;
import dev.agentruntime.v1.ServeToolsRequest;
import dev.agentruntime.v1.ServeToolsResponse;
import dev.agentruntime.v1.ToolOutput;
import dev.agentruntime.v1.WorkerCall;
import dev.agentruntime.v1.WorkerRegistration;
import io.grpc.Status;
import io.grpc.stub.ClientCallStreamObserver;
import io.grpc.stub.ClientResponseObserver;
import java.io.IOException;
import java.io.StringReader;
import java.lang.reflect.Type;
import java.time.Duration;
import java.util.Map;
import java.util.Set;
import java.util.TreeSet;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.LinkedBlockingQueue;
import java.util.concurrent.RejectedExecutionException;
import java.util.concurrent.ThreadFactory;
import java.util.concurrent.ThreadLocalRandom;
import java.util.concurrent.ThreadPoolExecutor;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.TimeoutException;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.function.Consumer;
import java.util.regex.Matcher;
import java.util.regex.Pattern;

/**
 * A host serving worker tools ({@code ToolDef.worker}) over the ServeTools stream, started by
 * {@link AgentRuntimeClient#serveTools}: it registers the queue, the handlers' tool names (sorted)
 * and the concurrency limit, runs each call the server sends on its own threads (at most
 * {@code maxConcurrentCalls} at once) and answers it with the handler's output.
 *
 * <ul>
 *   <li>A handler that throws, a tool name with no handler and arguments that are not a JSON object
 *       are answered as error results ({@code is_error}), never as a broken stream.
 *   <li>A dropped stream (UNAVAILABLE, CANCELLED or UNKNOWN from the server), or one the server ended
 *       (a restart), is reopened and the worker registers again, after a backoff of 250 ms doubling
 *       up to 10 s, with jitter; a successful registration resets it. Calls held when the stream
 *       dropped are in doubt on the server (the tool's {@code on_interrupted} decides); their outputs
 *       are not sent on the new stream.
 *   <li>Any other status (INVALID_ARGUMENT for a bad registration, UNAUTHENTICATED,
 *       PERMISSION_DENIED, ...) stops the worker at once: {@link #awaitRegistered} and {@link #await}
 *       throw it as an {@link AgentRuntimeException}.
 * </ul>
 *
 * <p>The stream has no deadline. {@link #close()} stops serving: it cancels the stream and
 * interrupts running handlers; closing the client closes its workers too. The worker is safe for
 * concurrent use.
 */
public final class ToolWorker implements AutoCloseable {
  /** The first reconnect waits about this long; each failure in a row doubles it. */
  static final Duration BACKOFF = Duration.ofMillis(250);
  /** The longest wait between reconnects. */
  static final Duration MAX_BACKOFF = Duration.ofSeconds(10);
  /** The server takes at most this many calls at once per worker. */
  static final int MAX_CONCURRENT_CALLS = 1000;

  private static final System.Logger LOG = System.getLogger(ToolWorker.class.getName());
  private static final Set<Status.Code> RECONNECT =
      Set.of(Status.Code.UNAVAILABLE, Status.Code.CANCELLED, Status.Code.UNKNOWN);
  private static final Gson GSON = new GsonBuilder()
      .setObjectToNumberStrategy(ToNumberPolicy.LONG_OR_DOUBLE)
      .serializeNulls()
      .create();
  private static final Type ARGUMENTS = new TypeToken<Map<String, Object>>() {}.getType();
  private static final Pattern WHERE = Pattern.compile("line \\d+ column \\d+");
  private static final AtomicInteger WORKERS = new AtomicInteger();

  private final AgentRuntimeGrpc.AgentRuntimeStub stub;
  private final String queue;
  private final Map<String, ToolHandler> handlers;
  private final ServeToolsRequest registration;
  private final ThreadPoolExecutor executor;
  private final Consumer<ToolWorker> onStop; // tells the client the worker stopped
  /** Completed by the first registration, or failed by a refusal or close() before it. */
  private final CompletableFuture<String> registered = new CompletableFuture<>();
  /** Completed by close(), or failed by a refusal. */
  private final CompletableFuture<Void> done = new CompletableFuture<>();

  private final Object lock = new Object();
  private Stream current; // guarded by lock; null while backing off and once stopped
  private boolean stopped; // guarded by lock
  private int failures; // guarded by lock: stream ends since the last registration
  private volatile String workerId;

  ToolWorker(AgentRuntimeGrpc.AgentRuntimeStub stub, String queue, Map<String, ToolHandler> handlers,
      int maxConcurrentCalls, Consumer<ToolWorker> onStop) {
    this.stub = stub;
    this.onStop = onStop;
    this.queue = queue;
    this.handlers = Map.copyOf(handlers);
    this.registration = ServeToolsRequest.newBuilder()
        .setRegistration(WorkerRegistration.newBuilder()
            .setQueue(queue)
            .addAllTools(new TreeSet<>(handlers.keySet()))
            .setMaxConcurrentCalls(maxConcurrentCalls))
        .build();
    int number = WORKERS.incrementAndGet();
    AtomicInteger threads = new AtomicInteger();
    ThreadFactory factory = runnable -> {
      Thread thread = new Thread(runnable, "agentruntime-worker-" + number + "-" + queue + "-" + threads.incrementAndGet());
      thread.setDaemon(true);
      return thread;
    };
    // maxConcurrentCalls threads at most; idle ones go away after a minute.
    this.executor = new ThreadPoolExecutor(
        maxConcurrentCalls, maxConcurrentCalls, 60, TimeUnit.SECONDS, new LinkedBlockingQueue<>(), factory);
    this.executor.allowCoreThreadTimeOut(true);
  }

  /** Opens the first stream. */
  void start() {
    connect();
  }

  /** The queue this worker serves. */
  public String queue() {
    return queue;
  }

  /** The worker id of the current connection ({@code WorkerRegistered.worker_id}); null while not registered. */
  public String workerId() {
    return workerId;
  }

  /**
   * Waits until the server has accepted the first registration and returns its worker id.
   *
   * @throws AgentRuntimeException the server refused the stream (INVALID_ARGUMENT, UNAUTHENTICATED,
   *     PERMISSION_DENIED, ...): the worker has stopped
   * @throws TimeoutException not registered within {@code timeout} (the worker keeps trying)
   * @throws IllegalStateException the worker was closed before it registered
   */
  public String awaitRegistered(Duration timeout) throws InterruptedException, TimeoutException {
    try {
      return registered.get(timeout.toNanos(), TimeUnit.NANOSECONDS);
    } catch (ExecutionException e) {
      throw rethrow(e.getCause());
    }
  }

  /**
   * Blocks until the worker stops: returns once {@link #close()} was called, throws the
   * {@link AgentRuntimeException} that stopped it otherwise.
   */
  public void await() throws InterruptedException {
    try {
      done.get();
    } catch (ExecutionException e) {
      throw rethrow(e.getCause());
    }
  }

  /** Whether the worker still serves (or reconnects): false after close() or a refusal. */
  public boolean isRunning() {
    synchronized (lock) {
      return !stopped;
    }
  }

  /**
   * Stops serving: cancels the stream (the calls it holds are in doubt on the server) and
   * interrupts running handlers, whose outputs are not sent. Idempotent; does not block.
   */
  @Override
  public void close() {
    Stream stream;
    synchronized (lock) {
      if (stopped) {
        return;
      }
      stopped = true;
      stream = current;
      current = null;
    }
    workerId = null;
    if (stream != null) {
      stream.cancel("the worker closed");
    }
    executor.shutdownNow();
    registered.completeExceptionally(new IllegalStateException("the worker was closed before it registered"));
    done.complete(null);
    onStop.accept(this);
  }

  private static RuntimeException rethrow(Throwable cause) {
    if (cause instanceof RuntimeException) {
      return (RuntimeException) cause;
    }
    return new IllegalStateException(cause);
  }

  /** Opens a stream and sends the registration, unless the worker stopped meanwhile. */
  private void connect() {
    Stream stream = new Stream();
    synchronized (lock) {
      if (stopped) {
        return;
      }
      current = stream;
    }
    try {
      stub.serveTools(stream);
      stream.send(registration);
    } catch (RuntimeException e) {
      ended(stream, e);
    }
  }

  /** The stream ended (error null: the server completed it): reconnect, or stop on a refusal. */
  private void ended(Stream stream, Throwable error) {
    Status status = error == null ? Status.OK : Status.fromThrowable(error);
    long delayMillis;
    synchronized (lock) {
      if (current != stream || stopped) {
        return; // an old stream, or close() cancelled it
      }
      current = null;
      workerId = null;
      if (error != null && !RECONNECT.contains(status.getCode())) {
        stopped = true;
        AgentRuntimeException refused = AgentRuntimeException.fromThrowable(error);
        executor.shutdownNow();
        registered.completeExceptionally(refused);
        done.completeExceptionally(refused);
        onStop.accept(this);
        return;
      }
      long ceiling = Math.min(MAX_BACKOFF.toMillis(), BACKOFF.toMillis() << Math.min(failures, 20));
      delayMillis = ceiling / 2 + ThreadLocalRandom.current().nextLong(ceiling / 2 + 1);
      failures++;
    }
    LOG.log(System.Logger.Level.WARNING, "ServeTools for queue {0} {1}; reconnecting in {2} ms",
        queue, error == null ? "ended by the server" : "dropped (" + status.getCode() + ")", String.valueOf(delayMillis));
    CompletableFuture.delayedExecutor(delayMillis, TimeUnit.MILLISECONDS).execute(this::connect);
  }

  private void registered(Stream stream, String id) {
    synchronized (lock) {
      if (current != stream) {
        return;
      }
      failures = 0;
      workerId = id;
    }
    registered.complete(id);
  }

  /** Runs one call's handler and sends its output on the stream the call came from. */
  private void answer(Stream stream, WorkerCall call) {
    ToolOutput.Builder output = ToolOutput.newBuilder().setCallId(call.getId());
    try {
      String result = run(call);
      output.setOutput(result == null ? "" : result);
    } catch (InterruptedException e) {
      if (executor.isShutdown()) {
        return; // close() interrupted it: the call stays in doubt
      }
      output.setOutput("interrupted").setIsError(true);
    } catch (VirtualMachineError fatal) {
      throw fatal; // out of memory and the like: the call stays in doubt
    } catch (Throwable e) {
      // The tool's failure (an exception, or an error such as a missing class) is its result,
      // for the model to see.
      output.setOutput(e.getMessage() == null ? e.getClass().getSimpleName() : e.getMessage()).setIsError(true);
    }
    stream.send(ServeToolsRequest.newBuilder().setOutput(output).build());
  }

  private String run(WorkerCall call) throws Exception {
    String name = call.getCall().getName();
    ToolHandler handler = handlers.get(name);
    if (handler == null) {
      throw new IllegalArgumentException("this worker has no handler for the tool '" + name + "'");
    }
    return handler.handle(arguments(call.getCall().getArgumentsJson()), call);
  }

  /** The arguments JSON as a map; empty is {@code {}}, anything but one JSON object is refused. */
  static Map<String, Object> arguments(String json) {
    if (json.isBlank()) {
      return Map.of();
    }
    JsonElement parsed;
    try {
      JsonReader reader = new JsonReader(new StringReader(json));
      reader.setStrictness(Strictness.STRICT);
      parsed = GSON.getAdapter(JsonElement.class).read(reader);
      if (reader.peek() != JsonToken.END_DOCUMENT) {
        throw new JsonParseException("trailing data after the JSON value");
      }
    } catch (IOException | JsonParseException | IllegalStateException e) {
      // Gson's message advises about its own API; the model gets where the JSON broke off.
      Matcher at = WHERE.matcher(String.valueOf(e.getMessage()));
      throw new IllegalArgumentException("the arguments are not valid JSON" + (at.find() ? " (" + at.group() + ")" : ""), e);
    }
    if (!parsed.isJsonObject()) {
      throw new IllegalArgumentException("the arguments are not a JSON object");
    }
    return GSON.fromJson(parsed, ARGUMENTS);
  }

  /** One ServeTools stream: its request side (not thread safe) is written under a lock. */
  private final class Stream implements ClientResponseObserver<ServeToolsRequest, ServeToolsResponse> {
    private ClientCallStreamObserver<ServeToolsRequest> requests; // guarded by this
    private boolean finished; // guarded by this: ended, or cancelled by us
    private String cancelled; // guarded by this: why cancel() came before beforeStart

    @Override
    public synchronized void beforeStart(ClientCallStreamObserver<ServeToolsRequest> requestStream) {
      requests = requestStream;
      if (cancelled != null) {
        requestStream.cancel(cancelled, null);
      }
    }

    /** Sends one request, unless the stream is over (an output for a dropped stream is dropped). */
    synchronized void send(ServeToolsRequest request) {
      if (!finished && requests != null) {
        requests.onNext(request);
      }
    }

    synchronized void cancel(String why) {
      if (finished) {
        return;
      }
      finished = true;
      if (requests != null) {
        requests.cancel(why, null);
      } else {
        cancelled = why;
      }
    }

    private synchronized void finish() {
      finished = true;
    }

    @Override
    public void onNext(ServeToolsResponse response) {
      switch (response.getMessageCase()) {
        case REGISTERED:
          registered(this, response.getRegistered().getWorkerId());
          break;
        case CALL:
          WorkerCall call = response.getCall();
          try {
            executor.execute(() -> answer(this, call)); // the server keeps to the limit
          } catch (RejectedExecutionException closing) {
            // close() shut the executor down: the call stays in doubt.
          }
          break;
        default:
          break; // a message of a newer server: ignored
      }
    }

    @Override
    public void onError(Throwable error) {
      finish();
      ended(this, error);
    }

    @Override
    public void onCompleted() {
      finish();
      ended(this, null);
    }
  }
}
