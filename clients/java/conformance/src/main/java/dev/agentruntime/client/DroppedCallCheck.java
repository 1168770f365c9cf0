package dev.agentruntime.client;

import dev.agentruntime.v1.AgentRuntimeGrpc;
import dev.agentruntime.v1.Answer;
import dev.agentruntime.v1.Event;
import dev.agentruntime.v1.HandleView;
import dev.agentruntime.v1.InspectRequest;
import dev.agentruntime.v1.InspectResponse;
import dev.agentruntime.v1.ResumeRequest;
import dev.agentruntime.v1.ResumeResponse;
import dev.agentruntime.v1.TaskResult;
import dev.agentruntime.v1.WaitRequest;
import dev.agentruntime.v1.WaitResponse;
import dev.agentruntime.v1.WatchRequest;
import dev.agentruntime.v1.WatchResponse;
import io.grpc.Context;
import io.grpc.InsecureServerCredentials;
import io.grpc.Server;
import io.grpc.Status;
import io.grpc.netty.shaded.io.grpc.netty.NettyServerBuilder;
import io.grpc.stub.StreamObserver;
import java.net.InetAddress;
import java.net.InetSocketAddress;
import java.time.Duration;
import java.util.List;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.CopyOnWriteArrayList;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.concurrent.atomic.AtomicReference;

/**
 * A CANCELLED the caller did not cause is a dropped call (grpc-core answers the calls that reach a
 * server as it begins to shut down so: grpc/grpc#41785), retried where an UNAVAILABLE is; the
 * client's own CANCELLEDs (an interrupt, a cancelled Context or future, the client closed) are not.
 * Against a stand-in AgentRuntime service on a loopback port in this JVM (no server of ours): its
 * Wait, Resume and Inspect answer CANCELLED the first {@code K} times for a handle (or answer id)
 * {@code cancelled-K}, then a DONE result; its Watch ends the first stream CANCELLED after seq 1
 * and serves the seqs after the one asked for on the next; a {@code hang-...} Wait is never
 * answered. Run by {@link ClientCheck}.
 */
final class DroppedCallCheck {
  private DroppedCallCheck() {}

  /** Several CANCELLEDs in a row (more than the 5 attempts gRPC's own retry policy made when the channel had one). */
  private static final int PAST_GRPC = 6;

  private static void expect(boolean holds, String what) {
    if (!holds) {
      throw new IllegalStateException(what);
    }
  }

  /** The stand-in: counts each method's calls per key and holds the {@code hang-} Waits. */
  private static final class StandIn extends AgentRuntimeGrpc.AgentRuntimeImplBase {
    final ConcurrentHashMap<String, AtomicInteger> calls = new ConcurrentHashMap<>();
    final ConcurrentHashMap<String, CountDownLatch> arrived = new ConcurrentHashMap<>();
    final List<Long> watchedAfter = new CopyOnWriteArrayList<>();

    int calls(String key) {
      AtomicInteger count = calls.get(key);
      return count == null ? 0 : count.get();
    }

    CountDownLatch arrived(String key) {
      return arrived.computeIfAbsent(key, k -> new CountDownLatch(1));
    }

    /** Counts the call; true when it is to be answered CANCELLED ({@code cancelled-K}: the first K). */
    private boolean cancelNow(String key, String id) {
      int n = calls.computeIfAbsent(key, k -> new AtomicInteger()).incrementAndGet();
      arrived(key).countDown();
      return id.startsWith("cancelled-") && n <= Integer.parseInt(id.substring("cancelled-".length()));
    }

    private static <T> boolean dropped(StreamObserver<T> observer) {
      observer.onError(Status.CANCELLED.withDescription("stand-in: a call pending at the server's shutdown")
          .asRuntimeException());
      return true;
    }

    private static TaskResult done(String id) {
      return TaskResult.newBuilder().setHandleId(id).setStatus(dev.agentruntime.v1.Status.STATUS_DONE).setText("done").build();
    }

    @Override
    public void wait(WaitRequest request, StreamObserver<WaitResponse> observer) {
      String id = request.getHandleId();
      if (cancelNow("wait:" + id, id) && dropped(observer)) {
        return;
      }
      if (id.startsWith("hang-")) {
        return; // held: never answered
      }
      observer.onNext(WaitResponse.newBuilder().setResult(done(id)).build());
      observer.onCompleted();
    }

    @Override
    public void resume(ResumeRequest request, StreamObserver<ResumeResponse> observer) {
      String id = request.getAnswer().getId();
      if (cancelNow("resume:" + id, id) && dropped(observer)) {
        return;
      }
      observer.onNext(ResumeResponse.newBuilder().setResult(done(id)).build());
      observer.onCompleted();
    }

    @Override
    public void inspect(InspectRequest request, StreamObserver<InspectResponse> observer) {
      String id = request.getHandleId();
      if (cancelNow("inspect:" + id, id) && dropped(observer)) {
        return;
      }
      observer.onNext(InspectResponse.newBuilder().setHandle(HandleView.newBuilder().setHandleId(id)).build());
      observer.onCompleted();
    }

    @Override
    public void watch(WatchRequest request, StreamObserver<WatchResponse> observer) {
      long after = request.getAfterSeq();
      watchedAfter.add(after);
      if (after == 0) {
        observer.onNext(event(1));
        dropped(observer);
        return;
      }
      for (long seq = after + 1; seq <= 3; seq++) {
        observer.onNext(event(seq));
      }
      // Left open: the client closes it.
    }

    private static WatchResponse event(long seq) {
      return WatchResponse.newBuilder().setEvent(Event.newBuilder().setSeq(seq).setHandleId("h")).build();
    }
  }

  /** What {@code body} threw as an AgentRuntimeException (null when it returned), on this thread. */
  private static AgentRuntimeException thrown(Runnable body) {
    try {
      body.run();
      return null;
    } catch (AgentRuntimeException e) {
      return e;
    }
  }

  /** Runs a blocking Wait on {@code hang} in a thread, gives up on it with {@code giveUp} once the server has it. */
  private static void notRetriedOnGiveUp(AgentRuntimeClient client, StandIn standIn, String hang, String how,
      java.util.function.BiConsumer<Thread, Context.CancellableContext> giveUp) throws InterruptedException {
    AtomicReference<AgentRuntimeException> error = new AtomicReference<>();
    AtomicReference<Boolean> flag = new AtomicReference<>();
    Context.CancellableContext context = Context.current().withCancellation();
    Thread waiter = new Thread(() -> context.run(() -> {
      error.set(thrown(() -> client.waitFor("rt", hang)));
      flag.set(Thread.currentThread().isInterrupted());
    }), "drop-check-" + hang);
    waiter.start();
    expect(standIn.arrived("wait:" + hang).await(10, TimeUnit.SECONDS), how + ": the Wait never reached the stand-in");
    giveUp.accept(waiter, context);
    waiter.join(10_000);
    expect(!waiter.isAlive(), how + ": waitFor still waiting 10 s after");
    expect(error.get() != null && error.get().code() == Status.Code.CANCELLED, how + ": waitFor threw " + error.get());
    if (how.equals("interrupt")) {
      expect(Boolean.TRUE.equals(flag.get()), "interrupt: the thread's interrupt flag is not set again");
    }
    Thread.sleep(300); // time for a retry that must not come
    expect(standIn.calls("wait:" + hang) == 1, how + ": the Wait was tried " + standIn.calls("wait:" + hang) + " times, want 1");
  }

  /** Runs the checks; returns what they showed, or throws IllegalStateException saying what differed. */
  static String run() throws Exception {
    // The helper itself: the server's CANCELLED is a drop, the client's own never.
    AgentRuntimeException fromServer = AgentRuntimeException.fromThrowable(Status.CANCELLED.asRuntimeException());
    expect(AgentRuntimeClient.isDrop(fromServer, false), "a CANCELLED from the server is not a drop");
    expect(!AgentRuntimeClient.isDrop(fromServer, true), "a CANCELLED after the caller gave up is a drop");
    expect(!AgentRuntimeClient.isDrop(AgentRuntimeClient.interrupted(null), false), "the client's interrupt CANCELLED is a drop");
    expect(!AgentRuntimeClient.isDrop(AgentRuntimeException.unwrap(new java.util.concurrent.CancellationException()), false),
        "a cancelled future's CANCELLED is a drop");

    StandIn standIn = new StandIn();
    Server server = NettyServerBuilder
        .forAddress(new InetSocketAddress(InetAddress.getLoopbackAddress(), 0), InsecureServerCredentials.create())
        .addService(standIn)
        .build()
        .start();
    try {
      checkAgainst(server.getPort(), standIn);
    } finally {
      server.shutdownNow();
      server.awaitTermination(5, TimeUnit.SECONDS);
    }
    return "a server's CANCELLED retried like UNAVAILABLE (Wait, Resume once and 6 times in a row, Inspect, "
        + "async Wait and Resume; Watch reopened after seq 1, seqs 1-3), the client's own (interrupt, Context, "
        + "future, close) not";
  }

  private static void checkAgainst(int port, StandIn standIn) throws Exception {
    try (AgentRuntimeClient client = AgentRuntimeClient.newBuilder("127.0.0.1:" + port).build()) {
      // Blocking Wait and Resume: once, and 6 times in a row (the client's loop; the channel has no retry policy).
      for (int times : new int[] {1, PAST_GRPC}) {
        String id = "cancelled-" + times;
        AgentRuntimeException error = thrown(() -> expect(client.waitFor("rt", id).getStatus()
            == dev.agentruntime.v1.Status.STATUS_DONE, "waitFor: not DONE"));
        expect(error == null, "waitFor after " + times + " CANCELLED: " + error);
        expect(standIn.calls("wait:" + id) == times + 1, "waitFor: " + standIn.calls("wait:" + id) + " Waits, want " + (times + 1));
        error = thrown(() -> expect(client.resume("rt", Answer.newBuilder().setId(id).setOk(true).build()).getStatus()
            == dev.agentruntime.v1.Status.STATUS_DONE, "resume: not DONE"));
        expect(error == null, "resume after " + times + " CANCELLED: " + error);
        expect(standIn.calls("resume:" + id) == times + 1, "resume: " + standIn.calls("resume:" + id) + " Resumes, want " + (times + 1));
      }
      // Inspect: the client's retry loop, as every call.
      AgentRuntimeException inspectError = thrown(() -> client.inspect("rt", "cancelled-1"));
      expect(inspectError == null && standIn.calls("inspect:cancelled-1") == 2,
          "inspect after a CANCELLED: " + inspectError + ", " + standIn.calls("inspect:cancelled-1") + " calls");

      // The async client's retries.
      String asyncId = "cancelled-" + (PAST_GRPC + 1); // a key of its own
      TaskResult waited = client.async().waitFor("rt", asyncId).handle((result, error) -> {
        expect(error == null, "async waitFor: " + error);
        return result;
      }).get(30, TimeUnit.SECONDS);
      expect(waited.getStatus() == dev.agentruntime.v1.Status.STATUS_DONE && standIn.calls("wait:" + asyncId) == PAST_GRPC + 2,
          "async waitFor: " + standIn.calls("wait:" + asyncId) + " Waits");
      TaskResult resumed = client.async().resume("rt", Answer.newBuilder().setId(asyncId).setOk(true).build())
          .handle((result, error) -> {
            expect(error == null, "async resume: " + error);
            return result;
          }).get(30, TimeUnit.SECONDS);
      expect(resumed.getStatus() == dev.agentruntime.v1.Status.STATUS_DONE && standIn.calls("resume:" + asyncId) == PAST_GRPC + 2,
          "async resume: " + standIn.calls("resume:" + asyncId) + " Resumes");

      // Watch: the stream ended CANCELLED after seq 1 is reopened from seq 1; no gap, no repeat.
      long[] seqs = new long[3];
      try (WatchStream events = client.watch("rt", 0, 2, Duration.ofMillis(10))) {
        for (int i = 0; i < seqs.length; i++) {
          AgentRuntimeException error = thrown(() -> expect(events.hasNext(), "watch: closed"));
          expect(error == null, "watch after a CANCELLED: " + error);
          seqs[i] = events.next().getSeq();
        }
      }
      expect(java.util.Arrays.equals(seqs, new long[] {1, 2, 3}) && standIn.watchedAfter.equals(List.of(0L, 1L)),
          "watch: seqs " + java.util.Arrays.toString(seqs) + ", opened after " + standIn.watchedAfter + ", want [1, 2, 3] after [0, 1]");

      // The client's own CANCELLEDs are never retried.
      notRetriedOnGiveUp(client, standIn, "hang-interrupt", "interrupt", (thread, context) -> thread.interrupt());
      notRetriedOnGiveUp(client, standIn, "hang-context", "cancelled Context", (thread, context) -> context.cancel(null));
      CompletableFuture<TaskResult> cancelled = client.async().waitFor("rt", "hang-future");
      expect(standIn.arrived("wait:hang-future").await(10, TimeUnit.SECONDS), "async: the Wait never reached the stand-in");
      cancelled.cancel(true);
      Thread.sleep(300);
      expect(standIn.calls("wait:hang-future") == 1, "a cancelled future: " + standIn.calls("wait:hang-future") + " Waits, want 1");
    }
    try (AgentRuntimeClient closing = AgentRuntimeClient.newBuilder("127.0.0.1:" + port).build()) {
      CompletableFuture<TaskResult> pending = closing.async().waitFor("rt", "hang-closed");
      expect(standIn.arrived("wait:hang-closed").await(10, TimeUnit.SECONDS), "closed: the Wait never reached the stand-in");
      closing.close();
      AgentRuntimeException error = pending.handle((result, failure) -> failure == null ? null
          : AgentRuntimeException.unwrap(failure)).get(10, TimeUnit.SECONDS);
      expect(error != null && error.code() == Status.Code.CANCELLED && standIn.calls("wait:hang-closed") == 1,
          "the client closed: " + error + ", " + standIn.calls("wait:hang-closed") + " Waits, want 1");
    }
  }
}
