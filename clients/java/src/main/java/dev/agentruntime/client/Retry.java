package dev.agentruntime.client;

import io.grpc.Status;
import java.time.Duration;
import java.util.UUID;
import java.util.concurrent.ThreadLocalRandom;

/**
 * The client's one retry layer, shared by {@link AgentRuntimeClient}, {@link AgentRuntimeAsyncClient}
 * and {@link WatchStream}: which failures are tried again, how long to pause before the next
 * attempt, and the request id a mutating call carries on every attempt. The channel has no retry
 * policy of its own (no service config {@code retryPolicy}), so attempts are never multiplied.
 *
 * <p>A failed attempt is tried again when it failed with UNAVAILABLE, with a CANCELLED the caller
 * did not cause (grpc-core answers a call that reached a server as it began to shut down so:
 * grpc/grpc#41785), with the DEADLINE_EXCEEDED of the attempt's own deadline while the overall
 * one has not passed, or with any status whose details carry {@code google.rpc.RetryInfo}; never
 * once the caller gave up (an interrupt, a cancelled Context or future, the client closed).
 */
final class Retry {
  private Retry() {}

  /** The first pause is up to this long; it doubles per attempt. */
  static final Duration BACKOFF = Duration.ofMillis(100);
  /** The longest random pause (a RetryInfo's {@code retry_delay} may ask for longer). */
  static final Duration MAX_BACKOFF = Duration.ofSeconds(5);

  /**
   * Whether a failed attempt is tried again (see the class comment): never when {@code gaveUp} or
   * the client raised the CANCELLED itself; always with a RetryInfo; else on UNAVAILABLE, a
   * CANCELLED, or a DEADLINE_EXCEEDED when {@code ownDeadlinePassed} (the attempt's own deadline,
   * tighter than the overall one, has passed).
   */
  static boolean retryable(AgentRuntimeException error, boolean gaveUp, boolean ownDeadlinePassed) {
    if (gaveUp || error.isCancelledByClient()) {
      return false;
    }
    if (error.retryInfo().isPresent()) {
      return true;
    }
    return AgentRuntimeClient.isDrop(error, false)
        || (error.code() == Status.Code.DEADLINE_EXCEEDED && ownDeadlinePassed);
  }

  /** Full jitter: uniform in [0, min(5 s, 100 ms * 2^attempt)], attempt counted from 0. */
  static long jitterNanos(int attempt) {
    long ceiling = MAX_BACKOFF.toNanos();
    if (attempt < 32) {
      ceiling = Math.min(ceiling, BACKOFF.toNanos() << Math.max(attempt, 0));
    }
    return ThreadLocalRandom.current().nextLong(ceiling + 1);
  }

  /** The pause after failed attempt {@code attempt} (from 0): full jitter, and at least the error's RetryInfo delay. */
  static long pauseNanos(int attempt, AgentRuntimeException error) {
    return Math.max(jitterNanos(attempt), retryDelayNanos(error));
  }

  /** The error's RetryInfo {@code retry_delay} in nanoseconds; 0 when it has none (or a negative one). */
  static long retryDelayNanos(AgentRuntimeException error) {
    return error.retryDelay().map(delay -> delay.isNegative() ? 0 : Requests.saturatedNanos(delay)).orElse(0L);
  }

  /** The caller's request id, or a fresh random one (a UUID v4) when it gave none ({@code null} or empty). */
  static String requestId(String given) {
    return given == null || given.isEmpty() ? UUID.randomUUID().toString() : given;
  }
}
