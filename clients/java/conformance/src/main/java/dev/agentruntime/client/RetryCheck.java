package dev.agentruntime.client;

import com.google.protobuf.Any;
import com.google.rpc.ErrorInfo;
import com.google.rpc.RetryInfo;
import dev.agentruntime.v1.AgentDef;
import dev.agentruntime.v1.AgentRuntimeGrpc;
import dev.agentruntime.v1.Answer;
import dev.agentruntime.v1.CloseRequest;
import dev.agentruntime.v1.CloseResponse;
import dev.agentruntime.v1.CreateRuntimeRequest;
import dev.agentruntime.v1.CreateRuntimeResponse;
import dev.agentruntime.v1.DeleteRuntimeRequest;
import dev.agentruntime.v1.DeleteRuntimeResponse;
import dev.agentruntime.v1.Event;
import dev.agentruntime.v1.ForkMessage;
import dev.agentruntime.v1.ForkRuntimeRequest;
import dev.agentruntime.v1.ForkRuntimeResponse;
import dev.agentruntime.v1.GetTranscriptRequest;
import dev.agentruntime.v1.GetTranscriptResponse;
import dev.agentruntime.v1.HandleView;
import dev.agentruntime.v1.InspectRequest;
import dev.agentruntime.v1.InspectResponse;
import dev.agentruntime.v1.InterruptRequest;
import dev.agentruntime.v1.InterruptResponse;
import dev.agentruntime.v1.ListRequest;
import dev.agentruntime.v1.ListResponse;
import dev.agentruntime.v1.ListRuntimesRequest;
import dev.agentruntime.v1.ListRuntimesResponse;
import dev.agentruntime.v1.PostRequest;
import dev.agentruntime.v1.PostResponse;
import dev.agentruntime.v1.ReplayDiff;
import dev.agentruntime.v1.ReplayRuntimeRequest;
import dev.agentruntime.v1.ReplayRuntimeResponse;
import dev.agentruntime.v1.ResumeRequest;
import dev.agentruntime.v1.ResumeResponse;
import dev.agentruntime.v1.SpawnRequest;
import dev.agentruntime.v1.SpawnResponse;
import dev.agentruntime.v1.TaskResult;
import dev.agentruntime.v1.Trust;
import dev.agentruntime.v1.UnrecordedCalls;
import dev.agentruntime.v1.WaitRequest;
import dev.agentruntime.v1.WaitResponse;
import dev.agentruntime.v1.WakeRequest;
import dev.agentruntime.v1.WakeResponse;
import dev.agentruntime.v1.WatchRequest;
import dev.agentruntime.v1.WatchResponse;
import io.grpc.Context;
import io.grpc.InsecureServerCredentials;
import io.grpc.Server;
import io.grpc.Status;
import io.grpc.StatusRuntimeException;
import io.grpc.netty.shaded.io.grpc.netty.NettyServerBuilder;
import io.grpc.protobuf.StatusProto;
import io.grpc.stub.StreamObserver;
import java.net.InetAddress;
import java.net.InetSocketAddress;
import java.time.Duration;
import java.util.ArrayDeque;
import java.util.ArrayList;
import java.util.Deque;
import java.util.HashMap;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.UUID;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.Executors;
import java.util.concurrent.ScheduledExecutorService;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicReference;
import java.util.function.Function;
import java.util.function.Supplier;
import java.util.stream.Collectors;

/**
 * The client's retry loop and request ids against a stand-in AgentRuntime service on a loopback
 * port in this JVM (Netty, as the client's own transport; no server of ours): the stand-in answers
 * each method as the check planned (a status with the details it chose, a held call never
 * answered, a response), else with a plain success, and records every attempt it saw (the method,
 * its request id, when it came). It shows:
 *
 * <ul>
 *   <li>every mutating method (blocking and async) sends one request id on all the attempts of a
 *       call: the caller's, or a generated UUID v4, a fresh one per call; {@code run} its Spawn's
 *       and its Wake's;
 *   <li>UNAVAILABLE, a status with a RetryInfo (waiting at least its {@code retry_delay}), and an
 *       attempt's own DEADLINE_EXCEEDED are retried, reads as well as writes;
 *   <li>another code is not, nor a call the caller gave up on (an interrupt in an attempt or in a
 *       pause, a cancelled Context, a Context deadline, a cancelled future);
 *   <li>{@code retries(false)}: one attempt, with a request id all the same;
 *   <li>the retry window bounds a call, a Wait's failures in a row (a success starts it again; a
 *       server answering STORE_BROKEN for ever fails the Wait) and a Watch's.
 * </ul>
 *
 * Run by {@link ClientCheck}.
 */
final class RetryCheck {
  private RetryCheck() {}

  private static void expect(boolean holds, String what) {
    if (!holds) {
      throw new IllegalStateException("retries: " + what);
    }
  }

  /** How the stand-in answers one attempt: a status, a response, or nothing (held). */
  static final class Outcome {
    final StatusRuntimeException error;
    final Object response;

    private Outcome(StatusRuntimeException error, Object response) {
      this.error = error;
      this.response = response;
    }

    boolean held() {
      return error == null && response == null;
    }
  }

  static Outcome fail(Status.Code code, com.google.protobuf.Message... details) {
    com.google.rpc.Status.Builder status = com.google.rpc.Status.newBuilder()
        .setCode(code.value())
        .setMessage("stand-in: " + code);
    for (com.google.protobuf.Message detail : details) {
      status.addDetails(Any.pack(detail));
    }
    return new Outcome(StatusProto.toStatusRuntimeException(status.build()), null);
  }

  static Outcome hold() {
    return new Outcome(null, null);
  }

  static Outcome answer(Object response) {
    return new Outcome(null, response);
  }

  static RetryInfo retryInfo(long millis) {
    return RetryInfo.newBuilder()
        .setRetryDelay(com.google.protobuf.Duration.newBuilder()
            .setSeconds(millis / 1000)
            .setNanos((int) (millis % 1000) * 1_000_000))
        .build();
  }

  static ErrorInfo errorInfo(String reason) {
    return ErrorInfo.newBuilder().setReason(reason).setDomain("agentruntime.dev").build();
  }

  /** An attempt the stand-in saw. */
  static final class Seen {
    final String method;
    final String requestId; // "" for a read
    final long at; // System.nanoTime()

    Seen(String method, String requestId, long at) {
      this.method = method;
      this.requestId = requestId;
      this.at = at;
    }
  }

  /** The stand-in service: planned outcomes per method, then a plain success (or the method's standing outcome). */
  static final class Peer extends AgentRuntimeGrpc.AgentRuntimeImplBase {
    private final List<Seen> seen = new ArrayList<>(); // guarded by this
    private final Map<String, Deque<Outcome>> plans = new HashMap<>(); // guarded by this
    private final Map<String, Outcome> always = new HashMap<>(); // guarded by this
    private final Map<String, List<com.google.protobuf.Message>> requests = new HashMap<>(); // guarded by this

    synchronized void reset() {
      seen.clear();
      plans.clear();
      always.clear();
      requests.clear();
    }

    /** Records a request as the stand-in received it (for the methods whose fields a check reads). */
    synchronized void record(String method, com.google.protobuf.Message request) {
      requests.computeIfAbsent(method, m -> new ArrayList<>()).add(request);
    }

    /** The requests of {@code method} received so far, in order (recorded ones only). */
    @SuppressWarnings("unchecked")
    synchronized <M extends com.google.protobuf.Message> List<M> requests(String method) {
      return (List<M>) (List<?>) List.copyOf(requests.getOrDefault(method, List.of()));
    }

    /** The next calls of {@code method} get these outcomes, in order. */
    synchronized void plan(String method, Outcome... outcomes) {
      plans.computeIfAbsent(method, m -> new ArrayDeque<>()).addAll(List.of(outcomes));
    }

    /** Every call of {@code method} past its plan gets {@code outcome}. */
    synchronized void always(String method, Outcome outcome) {
      always.put(method, outcome);
    }

    synchronized List<Seen> seen(String method) {
      return seen.stream().filter(s -> s.method.equals(method)).collect(Collectors.toList());
    }

    synchronized List<String> ids(String method) {
      return seen(method).stream().map(s -> s.requestId).collect(Collectors.toList());
    }

    /** Waits (at most 10 s) until {@code method} has been called {@code count} times. */
    synchronized void awaitSeen(String method, int count) throws InterruptedException {
      long end = System.nanoTime() + TimeUnit.SECONDS.toNanos(10);
      while (seen(method).size() < count) {
        long left = end - System.nanoTime();
        expect(left > 0, method + " was not called " + count + " times within 10 s");
        TimeUnit.NANOSECONDS.timedWait(this, left);
      }
    }

    private <T> void serve(String method, String requestId, StreamObserver<T> observer, Supplier<T> success) {
      Outcome outcome;
      synchronized (this) {
        seen.add(new Seen(method, requestId, System.nanoTime()));
        notifyAll();
        Deque<Outcome> plan = plans.get(method);
        outcome = plan != null && !plan.isEmpty() ? plan.poll() : always.get(method);
      }
      if (outcome == null) {
        observer.onNext(success.get());
        observer.onCompleted();
      } else if (outcome.error != null) {
        observer.onError(outcome.error);
      } else if (outcome.response != null) {
        @SuppressWarnings("unchecked")
        T response = (T) outcome.response;
        observer.onNext(response);
        observer.onCompleted();
      } // else held: never answered (the client's deadline or cancellation ends it)
    }

    static TaskResult done(String handleId) {
      return TaskResult.newBuilder().setHandleId(handleId).setStatus(dev.agentruntime.v1.Status.STATUS_DONE).setText("done").build();
    }

    @Override
    public void createRuntime(CreateRuntimeRequest request, StreamObserver<CreateRuntimeResponse> observer) {
      serve("CreateRuntime", request.getRequestId(), observer,
          () -> CreateRuntimeResponse.newBuilder().setRuntimeId("rt-made").build());
    }

    @Override
    public void spawn(SpawnRequest request, StreamObserver<SpawnResponse> observer) {
      serve("Spawn", request.getRequestId(), observer,
          () -> SpawnResponse.newBuilder().setHandleId(request.getParentId() + "/" + request.getAgent() + ".1").build());
    }

    @Override
    public void post(PostRequest request, StreamObserver<PostResponse> observer) {
      serve("Post", request.getRequestId(), observer, () -> PostResponse.newBuilder().setOk(true).setInboxSize(
          request.getTrust() == Trust.TRUST_EXTERNAL && request.getCoalesceKey().equals("tick") ? 7 : 1).build());
    }

    @Override
    public void wake(WakeRequest request, StreamObserver<WakeResponse> observer) {
      serve("Wake", request.getRequestId(), observer, () -> WakeResponse.newBuilder().setQueued(true).build());
    }

    @Override
    public void resume(ResumeRequest request, StreamObserver<ResumeResponse> observer) {
      serve("Resume", request.getRequestId(), observer,
          () -> ResumeResponse.newBuilder().setResult(done(request.getAnswer().getId())).build());
    }

    @Override
    public void interrupt(InterruptRequest request, StreamObserver<InterruptResponse> observer) {
      serve("Interrupt", request.getRequestId(), observer, () -> InterruptResponse.newBuilder().setInterrupted(true).build());
    }

    @Override
    public void close(CloseRequest request, StreamObserver<CloseResponse> observer) {
      serve("Close", request.getRequestId(), observer, () -> CloseResponse.newBuilder()
          .addClosedHandleIds(request.getHandleId() + (request.hasGrace() ? "+grace" : "")).build());
    }

    @Override
    public void deleteRuntime(DeleteRuntimeRequest request, StreamObserver<DeleteRuntimeResponse> observer) {
      serve("DeleteRuntime", request.getRequestId(), observer, DeleteRuntimeResponse::getDefaultInstance);
    }

    @Override
    public void wait(WaitRequest request, StreamObserver<WaitResponse> observer) {
      serve("Wait", "", observer, () -> WaitResponse.newBuilder().setResult(done(request.getHandleId())).build());
    }

    @Override
    public void inspect(InspectRequest request, StreamObserver<InspectResponse> observer) {
      serve("Inspect", "", observer,
          () -> InspectResponse.newBuilder().setHandle(HandleView.newBuilder().setHandleId(request.getHandleId())).build());
    }

    @Override
    public void list(ListRequest request, StreamObserver<ListResponse> observer) {
      serve("List", "", observer, () -> ListResponse.newBuilder().addHandles(HandleView.newBuilder().setHandleId("h")).build());
    }

    @Override
    public void getTranscript(GetTranscriptRequest request, StreamObserver<GetTranscriptResponse> observer) {
      serve("GetTranscript", "", observer, GetTranscriptResponse::getDefaultInstance);
    }

    @Override
    public void listRuntimes(ListRuntimesRequest request, StreamObserver<ListRuntimesResponse> observer) {
      record("ListRuntimes", request);
      serve("ListRuntimes", "", observer, ListRuntimesResponse::getDefaultInstance);
    }

    @Override
    public void forkRuntime(ForkRuntimeRequest request, StreamObserver<ForkRuntimeResponse> observer) {
      record("ForkRuntime", request);
      serve("ForkRuntime", request.getRequestId(), observer, () -> ForkRuntimeResponse.newBuilder()
          .setRuntimeId(request.getRuntimeId().isEmpty() ? "fork-made" : request.getRuntimeId())
          .setForkSeq(request.getAtSeq())
          .addHeldHandleIds("root/w.1")
          .build());
    }

    /**
     * A replay: settled at once unless planned otherwise. Like the server, it answers no sooner than
     * the request's {@code timeout} when that is under 5 s (the caller-timeout checks; the client's
     * 30 s slices are answered at once).
     */
    @Override
    public void replayRuntime(ReplayRuntimeRequest request, StreamObserver<ReplayRuntimeResponse> observer) {
      record("ReplayRuntime", request);
      long timeoutMillis = request.getTimeout().getSeconds() * 1000 + request.getTimeout().getNanos() / 1_000_000;
      if (timeoutMillis < 5000) {
        try {
          Thread.sleep(timeoutMillis);
        } catch (InterruptedException e) {
          Thread.currentThread().interrupt();
        }
      }
      serve("ReplayRuntime", request.getRequestId(), observer, () -> replayed(request.getSourceRuntimeId(), true));
    }

    static ReplayRuntimeResponse replayed(String source, boolean settled) {
      return ReplayRuntimeResponse.newBuilder()
          .setRuntimeId("replay-of-" + source)
          .setSettled(settled)
          .addDiffs(ReplayDiff.newBuilder().setHandleId("root/w.1").setRecorded(done("root/w.1"))
              .setReplayed(settled ? done("root/w.1") : TaskResult.getDefaultInstance()))
          .build();
    }

    @Override
    public void watch(WatchRequest request, StreamObserver<WatchResponse> observer) {
      // A success serves the seqs after the one asked for, up to 3, and leaves the stream open.
      serve("Watch", "", new StreamObserver<WatchResponse>() {
        @Override
        public void onNext(WatchResponse ignored) {
          for (long seq = request.getAfterSeq() + 1; seq <= 3; seq++) {
            observer.onNext(WatchResponse.newBuilder().setEvent(Event.newBuilder().setSeq(seq).setHandleId("h")).build());
          }
        }

        @Override
        public void onError(Throwable error) {
          observer.onError(error);
        }

        @Override
        public void onCompleted() {
          // left open: the client closes it
        }
      }, WatchResponse::getDefaultInstance);
    }
  }

  /** What {@code body} threw as an AgentRuntimeException (null when it returned). */
  private static AgentRuntimeException thrown(Runnable body) {
    try {
      body.run();
      return null;
    } catch (AgentRuntimeException e) {
      return e;
    }
  }

  /** The AgentRuntimeException a future failed with (null when it succeeded), within 30 s. */
  private static AgentRuntimeException failure(CompletableFuture<?> future) throws Exception {
    return future.handle((value, error) -> error == null ? null : AgentRuntimeException.unwrap(error)).get(30, TimeUnit.SECONDS);
  }

  private static boolean isUuid4(String id) {
    try {
      UUID uuid = UUID.fromString(id);
      return uuid.version() == 4 && uuid.toString().equals(id);
    } catch (IllegalArgumentException e) {
      return false;
    }
  }

  private static long millisSince(long start) {
    return TimeUnit.NANOSECONDS.toMillis(System.nanoTime() - start);
  }

  /** Runs the checks; returns what they showed, or throws IllegalStateException saying what differed. */
  static String run() throws Exception {
    Peer peer = new Peer();
    Server server = NettyServerBuilder
        .forAddress(new InetSocketAddress(InetAddress.getLoopbackAddress(), 0), InsecureServerCredentials.create())
        .addService(peer)
        .build()
        .start();
    ScheduledExecutorService timer = Executors.newSingleThreadScheduledExecutor();
    String target = "127.0.0.1:" + server.getPort();
    try {
      try (AgentRuntimeClient client = AgentRuntimeClient.newBuilder(target).build()) {
        sameIdOnEveryAttempt(client, peer);
        readsRetried(client, peer);
        retryInfoHonoured(client, peer);
        otherCodesNot(client, peer);
        callerGaveUp(client, peer, timer);
        runPassesItsIds(client, peer);
        asyncClient(client, peer);
        forkSendsItsFields(client, peer);
        replayLoopsUntilSettled(client, peer);
        listRuntimesForksOf(client, peer);
      }
      try (AgentRuntimeClient shortAttempts = AgentRuntimeClient.newBuilder(target)
          .defaultTimeout(Duration.ofMillis(300)).build()) {
        ownDeadlineRetried(shortAttempts, peer);
      }
      try (AgentRuntimeClient off = AgentRuntimeClient.newBuilder(target).retries(false).build()) {
        retriesOff(off, peer);
      }
      try (AgentRuntimeClient windowed = AgentRuntimeClient.newBuilder(target).retryWindow(Duration.ofSeconds(1))
          .defaultTimeout(Duration.ofSeconds(5)).build()) {
        windowBounds(windowed, peer);
      }
    } finally {
      timer.shutdownNow();
      server.shutdownNow();
      server.awaitTermination(5, TimeUnit.SECONDS);
    }
    return "retries: one request id on every attempt of each mutating call (10 blocking, 7 async, run's Spawn and Wake), "
        + "ForkRuntime's fields sent as given; ReplayRuntime sent again with its one request id while unsettled "
        + "(30 s slices; a caller's timeout, or a second before a Context deadline, ends it unsettled), blocking and async; ListRuntimes' forks_of; "
        + "UNAVAILABLE / RetryInfo (its delay waited) / an attempt's own DEADLINE_EXCEEDED retried, reads too; "
        + "other codes, interrupts, cancelled Contexts and futures, a Context deadline not; retries(false) one attempt; "
        + "the window bounds a call, a Wait's and a Watch's failures in a row";
  }

  /** Each mutating method, with the attempts it makes: the ids of its last call's attempts. */
  private static void sameIdOnEveryAttempt(AgentRuntimeClient client, Peer peer) throws Exception {
    Answer answer = Answer.newBuilder().setId("req-1").setOk(true).build();
    Map<String, Function<String, Object>> calls = new LinkedHashMap<>();
    calls.put("CreateRuntime", id -> client.createRuntime(List.of(AgentDef.getDefaultInstance()), "", id));
    calls.put("Spawn", id -> client.spawn("rt", "w", "root", null, id));
    calls.put("Post", id -> client.post("rt", "root/w.1", "note", "", "", id));
    calls.put("Wake", id -> client.wake("rt", "root/w.1", "go", id));
    calls.put("Resume", id -> client.resume("rt", answer, id));
    calls.put("Interrupt", id -> client.interrupt("rt", "root/w.1", id));
    calls.put("Close", id -> client.close("rt", "root/w.1", false, id));
    calls.put("DeleteRuntime", id -> {
      client.deleteRuntime("rt", true, id);
      return "deleted";
    });
    calls.put("ForkRuntime", id -> client.forkRuntime("rt", 6, null, null, null, "", id));
    calls.put("ReplayRuntime", id -> client.replayRuntime("rt", null, null, "", id, null));
    for (Map.Entry<String, Function<String, Object>> call : calls.entrySet()) {
      String method = call.getKey();
      peer.reset();
      // Generated: two UNAVAILABLEs, then the answer; all three attempts carry one UUID v4.
      peer.plan(method, fail(Status.Code.UNAVAILABLE), fail(Status.Code.UNAVAILABLE));
      AgentRuntimeException error = thrown(() -> call.getValue().apply(null));
      expect(error == null, method + " after two UNAVAILABLEs: " + error);
      List<String> ids = peer.ids(method);
      expect(ids.size() == 3 && isUuid4(ids.get(0)) && ids.stream().distinct().count() == 1,
          method + ": the attempts carried " + ids + ", want one UUID v4 three times");
      // A second call: a fresh id.
      expect(thrown(() -> call.getValue().apply(null)) == null, method + ": the second call failed");
      List<String> again = peer.ids(method);
      expect(again.size() == 4 && isUuid4(again.get(3)) && !again.get(3).equals(ids.get(0)),
          method + ": the second call's id " + again.get(3) + " is not a fresh UUID (the first: " + ids.get(0) + ")");
      // The caller's own id, on every attempt.
      peer.reset();
      String mine = "mine-" + method;
      peer.plan(method, fail(Status.Code.UNAVAILABLE));
      expect(thrown(() -> call.getValue().apply(mine)) == null, method + " with the caller's id failed");
      expect(peer.ids(method).equals(List.of(mine, mine)), method + ": the attempts carried " + peer.ids(method)
          + ", want [" + mine + ", " + mine + "]");
    }

    // The whole-request forms keep the caller's fields, and fill in the id only when it is empty.
    peer.reset();
    peer.plan("Post", fail(Status.Code.UNAVAILABLE));
    PostResponse posted = client.post(PostRequest.newBuilder().setRuntimeId("rt").setHandleId("root/w.1").setText("tick")
        .setTrust(Trust.TRUST_EXTERNAL).setCoalesceKey("tick").build());
    List<String> postIds = peer.ids("Post");
    expect(posted.getInboxSize() == 7 && postIds.size() == 2 && isUuid4(postIds.get(0)) && postIds.get(0).equals(postIds.get(1)),
        "post(PostRequest): inbox " + posted.getInboxSize() + ", ids " + postIds);
    peer.plan("Close", fail(Status.Code.UNAVAILABLE));
    CloseResponse closed = client.close(CloseRequest.newBuilder().setRuntimeId("rt").setHandleId("root/w.1")
        .setGrace(com.google.protobuf.Duration.newBuilder().setSeconds(1)).setRequestId("close-mine").build());
    expect(closed.getClosedHandleIds(0).equals("root/w.1+grace") && peer.ids("Close").equals(List.of("close-mine", "close-mine")),
        "close(CloseRequest): " + closed.getClosedHandleIdsList() + ", ids " + peer.ids("Close"));
  }

  /** Reads are retried too: UNAVAILABLE, and a CANCELLED the caller did not cause. */
  private static void readsRetried(AgentRuntimeClient client, Peer peer) {
    peer.reset();
    Map<String, Runnable> reads = new LinkedHashMap<>();
    reads.put("Inspect", () -> client.inspect("rt", "root/w.1"));
    reads.put("List", () -> client.listPage("rt", 0, ""));
    reads.put("GetTranscript", () -> client.transcriptPage("rt", "root/w.1", 0, ""));
    reads.put("ListRuntimes", () -> client.listRuntimesPage(0, ""));
    for (Map.Entry<String, Runnable> read : reads.entrySet()) {
      peer.plan(read.getKey(), fail(Status.Code.UNAVAILABLE), fail(Status.Code.CANCELLED));
      AgentRuntimeException error = thrown(read.getValue());
      expect(error == null && peer.seen(read.getKey()).size() == 3,
          read.getKey() + " after UNAVAILABLE and CANCELLED: " + error + ", " + peer.seen(read.getKey()).size() + " attempts, want 3");
    }
  }

  /** Any status with a RetryInfo is retried, after at least its retry_delay; an UNAVAILABLE's RetryInfo too. */
  private static void retryInfoHonoured(AgentRuntimeClient client, Peer peer) {
    peer.reset();
    peer.plan("Spawn", fail(Status.Code.FAILED_PRECONDITION, errorInfo("RUNTIME_MOVING"), retryInfo(400)),
        fail(Status.Code.UNAVAILABLE, errorInfo("SERVER_DRAINING"), retryInfo(300)));
    String handle = client.spawn("rt", "w");
    List<Seen> seen = peer.seen("Spawn");
    expect(handle.equals("root/w.1") && seen.size() == 3, "spawn after two RetryInfos: " + seen.size() + " attempts");
    long first = TimeUnit.NANOSECONDS.toMillis(seen.get(1).at - seen.get(0).at);
    long second = TimeUnit.NANOSECONDS.toMillis(seen.get(2).at - seen.get(1).at);
    expect(first >= 400 && second >= 300, "the pauses were " + first + " ms and " + second + " ms, want at least 400 and 300");
    expect(first < 3000 && second < 3000, "the pauses were " + first + " ms and " + second + " ms, far past the RetryInfo's");
  }

  /** Another code is thrown at once, after one attempt, with its details. */
  private static void otherCodesNot(AgentRuntimeClient client, Peer peer) {
    for (Status.Code code : List.of(Status.Code.FAILED_PRECONDITION, Status.Code.INVALID_ARGUMENT, Status.Code.NOT_FOUND,
        Status.Code.RESOURCE_EXHAUSTED, Status.Code.INTERNAL, Status.Code.DEADLINE_EXCEEDED)) {
      peer.reset();
      peer.plan("Wake", fail(code, errorInfo("REQUEST_ID_REUSED")));
      AgentRuntimeException error = thrown(() -> client.wake("rt", "root/w.1", "go", "wake-1"));
      expect(error != null && error.code() == code && peer.seen("Wake").size() == 1
          && error.errorInfo().map(ErrorInfo::getReason).orElse("").equals("REQUEST_ID_REUSED"),
          code + ": " + error + " after " + peer.seen("Wake").size() + " attempts, want it thrown after 1");
    }
  }

  /**
   * Runs a Spawn on a thread of its own, under a cancellable Context; once the stand-in has its
   * first attempt (and, for a {@code how} "... in the pause", once the thread is in the pause after
   * it: a timed wait, which a blocking attempt never is), {@code giveUp} gives up on it. The Spawn
   * must end CANCELLED, within 5 s (the pause the stand-in asked for is 10 s), after one attempt.
   */
  private static void gaveUpOnce(AgentRuntimeClient client, Peer peer, String how, Outcome firstAttempt,
      java.util.function.BiConsumer<Thread, Context.CancellableContext> giveUp) throws Exception {
    peer.reset();
    peer.plan("Spawn", firstAttempt);
    AtomicReference<AgentRuntimeException> error = new AtomicReference<>();
    AtomicReference<Boolean> flag = new AtomicReference<>();
    Context.CancellableContext context = Context.current().withCancellation();
    Thread caller = new Thread(() -> context.run(() -> {
      error.set(thrown(() -> client.spawn("rt", "w")));
      flag.set(Thread.currentThread().isInterrupted());
    }), "retry-check-" + how);
    caller.start();
    peer.awaitSeen("Spawn", 1);
    if (how.endsWith("in the pause")) {
      long end = System.nanoTime() + TimeUnit.SECONDS.toNanos(10);
      while (caller.getState() != Thread.State.TIMED_WAITING) {
        expect(System.nanoTime() < end && caller.isAlive(), how + ": the caller never paused (" + caller.getState() + ")");
        Thread.sleep(5);
      }
    }
    giveUp.accept(caller, context);
    caller.join(5_000);
    expect(!caller.isAlive(), how + ": spawn still running 5 s after");
    expect(error.get() != null && error.get().code() == Status.Code.CANCELLED, how + ": spawn threw " + error.get());
    if (how.startsWith("interrupt")) {
      expect(Boolean.TRUE.equals(flag.get()), how + ": the thread's interrupt flag is not set again");
    }
    // The blocking loop has returned: no attempt can come after this.
    expect(peer.seen("Spawn").size() == 1, how + ": " + peer.seen("Spawn").size() + " attempts, want 1");
  }

  private static void callerGaveUp(AgentRuntimeClient client, Peer peer, ScheduledExecutorService timer) throws Exception {
    Outcome longPause = fail(Status.Code.UNAVAILABLE, retryInfo(10_000));
    gaveUpOnce(client, peer, "interrupt in the pause", longPause, (thread, context) -> thread.interrupt());
    gaveUpOnce(client, peer, "interrupt in the attempt", hold(), (thread, context) -> thread.interrupt());
    gaveUpOnce(client, peer, "Context cancelled in the pause", longPause, (thread, context) -> context.cancel(null));
    gaveUpOnce(client, peer, "Context cancelled in the attempt", hold(), (thread, context) -> context.cancel(null));

    // The caller's Context deadline is the call's: retried until it, not for the client's 60 s window.
    peer.reset();
    peer.always("Inspect", fail(Status.Code.UNAVAILABLE));
    long start = System.nanoTime();
    Context.CancellableContext deadline = Context.current().withDeadlineAfter(1, TimeUnit.SECONDS, timer);
    AgentRuntimeException error = deadline.call(() -> thrown(() -> client.inspect("rt", "root/w.1")));
    long took = millisSince(start);
    expect(error != null && took < 3000 && peer.seen("Inspect").size() >= 2,
        "a 1 s Context deadline: " + error + " after " + took + " ms and " + peer.seen("Inspect").size() + " attempts");
  }

  /** An attempt's own deadline (the default 300 ms, under the 60 s window) is retried; the window's is not. */
  private static void ownDeadlineRetried(AgentRuntimeClient client, Peer peer) {
    peer.reset();
    peer.plan("Inspect", hold());
    AgentRuntimeException error = thrown(() -> client.inspect("rt", "root/w.1"));
    expect(error == null && peer.seen("Inspect").size() == 2,
        "an attempt past its 300 ms deadline: " + error + ", " + peer.seen("Inspect").size() + " attempts, want 2");
  }

  /** run(): its Spawn and its Wake each keep one id over their attempts (the caller's or generated), and its Wait is retried. */
  private static void runPassesItsIds(AgentRuntimeClient client, Peer peer) {
    peer.reset();
    peer.plan("Spawn", fail(Status.Code.UNAVAILABLE));
    peer.plan("Wake", fail(Status.Code.UNAVAILABLE));
    peer.plan("Wait", fail(Status.Code.UNAVAILABLE));
    TaskResult result = client.run("rt", "w", "go", "root", "run-spawn", "run-wake");
    expect(result.getStatus() == dev.agentruntime.v1.Status.STATUS_DONE && result.getHandleId().equals("root/w.1"),
        "run: " + result.getStatus() + " " + result.getHandleId());
    expect(peer.ids("Spawn").equals(List.of("run-spawn", "run-spawn")) && peer.ids("Wake").equals(List.of("run-wake", "run-wake"))
        && peer.seen("Wait").size() == 2, "run with ids: Spawn " + peer.ids("Spawn") + ", Wake " + peer.ids("Wake")
        + ", " + peer.seen("Wait").size() + " Waits");

    peer.reset();
    peer.plan("Spawn", fail(Status.Code.UNAVAILABLE));
    peer.plan("Wake", fail(Status.Code.UNAVAILABLE));
    client.run("rt", "w", "go");
    List<String> spawnIds = peer.ids("Spawn");
    List<String> wakeIds = peer.ids("Wake");
    expect(spawnIds.size() == 2 && isUuid4(spawnIds.get(0)) && spawnIds.get(0).equals(spawnIds.get(1))
        && wakeIds.size() == 2 && isUuid4(wakeIds.get(0)) && wakeIds.get(0).equals(wakeIds.get(1))
        && !spawnIds.get(0).equals(wakeIds.get(0)), "run: Spawn " + spawnIds + ", Wake " + wakeIds);
  }

  /** The async client: the same ids, retries and RetryInfo pauses, and a cancelled future stops its retries. */
  private static void asyncClient(AgentRuntimeClient client, Peer peer) throws Exception {
    AgentRuntimeAsyncClient async = client.async();
    Answer answer = Answer.newBuilder().setId("req-1").setOk(true).build();
    Map<String, Function<String, CompletableFuture<?>>> calls = new LinkedHashMap<>();
    calls.put("CreateRuntime", id -> async.createRuntime(List.of(AgentDef.getDefaultInstance()), "", id));
    calls.put("Spawn", id -> async.spawn("rt", "w", "root", null, id));
    calls.put("Post", id -> async.post("rt", "root/w.1", "note", "", "", id));
    calls.put("Wake", id -> async.wake("rt", "root/w.1", "go", id));
    calls.put("Resume", id -> async.resume("rt", answer, id));
    calls.put("ForkRuntime", id -> async.forkRuntime("rt", 6, null, null, null, "", id));
    calls.put("ReplayRuntime", id -> async.replayRuntime("rt", null, null, "", id, null));
    for (Map.Entry<String, Function<String, CompletableFuture<?>>> call : calls.entrySet()) {
      String method = call.getKey();
      peer.reset();
      peer.plan(method, fail(Status.Code.UNAVAILABLE), fail(Status.Code.CANCELLED));
      AgentRuntimeException error = failure(call.getValue().apply(null));
      List<String> ids = peer.ids(method);
      expect(error == null && ids.size() == 3 && isUuid4(ids.get(0)) && ids.stream().distinct().count() == 1,
          "async " + method + ": " + error + ", attempts carried " + ids);
      peer.reset();
      peer.plan(method, fail(Status.Code.UNAVAILABLE));
      expect(failure(call.getValue().apply("async-mine")) == null && peer.ids(method).equals(List.of("async-mine", "async-mine")),
          "async " + method + " with the caller's id: " + peer.ids(method));
    }

    // RetryInfo honoured; another code not retried; reads retried.
    peer.reset();
    peer.plan("Spawn", fail(Status.Code.ABORTED, retryInfo(300)));
    expect(failure(async.spawn("rt", "w", "root", null)) == null, "async spawn after a RetryInfo failed");
    List<Seen> seen = peer.seen("Spawn");
    long pause = TimeUnit.NANOSECONDS.toMillis(seen.get(1).at - seen.get(0).at);
    expect(seen.size() == 2 && pause >= 300, "async spawn: " + seen.size() + " attempts, paused " + pause + " ms, want 2 and >= 300");
    peer.reset();
    peer.plan("Wake", fail(Status.Code.FAILED_PRECONDITION));
    AgentRuntimeException refused = failure(async.wake("rt", "root/w.1", "go"));
    expect(refused != null && refused.code() == Status.Code.FAILED_PRECONDITION && peer.seen("Wake").size() == 1,
        "async wake FAILED_PRECONDITION: " + refused + " after " + peer.seen("Wake").size() + " attempts");
    peer.plan("Inspect", fail(Status.Code.UNAVAILABLE));
    peer.plan("List", fail(Status.Code.UNAVAILABLE));
    expect(failure(async.inspect("rt", "root/w.1")) == null && failure(async.listPage("rt", 0, "")) == null
        && peer.seen("Inspect").size() == 2 && peer.seen("List").size() == 2, "async reads were not retried");

    // async run(): its ids.
    peer.reset();
    peer.plan("Spawn", fail(Status.Code.UNAVAILABLE));
    peer.plan("Wake", fail(Status.Code.UNAVAILABLE));
    TaskResult ran = async.run("rt", "w", "go", "root", "arun-spawn", "arun-wake").get(30, TimeUnit.SECONDS);
    expect(ran.getStatus() == dev.agentruntime.v1.Status.STATUS_DONE && peer.ids("Spawn").equals(List.of("arun-spawn", "arun-spawn"))
        && peer.ids("Wake").equals(List.of("arun-wake", "arun-wake")), "async run: Spawn " + peer.ids("Spawn") + ", Wake " + peer.ids("Wake"));

    // Cancelling the future in the pause stops the retries: no second attempt, though the pause (1 s) has passed.
    peer.reset();
    peer.plan("Spawn", fail(Status.Code.UNAVAILABLE, retryInfo(1000)));
    CompletableFuture<String> cancelled = async.spawn("rt", "w", "root", null);
    peer.awaitSeen("Spawn", 1);
    cancelled.cancel(true);
    Thread.sleep(1500); // the pause's time and more, for a retry that must not come
    expect(peer.seen("Spawn").size() == 1, "a cancelled async spawn: " + peer.seen("Spawn").size() + " attempts, want 1");
  }

  /** ForkRuntime: the source, the cut and the changes are sent as given; the whole-request form gets an id only when it has none. */
  private static void forkSendsItsFields(AgentRuntimeClient client, Peer peer) {
    peer.reset();
    AgentDef agent = AgentDef.newBuilder().setName("w").setDescription("replaced").build();
    ForkMessage message = ForkMessage.newBuilder().setHandleId("root/w.1").setText("instead").build();
    Answer answer = Answer.newBuilder().setId("req-1").setOk(false).setReason("change freeze").build();
    peer.plan("ForkRuntime", fail(Status.Code.UNAVAILABLE));
    ForkRuntimeResponse forked = client.forkRuntime("rt-src", 7, List.of(agent), List.of(message), List.of(answer),
        "fork-1", "fork-mine");
    List<ForkRuntimeRequest> sent = peer.requests("ForkRuntime");
    ForkRuntimeRequest want = ForkRuntimeRequest.newBuilder().setSourceRuntimeId("rt-src").setAtSeq(7).setRuntimeId("fork-1")
        .addAgents(agent).addMessages(message).addAnswers(answer).setRequestId("fork-mine").build();
    expect(sent.size() == 2 && sent.get(0).equals(want) && sent.get(1).equals(want),
        "forkRuntime sent " + sent + ", want twice " + want);
    expect(forked.getRuntimeId().equals("fork-1") && forked.getForkSeq() == 7
        && forked.getHeldHandleIdsList().equals(List.of("root/w.1")), "forkRuntime answered " + forked);

    peer.reset();
    ForkRuntimeResponse plain = client.forkRuntime("rt-src", 3);
    ForkRuntimeRequest bare = peer.<ForkRuntimeRequest>requests("ForkRuntime").get(0);
    expect(plain.getRuntimeId().equals("fork-made") && bare.getAtSeq() == 3 && bare.getRuntimeId().isEmpty()
        && bare.getAgentsCount() == 0 && bare.getMessagesCount() == 0 && bare.getAnswersCount() == 0
        && isUuid4(bare.getRequestId()), "forkRuntime(source, 3) sent " + bare);

    peer.reset();
    peer.plan("ForkRuntime", fail(Status.Code.UNAVAILABLE));
    client.forkRuntime(ForkRuntimeRequest.newBuilder().setSourceRuntimeId("rt-src").setAtSeq(4).build());
    List<String> ids = peer.ids("ForkRuntime");
    expect(ids.size() == 2 && isUuid4(ids.get(0)) && ids.get(0).equals(ids.get(1)),
        "forkRuntime(ForkRuntimeRequest) without an id: the attempts carried " + ids);
    peer.reset();
    client.forkRuntime(ForkRuntimeRequest.newBuilder().setSourceRuntimeId("rt-src").setAtSeq(4).setRequestId("whole").build());
    expect(peer.ids("ForkRuntime").equals(List.of("whole")), "forkRuntime(ForkRuntimeRequest) with an id: " + peer.ids("ForkRuntime"));
  }

  /**
   * ReplayRuntime: answered {@code settled: false}, it is sent again, with the same request and the
   * same request id, until settled (a failure between is retried as a Wait's is), each attempt asking
   * the server for a 30 s slice; under a caller's timeout it ends with the unsettled answer. Blocking and async.
   */
  private static void replayLoopsUntilSettled(AgentRuntimeClient client, Peer peer) throws Exception {
    ReplayRuntimeResponse unsettled = Peer.replayed("rt", false);
    AgentDef agent = AgentDef.newBuilder().setName("w").setDescription("replaced").build();
    for (boolean viaAsync : new boolean[] {false, true}) {
      String how = viaAsync ? "async replayRuntime" : "replayRuntime";
      peer.reset();
      peer.plan("ReplayRuntime", answer(unsettled), fail(Status.Code.UNAVAILABLE), answer(unsettled), answer(unsettled));
      AtomicReference<ReplayRuntimeResponse> replayed = new AtomicReference<>();
      AgentRuntimeException error = viaAsync
          ? failure(client.async().replayRuntime("rt", List.of(agent), UnrecordedCalls.UNRECORDED_CALLS_LIVE)
              .thenAccept(replayed::set))
          : thrown(() -> replayed.set(client.replayRuntime("rt", List.of(agent), UnrecordedCalls.UNRECORDED_CALLS_LIVE)));
      expect(error == null, how + ": " + error);
      List<String> ids = peer.ids("ReplayRuntime");
      expect(replayed.get().getSettled() && replayed.get().getDiffs(0).getReplayed().getStatus() == dev.agentruntime.v1.Status.STATUS_DONE
          && ids.size() == 5 && isUuid4(ids.get(0)) && ids.stream().distinct().count() == 1,
          how + ": settled " + replayed.get().getSettled() + " after attempts with " + ids + ", want settled after 5 with one UUID");
      List<ReplayRuntimeRequest> sent = peer.requests("ReplayRuntime");
      ReplayRuntimeRequest first = sent.get(0);
      expect(first.getSourceRuntimeId().equals("rt") && first.getAgentsList().equals(List.of(agent))
          && first.getUnrecordedCalls() == UnrecordedCalls.UNRECORDED_CALLS_LIVE && first.getRuntimeId().isEmpty(),
          how + " sent " + first);
      for (ReplayRuntimeRequest request : sent) {
        expect(request.equals(first), how + ": a repeat sent " + request + ", the first " + first);
        expect(request.getTimeout().equals(com.google.protobuf.Duration.newBuilder().setSeconds(30).build()),
            how + ": an attempt asked for a timeout of " + request.getTimeout() + ", want 30 s");
      }

      // The caller's id, and a caller's timeout of 1 s: the unsettled answer once it has passed.
      peer.reset();
      peer.always("ReplayRuntime", answer(unsettled));
      long start = System.nanoTime();
      error = viaAsync
          ? failure(client.async().replayRuntime("rt", null, null, "replay-1", "replay-mine", Duration.ofSeconds(1))
              .thenAccept(replayed::set))
          : thrown(() -> replayed.set(client.replayRuntime("rt", null, null, "replay-1", "replay-mine", Duration.ofSeconds(1))));
      long took = millisSince(start);
      sent = peer.requests("ReplayRuntime");
      expect(error == null && !replayed.get().getSettled() && took >= 900 && took < 5000,
          how + " with a 1 s timeout: " + error + ", settled " + replayed.get().getSettled() + " after " + took + " ms");
      expect(!sent.isEmpty() && sent.size() <= 3 && peer.ids("ReplayRuntime").stream().allMatch("replay-mine"::equals)
          && sent.stream().allMatch(r -> r.getRuntimeId().equals("replay-1") && (r.getTimeout().getSeconds() < 1
              || r.getTimeout().equals(com.google.protobuf.Duration.newBuilder().setSeconds(1).build()))),
          how + " with a 1 s timeout sent " + sent.size() + " requests: " + sent);

      // A refusal is thrown at once.
      peer.reset();
      peer.plan("ReplayRuntime", fail(Status.Code.NOT_FOUND));
      error = viaAsync ? failure(client.async().replayRuntime("gone", null, null))
          : thrown(() -> client.replayRuntime("gone", null, null));
      expect(error != null && error.code() == Status.Code.NOT_FOUND && peer.seen("ReplayRuntime").size() == 1,
          how + " NOT_FOUND: " + error + " after " + peer.seen("ReplayRuntime").size() + " attempts");
    }

    // Under a Context deadline of 3 s: the unsettled answer a second before it (the slices fitted under it), not its error.
    peer.reset();
    peer.always("ReplayRuntime", answer(unsettled));
    ScheduledExecutorService deadlines = Executors.newSingleThreadScheduledExecutor();
    try {
      long start = System.nanoTime();
      AtomicReference<ReplayRuntimeResponse> cut = new AtomicReference<>();
      Context.CancellableContext deadline = Context.current().withDeadlineAfter(3, TimeUnit.SECONDS, deadlines);
      AgentRuntimeException error = deadline.call(() -> thrown(() -> cut.set(client.replayRuntime("rt", null, null))));
      deadline.cancel(null);
      long took = millisSince(start);
      expect(error == null && !cut.get().getSettled() && took >= 1800 && took < 3000 && peer.seen("ReplayRuntime").size() <= 2,
          "replayRuntime under a 3 s Context deadline: " + error + " after " + took + " ms and "
              + peer.seen("ReplayRuntime").size() + " attempts, want the unsettled answer within about 2 s");
    } finally {
      deadlines.shutdownNow();
    }

    // The whole-request form: its fields kept, its timeout replaced by the slice, an id generated only when empty.
    peer.reset();
    peer.plan("ReplayRuntime", answer(unsettled));
    client.replayRuntime(ReplayRuntimeRequest.newBuilder().setSourceRuntimeId("rt").setRuntimeId("replay-2")
        .setTimeout(com.google.protobuf.Duration.newBuilder().setSeconds(3600)).build(), null);
    List<ReplayRuntimeRequest> whole = peer.requests("ReplayRuntime");
    expect(whole.size() == 2 && whole.get(0).equals(whole.get(1)) && isUuid4(whole.get(0).getRequestId())
        && whole.get(0).getRuntimeId().equals("replay-2") && whole.get(0).getTimeout().getSeconds() == 30,
        "replayRuntime(ReplayRuntimeRequest, null) sent " + whole);
  }

  /** ListRuntimes' forks_of: sent by the forksOf forms, empty from the others. */
  private static void listRuntimesForksOf(AgentRuntimeClient client, Peer peer) {
    peer.reset();
    client.listRuntimes("rt-src");
    client.listRuntimesPage(5, "", "rt-src");
    client.listRuntimes();
    List<String> forksOf = peer.<ListRuntimesRequest>requests("ListRuntimes").stream()
        .map(ListRuntimesRequest::getForksOf).collect(Collectors.toList());
    expect(forksOf.equals(List.of("rt-src", "rt-src", "")), "ListRuntimes' forks_of: " + forksOf);
  }

  /** retries(false): one attempt, and the request id is sent all the same. */
  private static void retriesOff(AgentRuntimeClient client, Peer peer) throws Exception {
    peer.reset();
    peer.plan("Spawn", fail(Status.Code.UNAVAILABLE, retryInfo(10)));
    AgentRuntimeException error = thrown(() -> client.spawn("rt", "w"));
    List<String> ids = peer.ids("Spawn");
    expect(error != null && error.code() == Status.Code.UNAVAILABLE && ids.size() == 1 && isUuid4(ids.get(0)),
        "retries off: spawn threw " + error + " after attempts " + ids + ", want UNAVAILABLE after one with a UUID");
    expect(error.retryDelay().equals(java.util.Optional.of(Duration.ofMillis(10))), "retries off: retryDelay " + error.retryDelay());
    peer.plan("Wake", fail(Status.Code.UNAVAILABLE));
    expect(thrown(() -> client.wake("rt", "root/w.1", "go", "off-mine")) != null && peer.ids("Wake").equals(List.of("off-mine")),
        "retries off: wake attempts " + peer.ids("Wake"));
    peer.plan("Wait", fail(Status.Code.UNAVAILABLE));
    expect(thrown(() -> client.waitFor("rt", "root/w.1")) != null && peer.seen("Wait").size() == 1,
        "retries off: " + peer.seen("Wait").size() + " Waits, want 1");
    peer.plan("Inspect", fail(Status.Code.UNAVAILABLE));
    expect(failure(client.async().inspect("rt", "root/w.1")) != null && peer.seen("Inspect").size() == 1,
        "retries off: async inspect made " + peer.seen("Inspect").size() + " attempts, want 1");
  }

  /** Past this, a call under a 1 s window kept retrying (or hung): far above what a slow machine adds. */
  private static final long WINDOW_ENDED = 5000;

  /** The 1 s window: a call, a Wait's and a Watch's failures in a row; no attempt is made after it. */
  private static void windowBounds(AgentRuntimeClient client, Peer peer) throws Exception {
    // A unary call: UNAVAILABLE for ever.
    peer.reset();
    peer.always("Inspect", fail(Status.Code.UNAVAILABLE));
    long start = System.nanoTime();
    AgentRuntimeException error = thrown(() -> client.inspect("rt", "root/w.1"));
    long took = millisSince(start);
    List<Seen> seen = peer.seen("Inspect");
    long last = TimeUnit.NANOSECONDS.toMillis(seen.get(seen.size() - 1).at - start);
    // What the window promises, whatever the machine's speed: attempts again, none starts after
    // 1 s, and the call ends (retried for ever, it would pass WINDOW_ENDED's bound).
    expect(error != null && error.code() == Status.Code.UNAVAILABLE && seen.size() >= 2 && last < 1000 && took < WINDOW_ENDED,
        "a 1 s window: " + error + " after " + took + " ms, " + seen.size() + " attempts, the last at " + last + " ms");

    // The async client's too.
    peer.reset();
    peer.always("Inspect", fail(Status.Code.UNAVAILABLE));
    start = System.nanoTime();
    error = failure(client.async().inspect("rt", "root/w.1"));
    took = millisSince(start);
    seen = peer.seen("Inspect");
    last = TimeUnit.NANOSECONDS.toMillis(seen.get(seen.size() - 1).at - start);
    expect(error != null && error.code() == Status.Code.UNAVAILABLE && seen.size() >= 2 && last < 1000 && took < WINDOW_ENDED,
        "async, a 1 s window: " + error + " after " + took + " ms, " + seen.size() + " attempts, the last at " + last + " ms");

    // An attempt held past the window: its DEADLINE_EXCEEDED is the window's (the 5 s default is capped), not retried.
    peer.reset();
    peer.always("Inspect", hold());
    start = System.nanoTime();
    error = thrown(() -> client.inspect("rt", "root/w.1"));
    took = millisSince(start);
    expect(error != null && error.code() == Status.Code.DEADLINE_EXCEEDED && peer.seen("Inspect").size() == 1 && took < WINDOW_ENDED,
        "an attempt held: " + error + " after " + took + " ms and " + peer.seen("Inspect").size() + " attempts, want 1");

    // A Wait against a store that stays broken fails after the window instead of hanging.
    peer.reset();
    peer.always("Wait", fail(Status.Code.UNAVAILABLE, errorInfo("STORE_BROKEN"), retryInfo(100)));
    start = System.nanoTime();
    error = thrown(() -> client.waitFor("rt", "root/w.1"));
    took = millisSince(start);
    expect(error != null && error.errorInfo().map(ErrorInfo::getReason).orElse("").equals("STORE_BROKEN") && took < WINDOW_ENDED
        && peer.seen("Wait").size() >= 2, "a Wait on STORE_BROKEN: " + error + " after " + took + " ms");
    peer.reset();
    peer.always("Wait", fail(Status.Code.UNAVAILABLE, errorInfo("STORE_BROKEN"), retryInfo(100)));
    error = failure(client.async().waitFor("rt", "root/w.1"));
    expect(error != null && error.errorInfo().map(ErrorInfo::getReason).orElse("").equals("STORE_BROKEN"),
        "an async Wait on STORE_BROKEN: " + error);

    // A Wait's window is for failures in a row: 0.8 s of them, a slice that ends STATUS_TIMEOUT, 0.8 s more,
    // then the result (1.6 s of failures in all, in two runs under the 1 s window). Blocking and async.
    WaitResponse timedOut = WaitResponse.newBuilder()
        .setResult(TaskResult.newBuilder().setHandleId("root/w.1").setStatus(dev.agentruntime.v1.Status.STATUS_TIMEOUT)).build();
    for (boolean viaAsync : new boolean[] {false, true}) {
      peer.reset();
      Outcome moving = fail(Status.Code.UNAVAILABLE, errorInfo("RUNTIME_MOVING"), retryInfo(400));
      peer.plan("Wait", moving, moving, answer(timedOut), moving, moving);
      AtomicReference<TaskResult> waited = new AtomicReference<>();
      error = viaAsync ? failure(client.async().waitFor("rt", "root/w.1").thenAccept(waited::set))
          : thrown(() -> waited.set(client.waitFor("rt", "root/w.1")));
      TaskResult result = waited.get();
      expect(error == null, (viaAsync ? "async " : "") + "a Wait with two runs of failures under the window: " + error
          + " after " + peer.seen("Wait").size() + " Waits");
      expect(result.getStatus() == dev.agentruntime.v1.Status.STATUS_DONE && peer.seen("Wait").size() == 6,
          (viaAsync ? "async " : "") + "a Wait with two runs of failures: " + result.getStatus() + " after "
              + peer.seen("Wait").size() + " Waits, want STATUS_DONE after 6");
    }

    // A Watch: its reconnects in a row are bounded by the window too, however many maxRetries allows.
    peer.reset();
    peer.always("Watch", fail(Status.Code.UNAVAILABLE));
    start = System.nanoTime();
    try (WatchStream events = client.watch("rt", 0, 1000, Duration.ofMillis(10))) {
      error = thrown(events::hasNext);
    }
    took = millisSince(start);
    expect(error != null && error.code() == Status.Code.UNAVAILABLE && took < WINDOW_ENDED && peer.seen("Watch").size() >= 2,
        "a Watch on UNAVAILABLE: " + error + " after " + took + " ms and " + peer.seen("Watch").size() + " streams");
    // And it reconnects on a RetryInfo, after its delay.
    peer.reset();
    peer.plan("Watch", fail(Status.Code.ABORTED, retryInfo(300)));
    try (WatchStream events = client.watch("rt", 0, 5, Duration.ofMillis(10))) {
      error = thrown(() -> expect(events.hasNext() && events.next().getSeq() == 1, "watch: no seq 1"));
    }
    seen = peer.seen("Watch");
    expect(error == null && seen.size() == 2 && TimeUnit.NANOSECONDS.toMillis(seen.get(1).at - seen.get(0).at) >= 300,
        "a Watch on a RetryInfo: " + error + ", " + seen.size() + " streams");
  }
}
