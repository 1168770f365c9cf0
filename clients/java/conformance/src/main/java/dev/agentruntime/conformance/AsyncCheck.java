package dev.agentruntime.conformance;

import dev.agentruntime.client.AgentRuntimeAsyncClient;
import dev.agentruntime.client.AgentRuntimeClient;
import dev.agentruntime.client.AgentRuntimeException;
import dev.agentruntime.v1.AgentDef;
import dev.agentruntime.v1.Delta;
import dev.agentruntime.v1.ForkRuntimeResponse;
import dev.agentruntime.v1.Answer;
import dev.agentruntime.v1.ApprovalPolicy;
import dev.agentruntime.v1.HandleState;
import dev.agentruntime.v1.HandleView;
import dev.agentruntime.v1.HttpTool;
import dev.agentruntime.v1.ListResponse;
import dev.agentruntime.v1.ReplayRuntimeResponse;
import dev.agentruntime.v1.RuntimeSummary;
import dev.agentruntime.v1.Script;
import dev.agentruntime.v1.ScriptedReply;
import dev.agentruntime.v1.ScriptedToolCall;
import dev.agentruntime.v1.Status;
import dev.agentruntime.v1.TaskResult;
import dev.agentruntime.v1.ToolDef;
import io.grpc.CallOptions;
import io.grpc.Channel;
import io.grpc.ClientCall;
import io.grpc.ClientInterceptor;
import io.grpc.MethodDescriptor;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.Objects;
import java.util.concurrent.CancellationException;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.CompletionException;
import java.util.concurrent.CopyOnWriteArrayList;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.stream.Collectors;

/**
 * The async client (AgentRuntimeAsyncClient), the pagination iterators and the builder's keepalive
 * and interceptor options against the real server at AGENTRUNTIME_ADDR (TLS and token from the
 * same variables as the runner): a 2 s run waited for through a client whose default deadline is
 * 1 s, an approval answered with resume, a typed NOT_FOUND, a cancelled wait, List's pages one
 * handle at a time, a fork and a replay (its 2 s root replayed past the 1 s deadline) listed as
 * forks of their source, and, with the restart hook, a wait and a streamRun across a server restart. Prints one line and exits 0, or says what differed and exits 1.
 */
public final class AsyncCheck {
  private AsyncCheck() {}

  private static void expect(boolean holds, String what) {
    if (!holds) {
      throw new IllegalStateException(what);
    }
  }

  private static <T> T await(CompletableFuture<T> future) throws Exception {
    return future.get(60, TimeUnit.SECONDS);
  }

  /** The streamer's reply: 7.6 s of pieces, long enough for the restart and the watch's reconnect. */
  private static final String STREAMED = "Streaming lets a person read an answer while the model is still writing it.";

  /**
   * streamRun of a turn killed mid-stream (SIGKILL) and run again after the restart: the watch
   * reconnects, a reset comes before the re-run's pieces, and what was joined, the reset clearing
   * the pieces before it, equals the result's text.
   */
  private static String streamAcrossRestart(AgentRuntimeClient client, String runtimeId, String hook) throws Exception {
    List<Delta> deltas = new CopyOnWriteArrayList<>();
    CountDownLatch someText = new CountDownLatch(5);
    CompletableFuture<TaskResult> streaming = CompletableFuture.supplyAsync(
        () -> client.streamRun(runtimeId, "streamer", "stream it", "root", delta -> {
          deltas.add(delta);
          if (delta.getPieceCase() == Delta.PieceCase.TEXT) {
            someText.countDown();
          }
        }));
    expect(someText.await(30, TimeUnit.SECONDS), "streamRun: no text within 30 s");
    int status = new ProcessBuilder("sh", "-c", hook).inheritIO().start().waitFor();
    expect(status == 0, "the restart hook exited with " + status);
    TaskResult streamed = await(streaming);
    String joined = Runner.joinText(deltas);
    long resets = deltas.stream().filter(Delta::hasReset).count();
    expect(streamed.getStatus() == Status.STATUS_DONE && streamed.getText().equals(STREAMED) && joined.equals(STREAMED)
        && resets >= 1, "streamRun across a restart: " + streamed.getStatus() + " " + resets + " resets, joined "
        + joined);
    return "streamRun across a restart mid-stream (" + resets + " reset, " + deltas.size() + " deltas joined to the result)";
  }

  /**
   * An async fork at the runtime's first event (its one root spawned, nothing held) and an async
   * replay of its one root (2 s of scripted delay, through the client's 1 s default deadline: the
   * replay's calls have their own), a blocking replay cut by a 500 ms timeout then waited on with
   * the same request id, then all three listed as forks of the runtime, and deleted.
   */
  private static String forkAndReplay(AgentRuntimeClient client, AgentRuntimeAsyncClient async, String runtimeId)
      throws Exception {
    ForkRuntimeResponse fork = await(async.forkRuntime(runtimeId, 1));
    expect(!fork.getRuntimeId().isEmpty() && fork.getForkSeq() >= 1 && fork.getHeldHandleIdsList().isEmpty(),
        "forkRuntime at seq 1: " + fork);
    HandleView spawned = await(async.inspect(fork.getRuntimeId(), "root/patient.1"));
    expect(spawned.getTurns() == 0 && spawned.getState() == HandleState.HANDLE_STATE_IDLE, "the fork's root/patient.1: " + spawned);
    ReplayRuntimeResponse replay = await(async.replayRuntime(runtimeId, null, null));
    expect(replay.getSettled() && replay.getDiffsCount() == 1 && replay.getChangedCount() == 0
        && replay.getDiffs(0).getHandleId().equals("root/patient.1") && replay.getDiffs(0).getChangedCount() == 0
        && replay.getDiffs(0).getReplayed().getText().equals("worth the wait"), "replayRuntime: " + replay);
    // The blocking helper under a caller's timeout shorter than the replay: unsettled; the same
    // request id again (another timeout, the same request): the same replay, settled.
    String requestId = java.util.UUID.randomUUID().toString();
    ReplayRuntimeResponse early = client.replayRuntime(runtimeId, null, null, "", requestId, Duration.ofMillis(500));
    ReplayRuntimeResponse later = client.replayRuntime(runtimeId, null, null, "", requestId, null);
    expect(!early.getSettled() && later.getSettled() && later.getRuntimeId().equals(early.getRuntimeId())
        && later.getDiffs(0).getChangedCount() == 0, "replayRuntime with a 500 ms timeout, then again: " + early + " / " + later);
    Map<String, RuntimeSummary> forks = client.listRuntimes(runtimeId).stream()
        .collect(Collectors.toMap(RuntimeSummary::getRuntimeId, summary -> summary));
    RuntimeSummary forkSummary = forks.get(fork.getRuntimeId());
    RuntimeSummary replaySummary = forks.get(replay.getRuntimeId());
    expect(forks.size() == 3 && forks.containsKey(later.getRuntimeId()) && forkSummary != null && replaySummary != null
        && forkSummary.getForkedFrom().equals(runtimeId) && forkSummary.getForkSeq() == fork.getForkSeq()
        && replaySummary.getForkedFrom().equals(runtimeId) && replaySummary.getForkSeq() == 0,
        "listRuntimes(forksOf " + runtimeId + "): " + forks.values());
    client.deleteRuntime(fork.getRuntimeId(), true);
    client.deleteRuntime(replay.getRuntimeId(), true);
    client.deleteRuntime(later.getRuntimeId(), true);
    return "fork at seq " + fork.getForkSeq() + " and replay (" + replay.getDiffsCount() + " diff, unchanged; unsettled "
        + "after a 500 ms timeout, then settled with the same request id) listed as forks";
  }

  public static void main(String[] args) throws Exception {
    String address = System.getenv().getOrDefault("AGENTRUNTIME_ADDR", "127.0.0.1:50051");
    List<AgentDef> agents = List.of(
        AgentDef.newBuilder()
            .setName("patient")
            .setDescription("answers after two seconds")
            .setScript(Script.newBuilder().addReplies(ScriptedReply.newBuilder()
                .setText("worth the wait").setTokens(7).setDelay(com.google.protobuf.Duration.newBuilder().setSeconds(2))))
            .build(),
        AgentDef.newBuilder()
            .setName("committer")
            .setDescription("asks before it commits")
            .addTools(ToolDef.newBuilder()
                .setName("commit")
                .setDescription("the commit tool")
                .setHttp(HttpTool.newBuilder().setUrl("http://127.0.0.1:9/refused")
                    .setTimeout(com.google.protobuf.Duration.newBuilder().setSeconds(2)))
                .setApproval(ApprovalPolicy.newBuilder().setRequired(true).setPrompt("Commit?")))
            .setScript(Script.newBuilder()
                .addReplies(ScriptedReply.newBuilder()
                    .addToolCalls(ScriptedToolCall.newBuilder().setName("commit").setArgumentsJson("{}"))
                    .setTokens(50))
                .addReplies(ScriptedReply.newBuilder().setText("reported").setTokens(50)))
            .build(),
        AgentDef.newBuilder()
            .setName("streamer")
            .setDescription("writes slowly, a character at a time")
            .setScript(Script.newBuilder().addReplies(ScriptedReply.newBuilder()
                .setText(STREAMED).setTokens(19).setStreamChunkChars(1)
                .setStreamPause(com.google.protobuf.Duration.newBuilder().setNanos(100_000_000))))
            .build());

    AtomicInteger intercepted = new AtomicInteger();
    ClientInterceptor counter = new ClientInterceptor() {
      @Override
      public <Q, R> ClientCall<Q, R> interceptCall(MethodDescriptor<Q, R> method, CallOptions options, Channel next) {
        intercepted.incrementAndGet();
        return next.newCall(method, options);
      }
    };
    int exitCode = 0;
    // A 1 s default deadline: the 2 s run is waited for past it all the same.
    try (AgentRuntimeClient client = Runner.connect(address, Duration.ofSeconds(1))) {
      AgentRuntimeAsyncClient async = client.async();
      String runtimeId = await(async.createRuntime(agents));

      TaskResult run = await(async.run(runtimeId, "patient", "take two seconds"));
      expect(run.getStatus() == Status.STATUS_DONE && run.getText().equals("worth the wait")
          && run.getOwnTokens() == 7 && run.getTotalTokens() == 7 && run.getTurns() == 1, "run: " + run);
      String forked = forkAndReplay(client, async, runtimeId);

      // spawn + wake + waitFor: PENDING on the approval, then resume.
      String committer = await(async.spawn(runtimeId, "committer", "root", null));
      expect(committer.equals("root/committer.1"), "spawn: " + committer);
      expect(await(async.wake(runtimeId, committer, "ship")), "wake: not queued");
      TaskResult pending = await(async.waitFor(runtimeId, committer));
      expect(pending.getStatus() == Status.STATUS_PENDING && pending.getPending().getKind().equals("approval"),
          "waitFor: " + pending);
      TaskResult resumed = await(async.resume(runtimeId,
          Answer.newBuilder().setId(pending.getPending().getId()).setOk(true).build()));
      expect(resumed.getStatus() == Status.STATUS_DONE && resumed.getTurns() == 2 && resumed.getTotalTokens() == 100
          && resumed.getToolCalls() == 1, "resume: " + resumed);
      HandleView view = await(async.inspect(runtimeId, committer));
      expect(view.getState() == HandleState.HANDLE_STATE_IDLE && view.getTurns() == 2, "inspect: " + view);

      // A typed error through the future: NOT_FOUND with its ResourceInfo.
      try {
        async.inspect(runtimeId, "root/nobody.1").join();
        expect(false, "inspect of root/nobody.1 succeeded");
      } catch (CompletionException failed) {
        AgentRuntimeException error = AgentRuntimeException.unwrap(failed);
        expect(error.isNotFound() && error.resourceInfo().map(info -> info.getResourceName()).orElse("")
            .contains("root/nobody.1"), "inspect of root/nobody.1: " + error + " " + error.details());
      }

      // Cancelling a wait cancels its call: the future says so, and the run goes on.
      String second = await(async.spawn(runtimeId, "patient", "root", null));
      await(async.wake(runtimeId, second, "again"));
      CompletableFuture<TaskResult> waiting = async.waitFor(runtimeId, second);
      expect(waiting.cancel(true) && waiting.isCancelled(), "cancel: not cancelled");
      try {
        waiting.join();
        expect(false, "a cancelled wait returned");
      } catch (CancellationException expected) {
        // as it should
      }
      TaskResult settled = await(async.waitFor(runtimeId, second, Duration.ofSeconds(30)));
      expect(settled.getStatus() == Status.STATUS_DONE, "wait after cancel: " + settled);

      // The pagination iterators: one handle per page, lazily; the streams over every page.
      List<String> pageIds = new ArrayList<>();
      int pages = 0;
      for (ListResponse page : client.listPages(runtimeId, 1)) {
        pages++;
        page.getHandlesList().forEach(handle -> pageIds.add(handle.getHandleId()));
      }
      List<String> streamed = client.listStream(runtimeId).map(HandleView::getHandleId).toList();
      expect(pages == 3 && pageIds.equals(List.of("root/patient.1", "root/committer.1", "root/patient.2"))
          && streamed.equals(pageIds), "listPages: " + pages + " pages " + pageIds + ", listStream " + streamed);
      long messages = client.transcriptStream(runtimeId, committer).count();
      expect(messages == client.transcript(runtimeId, committer).size() && messages > 0, "transcriptStream: " + messages);
      expect(client.listRuntimesStream().anyMatch(summary -> summary.getRuntimeId().equals(runtimeId)),
          "listRuntimesStream: no " + runtimeId);

      // A server killed (SIGKILL) and started again mid-wait, when the restart hook is there
      // (scripts/with-server.sh sets it): the async wait goes on through UNAVAILABLE, as the blocking one does.
      String restarted = "skipped (no AGENTRUNTIME_RESTART_HOOK)";
      String hook = System.getenv("AGENTRUNTIME_RESTART_HOOK");
      if (hook != null && !hook.isEmpty()) {
        String third = await(async.spawn(runtimeId, "patient", "root", null));
        await(async.wake(runtimeId, third, "through a restart"));
        CompletableFuture<TaskResult> across = async.waitFor(runtimeId, third);
        Thread.sleep(500);
        int status = new ProcessBuilder("sh", "-c", hook).inheritIO().start().waitFor();
        expect(status == 0, "the restart hook exited with " + status);
        TaskResult survived = await(across);
        expect(survived.getStatus() == Status.STATUS_DONE && survived.getTurns() == 1 && survived.getOwnTokens() == 7,
            "wait across a restart: " + survived);
        restarted = "survived a server restart";
        restarted += ", " + streamAcrossRestart(client, runtimeId, hook);
      }

      // The builder's keepalive and interceptor options, on a client of their own.
      AgentRuntimeClient.Builder builder = AgentRuntimeClient.newBuilder(address)
          .keepAlive(Duration.ofSeconds(10), Duration.ofSeconds(5))
          .intercept(counter);
      Runner.secure(builder);
      try (AgentRuntimeClient intercepting = builder.build()) {
        intercepting.inspect(runtimeId, committer);
        Objects.requireNonNull(intercepting.async().inspect(runtimeId, committer).get(60, TimeUnit.SECONDS));
      }
      expect(intercepted.get() == 2, "interceptor: saw " + intercepted.get() + " calls, not 2");

      client.deleteRuntime(runtimeId, true);
      System.out.println("async-check: ok (run " + run.getStatus().name() + " " + run.getTotalTokens()
          + " tokens past a 1 s deadline, resume " + resumed.getStatus().name() + " " + resumed.getTotalTokens()
          + " tokens, " + forked + ", NOT_FOUND typed, wait cancelled, async wait " + restarted + ", " + pages + " pages of 1, interceptor saw "
          + intercepted.get() + " calls)");
    } catch (IllegalStateException | AgentRuntimeException | java.util.concurrent.ExecutionException
        | java.util.concurrent.TimeoutException failure) {
      System.out.println("async-check: FAIL " + failure.getMessage());
      exitCode = 1;
    }
    System.exit(exitCode);
  }
}
