package dev.agentruntime.client;

import com.google.rpc.ErrorInfo;
import dev.agentruntime.v1.AgentRuntimeGrpc;
import dev.agentruntime.v1.Event;
import dev.agentruntime.v1.WatchRequest;
import dev.agentruntime.v1.WatchResponse;
import io.grpc.Context;
import io.grpc.Status;
import io.grpc.StatusRuntimeException;
import java.time.Duration;
import java.util.ArrayDeque;
import java.util.Iterator;
import java.util.List;
import java.util.NoSuchElementException;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.ThreadLocalRandom;
import java.util.concurrent.TimeUnit;
import java.util.function.Consumer;

/**
 * A runtime's events, in order and once each, over the Watch stream, opened by
 * {@link AgentRuntimeClient#watch}: a blocking {@link Iterator} that never ends by itself, and an
 * {@link AutoCloseable} that stops it.
 *
 * <ul>
 *   <li>Every stream it opens asks for batches ({@code WatchRequest.batch}): the server sends the
 *       events at hand together in one response's {@code events}, and they are handed over one at a
 *       time, in order, as from one event a response (which a server from before batches sends, in
 *       {@code event}, and which is taken as well). {@link #lastSeq()} moves with each event handed
 *       over, so a reconnect goes on after the last event of the last batch.
 *   <li>{@link #hasNext()} blocks until the next event arrives; it is {@code false} only once the
 *       stream is closed (by {@link #close()}, from any thread, or by closing the client).
 *   <li>A dropped stream (UNAVAILABLE, or a CANCELLED the caller did not cause, which a grpc-core
 *       server that begins to shut down sends, grpc/grpc#41785; RESOURCE_EXHAUSTED with
 *       {@code ErrorInfo} reason {@code WATCH_LAGGING}, when this consumer fell too far behind; or the server ending the
 *       stream, as one that shuts down does) is reopened from the last seq seen ({@link #lastSeq()}),
 *       so nothing is missed or seen twice. Before each reconnect but a lagging one it waits the
 *       backoff (1 s by default), doubling per failure in a row, plus up to half again at random
 *       (so that the watchers of a restarted server do not all come back at once), 30 s at most.
 *   <li>A status carrying {@code google.rpc.RetryInfo} is reconnected too, after at least its
 *       {@code retry_delay}.
 *   <li>After {@code maxRetries} (5 by default) reconnects in a row with no event between them (in
 *       the watch of {@link AgentRuntimeClient#streamRun}: nor a delta not seen before, other than a
 *       reset), or once a run of failures in a row would last longer than the client's retry window
 *       (60 s by default: {@link AgentRuntimeClient.Builder#retryWindow}), the last failure is thrown by
 *       {@link #hasNext()} as an {@link AgentRuntimeException}, and so is any
 *       other status at once (NOT_FOUND for an unknown runtime, PERMISSION_DENIED, ...). An interrupt
 *       of the iterating thread throws CANCELLED (with its interrupt flag set again), and so does a
 *       cancelled Context of the iterating thread. The stream is closed then.
 * </ul>
 *
 * <p>The stream has no deadline. Iterate it from one thread at a time.
 */
public final class WatchStream implements Iterator<Event>, AutoCloseable {
  /** Reconnects in a row, with no event between them, before the failure is thrown. */
  static final int MAX_RETRIES = 5;
  /**
   * The wait before the first reconnect; it doubles per failure in a row (plus up to half again, at
   * random), so the default 5 reconnects span at least 31 s: a server's graceful stop (its running
   * turns get up to 10 s to reach a journal point) and its start again.
   */
  static final Duration BACKOFF = Duration.ofSeconds(1);
  /** The longest wait before a reconnect, however many {@code maxRetries} allows (as in the other clients). */
  static final Duration MAX_BACKOFF = Duration.ofSeconds(30);
  /** The reason of the RESOURCE_EXHAUSTED that drops a consumer that fell too far behind. */
  static final String WATCH_LAGGING = "WATCH_LAGGING";

  private static final System.Logger LOG = System.getLogger(WatchStream.class.getName());

  private final AgentRuntimeGrpc.AgentRuntimeBlockingStub stub;
  private final Runnable resetConnectBackoff;
  private final String runtimeId;
  private final int maxRetries;
  private final Duration backoff;
  private final long windowNanos; // the longest run of failures in a row
  private final Consumer<WatchStream> onClose; // tells the client the watch is closed
  private final DeltaFilter deltas; // null: a watch of events only (no WatchRequest.deltas)

  private final Object lock = new Object();
  private final CountDownLatch closedLatch = new CountDownLatch(1); // cuts a backoff short
  private Context.CancellableContext context; // guarded by lock: the open stream's; null when none
  private volatile boolean closed;

  // The iterating thread's.
  private Iterator<WatchResponse> responses; // null: no stream open
  private final ArrayDeque<Event> batch = new ArrayDeque<>(); // the last response's events not yet handed over
  private Event next; // fetched by hasNext(), not yet returned by next()
  private volatile long lastSeq;
  private int failures; // reconnects since the last event (or fresh delta)
  private long failingUntil; // System.nanoTime() when the window of this run of failures ends

  /**
   * A watch from {@code afterSeq}; with {@code deltas} (else null) it asks for deltas too and hands
   * each one to {@code deltas} on the iterating thread, from {@link #hasNext()}, as it arrives.
   */
  WatchStream(AgentRuntimeGrpc.AgentRuntimeBlockingStub stub, Runnable resetConnectBackoff, String runtimeId,
      long afterSeq, int maxRetries, Duration backoff, Duration window, Consumer<WatchStream> onClose,
      DeltaFilter deltas) {
    this.stub = stub;
    this.resetConnectBackoff = resetConnectBackoff;
    this.runtimeId = runtimeId;
    this.lastSeq = afterSeq;
    this.maxRetries = maxRetries;
    this.backoff = backoff;
    this.windowNanos = Math.min(Requests.saturatedNanos(window), Long.MAX_VALUE / 4);
    this.onClose = onClose;
    this.deltas = deltas;
  }

  /** The runtime being watched. */
  public String runtimeId() {
    return runtimeId;
  }

  /**
   * The seq of the last event received (returned by {@link #next()}, or held by {@link #hasNext()});
   * the {@code afterSeq} it was opened with before the first. A new watch from it goes on where this
   * one stopped.
   */
  public long lastSeq() {
    return lastSeq;
  }

  /** Whether the stream was closed. */
  public boolean isClosed() {
    return closed;
  }

  /**
   * Blocks until the next event (then {@code true}) or the stream is closed ({@code false}).
   *
   * @throws AgentRuntimeException a status that is not reconnected, or one after {@code maxRetries}
   *     failed reconnects in a row or a retry window of failures; CANCELLED when the thread is interrupted
   */
  @Override
  public boolean hasNext() {
    if (next != null) {
      return true;
    }
    while (!closed) {
      Event pending = batch.poll();
      if (pending != null) {
        hold(pending);
        return true;
      }
      if (responses == null && !open()) {
        return false;
      }
      WatchResponse response;
      try {
        response = responses.hasNext() ? responses.next() : null;
      } catch (StatusRuntimeException e) {
        endStream();
        if (closed) {
          return false; // close() cancelled it
        }
        AgentRuntimeException error = AgentRuntimeException.fromThrowable(e);
        if (Thread.currentThread().isInterrupted()) {
          close();
          throw error; // CANCELLED by the interrupt (grpc set the flag again)
        }
        boolean lagging = error.code() == Status.Code.RESOURCE_EXHAUSTED
            && error.errorInfo().map(ErrorInfo::getReason).orElse("").equals(WATCH_LAGGING);
        boolean dropped = Retry.retryable(error, Context.current().isCancelled(), false);
        if (!(lagging || dropped)) {
          close();
          throw error;
        }
        backOff("dropped (" + error.getMessage() + ")", error, lagging);
        continue;
      }
      if (response == null) {
        // The server ended the stream (it is shutting down): reopen it like a drop.
        endStream();
        backOff("ended by the server",
            new AgentRuntimeException(Status.Code.UNAVAILABLE, "the server ended the Watch stream", List.of()), false);
        continue;
      }
      if (response.hasDelta()) {
        // A piece not seen before is progress, as an event is: a long turn with several drops
        // goes on. One sent again after a reconnect, or a reset, is not: a server that sends a
        // turn again and drops each time is given up on after maxRetries.
        // Outside the try: the consumer's exception is no drop.
        if (deltas != null && deltas.accept(response.getDelta())) {
          failures = 0;
        }
        continue;
      }
      if (response.getEventsCount() == 0) {
        hold(response.getEvent()); // a server from before batches: one event a response, in `event`
        return true;
      }
      batch.addAll(response.getEventsList()); // handed over one at a time, from the top of the loop
    }
    return false;
  }

  /** Holds {@code event} for {@link #next()}: progress, and the seq a reconnect goes on after. */
  private void hold(Event event) {
    failures = 0;
    if (deltas != null) {
      deltas.forget(event);
    }
    lastSeq = event.getSeq();
    next = event;
  }

  /**
   * Waits before reconnecting after a failure (not after a lagging one), or closes the stream and
   * throws {@code failure} when {@code maxRetries} or the retry window of this run of failures in a
   * row is spent.
   */
  private void backOff(String why, AgentRuntimeException failure, boolean lagging) {
    long now = System.nanoTime();
    if (failures == 0) {
      failingUntil = now + windowNanos;
    }
    long pause = lagging ? 0 : Math.max(backoffNanos(backoff, failures), Retry.retryDelayNanos(failure));
    if (failures >= maxRetries || pause >= failingUntil - now) {
      close();
      throw failure;
    }
    LOG.log(System.Logger.Level.WARNING, "Watch of runtime {0} {1}; reconnecting from seq {2} in {3} ms",
        runtimeId, why, lastSeq, TimeUnit.NANOSECONDS.toMillis(pause));
    if (!lagging) {
      pause(pause);
      resetConnectBackoff.run(); // connect now, not at the channel's own (up to 2 min) backoff
    }
    failures++;
  }

  /** The next event, blocking until it arrives. */
  @Override
  public Event next() {
    if (!hasNext()) {
      throw new NoSuchElementException("the Watch stream is closed");
    }
    Event event = next;
    next = null;
    return event;
  }

  /** Stops watching: cancels the stream (a blocked {@link #hasNext()} returns {@code false}). Idempotent. */
  @Override
  public void close() {
    Context.CancellableContext open;
    synchronized (lock) {
      if (closed) {
        return;
      }
      closed = true;
      open = context;
      context = null;
    }
    closedLatch.countDown();
    if (open != null) {
      open.cancel(null);
    }
    onClose.accept(this);
  }

  /** Opens a stream from {@link #lastSeq} in a cancellable context; {@code false} when closed. */
  private boolean open() {
    WatchRequest request = WatchRequest.newBuilder()
        .setRuntimeId(runtimeId).setAfterSeq(lastSeq).setDeltas(deltas != null).setBatch(true).build();
    synchronized (lock) {
      if (closed) {
        return false;
      }
      Context.CancellableContext opened = Context.current().withCancellation();
      Context previous = opened.attach();
      try {
        responses = stub.watch(request); // the call is bound to `opened`: cancelling it ends the call
      } catch (RuntimeException e) {
        opened.cancel(null);
        throw e instanceof StatusRuntimeException ? AgentRuntimeException.fromThrowable(e) : e;
      } finally {
        opened.detach(previous);
      }
      context = opened;
      return true;
    }
  }

  private void endStream() {
    responses = null;
    Context.CancellableContext open;
    synchronized (lock) {
      open = context;
      context = null;
    }
    if (open != null) {
      open.cancel(null);
    }
  }

  /**
   * {@code backoff} doubled per failure in a row, plus up to half of it again at random, and at most
   * {@link #MAX_BACKOFF}.
   */
  static long backoffNanos(Duration backoff, int failures) {
    long cap = MAX_BACKOFF.toNanos();
    long nanos = backoff.compareTo(MAX_BACKOFF) < 0 ? backoff.toNanos() : cap;
    for (int i = 0; i < failures && nanos < cap; i++) {
      nanos *= 2;
    }
    nanos = Math.min(nanos, cap);
    return Math.min(cap, nanos + ThreadLocalRandom.current().nextLong(nanos / 2 + 1));
  }

  /** Waits, cut short by close(); throws CANCELLED (flag set again) when interrupted. */
  private void pause(long nanos) {
    try {
      closedLatch.await(nanos, TimeUnit.NANOSECONDS);
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
      close();
      throw AgentRuntimeClient.interrupted(e);
    }
  }
}
