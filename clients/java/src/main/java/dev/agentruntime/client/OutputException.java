package dev.agentruntime.client;

/**
 * A task result's structured output that {@link Outputs#outputAs} could not decode: none was
 * there ({@link #path()} is {@code null}), or the value at {@link #path()} (a JSON path such as
 * {@code $.confidence} or {@code $.tags[1]}; {@code $} is the whole output) does not fit the type.
 */
public final class OutputException extends IllegalArgumentException {
  private static final long serialVersionUID = 1L;

  private final String path;

  OutputException(String message, String path, Throwable cause) {
    super(message, cause);
    this.path = path;
  }

  /** Where the output did not fit, as a JSON path; {@code null} when the result has no output. */
  public String path() {
    return path;
  }
}
