package dev.agentruntime.client;

import dev.agentruntime.v1.AgentDef;
import dev.agentruntime.v1.AgentRuntimeGrpc;
import dev.agentruntime.v1.Answer;
import dev.agentruntime.v1.Budget;
import dev.agentruntime.v1.CreateRuntimeRequest;
import dev.agentruntime.v1.CreateRuntimeResponse;
import dev.agentruntime.v1.ForkMessage;
import dev.agentruntime.v1.ForkRuntimeRequest;
import dev.agentruntime.v1.ForkRuntimeResponse;
import dev.agentruntime.v1.HandleView;
import dev.agentruntime.v1.InspectRequest;
import dev.agentruntime.v1.InspectResponse;
import dev.agentruntime.v1.ListRequest;
import dev.agentruntime.v1.ListResponse;
import dev.agentruntime.v1.PostRequest;
import dev.agentruntime.v1.PostResponse;
import dev.agentruntime.v1.ReplayRuntimeRequest;
import dev.agentruntime.v1.ReplayRuntimeResponse;
import dev.agentruntime.v1.ResumeRequest;
import dev.agentruntime.v1.ResumeResponse;
import dev.agentruntime.v1.SpawnRequest;
import dev.agentruntime.v1.SpawnResponse;
import dev.agentruntime.v1.TaskResult;
import dev.agentruntime.v1.UnrecordedCalls;
import dev.agentruntime.v1.WaitRequest;
import dev.agentruntime.v1.WaitResponse;
import dev.agentruntime.v1.WakeRequest;
import dev.agentruntime.v1.WakeResponse;
import io.grpc.Context;
import io.grpc.ManagedChannel;
import io.grpc.stub.StreamObserver;
import java.time.Duration;
import java.util.List;
import java.util.Objects;
import java.util.Set;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.Executors;
import java.util.concurrent.RejectedExecutionException;
import java.util.concurrent.ScheduledExecutorService;
import java.util.concurrent.TimeUnit;
import java.util.function.BiConsumer;
import java.util.function.Function;

/**
 * The future-based variant of {@link AgentRuntimeClient} for the main calls: each method returns at
 * once a {@link CompletableFuture} that completes with what the blocking method returns, or
 * exceptionally with the same {@link AgentRuntimeException} (from {@code join()}: wrapped in a
 * {@code CompletionException}; {@link AgentRuntimeException#unwrap} takes it out). Get it with
 * {@link AgentRuntimeClient#async()}: it shares the blocking client's channel, default deadline,
 * request conversions, and its waiting and retry rules.
 *
 * <pre>{@code
 * AgentRuntimeAsyncClient async = client.async();
 * async.run(runtimeId, "coordinator", "map the repo")
 *     .thenAccept(result -> System.out.println(result.getStatus() + " " + result.getTotalTokens()))
 *     .exceptionally(error -> {
 *       AgentRuntimeException e = AgentRuntimeException.unwrap(error);
 *       System.err.println(e.code() + ": " + e.description());
 *       return null;
 *     });
 * }</pre>
 *
 * <ul>
 *   <li>Every call is retried as the blocking client's are (UNAVAILABLE, a CANCELLED the caller
 *       did not cause as a restarting server sends: grpc/grpc#41785, an attempt's own
 *       DEADLINE_EXCEEDED, any status with a RetryInfo; full jitter, at least the RetryInfo's
 *       delay; within the retry window from the call's start), with no thread held during the
 *       pauses; the mutating ones (CreateRuntime, Spawn, Post, Wake, Resume, ForkRuntime,
 *       ReplayRuntime) carry a request id,
 *       the caller's or one generated once per call, on every attempt. The builder's
 *       {@code retries(false)} makes every call once.
 *   <li>{@link #waitFor} keeps waiting exactly as the blocking one does: repeated Waits of at most
 *       30 s each, past any default deadline, and through failures in a row for up to the retry
 *       window, until the run settles or the caller's {@code timeout} passes; {@link #replayRuntime}
 *       waits for a replay to settle the same way.
 *   <li>Cancelling a returned future cancels its call (and stops a wait's or a retry's next
 *       attempt). Closing the client completes the pending ones with CANCELLED (never retried).
 *   <li>The futures complete on gRPC's threads: chain blocking work with the {@code ...Async}
 *       stages and an executor of your own.
 * </ul>
 */
public final class AgentRuntimeAsyncClient {
  private final ManagedChannel channel;
  private final AgentRuntimeGrpc.AgentRuntimeStub stub;
  private final Duration timeout;
  private final boolean retries;
  private final long windowNanos;
  private final ScheduledExecutorService scheduler; // the retries' pauses (one daemon thread)
  private final Set<CompletableFuture<?>> pending = ConcurrentHashMap.newKeySet(); // every call under way
  private volatile boolean closed;

  AgentRuntimeAsyncClient(ManagedChannel channel, Duration timeout, boolean retries, Duration window) {
    this.channel = channel;
    this.stub = AgentRuntimeGrpc.newStub(channel);
    this.timeout = timeout;
    this.retries = retries;
    this.windowNanos = Math.min(Requests.saturatedNanos(window), Long.MAX_VALUE / 4);
    this.scheduler = Executors.newSingleThreadScheduledExecutor(runnable -> {
      Thread thread = new Thread(runnable, "agentruntime-async-retry");
      thread.setDaemon(true);
      return thread;
    });
  }

  /** Fails the pending operations with CANCELLED and stops the retry timer (the client's close()). */
  void shutdownScheduler() {
    closed = true;
    scheduler.shutdownNow();
    AgentRuntimeException cancelled = AgentRuntimeException.cancelledByClient("the client was closed", null);
    for (CompletableFuture<?> future : List.copyOf(pending)) {
      future.completeExceptionally(cancelled);
    }
  }

  /**
   * One attempt of a unary call on the async stub with this deadline ({@code null}: none). It runs in a
   * cancellable context of its own, cancelled when the future completes (so cancelling the future
   * cancels the call); a fresh context under ROOT, so a call started from another call's callback
   * does not inherit that call's (soon cancelled) context.
   */
  private <T> CompletableFuture<T> attempt(Duration deadline,
      BiConsumer<AgentRuntimeGrpc.AgentRuntimeStub, StreamObserver<T>> rpc) {
    CompletableFuture<T> future = new CompletableFuture<>();
    AgentRuntimeGrpc.AgentRuntimeStub target =
        deadline == null ? stub : stub.withDeadlineAfter(deadline.toNanos(), TimeUnit.NANOSECONDS);
    Context.CancellableContext context = Context.ROOT.withCancellation();
    future.whenComplete((value, error) -> context.cancel(null));
    context.run(() -> {
      try {
        rpc.accept(target, new StreamObserver<T>() {
          private T value;

          @Override
          public void onNext(T response) {
            value = response;
          }

          @Override
          public void onError(Throwable error) {
            future.completeExceptionally(AgentRuntimeException.fromThrowable(error));
          }

          @Override
          public void onCompleted() {
            future.complete(value);
          }
        });
      } catch (RuntimeException error) {
        future.completeExceptionally(AgentRuntimeException.fromThrowable(error));
      }
    });
    return future;
  }

  /**
   * A unary call through the retry loop (see {@link Retrying}), its result {@code answer} of the
   * response. The returned future is the loop's own, so cancelling it cancels the attempt under
   * way and stops the retries.
   */
  private <R, T> CompletableFuture<T> call(BiConsumer<AgentRuntimeGrpc.AgentRuntimeStub, StreamObserver<R>> rpc,
      Function<R, T> answer) {
    CompletableFuture<T> result = track(new CompletableFuture<>());
    new Retrying<R, T>(result, null, false) {
      @Override
      Duration deadline(long leftNanos) {
        if (!retries) {
          return timeout;
        }
        long own = timeout == null ? leftNanos : Math.min(Requests.saturatedNanos(timeout), leftNanos);
        return Duration.ofNanos(Math.max(own, 1));
      }

      @Override
      CompletableFuture<R> attempt(Duration deadline) {
        return AgentRuntimeAsyncClient.this.attempt(deadline, rpc);
      }

      @Override
      boolean done(R response) {
        result.complete(answer.apply(response));
        return true;
      }
    }.start();
    return result;
  }

  /** {@link AgentRuntimeClient#createRuntime(List, String)}: the runtime id (retried, with a generated request id). */
  public CompletableFuture<String> createRuntime(List<AgentDef> agents, String runtimeId) {
    return createRuntime(agents, runtimeId, null);
  }

  /** {@link AgentRuntimeClient#createRuntime(List, String, String)}: with this request id ({@code null}: generated). */
  public CompletableFuture<String> createRuntime(List<AgentDef> agents, String runtimeId, String requestId) {
    CreateRuntimeRequest request = Requests.createRuntime(agents, runtimeId, Retry.requestId(requestId));
    return call((s, o) -> s.createRuntime(request, o), CreateRuntimeResponse::getRuntimeId);
  }

  /** A runtime with a generated id. */
  public CompletableFuture<String> createRuntime(List<AgentDef> agents) {
    return createRuntime(agents, "");
  }

  /** {@link AgentRuntimeClient#spawn(String, String, String, Budget)}: the handle id (retried, with a generated request id). */
  public CompletableFuture<String> spawn(String runtimeId, String agent, String parent, Budget budget) {
    return spawn(runtimeId, agent, parent, budget, null);
  }

  /** {@link AgentRuntimeClient#spawn(String, String, String, Budget, String)}: with this request id ({@code null}: generated). */
  public CompletableFuture<String> spawn(String runtimeId, String agent, String parent, Budget budget, String requestId) {
    SpawnRequest request = Requests.spawn(runtimeId, agent, parent, budget, Retry.requestId(requestId));
    return call((s, o) -> s.spawn(request, o), SpawnResponse::getHandleId);
  }

  /**
   * {@link AgentRuntimeClient#post(String, String, String, String, String)}: the inbox size (retried,
   * with a generated request id).
   */
  public CompletableFuture<Integer> post(String runtimeId, String handleId, String text, String channel, String sender) {
    return post(runtimeId, handleId, text, channel, sender, null);
  }

  /**
   * {@link AgentRuntimeClient#post(String, String, String, String, String, String)}: with this request
   * id ({@code null}: generated).
   */
  public CompletableFuture<Integer> post(String runtimeId, String handleId, String text, String channel, String sender,
      String requestId) {
    PostRequest request = Requests.post(runtimeId, handleId, text, channel, sender, Retry.requestId(requestId));
    return call((s, o) -> s.post(request, o), PostResponse::getInboxSize);
  }

  /** {@link AgentRuntimeClient#wake}: whether the run was queued (retried, with a generated request id). */
  public CompletableFuture<Boolean> wake(String runtimeId, String handleId, String prompt) {
    return wake(runtimeId, handleId, prompt, null);
  }

  /** {@link AgentRuntimeClient#wake(String, String, String, String)}: with this request id ({@code null}: generated). */
  public CompletableFuture<Boolean> wake(String runtimeId, String handleId, String prompt, String requestId) {
    WakeRequest request = Requests.wake(runtimeId, handleId, prompt, Retry.requestId(requestId));
    return call((s, o) -> s.wake(request, o), WakeResponse::getQueued);
  }

  /** {@link AgentRuntimeClient#inspect}: the handle's view. */
  public CompletableFuture<HandleView> inspect(String runtimeId, String handleId) {
    InspectRequest request = Requests.inspect(runtimeId, handleId);
    return call((s, o) -> s.inspect(request, o), InspectResponse::getHandle);
  }

  /** {@link AgentRuntimeClient#listPage}: one page of List. */
  public CompletableFuture<ListResponse> listPage(String runtimeId, int pageSize, String pageToken) {
    ListRequest request = Requests.list(runtimeId, pageSize, pageToken);
    return call((s, o) -> s.list(request, o), Function.<ListResponse>identity());
  }

  /**
   * {@link AgentRuntimeClient#waitFor(String, String, Duration)} without holding a thread: the
   * handle's settled (or PENDING) result however long the run takes, through a restarting server;
   * with a non-null {@code timeout}, the server's {@code STATUS_TIMEOUT} result once it has passed
   * (or the last failure, when the server is still away then, or after a retry window of failures
   * in a row).
   */
  public CompletableFuture<TaskResult> waitFor(String runtimeId, String handleId, Duration timeout) {
    CompletableFuture<TaskResult> result = track(new CompletableFuture<>());
    Long end = Requests.waitEnd(timeout);
    new Retrying<WaitResponse, TaskResult>(result, end, true) {
      private Duration slice; // the server-side wait of the attempt under way

      @Override
      Duration deadline(long leftNanos) {
        slice = Requests.nextSlice(end);
        return slice.plus(AgentRuntimeClient.WAIT_MARGIN);
      }

      @Override
      CompletableFuture<WaitResponse> attempt(Duration deadline) {
        WaitRequest request = Requests.waitSlice(runtimeId, handleId, slice);
        return AgentRuntimeAsyncClient.this.<WaitResponse>attempt(deadline, (s, o) -> s.wait(request, o));
      }

      @Override
      boolean done(WaitResponse response) {
        TaskResult settled = response.getResult();
        if (settled.getStatus() != dev.agentruntime.v1.Status.STATUS_TIMEOUT || Requests.passed(end)) {
          result.complete(settled);
          return true;
        }
        return false; // the server's slice ran out: wait again
      }
    }.start();
    return result;
  }

  /** Waits until the handle settles (or suspends), however long that takes. */
  public CompletableFuture<TaskResult> waitFor(String runtimeId, String handleId) {
    return waitFor(runtimeId, handleId, null);
  }

  /**
   * {@link AgentRuntimeClient#resume}: the result the resumed handles settle on (retried, with a
   * generated request id: a repeat runs nothing again).
   */
  public CompletableFuture<TaskResult> resume(String runtimeId, Answer answer) {
    return resume(runtimeId, answer, null);
  }

  /** {@link AgentRuntimeClient#resume(String, Answer, String)}: with this request id ({@code null}: generated). */
  public CompletableFuture<TaskResult> resume(String runtimeId, Answer answer, String requestId) {
    ResumeRequest request = Requests.resume(runtimeId, answer, Retry.requestId(requestId));
    return call((s, o) -> s.resume(request, o), ResumeResponse::getResult);
  }

  /**
   * {@link AgentRuntimeClient#forkRuntime(String, long)}: the fork's id, {@code fork_seq} and held
   * handles (retried, with a generated request id: a repeat forks nothing more).
   */
  public CompletableFuture<ForkRuntimeResponse> forkRuntime(String sourceRuntimeId, long atSeq) {
    return forkRuntime(sourceRuntimeId, atSeq, null, null, null, "", null);
  }

  /**
   * {@link AgentRuntimeClient#forkRuntime(String, long, List, List, List, String, String)}: with the
   * changes at the fork, the fork's id and this request id (each {@code null}: none, or generated).
   */
  public CompletableFuture<ForkRuntimeResponse> forkRuntime(String sourceRuntimeId, long atSeq, List<AgentDef> agents,
      List<ForkMessage> messages, List<Answer> answers, String runtimeId, String requestId) {
    Objects.requireNonNull(sourceRuntimeId, "sourceRuntimeId");
    return forkRuntime(Requests.forkRuntime(sourceRuntimeId, atSeq, agents, messages, answers, runtimeId,
        Retry.requestId(requestId)));
  }

  /** {@link AgentRuntimeClient#forkRuntime(ForkRuntimeRequest)}: the whole request, its request id generated when empty. */
  public CompletableFuture<ForkRuntimeResponse> forkRuntime(ForkRuntimeRequest request) {
    ForkRuntimeRequest sent = Requests.forkRuntime(Objects.requireNonNull(request, "request"));
    return call((s, o) -> s.forkRuntime(sent, o), Function.<ForkRuntimeResponse>identity());
  }

  /**
   * {@link AgentRuntimeClient#replayRuntime(String, List, UnrecordedCalls)} without holding a thread:
   * the recording and the replay side by side once every root of the replay has settled.
   */
  public CompletableFuture<ReplayRuntimeResponse> replayRuntime(String sourceRuntimeId, List<AgentDef> agents,
      UnrecordedCalls unrecordedCalls) {
    return replayRuntime(sourceRuntimeId, agents, unrecordedCalls, "", null, null);
  }

  /**
   * {@link AgentRuntimeClient#replayRuntime(String, List, UnrecordedCalls, String, String, Duration)}:
   * with the replay's id, this request id and the caller's {@code timeout} (each {@code null}:
   * generated, or none).
   */
  public CompletableFuture<ReplayRuntimeResponse> replayRuntime(String sourceRuntimeId, List<AgentDef> agents,
      UnrecordedCalls unrecordedCalls, String runtimeId, String requestId, Duration timeout) {
    Objects.requireNonNull(sourceRuntimeId, "sourceRuntimeId");
    return replayRuntime(Requests.replayRuntime(sourceRuntimeId, agents, unrecordedCalls, runtimeId,
        Retry.requestId(requestId)), timeout);
  }

  /**
   * {@link AgentRuntimeClient#replayRuntime(ReplayRuntimeRequest, Duration)} without holding a
   * thread: ReplayRuntime with one request id, each call asking the server to wait at most 30 s
   * (its deadline 10 s past that), sent again while the answer says {@code settled: false}, and
   * retried as a Wait is; with a non-null {@code timeout}, the last answer once it has passed.
   */
  public CompletableFuture<ReplayRuntimeResponse> replayRuntime(ReplayRuntimeRequest request, Duration timeout) {
    ReplayRuntimeRequest sent = Requests.replayRuntime(Objects.requireNonNull(request, "request"));
    CompletableFuture<ReplayRuntimeResponse> result = track(new CompletableFuture<>());
    Long end = Requests.waitEnd(timeout);
    new Retrying<ReplayRuntimeResponse, ReplayRuntimeResponse>(result, end, true) {
      private Duration slice; // the server-side wait of the attempt under way

      @Override
      Duration deadline(long leftNanos) {
        slice = Requests.nextSlice(end);
        return slice.plus(AgentRuntimeClient.WAIT_MARGIN);
      }

      @Override
      CompletableFuture<ReplayRuntimeResponse> attempt(Duration deadline) {
        ReplayRuntimeRequest attempt = Requests.replaySlice(sent, slice);
        return AgentRuntimeAsyncClient.this.<ReplayRuntimeResponse>attempt(deadline,
            (s, o) -> s.replayRuntime(attempt, o));
      }

      @Override
      boolean done(ReplayRuntimeResponse response) {
        if (response.getSettled() || Requests.passed(end)) {
          result.complete(response);
          return true;
        }
        return false; // the server's slice ran out: ask again, with the same request id
      }
    }.start();
    return result;
  }

  /**
   * Spawn + Wake + Wait ({@link AgentRuntimeClient#run(String, String, String, String)}): the settled
   * (or PENDING) result of a fresh handle under {@code parent}, its Spawn and its Wake each with a
   * request id generated once. Cancelling the future cancels the step under way (a spawned handle
   * stays: close it).
   */
  public CompletableFuture<TaskResult> run(String runtimeId, String agent, String prompt, String parent) {
    return run(runtimeId, agent, prompt, parent, null, null);
  }

  /** {@link #run(String, String, String, String)} with the request ids of its Spawn and its Wake ({@code null}: generated). */
  public CompletableFuture<TaskResult> run(String runtimeId, String agent, String prompt, String parent,
      String spawnRequestId, String wakeRequestId) {
    CompletableFuture<TaskResult> result = track(new CompletableFuture<>());
    CompletableFuture<String> spawned = spawn(runtimeId, agent, parent, null, spawnRequestId);
    cancelWith(result, spawned);
    spawned.whenComplete((handleId, spawnError) -> {
      if (spawnError != null) {
        result.completeExceptionally(AgentRuntimeException.unwrap(spawnError));
        return;
      }
      CompletableFuture<Boolean> woken = wake(runtimeId, handleId, prompt, wakeRequestId);
      cancelWith(result, woken);
      woken.whenComplete((queued, wakeError) -> {
        if (wakeError != null) {
          result.completeExceptionally(AgentRuntimeException.unwrap(wakeError));
          return;
        }
        CompletableFuture<TaskResult> waited = waitFor(runtimeId, handleId, null);
        cancelWith(result, waited);
        waited.whenComplete((settled, waitError) -> {
          if (waitError != null) {
            result.completeExceptionally(AgentRuntimeException.unwrap(waitError));
          } else {
            result.complete(settled);
          }
        });
      });
    });
    return result;
  }

  /** Spawn + Wake + Wait of a fresh top-level handle. */
  public CompletableFuture<TaskResult> run(String runtimeId, String agent, String prompt) {
    return run(runtimeId, agent, prompt, "root");
  }

  /** Cancels {@code step} when {@code outcome} completes first (cancelled, failed, or the client closed). */
  private static void cancelWith(CompletableFuture<?> outcome, CompletableFuture<?> step) {
    outcome.whenComplete((value, error) -> step.cancel(false));
  }

  /** Registers an operation, so that closing the client fails it; it unregisters when done. */
  private <T> CompletableFuture<T> track(CompletableFuture<T> future) {
    pending.add(future);
    future.whenComplete((value, error) -> pending.remove(future));
    if (closed) {
      future.completeExceptionally(AgentRuntimeException.cancelledByClient("the client was closed", null));
    }
    return future;
  }

  /**
   * A call repeated until {@link #done} says so, and retried as {@link Retry#retryable} says after
   * {@link Retry#pauseNanos} (full jitter from 100 ms doubling to 5 s, at least a RetryInfo's
   * delay), each retry resetting the channel's connection backoff first; never past {@code end}
   * (the caller's, null: none) nor past the retry window: from the call's start for a unary call,
   * from the first of a run of failures in a row for a Wait ({@code slices}: a success starts it
   * again). With retries off a failure completes the result at once.
   */
  private abstract class Retrying<R, T> {
    private final CompletableFuture<T> result;
    private final Long end;
    private final boolean slices;
    private long windowEnd; // System.nanoTime() when the window ends
    private volatile CompletableFuture<R> current; // the attempt under way
    private int failures; // in a row; touched by one callback at a time

    Retrying(CompletableFuture<T> result, Long end, boolean slices) {
      this.result = result;
      this.end = end;
      this.slices = slices;
      result.whenComplete((value, error) -> {
        CompletableFuture<R> call = current;
        if (call != null) {
          call.cancel(false); // cancelled or closed: the call under way too
        }
      });
    }

    /** The next attempt's deadline ({@code null}: none), with {@code leftNanos} left of the window. */
    abstract Duration deadline(long leftNanos);

    abstract CompletableFuture<R> attempt(Duration deadline);

    /** Completes {@code result} and returns true, or returns false to call again at once. */
    abstract boolean done(R response);

    void start() {
      windowEnd = System.nanoTime() + windowNanos;
      next();
    }

    private void next() {
      if (result.isDone()) {
        return;
      }
      long start = System.nanoTime();
      long left = slices ? Long.MAX_VALUE : windowEnd - start;
      Duration deadline = deadline(left);
      CompletableFuture<R> call = attempt(deadline);
      current = call;
      if (result.isDone()) {
        call.cancel(false);
        return;
      }
      call.whenComplete((response, error) -> {
        if (result.isDone()) {
          return;
        }
        if (error == null) {
          failures = 0;
          if (!done(response)) {
            next();
          }
          return;
        }
        AgentRuntimeException failure = AgentRuntimeException.unwrap(error);
        long now = System.nanoTime();
        if (slices && failures == 0) {
          windowEnd = now + windowNanos;
        }
        boolean ownDeadlinePassed = deadline != null && deadline.toNanos() < left
            && now - (start + deadline.toNanos()) >= 0;
        if (!retries || !Retry.retryable(failure, closed || channel.isShutdown(), ownDeadlinePassed)
            || Requests.passed(end)) {
          result.completeExceptionally(failure);
          return;
        }
        long pause = Retry.pauseNanos(failures, failure);
        if (pause >= Math.min(windowEnd - now, Requests.remainingNanos(end))) {
          result.completeExceptionally(failure); // the window (or the caller's timeout) ends first
          return;
        }
        failures++;
        try {
          scheduler.schedule(() -> {
            channel.resetConnectBackoff(); // try the server now, not at the channel's own backoff
            next();
          }, pause, TimeUnit.NANOSECONDS);
        } catch (RejectedExecutionException closing) {
          result.completeExceptionally(failure);
        }
      });
    }
  }
}
