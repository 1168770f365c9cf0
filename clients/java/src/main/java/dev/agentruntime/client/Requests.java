package dev.agentruntime.client;

import dev.agentruntime.v1.AgentDef;
import dev.agentruntime.v1.Answer;
import dev.agentruntime.v1.Budget;
import dev.agentruntime.v1.CloseRequest;
import dev.agentruntime.v1.CreateRuntimeRequest;
import dev.agentruntime.v1.DeleteRuntimeRequest;
import dev.agentruntime.v1.ForkMessage;
import dev.agentruntime.v1.ForkRuntimeRequest;
import dev.agentruntime.v1.GetTranscriptRequest;
import dev.agentruntime.v1.InspectRequest;
import dev.agentruntime.v1.InterruptRequest;
import dev.agentruntime.v1.ListRequest;
import dev.agentruntime.v1.ListRuntimesRequest;
import dev.agentruntime.v1.PostRequest;
import dev.agentruntime.v1.ReplayRuntimeRequest;
import dev.agentruntime.v1.ResumeRequest;
import dev.agentruntime.v1.SpawnRequest;
import dev.agentruntime.v1.UnrecordedCalls;
import dev.agentruntime.v1.WaitRequest;
import dev.agentruntime.v1.WakeRequest;
import java.time.Duration;
import java.util.List;

/**
 * The conversions from plain Java arguments to requests, and the waiting arithmetic, shared by
 * {@link AgentRuntimeClient} and {@link AgentRuntimeAsyncClient} so that both send the same
 * requests and wait the same way. A mutating request's {@code requestId} is the one its call
 * carries on every attempt (the caller's, or one {@link Retry#requestId} generated).
 */
final class Requests {
  private Requests() {}

  static String orEmpty(String value) {
    return value == null ? "" : value;
  }

  static com.google.protobuf.Duration toProto(Duration duration) {
    return com.google.protobuf.Duration.newBuilder()
        .setSeconds(duration.getSeconds())
        .setNanos(duration.getNano())
        .build();
  }

  static CreateRuntimeRequest createRuntime(List<AgentDef> agents, String runtimeId, String requestId) {
    return CreateRuntimeRequest.newBuilder()
        .setRuntimeId(orEmpty(runtimeId))
        .addAllAgents(agents)
        .setRequestId(requestId)
        .build();
  }

  static SpawnRequest spawn(String runtimeId, String agent, String parent, Budget budget, String requestId) {
    SpawnRequest.Builder request = SpawnRequest.newBuilder()
        .setRuntimeId(runtimeId)
        .setParentId(parent)
        .setAgent(agent)
        .setRequestId(requestId);
    if (budget != null) {
      request.setBudget(budget);
    }
    return request.build();
  }

  static PostRequest post(String runtimeId, String handleId, String text, String channel, String sender,
      String requestId) {
    return PostRequest.newBuilder()
        .setRuntimeId(runtimeId)
        .setHandleId(handleId)
        .setText(text)
        .setChannel(orEmpty(channel))
        .setSender(orEmpty(sender))
        .setRequestId(requestId)
        .build();
  }

  /** The caller's whole PostRequest, with a generated request id when it carries none. */
  static PostRequest post(PostRequest request) {
    return request.getRequestId().isEmpty() ? request.toBuilder().setRequestId(Retry.requestId(null)).build() : request;
  }

  static WakeRequest wake(String runtimeId, String handleId, String prompt, String requestId) {
    return WakeRequest.newBuilder()
        .setRuntimeId(runtimeId)
        .setHandleId(handleId)
        .setPrompt(orEmpty(prompt))
        .setRequestId(requestId)
        .build();
  }

  static WaitRequest waitSlice(String runtimeId, String handleId, Duration slice) {
    return WaitRequest.newBuilder().setRuntimeId(runtimeId).setHandleId(handleId).setTimeout(toProto(slice)).build();
  }

  static ResumeRequest resume(String runtimeId, Answer answer, String requestId) {
    return ResumeRequest.newBuilder().setRuntimeId(runtimeId).setAnswer(answer).setRequestId(requestId).build();
  }

  static InterruptRequest interrupt(String runtimeId, String handleId, String requestId) {
    return InterruptRequest.newBuilder().setRuntimeId(runtimeId).setHandleId(handleId).setRequestId(requestId).build();
  }

  static CloseRequest close(String runtimeId, String handleId, boolean force, String requestId) {
    return CloseRequest.newBuilder()
        .setRuntimeId(runtimeId)
        .setHandleId(handleId)
        .setForce(force)
        .setRequestId(requestId)
        .build();
  }

  /** The caller's whole CloseRequest, with a generated request id when it carries none. */
  static CloseRequest close(CloseRequest request) {
    return request.getRequestId().isEmpty() ? request.toBuilder().setRequestId(Retry.requestId(null)).build() : request;
  }

  static DeleteRuntimeRequest deleteRuntime(String runtimeId, boolean force, String requestId) {
    return DeleteRuntimeRequest.newBuilder().setRuntimeId(runtimeId).setForce(force).setRequestId(requestId).build();
  }

  static InspectRequest inspect(String runtimeId, String handleId) {
    return InspectRequest.newBuilder().setRuntimeId(runtimeId).setHandleId(handleId).build();
  }

  static ListRequest list(String runtimeId, int pageSize, String pageToken) {
    return ListRequest.newBuilder().setRuntimeId(runtimeId).setPageSize(pageSize).setPageToken(orEmpty(pageToken)).build();
  }

  static GetTranscriptRequest transcript(String runtimeId, String handleId, int pageSize, String pageToken) {
    return GetTranscriptRequest.newBuilder()
        .setRuntimeId(runtimeId)
        .setHandleId(handleId)
        .setPageSize(pageSize)
        .setPageToken(orEmpty(pageToken))
        .build();
  }

  static ListRuntimesRequest listRuntimes(int pageSize, String pageToken) {
    return listRuntimes(pageSize, pageToken, null);
  }

  static ListRuntimesRequest listRuntimes(int pageSize, String pageToken, String forksOf) {
    return ListRuntimesRequest.newBuilder()
        .setPageSize(pageSize)
        .setPageToken(orEmpty(pageToken))
        .setForksOf(orEmpty(forksOf))
        .build();
  }

  static ForkRuntimeRequest forkRuntime(String sourceRuntimeId, long atSeq, List<AgentDef> agents,
      List<ForkMessage> messages, List<Answer> answers, String runtimeId, String requestId) {
    ForkRuntimeRequest.Builder request = ForkRuntimeRequest.newBuilder()
        .setSourceRuntimeId(sourceRuntimeId)
        .setAtSeq(atSeq)
        .setRuntimeId(orEmpty(runtimeId))
        .setRequestId(requestId);
    if (agents != null) {
      request.addAllAgents(agents);
    }
    if (messages != null) {
      request.addAllMessages(messages);
    }
    if (answers != null) {
      request.addAllAnswers(answers);
    }
    return request.build();
  }

  /** The caller's whole ForkRuntimeRequest, with a generated request id when it carries none. */
  static ForkRuntimeRequest forkRuntime(ForkRuntimeRequest request) {
    return request.getRequestId().isEmpty() ? request.toBuilder().setRequestId(Retry.requestId(null)).build() : request;
  }

  /**
   * A ReplayRuntimeRequest with this request id and no {@code timeout} yet: each attempt sets its
   * own ({@link #replaySlice}).
   */
  static ReplayRuntimeRequest replayRuntime(String sourceRuntimeId, List<AgentDef> agents,
      UnrecordedCalls unrecordedCalls, String runtimeId, String requestId) {
    ReplayRuntimeRequest.Builder request = ReplayRuntimeRequest.newBuilder()
        .setSourceRuntimeId(sourceRuntimeId)
        .setUnrecordedCalls(unrecordedCalls == null ? UnrecordedCalls.UNRECORDED_CALLS_UNSPECIFIED : unrecordedCalls)
        .setRuntimeId(orEmpty(runtimeId))
        .setRequestId(requestId);
    if (agents != null) {
      request.addAllAgents(agents);
    }
    return request.build();
  }

  /** The caller's whole ReplayRuntimeRequest, with a generated request id when it carries none. */
  static ReplayRuntimeRequest replayRuntime(ReplayRuntimeRequest request) {
    return request.getRequestId().isEmpty() ? request.toBuilder().setRequestId(Retry.requestId(null)).build() : request;
  }

  /** One attempt of a replay: {@code request} (its request id kept) asking the server to wait at most {@code slice}. */
  static ReplayRuntimeRequest replaySlice(ReplayRuntimeRequest request, Duration slice) {
    return request.toBuilder().setTimeout(toProto(slice)).build();
  }

  /**
   * When a wait with this caller's {@code timeout} ends, as a {@link System#nanoTime()} value;
   * null: never (no timeout, or one too long to count in nanoseconds).
   */
  static Long waitEnd(Duration timeout) {
    if (timeout == null) {
      return null;
    }
    long nanos = timeout.isNegative() ? 0 : saturatedNanos(timeout);
    return nanos < Long.MAX_VALUE / 2 ? System.nanoTime() + nanos : null;
  }

  /**
   * When a replay helper with this caller's {@code timeout} under this Context {@code deadline}
   * (null: none) stops asking, as {@link #waitEnd} says: the sooner of the timeout and, under a
   * deadline, a second before it (half what is left when that is under 2 s), when the server
   * answers {@code settled: false} by itself; so the last answer is returned before the deadline
   * rather than the deadline's error.
   */
  static Long replayEnd(Duration timeout, io.grpc.Deadline deadline) {
    Long end = waitEnd(timeout);
    if (deadline == null) {
      return end;
    }
    long remaining = Math.max(deadline.timeRemaining(java.util.concurrent.TimeUnit.NANOSECONDS), 0);
    long second = Duration.ofSeconds(1).toNanos();
    long answerBy = System.nanoTime() + (remaining > 2 * second ? remaining - second : remaining / 2);
    return end == null || end - answerBy > 0 ? Long.valueOf(answerBy) : end;
  }

  /** Whether the wait ending at {@code end} (see {@link #waitEnd}) is over. */
  static boolean passed(Long end) {
    return end != null && System.nanoTime() - end >= 0;
  }

  /** Nanoseconds left until {@code end}, at least 0; Long.MAX_VALUE when it is null (never). */
  static long remainingNanos(Long end) {
    return end == null ? Long.MAX_VALUE : Math.max(end - System.nanoTime(), 0);
  }

  /** The server-side wait of the next Wait: {@link AgentRuntimeClient#WAIT_SLICE}, or less when the caller's timeout is nearer. */
  static Duration nextSlice(Long end) {
    long remaining = remainingNanos(end);
    return remaining < AgentRuntimeClient.WAIT_SLICE.toNanos() ? Duration.ofNanos(remaining) : AgentRuntimeClient.WAIT_SLICE;
  }

  static long saturatedNanos(Duration duration) {
    try {
      return duration.toNanos();
    } catch (ArithmeticException e) {
      return Long.MAX_VALUE;
    }
  }
}
