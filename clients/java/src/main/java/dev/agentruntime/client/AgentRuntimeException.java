package dev.agentruntime.client;

import com.google.protobuf.Any;
import com.google.protobuf.InvalidProtocolBufferException;
import com.google.protobuf.Message;
import com.google.rpc.BadRequest;
import com.google.rpc.ErrorInfo;
import com.google.rpc.QuotaFailure;
import com.google.rpc.ResourceInfo;
import com.google.rpc.RetryInfo;
import io.grpc.Status;
import io.grpc.protobuf.StatusProto;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Collections;
import java.util.List;
import java.util.Optional;

/**
 * A call the server refused (or that failed on the way): the gRPC status code, the server's
 * message and the decoded {@code google.rpc} details ({@link BadRequest}, {@link ErrorInfo},
 * {@link ResourceInfo}, {@link QuotaFailure}, {@link RetryInfo}) of the {@code grpc-status-details-bin}
 * trailer.
 *
 * <pre>{@code
 * try {
 *   client.spawn(runtimeId, "helper", "root/lead.1", null);
 * } catch (AgentRuntimeException e) {
 *   if (e.code() == Status.Code.RESOURCE_EXHAUSTED) {
 *     String limit = e.errorInfo().map(info -> info.getMetadataOrDefault("limit", "")).orElse("");
 *   }
 * }
 * }</pre>
 */
public final class AgentRuntimeException extends RuntimeException {
  private static final long serialVersionUID = 1L;

  private final Status.Code code;
  private final String description;
  private final transient List<Message> details;
  /** A CANCELLED this client raised itself (see {@link #cancelledByClient}), never a dropped call. */
  private final boolean byClient;

  public AgentRuntimeException(Status.Code code, String description, List<? extends Message> details) {
    super(code.name() + ": " + description);
    this.code = code;
    this.description = description;
    this.details = Collections.unmodifiableList(new ArrayList<>(details));
    this.byClient = false;
  }

  private AgentRuntimeException(Status.Code code, String description, List<Message> details, Throwable cause,
      boolean byClient) {
    super(code.name() + ": " + description, cause);
    this.code = code;
    this.description = description;
    this.details = Collections.unmodifiableList(details);
    this.byClient = byClient;
  }

  /**
   * The CANCELLED the client raises itself (an interrupt of the calling thread, the client closed,
   * a cancelled future): marked, so that {@link AgentRuntimeClient#isDrop} never retries it.
   */
  static AgentRuntimeException cancelledByClient(String description, Throwable cause) {
    return new AgentRuntimeException(Status.Code.CANCELLED, description, new ArrayList<>(),
        Status.CANCELLED.withDescription(description).withCause(cause).asRuntimeException(), true);
  }

  /** Whether the client raised this CANCELLED itself ({@link #cancelledByClient}). */
  boolean isCancelledByClient() {
    return byClient;
  }

  /** Wraps a failed call's exception (a {@code StatusRuntimeException} or {@code StatusException}). */
  public static AgentRuntimeException fromThrowable(Throwable error) {
    Status status = Status.fromThrowable(error);
    String description = status.getDescription() == null ? "" : status.getDescription();
    List<Message> details = new ArrayList<>();
    com.google.rpc.Status rich = StatusProto.fromThrowable(error);
    if (rich != null) {
      for (Any packed : rich.getDetailsList()) {
        Message unpacked = unpack(packed);
        if (unpacked != null) {
          details.add(unpacked);
        }
      }
    }
    return new AgentRuntimeException(status.getCode(), description, details, error, false);
  }

  private static Message unpack(Any packed) {
    try {
      if (packed.is(BadRequest.class)) {
        return packed.unpack(BadRequest.class);
      }
      if (packed.is(ErrorInfo.class)) {
        return packed.unpack(ErrorInfo.class);
      }
      if (packed.is(ResourceInfo.class)) {
        return packed.unpack(ResourceInfo.class);
      }
      if (packed.is(QuotaFailure.class)) {
        return packed.unpack(QuotaFailure.class);
      }
      if (packed.is(RetryInfo.class)) {
        return packed.unpack(RetryInfo.class);
      }
    } catch (InvalidProtocolBufferException e) {
      // A malformed detail is dropped, as the Python client drops unknown ones.
    }
    return null;
  }

  /**
   * The AgentRuntimeException behind a failed future's error: {@code error} itself, or the cause
   * of the {@code CompletionException} / {@code ExecutionException} wrapping it ({@code join()},
   * {@code get()}, a dependent stage); any other throwable is converted as {@link #fromThrowable}
   * does (a {@code CancellationException}: CANCELLED).
   */
  public static AgentRuntimeException unwrap(Throwable error) {
    Throwable cause = error;
    while ((cause instanceof java.util.concurrent.CompletionException
        || cause instanceof java.util.concurrent.ExecutionException) && cause.getCause() != null) {
      cause = cause.getCause();
    }
    if (cause instanceof AgentRuntimeException) {
      return (AgentRuntimeException) cause;
    }
    if (cause instanceof java.util.concurrent.CancellationException) {
      return cancelledByClient("cancelled", cause);
    }
    return fromThrowable(cause);
  }

  /** NOT_FOUND: no such runtime, handle or pending request ({@link #resourceInfo()} says which). */
  public boolean isNotFound() {
    return code == Status.Code.NOT_FOUND;
  }

  /** INVALID_ARGUMENT: a malformed request ({@link #badRequest()} names the fields). */
  public boolean isInvalidArgument() {
    return code == Status.Code.INVALID_ARGUMENT;
  }

  /** FAILED_PRECONDITION: not in this state (a running handle, a closed one, ...; {@link #errorInfo()} has the reason). */
  public boolean isFailedPrecondition() {
    return code == Status.Code.FAILED_PRECONDITION;
  }

  /** RESOURCE_EXHAUSTED: a budget limit ({@code errorInfo().metadata["limit"]}) or a quota. */
  public boolean isResourceExhausted() {
    return code == Status.Code.RESOURCE_EXHAUSTED;
  }

  /** ALREADY_EXISTS: e.g. a runtime id that is taken. */
  public boolean isAlreadyExists() {
    return code == Status.Code.ALREADY_EXISTS;
  }

  /** UNAUTHENTICATED: a missing or rejected token. */
  public boolean isUnauthenticated() {
    return code == Status.Code.UNAUTHENTICATED;
  }

  /** PERMISSION_DENIED: a token without the scope the call needs. */
  public boolean isPermissionDenied() {
    return code == Status.Code.PERMISSION_DENIED;
  }

  /** UNAUTHENTICATED or PERMISSION_DENIED: no valid token, or one without the scope or tenant. */
  public boolean isAuthError() {
    return code == Status.Code.UNAUTHENTICATED || code == Status.Code.PERMISSION_DENIED;
  }

  /**
   * UNAVAILABLE: the server could not be reached (down, restarting, a network fault), or refused the
   * call without acting on it ({@link #errorInfo()} has the reason: {@code RUNTIME_MOVING},
   * {@code SERVER_DRAINING}, {@code STORE_UNAVAILABLE}, ...; {@link #retryDelay()} how long to wait).
   */
  public boolean isUnavailable() {
    return code == Status.Code.UNAVAILABLE;
  }

  /** DEADLINE_EXCEEDED: the call's deadline passed first (the client's per-call timeout). */
  public boolean isDeadlineExceeded() {
    return code == Status.Code.DEADLINE_EXCEEDED;
  }

  /** The gRPC status code, e.g. {@code FAILED_PRECONDITION}. */
  public Status.Code code() {
    return code;
  }

  /** The server's message (the status description), without the code; never null. */
  public String description() {
    return description;
  }

  /** The decoded details, in the order the server sent them. */
  public List<Message> details() {
    return details;
  }

  /** The first detail of the given type, e.g. {@code detail(ErrorInfo.class)}. */
  public <T extends Message> Optional<T> detail(Class<T> type) {
    return details.stream().filter(type::isInstance).map(type::cast).findFirst();
  }

  /** The {@link ErrorInfo} detail: its {@code metadata["limit"]} names the budget that refused a call. */
  public Optional<ErrorInfo> errorInfo() {
    return detail(ErrorInfo.class);
  }

  /** The {@link BadRequest} detail: which request fields were invalid, and why. */
  public Optional<BadRequest> badRequest() {
    return detail(BadRequest.class);
  }

  /** The {@link ResourceInfo} detail: which runtime, handle or request was not found. */
  public Optional<ResourceInfo> resourceInfo() {
    return detail(ResourceInfo.class);
  }

  /** The {@link QuotaFailure} detail: the tenant quota a RESOURCE_EXHAUSTED hit (its subject). */
  public Optional<QuotaFailure> quotaFailure() {
    return detail(QuotaFailure.class);
  }

  /**
   * The {@link RetryInfo} detail: the server refused the call without acting on it and says the
   * same call may succeed after {@code retry_delay}. The client retries such a call by itself
   * (see the README's "Retries and request ids"), so it reaches the caller only once the retries
   * are spent or turned off.
   */
  public Optional<RetryInfo> retryInfo() {
    return detail(RetryInfo.class);
  }

  /** The {@link RetryInfo}'s {@code retry_delay}: how long the server asks the caller to wait before trying again. */
  public Optional<Duration> retryDelay() {
    return retryInfo().map(info -> Duration.ofSeconds(info.getRetryDelay().getSeconds(), info.getRetryDelay().getNanos()));
  }
}
