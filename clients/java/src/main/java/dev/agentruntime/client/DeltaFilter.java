package dev.agentruntime.client;

import dev.agentruntime.v1.Delta;
import dev.agentruntime.v1.Event;
import java.util.HashMap;
import java.util.Map;
import java.util.function.Consumer;

/**
 * The deltas of a watch, each handed over once, for {@link AgentRuntimeClient#streamRun}: the
 * fresh ones of one handle go to its consumer.
 *
 * <p>After a reconnect the server sends every turn still in progress again from index 0, so the
 * filter remembers, per handle and turn, the next index it expects and skips a delta below it. A
 * {@code reset} is always handed over (what was streamed for the turn is void, and the consumer
 * must hear it even when it comes again in a replay); the turn's next expected index is then 1.
 * Every handle's turns are followed, not only the consumer's: a fresh piece of any of them shows
 * the stream makes progress (see {@link #accept}). Used from the watching thread only.
 */
final class DeltaFilter {
  private final String handleId;
  private final Consumer<Delta> onDelta;
  private final Map<String, Long> nextIndex = new HashMap<>(); // handle + turn -> the next index not yet seen

  DeltaFilter(String handleId, Consumer<Delta> onDelta) {
    this.handleId = handleId;
    this.onDelta = onDelta;
  }

  /**
   * Hands {@code delta} to the consumer when it is this handle's and new (or a reset); returns
   * whether it is progress: a piece not seen before, of any handle. A reset is not (a server that
   * sends a turn's reset and drops, again and again, is still given up on), and neither is a piece
   * sent again after a reconnect.
   */
  boolean accept(Delta delta) {
    boolean reset = delta.getPieceCase() == Delta.PieceCase.RESET;
    boolean fresh = fresh(delta, reset);
    if (fresh && delta.getHandleId().equals(handleId)) {
      onDelta.accept(delta);
    }
    return fresh && !reset;
  }

  /**
   * An ended turn is never sent again (a reconnect starts after its TurnEnded): forgets it, so a
   * long watch keeps one entry per turn in progress, not per turn ever.
   */
  void forget(Event event) {
    if (event.hasTurnEnded()) {
      nextIndex.remove(key(event.getHandleId(), event.getTurnEnded().getTurn()));
    }
  }

  /** Whether the delta is new (or a reset); records it as seen. */
  private boolean fresh(Delta delta, boolean reset) {
    String key = key(delta.getHandleId(), delta.getTurn());
    if (reset) {
      nextIndex.put(key, 1L);
      return true;
    }
    if (delta.getIndex() < nextIndex.getOrDefault(key, 0L)) {
      return false;
    }
    nextIndex.put(key, delta.getIndex() + 1);
    return true;
  }

  private static String key(String handleId, long turn) {
    return turn + "@" + handleId;
  }
}
