package dev.agentruntime.client;

import com.google.rpc.ErrorInfo;
import dev.agentruntime.v1.AgentRuntimeGrpc;
import dev.agentruntime.v1.Delta;
import dev.agentruntime.v1.DeltaReset;
import dev.agentruntime.v1.Event;
import dev.agentruntime.v1.SpawnRequest;
import dev.agentruntime.v1.SpawnResponse;
import dev.agentruntime.v1.TaskResult;
import dev.agentruntime.v1.TurnEnded;
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
import io.grpc.stub.ServerCallStreamObserver;
import io.grpc.stub.StreamObserver;
import java.net.InetAddress;
import java.net.InetSocketAddress;
import java.util.ArrayList;
import java.util.List;
import java.util.Queue;
import java.util.concurrent.ConcurrentLinkedQueue;
import java.util.concurrent.CopyOnWriteArrayList;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.Executors;
import java.util.concurrent.ScheduledExecutorService;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.stream.Collectors;

/**
 * {@link AgentRuntimeClient#streamRun} against a stand-in AgentRuntime service on a loopback port in
 * this JVM (no server of ours), whose Watch plays one planned stream per call: responses, then the
 * stream dropped (a status), ended, or left open. It shows that the helper
 *
 * <ul>
 *   <li>spawns with a request id, watches from seq 0 with {@code deltas} and {@code batch}, and
 *       wakes (with a request id, the same on a retried attempt) only once the Watch has sent its
 *       first response, on the stream reopened when the first one dropped before it (a real
 *       provider's turn streams only to the watchers subscribed when it starts);
 *   <li>reconnects from the last event's seq (deltas do not move it) and hands over the handle's
 *       deltas once each when the server sends the turn in progress again from index 0, a
 *       {@code reset} every time it comes, and no other handle's (a sibling's, a child's);
 *   <li>returns the handle's first result, not another handle's;
 *   <li>counts a delta not seen before (not a reset) as progress, as an event (a long turn with
 *       more than 5 drops, a new piece between each two, goes on, and so does one that streams for
 *       longer than the retry window between two drops), but not a piece sent again or a reset
 *       (drops in a row with only those between them are given up on after 5 reconnects);
 *   <li>ends with the consumer's own exception (the stream cancelled), and with CANCELLED when the
 *       client is closed under it;
 *   <li>takes batched events ({@code WatchResponse.events}) and single ones ({@code event}, a server
 *       from before batches) alike, among deltas, and reconnects from the last event of the last batch;
 * </ul>
 *
 * and that a plain {@code watch} asks for batches but no deltas, skips a delta sent all the same,
 * hands a batch's events over one at a time in order ({@code lastSeq()} moving with each) and
 * reconnects after the last event of the last batch. Run by {@link ClientCheck}.
 */
final class StreamRunCheck {
  private StreamRunCheck() {}

  private static final String HANDLE = "root/writer.1";

  private static void expect(boolean holds, String what) {
    if (!holds) {
      throw new IllegalStateException("streamRun: " + what);
    }
  }

  /**
   * One planned Watch stream: its responses ({@code pauseMs} apart), then {@code end} (an error),
   * completed, or held open.
   */
  private static final class Planned {
    final List<WatchResponse> responses;
    final long pauseMs;
    final StatusRuntimeException end; // null: completed, unless held
    final boolean held;

    Planned(List<WatchResponse> responses, long pauseMs, StatusRuntimeException end, boolean held) {
      this.responses = responses;
      this.pauseMs = pauseMs;
      this.end = end;
      this.held = held;
    }
  }

  private static Planned dropped(StatusRuntimeException end, WatchResponse... responses) {
    return new Planned(List.of(responses), 0, end, false);
  }

  private static Planned droppedSlowly(long pauseMs, StatusRuntimeException end, WatchResponse... responses) {
    return new Planned(List.of(responses), pauseMs, end, false);
  }

  private static Planned ended(WatchResponse... responses) {
    return new Planned(List.of(responses), 0, null, false);
  }

  private static Planned held(WatchResponse... responses) {
    return new Planned(List.of(responses), 0, null, true);
  }

  /** RESOURCE_EXHAUSTED with WATCH_LAGGING: reconnected at once (no backoff), so the check stays fast. */
  private static StatusRuntimeException lagging() {
    com.google.rpc.Status status = com.google.rpc.Status.newBuilder()
        .setCode(Status.Code.RESOURCE_EXHAUSTED.value())
        .setMessage("stand-in: too far behind")
        .addDetails(com.google.protobuf.Any.pack(
            ErrorInfo.newBuilder().setReason(WatchStream.WATCH_LAGGING).setDomain("agentruntime.dev").build()))
        .build();
    return io.grpc.protobuf.StatusProto.toStatusRuntimeException(status);
  }

  private static WatchResponse event(long seq, String handleId) {
    return WatchResponse.newBuilder().setEvent(Event.newBuilder().setSeq(seq).setHandleId(handleId)).build();
  }

  private static WatchResponse turnEnded(long seq, String handleId, long turn) {
    return WatchResponse.newBuilder().setEvent(Event.newBuilder().setSeq(seq).setHandleId(handleId)
        .setTurnEnded(TurnEnded.newBuilder().setTurn(turn))).build();
  }

  private static WatchResponse result(long seq, String handleId, String text) {
    return WatchResponse.newBuilder().setEvent(Event.newBuilder().setSeq(seq).setHandleId(handleId)
        .setResult(TaskResult.newBuilder().setHandleId(handleId).setText(text)
            .setStatus(dev.agentruntime.v1.Status.STATUS_DONE))).build();
  }

  /** One batched response ({@code events}) of the events of single-event responses, in their order. */
  private static WatchResponse batch(WatchResponse... singles) {
    WatchResponse.Builder batch = WatchResponse.newBuilder();
    for (WatchResponse single : singles) {
      batch.addEvents(single.getEvent());
    }
    return batch.build();
  }

  private static WatchResponse text(String handleId, long turn, long index, String text) {
    return WatchResponse.newBuilder().setDelta(Delta.newBuilder().setHandleId(handleId).setTurn(turn).setIndex(index)
        .setText(text)).build();
  }

  private static WatchResponse reset(String handleId, long turn) {
    return WatchResponse.newBuilder().setDelta(Delta.newBuilder().setHandleId(handleId).setTurn(turn).setIndex(0)
        .setReset(DeltaReset.newBuilder().setReason("retry"))).build();
  }

  /** The stand-in: Spawn names the handle {@code parent/agent.1}, Wake queues, Watch plays the plan. */
  private static final class StandIn extends AgentRuntimeGrpc.AgentRuntimeImplBase {
    final Queue<Planned> plan = new ConcurrentLinkedQueue<>();
    final List<WatchRequest> watches = new CopyOnWriteArrayList<>();
    final List<String> requestIds = new CopyOnWriteArrayList<>(); // Spawn's, then Wake's (each attempt)
    volatile CountDownLatch cancelled = new CountDownLatch(1); // a Watch the client cancelled
    // When each Wake attempt came: {n, k}, n Watch calls so far, k responses sent on the last one
    // (counted before each response goes, so a Wake that follows one is never seen as early).
    final List<int[]> wakes = new CopyOnWriteArrayList<>();
    final AtomicInteger sentOnLatest = new AtomicInteger();
    volatile int wakeFailures; // UNAVAILABLE answers before a Wake is taken

    void reset(Planned... streams) {
      plan.clear();
      plan.addAll(List.of(streams));
      watches.clear();
      requestIds.clear();
      cancelled = new CountDownLatch(1);
      wakes.clear();
      sentOnLatest.set(0);
      wakeFailures = 0;
    }

    @Override
    public void spawn(SpawnRequest request, StreamObserver<SpawnResponse> observer) {
      requestIds.add(request.getRequestId());
      observer.onNext(SpawnResponse.newBuilder().setHandleId(request.getParentId() + "/" + request.getAgent() + ".1").build());
      observer.onCompleted();
    }

    @Override
    public void wake(WakeRequest request, StreamObserver<WakeResponse> observer) {
      requestIds.add(request.getRequestId());
      wakes.add(new int[] {watches.size(), sentOnLatest.get()});
      if (wakeFailures > 0) {
        wakeFailures--;
        observer.onError(Status.UNAVAILABLE.withDescription("stand-in: wake dropped").asRuntimeException());
        return;
      }
      observer.onNext(WakeResponse.newBuilder().setQueued(true).build());
      observer.onCompleted();
    }

    @Override
    public void watch(WatchRequest request, StreamObserver<WatchResponse> observer) {
      sentOnLatest.set(0);
      watches.add(request);
      CountDownLatch latch = cancelled;
      ((ServerCallStreamObserver<WatchResponse>) observer).setOnCancelHandler(latch::countDown);
      Planned stream = plan.poll();
      if (stream == null) {
        return; // nothing planned: held open
      }
      for (int i = 0; i < stream.responses.size(); i++) {
        if (i > 0 && stream.pauseMs > 0) {
          sleep(stream.pauseMs);
        }
        sentOnLatest.incrementAndGet();
        observer.onNext(stream.responses.get(i));
      }
      if (stream.end != null) {
        observer.onError(stream.end);
      } else if (!stream.held) {
        observer.onCompleted();
      }
    }
  }

  private static void sleep(long millis) {
    try {
      Thread.sleep(millis);
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
    }
  }

  /** What a delta stands for in the checks: its text, or "<reset>". */
  private static String piece(Delta delta) {
    return delta.hasReset() ? "<reset>" : delta.getText();
  }

  /**
   * Every Wake attempt came on Watch call {@code watch} (1 the first), after it sent its first
   * response: the Wake that starts the turn never precedes the subscription that streams it.
   */
  private static void wokeOnceWatching(StandIn standIn, int watch, int attempts) {
    List<String> seen = standIn.wakes.stream().map(w -> "after " + w[1] + " responses of Watch call " + w[0])
        .collect(Collectors.toList());
    expect(standIn.wakes.size() == attempts && standIn.wakes.stream().allMatch(w -> w[0] == watch && w[1] >= 1),
        "want " + attempts + " Wake attempt(s), each after the first response of Watch call " + watch + ": " + seen);
  }

  /** Runs the checks; returns what they showed, or throws IllegalStateException saying what differed. */
  static String run() throws Exception {
    StandIn standIn = new StandIn();
    Server server = NettyServerBuilder
        .forAddress(new InetSocketAddress(InetAddress.getLoopbackAddress(), 0), InsecureServerCredentials.create())
        .addService(standIn)
        .build()
        .start();
    String target = "127.0.0.1:" + server.getPort();
    try {
      try (AgentRuntimeClient client = AgentRuntimeClient.newBuilder(target).build()) {
        replayedOnce(client, standIn);
        wakeAfterReconnect(client, standIn);
        freshDeltasAreProgress(client, standIn);
        replaysAreNoProgress(client, standIn);
        consumerFails(client, standIn);
        plainWatch(client, standIn);
        batchedWatch(client, standIn);
        batchedStreamRun(client, standIn);
      }
      try (AgentRuntimeClient shortWindow = AgentRuntimeClient.newBuilder(target)
          .retryWindow(java.time.Duration.ofMillis(500)).build()) {
        freshDeltasRestartTheWindow(shortWindow, standIn);
      }
      clientClosed(target, standIn);
    } finally {
      server.shutdownNow();
      server.awaitTermination(5, TimeUnit.SECONDS);
    }
    return "streamRun: Spawn, Watch from seq 0 with deltas and batches, Wake after the Watch's first response (on "
        + "the reopened stream after a drop before it; its retry with the same request id), reconnected from the last event's "
        + "seq; a turn sent again from index 0 handed over once, a reset each time, no other handle's deltas; the "
        + "handle's first result; a new piece is progress (8 drops, one between each two, and a turn longer than "
        + "the window between drops go on), pieces sent again and resets are not (5 reconnects at most); the "
        + "consumer's exception and a closed client end it; a plain watch asks for batches, no deltas; batches of "
        + "events (with single events and deltas between them) handed over one at a time in order, reconnected "
        + "after the last event of the last batch";
  }

  /**
   * Two reconnects in the middle of turn 1: the turn comes again from index 0 each time, with a
   * reset in it after the first; a sibling's and a child's deltas and a sibling's result pass by.
   */
  private static void replayedOnce(AgentRuntimeClient client, StandIn standIn) {
    String sibling = "root/other.1";
    String child = HANDLE + "/helper.1";
    standIn.reset(
        dropped(lagging(), event(1, HANDLE), event(2, HANDLE), text(sibling, 1, 0, "nope"),
            text(HANDLE, 1, 0, "Hel"), text(HANDLE, 1, 1, "lo")),
        ended(text(HANDLE, 1, 0, "Hel"), text(HANDLE, 1, 1, "lo"), text(HANDLE, 1, 2, ", w"),
            reset(HANDLE, 1), text(HANDLE, 1, 1, "Hi")),
        held(reset(HANDLE, 1), text(HANDLE, 1, 1, "Hi"), text(HANDLE, 1, 2, " there"), turnEnded(3, HANDLE, 1),
            text(child, 1, 0, "nope"), result(4, sibling, "not this one"), result(5, HANDLE, "Hi there"),
            result(6, HANDLE, "a second run")));
    List<Delta> deltas = new ArrayList<>();
    TaskResult result = client.streamRun("rt", "writer", "write it", "root", deltas::add);

    expect(result.getHandleId().equals(HANDLE) && result.getText().equals("Hi there"),
        "the result: " + result.getHandleId() + " " + result.getText());
    List<String> pieces = deltas.stream().map(StreamRunCheck::piece).collect(Collectors.toList());
    List<String> want = List.of("Hel", "lo", ", w", "<reset>", "Hi", "<reset>", "Hi", " there");
    expect(pieces.equals(want), "deltas handed over " + pieces + ", want " + want);
    expect(deltas.stream().allMatch(d -> d.getHandleId().equals(HANDLE)), "another handle's delta: " + deltas);
    List<String> asked = standIn.watches.stream()
        .map(StreamRunCheck::asked).collect(Collectors.toList());
    expect(asked.equals(List.of("rt@0+deltas+batch", "rt@2+deltas+batch", "rt@2+deltas+batch")),
        "watches asked: " + asked);
    expect(standIn.requestIds.size() == 2 && standIn.requestIds.stream().noneMatch(String::isEmpty)
        && !standIn.requestIds.get(0).equals(standIn.requestIds.get(1)), "Spawn and Wake request ids: " + standIn.requestIds);
    wokeOnceWatching(standIn, 1, 1);
  }

  /**
   * The first Watch drops before it sends anything, and the first Wake attempt is dropped: the Wake
   * waits for the reopened stream's first response, and its retry carries the same request id.
   */
  private static void wakeAfterReconnect(AgentRuntimeClient client, StandIn standIn) {
    standIn.reset(
        dropped(lagging()),
        held(event(1, HANDLE), text(HANDLE, 1, 0, "Hi"), result(2, HANDLE, "Hi")));
    standIn.wakeFailures = 1;
    StringBuilder joined = new StringBuilder();
    TaskResult result = client.streamRun("rt", "writer", "write it", "root", d -> joined.append(d.getText()));
    expect(result.getText().equals("Hi") && joined.toString().equals("Hi"), "after a reconnect: " + joined + " / "
        + result.getText());
    wokeOnceWatching(standIn, 2, 2);
    List<String> ids = standIn.requestIds;
    expect(ids.size() == 3 && ids.get(1).equals(ids.get(2)) && !ids.get(1).isEmpty() && !ids.get(0).equals(ids.get(1)),
        "Spawn's and the two Wake attempts' request ids: " + ids);
  }

  /**
   * Eight drops in a row with no event between them, but a piece not seen before in each stream (a
   * long turn, the stream cut again and again): each is progress, as an event is, so the watch goes
   * on to the result.
   */
  private static void freshDeltasAreProgress(AgentRuntimeClient client, StandIn standIn) {
    List<Planned> streams = new ArrayList<>();
    for (int index = 0; index < 8; index++) {
      List<WatchResponse> responses = new ArrayList<>();
      if (index == 0) {
        responses.add(event(1, HANDLE));
      }
      for (int i = 0; i <= index; i++) {
        responses.add(text(HANDLE, 1, i, Integer.toString(i)));
      }
      streams.add(dropped(lagging(), responses.toArray(new WatchResponse[0])));
    }
    streams.add(held(text(HANDLE, 1, 8, "8"), result(2, HANDLE, "012345678")));
    standIn.reset(streams.toArray(new Planned[0]));
    StringBuilder joined = new StringBuilder();
    TaskResult result = client.streamRun("rt", "writer", "write it", "root", d -> joined.append(d.getText()));
    expect(result.getText().equals("012345678") && joined.toString().equals("012345678") && standIn.watches.size() == 9,
        "8 drops with a new piece between each two: " + joined + " / " + result.getText() + " after "
            + standIn.watches.size() + " streams");
  }

  /**
   * Drops in a row with deltas but no event, and nothing new among them: the turn's pieces sent
   * again from index 0, and a reset (handed over every time, but no progress). After the 5
   * reconnects a watch makes without progress the last failure is thrown (a server that sends a
   * turn again and drops each time is given up on, as the other clients do).
   */
  private static void replaysAreNoProgress(AgentRuntimeClient client, StandIn standIn) {
    List<Planned> streams = new ArrayList<>();
    streams.add(dropped(lagging(), event(1, HANDLE), text(HANDLE, 1, 0, "0"), text(HANDLE, 1, 1, "1")));
    for (int i = 0; i < 7; i++) {
      streams.add(dropped(lagging(), text(HANDLE, 1, 0, "0"), text(HANDLE, 1, 1, "1"), reset(HANDLE, 2)));
    }
    streams.add(held(result(2, HANDLE, "never reached")));
    standIn.reset(streams.toArray(new Planned[0]));
    List<String> pieces = new ArrayList<>();
    AgentRuntimeException error = null;
    try {
      client.streamRun("rt", "writer", "write it", "root", d -> pieces.add(piece(d)));
    } catch (AgentRuntimeException e) {
      error = e;
    }
    List<String> want = List.of("0", "1", "<reset>", "<reset>", "<reset>", "<reset>", "<reset>");
    expect(error != null && error.code() == Status.Code.RESOURCE_EXHAUSTED && standIn.watches.size() == 6
        && pieces.equals(want), "drops with only pieces sent again and resets between them: " + error + " after "
        + standIn.watches.size() + " streams, deltas " + pieces + ", want " + want);
  }

  /**
   * With a 500 ms retry window: a drop, then a stream whose deltas come 700 ms apart before it drops
   * again. The new piece after the reconnect is progress, so the second drop starts a new run of
   * failures and is reconnected (a turn that streams for longer than the window between two drops
   * is not cut).
   */
  private static void freshDeltasRestartTheWindow(AgentRuntimeClient client, StandIn standIn) {
    standIn.reset(
        dropped(lagging(), event(1, HANDLE), text(HANDLE, 1, 0, "slow")),
        droppedSlowly(700, lagging(), text(HANDLE, 1, 0, "slow"), text(HANDLE, 1, 1, "ly"), text(HANDLE, 1, 2, " so")),
        held(result(2, HANDLE, "slowly so")));
    StringBuilder joined = new StringBuilder();
    TaskResult result = client.streamRun("rt", "writer", "write it", "root", d -> joined.append(d.getText()));
    expect(result.getText().equals("slowly so") && joined.toString().equals("slowly so") && standIn.watches.size() == 3,
        "a drop 1.4 s after the last one, deltas between: " + joined + " / " + result.getText() + " after "
            + standIn.watches.size() + " streams");
  }

  /** The consumer's exception ends streamRun as it is, and the Watch is cancelled. */
  private static void consumerFails(AgentRuntimeClient client, StandIn standIn) throws InterruptedException {
    standIn.reset(held(event(1, HANDLE), text(HANDLE, 1, 0, "boom")));
    IllegalArgumentException thrown = null;
    try {
      client.streamRun("rt", "writer", "write it", "root", d -> {
        throw new IllegalArgumentException("the consumer's own");
      });
    } catch (IllegalArgumentException e) {
      thrown = e;
    }
    expect(thrown != null && thrown.getMessage().equals("the consumer's own"), "the consumer's exception: " + thrown);
    expect(standIn.cancelled.await(5, TimeUnit.SECONDS), "the Watch was not cancelled after the consumer's exception");
  }

  /** A Watch call as the checks compare them: runtime@after_seq, +deltas, +batch. */
  private static String asked(WatchRequest request) {
    return request.getRuntimeId() + "@" + request.getAfterSeq() + (request.getDeltas() ? "+deltas" : "")
        + (request.getBatch() ? "+batch" : "");
  }

  /**
   * A plain watch sends deltas=false and batch=true, and a delta sent all the same is not taken for
   * an event.
   */
  private static void plainWatch(AgentRuntimeClient client, StandIn standIn) {
    standIn.reset(held(text(HANDLE, 1, 0, "stray"), event(1, HANDLE)));
    try (WatchStream events = client.watch("rt", 0)) {
      Event first = events.next();
      expect(first.getSeq() == 1 && events.lastSeq() == 1, "a plain watch's first event: seq " + first.getSeq());
    }
    expect(asked(standIn.watches.get(0)).equals("rt@0+batch"), "a plain watch asked " + asked(standIn.watches.get(0)));
  }

  /**
   * A plain watch of batches: two batches of several events, the stream dropped after them, then a
   * batch and a single event (as a server from before batches sends it) on the reopened one. The
   * events come one at a time, in order, each once, {@code lastSeq()} moving with each, and the
   * reconnect asks for the seqs after the last event of the last batch (5).
   */
  private static void batchedWatch(AgentRuntimeClient client, StandIn standIn) {
    standIn.reset(
        dropped(lagging(), batch(event(1, HANDLE), event(2, HANDLE), event(3, HANDLE)),
            batch(event(4, HANDLE), event(5, HANDLE))),
        held(batch(event(6, HANDLE), event(7, HANDLE)), event(8, HANDLE)));
    List<String> seen = new ArrayList<>();
    ScheduledExecutorService timer = Executors.newSingleThreadScheduledExecutor();
    try (WatchStream events = client.watch("rt", 0)) {
      timer.schedule((Runnable) events::close, 10, TimeUnit.SECONDS); // a client that waits for more ends
      for (int i = 0; i < 8 && events.hasNext(); i++) {
        Event event = events.next();
        seen.add(event.getSeq() + (events.lastSeq() == event.getSeq() ? "" : " (lastSeq " + events.lastSeq() + ")"));
      }
    } finally {
      timer.shutdownNow();
    }
    List<String> want = List.of("1", "2", "3", "4", "5", "6", "7", "8");
    expect(seen.equals(want), "a batched watch handed over " + seen + ", want " + want);
    List<String> asked = standIn.watches.stream().map(StreamRunCheck::asked).collect(Collectors.toList());
    expect(asked.equals(List.of("rt@0+batch", "rt@5+batch")), "a batched watch asked " + asked);
  }

  /**
   * streamRun on batches: a batch (the handle's spawn and a sibling's event) and the turn's first
   * pieces, a drop, then the turn again from index 0 and its last piece, and a batch holding the
   * TurnEnded, a sibling's result, the handle's result and an event after it. The Wake follows the
   * first batch, the reconnect asks from the last event of that batch (2), each piece is handed over
   * once, and the result is the handle's.
   */
  private static void batchedStreamRun(AgentRuntimeClient client, StandIn standIn) throws Exception {
    String sibling = "root/other.1";
    standIn.reset(
        dropped(lagging(), batch(event(1, HANDLE), event(2, sibling)), text(HANDLE, 1, 0, "Hel"),
            text(HANDLE, 1, 1, "lo")),
        held(text(HANDLE, 1, 0, "Hel"), text(HANDLE, 1, 1, "lo"), text(HANDLE, 1, 2, "!"),
            batch(turnEnded(3, HANDLE, 1), result(4, sibling, "not this one"), result(5, HANDLE, "Hello!"),
                event(6, HANDLE))));
    List<Delta> deltas = new ArrayList<>();
    ScheduledExecutorService timer = Executors.newSingleThreadScheduledExecutor();
    Context.CancellableContext bounded = Context.current().withDeadlineAfter(10, TimeUnit.SECONDS, timer);
    TaskResult result;
    try {
      result = bounded.call(() -> client.streamRun("rt", "writer", "write it", "root", deltas::add));
    } catch (AgentRuntimeException e) {
      throw new IllegalStateException("streamRun on batches: " + e, e);
    } finally {
      bounded.cancel(null);
      timer.shutdownNow();
    }
    List<String> pieces = deltas.stream().map(StreamRunCheck::piece).collect(Collectors.toList());
    expect(result.getHandleId().equals(HANDLE) && result.getText().equals("Hello!")
        && pieces.equals(List.of("Hel", "lo", "!")), "streamRun on batches: " + pieces + " / " + result.getText());
    List<String> asked = standIn.watches.stream().map(StreamRunCheck::asked).collect(Collectors.toList());
    expect(asked.equals(List.of("rt@0+deltas+batch", "rt@2+deltas+batch")), "streamRun on batches asked " + asked);
    wokeOnceWatching(standIn, 1, 1);
  }

  /** Closing the client under a streamRun ends it with the client's own CANCELLED. */
  private static void clientClosed(String target, StandIn standIn) {
    standIn.reset(held(event(1, HANDLE), text(HANDLE, 1, 0, "still writing")));
    ScheduledExecutorService timer = Executors.newSingleThreadScheduledExecutor();
    AgentRuntimeException error = null;
    try (AgentRuntimeClient client = AgentRuntimeClient.newBuilder(target).build()) {
      List<Delta> deltas = new CopyOnWriteArrayList<>();
      timer.schedule((Runnable) client::close, 300, TimeUnit.MILLISECONDS);
      try {
        client.streamRun("rt", "writer", "write it", "root", deltas::add);
      } catch (AgentRuntimeException e) {
        error = e;
      }
      expect(deltas.size() == 1, "deltas before the close: " + deltas.size());
    } finally {
      timer.shutdownNow();
    }
    expect(error != null && error.code() == Status.Code.CANCELLED && error.isCancelledByClient(),
        "a streamRun under a closed client: " + error);
  }
}
