package dev.agentruntime.client;

import java.time.Duration;

/**
 * The client's defaults that need no server, from inside its package (this class is in the
 * conformance project, never in the released jar): keepalive is on unless turned off, and a Watch
 * waits at most 30 s before a reconnect, as the other clients do; and, against stand-in services on
 * loopback ports in this JVM, that a CANCELLED the caller did not cause is retried like
 * UNAVAILABLE and the client's own is not ({@link DroppedCallCheck}), and the retry loop and
 * request ids ({@link RetryCheck}), and the stream-run helper ({@link StreamRunCheck}); and the typed-result decoder
 * ({@link OutputCheck}). Prints one
 * line and exits 0, or says what differed and exits 1.
 */
public final class ClientCheck {
  private ClientCheck() {}

  private static void expect(boolean holds, String what) {
    if (!holds) {
      throw new IllegalStateException(what);
    }
  }

  public static void main(String[] args) {
    int exitCode = 0;
    try {
      // Without pings a Watch or a worker behind a NAT or a dead proxy waits forever.
      AgentRuntimeClient.Builder defaults = AgentRuntimeClient.newBuilder("127.0.0.1:1");
      expect(Duration.ofSeconds(60).equals(defaults.keepAliveTime)
          && Duration.ofSeconds(20).equals(defaults.keepAliveTimeout) && !defaults.keepAliveWithoutCalls,
          "default keepalive: " + defaults.keepAliveTime + " / " + defaults.keepAliveTimeout + " / without calls "
              + defaults.keepAliveWithoutCalls + ", want PT1M / PT20S / false");
      defaults.build().close(); // grpc-java takes the values (it connects lazily)
      AgentRuntimeClient.Builder off = AgentRuntimeClient.newBuilder("127.0.0.1:1").noKeepAlive();
      expect(off.keepAliveTime == null, "noKeepAlive: " + off.keepAliveTime);
      off.build().close();
      AgentRuntimeClient.Builder custom = AgentRuntimeClient.newBuilder("127.0.0.1:1")
          .keepAlive(Duration.ofSeconds(15), Duration.ofSeconds(5)).keepAliveWithoutCalls(true);
      expect(Duration.ofSeconds(15).equals(custom.keepAliveTime) && Duration.ofSeconds(5).equals(custom.keepAliveTimeout)
          && custom.keepAliveWithoutCalls, "keepAlive(15 s, 5 s): " + custom.keepAliveTime + " / " + custom.keepAliveTimeout);

      // The Watch's reconnect pause: the first one within [1 s, 1.5 s], none over 30 s, however many
      // failures in a row or however long a backoff the caller gave.
      long cap = Duration.ofSeconds(30).toNanos();
      long first = WatchStream.backoffNanos(WatchStream.BACKOFF, 0);
      expect(first >= Duration.ofSeconds(1).toNanos() && first <= Duration.ofMillis(1500).toNanos(), "first pause: " + first);
      long longest = 0;
      for (int failures = 0; failures <= 2000; failures++) {
        longest = Math.max(longest, WatchStream.backoffNanos(WatchStream.BACKOFF, failures));
      }
      expect(longest == cap, "longest pause: " + Duration.ofNanos(longest) + ", want PT30S");
      long given = WatchStream.backoffNanos(Duration.ofMinutes(10), 3);
      expect(given == cap, "pause with a 10 min backoff: " + Duration.ofNanos(given) + ", want PT30S");

      // A CANCELLED the caller did not cause is retried like UNAVAILABLE; the client's own is not.
      String dropped = DroppedCallCheck.run();
      // The retry loop, its window and RetryInfo, and the request ids.
      String retries = RetryCheck.run();
      // The stream-run helper: its deltas once each across reconnects, its result.
      String streamRun = StreamRunCheck.run();
      // Typed results: the output decoded, misfits by their path.
      String outputs = OutputCheck.run();
      System.out.println("client-check: ok (keepalive 60 s / 20 s while calls are open by default, off on request; "
          + "Watch reconnect pause at most " + Duration.ofNanos(longest).toSeconds() + " s; " + dropped + "; " + retries
          + "; " + streamRun + "; " + outputs + ")");
    } catch (IllegalStateException failure) {
      System.out.println("client-check: FAIL " + failure.getMessage());
      exitCode = 1;
    } catch (Exception failure) {
      System.out.println("client-check: FAIL " + failure);
      exitCode = 1;
    }
    System.exit(exitCode);
  }
}
