package dev.agentruntime.client;

import dev.agentruntime.v1.Delta;
import java.util.HashMap;
import java.util.Map;
import java.util.function.Consumer;

/**
 * The deltas of one handle, each handed over once, for {@link AgentRuntimeClient#streamRun}.
 *
 * <p>After a reconnect the server sends every turn still in progress again from index 0, so the
 * filter remembers, per turn, the next index it expects and skips a delta below it. A {@code reset}
 * is always handed over (what was streamed for the turn is void, and the consumer must hear it
 * even when it comes again in a replay); the turn's next expected index is then 1. Deltas are
 * accepted from the watching thread only.
 */
final class DeltaFilter implements Consumer<Delta> {
  private final String handleId;
  private final Consumer<Delta> onDelta;
  private final Map<Long, Long> nextIndex = new HashMap<>(); // turn -> the next index not yet handed over

  DeltaFilter(String handleId, Consumer<Delta> onDelta) {
    this.handleId = handleId;
    this.onDelta = onDelta;
  }

  @Override
  public void accept(Delta delta) {
    if (delta.getHandleId().equals(handleId) && fresh(delta)) {
      onDelta.accept(delta);
    }
  }

  /** Whether the delta is new to the consumer (or a reset); records it as handed over. */
  private boolean fresh(Delta delta) {
    long turn = delta.getTurn();
    if (delta.getPieceCase() == Delta.PieceCase.RESET) {
      nextIndex.put(turn, 1L);
      return true;
    }
    if (delta.getIndex() < nextIndex.getOrDefault(turn, 0L)) {
      return false;
    }
    nextIndex.put(turn, delta.getIndex() + 1);
    return true;
  }
}
