package dev.agentruntime.client;

import dev.agentruntime.v1.AgentDef;
import dev.agentruntime.v1.AgentRuntimeGrpc;
import dev.agentruntime.v1.Answer;
import dev.agentruntime.v1.Budget;
import dev.agentruntime.v1.CreateRuntimeResponse;
import dev.agentruntime.v1.HandleView;
import dev.agentruntime.v1.InspectResponse;
import dev.agentruntime.v1.ListResponse;
import dev.agentruntime.v1.PostResponse;
import dev.agentruntime.v1.ResumeResponse;
import dev.agentruntime.v1.SpawnResponse;
import dev.agentruntime.v1.TaskResult;
import dev.agentruntime.v1.WaitResponse;
import dev.agentruntime.v1.WakeResponse;
import io.grpc.Context;
import io.grpc.ManagedChannel;
import io.grpc.stub.StreamObserver;
import java.time.Duration;
import java.util.List;
import java.util.Set;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.Executors;
import java.util.concurrent.RejectedExecutionException;
import java.util.concurrent.ScheduledExecutorService;
import java.util.concurrent.TimeUnit;
import java.util.function.BiConsumer;

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
 *   <li>{@link #waitFor} keeps waiting exactly as the blocking one does: repeated Waits of at most
 *       30 s each, past any default deadline, and through a dropped call (UNAVAILABLE, or a
 *       CANCELLED the caller did not cause: a restarting server, grpc/grpc#41785)
 *       with backoff until the run settles or the caller's {@code timeout} passes; no thread is
 *       held while it waits.
 *   <li>{@link #resume} is retried when dropped like the blocking one; Spawn, Wake, Post and
 *       CreateRuntime are not (a lost answer does not say whether they took effect).
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
  private final ScheduledExecutorService scheduler; // the retries' pauses (one daemon thread)
  private final Set<CompletableFuture<?>> pending = ConcurrentHashMap.newKeySet(); // waits, resumes, runs
  private volatile boolean closed;

  AgentRuntimeAsyncClient(ManagedChannel channel, Duration timeout) {
    this.channel = channel;
    this.stub = AgentRuntimeGrpc.newStub(channel);
    this.timeout = timeout;
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
   * One unary call on the async stub with this deadline ({@code null}: none). The call runs in a
   * cancellable context of its own, cancelled when the future completes (so cancelling the future
   * cancels the call); a fresh context under ROOT, so a call started from another call's callback
   * does not inherit that call's (soon cancelled) context.
   */
  private <T> CompletableFuture<T> call(Duration deadline, BiConsumer<AgentRuntimeGrpc.AgentRuntimeStub, StreamObserver<T>> rpc) {
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

  private <T> CompletableFuture<T> call(BiConsumer<AgentRuntimeGrpc.AgentRuntimeStub, StreamObserver<T>> rpc) {
    return call(timeout, rpc);
  }

  /** {@link AgentRuntimeClient#createRuntime(List, String)}: the runtime id. Not retried. */
  public CompletableFuture<String> createRuntime(List<AgentDef> agents, String runtimeId) {
    return this.<CreateRuntimeResponse>call((s, o) -> s.createRuntime(Requests.createRuntime(agents, runtimeId), o))
        .thenApply(response -> response.getRuntimeId());
  }

  /** A runtime with a generated id. */
  public CompletableFuture<String> createRuntime(List<AgentDef> agents) {
    return createRuntime(agents, "");
  }

  /** {@link AgentRuntimeClient#spawn(String, String, String, Budget)}: the handle id. Not retried. */
  public CompletableFuture<String> spawn(String runtimeId, String agent, String parent, Budget budget) {
    return this.<SpawnResponse>call((s, o) -> s.spawn(Requests.spawn(runtimeId, agent, parent, budget), o))
        .thenApply(response -> response.getHandleId());
  }

  /** {@link AgentRuntimeClient#post(String, String, String, String, String)}: the inbox size. Not retried. */
  public CompletableFuture<Integer> post(String runtimeId, String handleId, String text, String channel, String sender) {
    return this.<PostResponse>call((s, o) -> s.post(Requests.post(runtimeId, handleId, text, channel, sender), o))
        .thenApply(response -> response.getInboxSize());
  }

  /** {@link AgentRuntimeClient#wake}: whether the run was queued. Not retried. */
  public CompletableFuture<Boolean> wake(String runtimeId, String handleId, String prompt) {
    return this.<WakeResponse>call((s, o) -> s.wake(Requests.wake(runtimeId, handleId, prompt), o))
        .thenApply(response -> response.getQueued());
  }

  /** {@link AgentRuntimeClient#inspect}: the handle's view (retried by gRPC when dropped). */
  public CompletableFuture<HandleView> inspect(String runtimeId, String handleId) {
    return this.<InspectResponse>call((s, o) -> s.inspect(Requests.inspect(runtimeId, handleId), o)).thenApply(response -> response.getHandle());
  }

  /** {@link AgentRuntimeClient#listPage}: one page of List. */
  public CompletableFuture<ListResponse> listPage(String runtimeId, int pageSize, String pageToken) {
    return this.<ListResponse>call((s, o) -> s.list(Requests.list(runtimeId, pageSize, pageToken), o));
  }

  /**
   * {@link AgentRuntimeClient#waitFor(String, String, Duration)} without holding a thread: the
   * handle's settled (or PENDING) result however long the run takes, through a restarting server;
   * with a non-null {@code timeout}, the server's {@code STATUS_TIMEOUT} result once it has passed
   * (or the drop's UNAVAILABLE or CANCELLED, when the server is still away then).
   */
  public CompletableFuture<TaskResult> waitFor(String runtimeId, String handleId, Duration timeout) {
    CompletableFuture<TaskResult> result = track(new CompletableFuture<>());
    Long end = Requests.waitEnd(timeout);
    new Retrying<WaitResponse, TaskResult>(result, Integer.MAX_VALUE, end) {
      @Override
      CompletableFuture<WaitResponse> attempt() {
        Duration slice = Requests.nextSlice(end);
        return AgentRuntimeAsyncClient.this.<WaitResponse>call(slice.plus(AgentRuntimeClient.WAIT_MARGIN),
            (s, o) -> s.wait(Requests.waitSlice(runtimeId, handleId, slice), o));
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
   * {@link AgentRuntimeClient#resume}: the result the resumed handles settle on; retried while the
   * server is unavailable or drops the call, {@link AgentRuntimeClient#RESUME_ATTEMPTS} times in
   * all, with backoff.
   */
  public CompletableFuture<TaskResult> resume(String runtimeId, Answer answer) {
    CompletableFuture<TaskResult> result = track(new CompletableFuture<>());
    new Retrying<ResumeResponse, TaskResult>(result, AgentRuntimeClient.RESUME_ATTEMPTS, null) {
      @Override
      CompletableFuture<ResumeResponse> attempt() {
        return AgentRuntimeAsyncClient.this.<ResumeResponse>call((s, o) -> s.resume(Requests.resume(runtimeId, answer), o));
      }

      @Override
      boolean done(ResumeResponse response) {
        result.complete(response.getResult());
        return true;
      }
    }.start();
    return result;
  }

  /**
   * Spawn + Wake + Wait ({@link AgentRuntimeClient#run(String, String, String, String)}): the settled
   * (or PENDING) result of a fresh handle under {@code parent}. Cancelling the future cancels the
   * step under way (a spawned handle stays: close it).
   */
  public CompletableFuture<TaskResult> run(String runtimeId, String agent, String prompt, String parent) {
    CompletableFuture<TaskResult> result = track(new CompletableFuture<>());
    CompletableFuture<String> spawned = spawn(runtimeId, agent, parent, null);
    cancelWith(result, spawned);
    spawned.whenComplete((handleId, spawnError) -> {
      if (spawnError != null) {
        result.completeExceptionally(AgentRuntimeException.unwrap(spawnError));
        return;
      }
      CompletableFuture<Boolean> woken = wake(runtimeId, handleId, prompt);
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
   * A call repeated until {@link #done} says so, and retried when dropped (UNAVAILABLE, or a
   * CANCELLED the caller did not cause: {@link AgentRuntimeClient#isDrop}) after a pause (100 ms
   * doubling up to 5 s, full jitter: the blocking client's), at most {@code attempts} times in a
   * row and never past {@code end}; each retry resets the channel's connection backoff first.
   */
  private abstract class Retrying<R, T> {
    private final CompletableFuture<T> result;
    private final int attempts;
    private final Long end;
    private volatile CompletableFuture<R> current; // the call under way
    private int failures; // in a row; touched by one callback at a time

    Retrying(CompletableFuture<T> result, int attempts, Long end) {
      this.result = result;
      this.attempts = attempts;
      this.end = end;
      result.whenComplete((value, error) -> {
        CompletableFuture<R> call = current;
        if (call != null) {
          call.cancel(false); // cancelled or closed: the call under way too
        }
      });
    }

    abstract CompletableFuture<R> attempt();

    /** Completes {@code result} and returns true, or returns false to call again at once. */
    abstract boolean done(R response);

    void start() {
      next();
    }

    private void next() {
      if (result.isDone()) {
        return;
      }
      CompletableFuture<R> call = attempt();
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
        failures++;
        if (!AgentRuntimeClient.isDrop(failure, closed || channel.isShutdown()) || failures >= attempts
            || Requests.passed(end)) {
          result.completeExceptionally(failure);
          return;
        }
        long pause = Math.min(Requests.retryBackoffNanos(failures), Requests.remainingNanos(end));
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
