package dev.agentruntime.client;

import java.util.Iterator;
import java.util.List;
import java.util.NoSuchElementException;
import java.util.function.Function;
import java.util.stream.Stream;
import java.util.stream.StreamSupport;

/**
 * The pages of a paginated RPC (List, GetTranscript, ListRuntimes), fetched lazily: each iterator
 * starts at the first page (an empty token) and fetches the next page only when asked for it, until
 * a page's {@code next_page_token} is empty. A refused page is thrown by {@code next()} as an
 * {@link AgentRuntimeException}.
 */
final class Pages<P> implements Iterable<P> {
  private final Function<String, P> fetch;
  private final Function<P, String> nextToken;

  Pages(Function<String, P> fetch, Function<P, String> nextToken) {
    this.fetch = fetch;
    this.nextToken = nextToken;
  }

  @Override
  public Iterator<P> iterator() {
    return new Iterator<>() {
      private String token = "";
      private boolean done;

      @Override
      public boolean hasNext() {
        return !done;
      }

      @Override
      public P next() {
        if (done) {
          throw new NoSuchElementException();
        }
        P page = fetch.apply(token);
        token = nextToken.apply(page);
        done = token.isEmpty();
        return page;
      }
    };
  }

  /** The pages' items, in order, as a sequential stream that fetches each page when it reaches it. */
  static <P, T> Stream<T> stream(Iterable<P> pages, Function<P, List<T>> items) {
    return StreamSupport.stream(pages.spliterator(), false).flatMap(page -> items.apply(page).stream());
  }
}
