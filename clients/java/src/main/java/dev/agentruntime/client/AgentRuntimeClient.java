package dev.agentruntime.client;

import dev.agentruntime.v1.AgentDef;
import dev.agentruntime.v1.AgentRuntimeGrpc;
import dev.agentruntime.v1.Answer;
import dev.agentruntime.v1.Budget;
import dev.agentruntime.v1.CloseRequest;
import dev.agentruntime.v1.CloseResponse;
import dev.agentruntime.v1.CreateRuntimeRequest;
import dev.agentruntime.v1.DeleteRuntimeRequest;
import dev.agentruntime.v1.Delta;
import dev.agentruntime.v1.Event;
import dev.agentruntime.v1.ForkMessage;
import dev.agentruntime.v1.ForkRuntimeRequest;
import dev.agentruntime.v1.ForkRuntimeResponse;
import dev.agentruntime.v1.GetTranscriptRequest;
import dev.agentruntime.v1.GetTranscriptResponse;
import dev.agentruntime.v1.HandleView;
import dev.agentruntime.v1.InspectRequest;
import dev.agentruntime.v1.InterruptRequest;
import dev.agentruntime.v1.ListRequest;
import dev.agentruntime.v1.ListResponse;
import dev.agentruntime.v1.ListRuntimesRequest;
import dev.agentruntime.v1.ListRuntimesResponse;
import dev.agentruntime.v1.Message;
import dev.agentruntime.v1.PostRequest;
import dev.agentruntime.v1.PostResponse;
import dev.agentruntime.v1.ReplayRuntimeRequest;
import dev.agentruntime.v1.ReplayRuntimeResponse;
import dev.agentruntime.v1.ResumeRequest;
import dev.agentruntime.v1.RuntimeSummary;
import dev.agentruntime.v1.SpawnRequest;
import dev.agentruntime.v1.TaskResult;
import dev.agentruntime.v1.UnrecordedCalls;
import dev.agentruntime.v1.WaitRequest;
import dev.agentruntime.v1.WakeRequest;
import io.grpc.CallCredentials;
import io.grpc.ChannelCredentials;
import io.grpc.ClientInterceptor;
import io.grpc.CompositeChannelCredentials;
import io.grpc.Context;
import io.grpc.Deadline;
import io.grpc.Grpc;
import io.grpc.InsecureChannelCredentials;
import io.grpc.ManagedChannel;
import io.grpc.ManagedChannelBuilder;
import io.grpc.Metadata;
import io.grpc.Status;
import io.grpc.StatusRuntimeException;
import io.grpc.TlsChannelCredentials;
import java.io.ByteArrayInputStream;
import java.io.File;
import java.io.IOException;
import java.io.UncheckedIOException;
import java.nio.file.Files;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.Objects;
import java.util.Set;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.Executor;
import java.util.concurrent.TimeUnit;
import java.util.function.Consumer;
import java.util.function.Function;
import java.util.function.Predicate;
import java.util.stream.Stream;

/**
 * A thin blocking client over the generated stubs: one method per RPC, plain Java arguments in,
 * generated messages out, and every refused call as an unchecked {@link AgentRuntimeException}
 * carrying the gRPC code, the server's message and its {@code google.rpc} details.
 *
 * <pre>{@code
 * try (AgentRuntimeClient client = AgentRuntimeClient.newBuilder("127.0.0.1:50051").build()) {
 *   String runtimeId = client.createRuntime(agents, "");
 *   TaskResult result = client.run(runtimeId, "coordinator", "map the repo");
 * }
 * }</pre>
 *
 * <p>Every unary call is retried by the client's own loop when an attempt fails with UNAVAILABLE,
 * a CANCELLED the caller did not cause (as a stopping grpc-core server sends: grpc/grpc#41785),
 * the DEADLINE_EXCEEDED of the attempt's own deadline, or any status carrying
 * {@code google.rpc.RetryInfo}: after a pause of full jitter (up to 100 ms doubling per attempt,
 * at most 5 s; at least the RetryInfo's {@code retry_delay}), until the caller's deadline (its
 * {@link Context}'s) or else the retry window ({@link #DEFAULT_RETRY_WINDOW}, 60 s; see
 * {@link Builder#retryWindow}) has passed, and never once the caller gave up (an interrupt, a
 * cancelled Context, the client closed). Every mutating call (CreateRuntime, Spawn, Post, Wake,
 * Resume, Interrupt, Close, DeleteRuntime, ForkRuntime, ReplayRuntime) carries a request id, the caller's or one generated
 * once per call ({@link java.util.UUID#randomUUID}), on all its attempts, so the server answers
 * a repeat with the first answer and acts once. {@link Builder#retries retries(false)} turns the
 * loop off (one attempt; the request id is still sent).
 *
 * <p>Each attempt gets the default deadline (60 s unless the builder says otherwise; {@code null}
 * means none), capped by what is left of the overall one; Wait ({@link #waitFor}) and ReplayRuntime
 * ({@link #replayRuntime}) make repeated 30 s slices, each with its own deadline, and the streams
 * (Watch, ServeTools) have none. The
 * client is safe for concurrent use; {@link #close()} shuts its channel down.
 *
 * <p>{@link #async()} is the future-based variant of the main calls on the same channel;
 * {@link #listPages}, {@link #listStream} and their transcript and runtime counterparts page
 * lazily; the builder also sets keepalive ({@link Builder#keepAlive}; by default a PING after 60 s
 * without activity while a call is open) and interceptors ({@link Builder#intercept(ClientInterceptor...)}).
 */
public final class AgentRuntimeClient implements AutoCloseable {
  /** The per-call deadline when the builder sets none; it matches the Python client. */
  public static final Duration DEFAULT_TIMEOUT = Duration.ofSeconds(60);

  /** The longest server-side wait one Wait asks for: well under any proxy's idle cut. */
  public static final Duration WAIT_SLICE = Duration.ofSeconds(30);
  /** A Wait's call deadline is its server-side wait plus this much, so the server answers first. */
  public static final Duration WAIT_MARGIN = Duration.ofSeconds(10);
  /**
   * How many times {@link #resume} tried while the server was unavailable, before every call was
   * retried alike: no longer used (Resume is retried as every call is, within the retry window).
   *
   * @deprecated Resume is retried by the client's one retry loop: see {@link Builder#retryWindow}.
   */
  @Deprecated
  public static final int RESUME_ATTEMPTS = 8;
  /**
   * How long the client keeps retrying a call when the caller set no deadline of its own (an
   * {@link io.grpc.Context} deadline); for a Wait or a Watch, how long a run of failures in a
   * row may last. {@link Builder#retryWindow} changes it.
   */
  public static final Duration DEFAULT_RETRY_WINDOW = Duration.ofSeconds(60);
  /**
   * The keepalive unless the builder says otherwise: while a call is open, an HTTP/2 PING after this
   * long without activity. Without it a Watch or a worker's stream behind a NAT or a proxy that
   * silently dropped the connection would wait forever.
   */
  public static final Duration DEFAULT_KEEPALIVE_TIME = Duration.ofSeconds(60);
  /** How long the default keepalive waits for a PING's answer before the connection counts as dead. */
  public static final Duration DEFAULT_KEEPALIVE_TIMEOUT = Duration.ofSeconds(20);
  /**
   * Whether a failed call was dropped on the way, so that it is tried again (the client's retry
   * loop, the async client's, the Watch's reconnect; see {@link Retry#retryable} for the whole
   * rule): UNAVAILABLE, or a CANCELLED that the caller did not cause. A grpc-core server answers the calls that reach it as
   * it begins to shut down, before a handler took them, with CANCELLED instead of UNAVAILABLE
   * (grpc/grpc#41785), so such a CANCELLED is a drop like UNAVAILABLE. The client's own are not:
   * those it raises itself ({@link AgentRuntimeException#cancelledByClient}: an interrupt, the
   * client closed, a cancelled future), and any failure once {@code gaveUp}: the caller or the
   * client stopped wanting the answer (the thread interrupted, its Context cancelled, the client
   * closed or its channel shut down; see {@link #gaveUp()}).
   */
  static boolean isDrop(AgentRuntimeException error, boolean gaveUp) {
    if (gaveUp || error.isCancelledByClient()) {
      return false;
    }
    return error.code() == Status.Code.UNAVAILABLE || error.code() == Status.Code.CANCELLED;
  }

  /**
   * Whether the blocking caller or this client gave up: the calling thread is interrupted (grpc's
   * blocking stub ends the call CANCELLED then), the caller's Context is cancelled (grpc ends the
   * calls under it CANCELLED) or the channel is shut down.
   */
  private boolean gaveUp() {
    return Thread.currentThread().isInterrupted() || Context.current().isCancelled() || channel.isShutdown();
  }

  private final ManagedChannel channel;
  private final AgentRuntimeGrpc.AgentRuntimeBlockingStub stub;
  private final AgentRuntimeGrpc.AgentRuntimeStub asyncStub; // the streams (ServeTools)
  private final Set<ToolWorker> workers = ConcurrentHashMap.newKeySet(); // running, closed with the client
  private final Set<WatchStream> watches = ConcurrentHashMap.newKeySet(); // open, closed with the client
  private final Duration timeout;
  private final boolean retries;
  private final Duration retryWindow;
  private AgentRuntimeAsyncClient async; // guarded by this; made on first use

  private AgentRuntimeClient(ManagedChannel channel, Duration timeout, boolean retries, Duration retryWindow) {
    this.channel = channel;
    this.stub = AgentRuntimeGrpc.newBlockingStub(channel);
    this.asyncStub = AgentRuntimeGrpc.newStub(channel);
    this.timeout = timeout;
    this.retries = retries;
    this.retryWindow = retryWindow;
  }

  /** A builder for a client of the server at {@code target} ({@code host:port} or a gRPC target URI). */
  public static Builder newBuilder(String target) {
    return new Builder(target);
  }

  /**
   * Configures the channel: plaintext by default (like the Python client), TLS on request.
   *
   * <pre>{@code
   * AgentRuntimeClient client = AgentRuntimeClient.newBuilder("agents.example.com:443")
   *     .trustCertificates(new File("ca.pem"))                             // a private CA
   *     .clientCertificate(new File("client.pem"), new File("client.key")) // mTLS
   *     .bearerToken(System.getenv("AGENTRUNTIME_TOKEN"))
   *     .build();
   * }</pre>
   */
  public static final class Builder {
    private final String target;
    private ChannelCredentials credentials; // set by usePlaintext or credentials(); null: from the TLS settings
    private boolean tls;
    private byte[] trustedCertificates; // PEM; null: the JVM's trust store
    private byte[] clientCertificateChain; // PEM
    private byte[] clientPrivateKey; // PEM, PKCS#8
    private CallCredentials callCredentials;
    private Duration timeout = DEFAULT_TIMEOUT;
    // Package-private for the client's checks (conformance/src/main/java/dev/agentruntime/client).
    Duration keepAliveTime = DEFAULT_KEEPALIVE_TIME; // null: no keepalive pings
    Duration keepAliveTimeout = DEFAULT_KEEPALIVE_TIMEOUT;
    boolean keepAliveWithoutCalls;
    boolean retries = true;
    Duration retryWindow = DEFAULT_RETRY_WINDOW;
    private final List<ClientInterceptor> interceptors = new ArrayList<>();

    private Builder(String target) {
      this.target = Objects.requireNonNull(target, "target");
    }

    /** No transport security (the default): for a server on loopback or behind a TLS proxy. */
    public Builder usePlaintext() {
      this.credentials = InsecureChannelCredentials.create();
      this.tls = false;
      return this;
    }

    /** TLS, verifying the server against the JVM's default trust store (unless {@link #trustCertificates} says otherwise). */
    public Builder useTransportSecurity() {
      this.credentials = null;
      this.tls = true;
      return this;
    }

    /** TLS, verifying the server against the PEM root certificates in {@code rootCertificates}. */
    public Builder useTransportSecurity(File rootCertificates) {
      return trustCertificates(rootCertificates);
    }

    /** TLS, verifying the server against these PEM CA certificates instead of the JVM's trust store. */
    public Builder trustCertificates(byte[] pem) {
      this.trustedCertificates = Objects.requireNonNull(pem, "pem").clone();
      return useTransportSecurity();
    }

    /** {@link #trustCertificates(byte[])} with the PEM read from a file (now). */
    public Builder trustCertificates(File pem) {
      return trustCertificates(read(pem));
    }

    /**
     * TLS, presenting this client certificate (a PEM chain) and its private key (PEM, PKCS#8:
     * {@code -----BEGIN PRIVATE KEY-----}) to a server that asks for one (mTLS).
     */
    public Builder clientCertificate(byte[] certificateChain, byte[] privateKey) {
      this.clientCertificateChain = Objects.requireNonNull(certificateChain, "certificateChain").clone();
      this.clientPrivateKey = Objects.requireNonNull(privateKey, "privateKey").clone();
      return useTransportSecurity();
    }

    /** {@link #clientCertificate(byte[], byte[])} with the PEM read from files (now). */
    public Builder clientCertificate(File certificateChain, File privateKey) {
      return clientCertificate(read(certificateChain), read(privateKey));
    }

    /** Any channel credentials (ALTS, a custom TLS setup, ...); the TLS settings above are then ignored. */
    public Builder credentials(ChannelCredentials credentials) {
      this.credentials = Objects.requireNonNull(credentials, "credentials");
      return this;
    }

    /**
     * Sends {@code authorization: Bearer <token>} on every call, as {@link CallCredentials} on the
     * channel (so {@link #stub()} calls carry it too); {@code null} or empty sends none.
     */
    public Builder bearerToken(String token) {
      this.callCredentials = token == null || token.isEmpty() ? null : new BearerToken(token);
      return this;
    }

    /** Any call credentials (an OAuth token source, ...), in place of {@link #bearerToken}. */
    public Builder callCredentials(CallCredentials callCredentials) {
      this.callCredentials = callCredentials;
      return this;
    }

    /**
     * The deadline of every unary call but Wait (whose slices have their own: see
     * {@link AgentRuntimeClient#waitFor}); {@code null} means none.
     */
    public Builder defaultTimeout(Duration timeout) {
      this.timeout = timeout;
      return this;
    }

    /**
     * Keepalive: an HTTP/2 PING after {@code time} without activity on the connection, and the
     * connection counted dead (its calls failing UNAVAILABLE, then reconnected) when no answer comes
     * within {@code timeout}. On by default, with {@link #DEFAULT_KEEPALIVE_TIME} (60 s) and
     * {@link #DEFAULT_KEEPALIVE_TIMEOUT} (20 s), while a call is open; {@link #noKeepAlive()} turns
     * it off. gRPC-java raises a {@code time} under 10 s to 10 s; the agentruntime server accepts a
     * ping a second. It matters behind NATs and load balancers that drop connections silently, and
     * for long Waits, Watches and tool workers.
     */
    public Builder keepAlive(Duration time, Duration timeout) {
      this.keepAliveTime = Objects.requireNonNull(time, "time");
      this.keepAliveTimeout = Objects.requireNonNull(timeout, "timeout");
      return this;
    }

    /**
     * No keepalive pings (gRPC's own default): a stream whose connection silently died then waits
     * until it is cancelled.
     */
    public Builder noKeepAlive() {
      this.keepAliveTime = null;
      return this;
    }

    /** Whether keepalive pings are sent also while no call is open (off by default). */
    public Builder keepAliveWithoutCalls(boolean enable) {
      this.keepAliveWithoutCalls = enable;
      return this;
    }

    /**
     * Whether the client retries failed calls (on by default): see the class comment and the
     * README's "Retries and request ids". {@code retries(false)}: every call is made once (a Wait
     * too: a failed one is thrown, though the helper still repeats the 30 s slices that end
     * {@code STATUS_TIMEOUT}), and a mutating call still carries a request id, the caller's or a
     * generated one, so the caller can repeat it safely itself.
     */
    public Builder retries(boolean enable) {
      this.retries = enable;
      return this;
    }

    /**
     * How long a call is retried when the caller set no deadline of its own (a {@link Context}
     * deadline), and how long a run of failures in a row may last in a Wait or a Watch:
     * {@link #DEFAULT_RETRY_WINDOW} (60 s) unless set. Each attempt's deadline is the default
     * deadline ({@link #defaultTimeout}) capped by what is left of it.
     *
     * @throws IllegalArgumentException a window that is not positive
     */
    public Builder retryWindow(Duration window) {
      Objects.requireNonNull(window, "window");
      if (window.isNegative() || window.isZero()) {
        throw new IllegalArgumentException("the retry window must be positive, got " + window);
      }
      this.retryWindow = window;
      return this;
    }

    /**
     * Adds client interceptors (logging, metrics, tracing, extra headers) to every call of the
     * client, the streams and {@link AgentRuntimeClient#stub()} included. As in
     * {@code ManagedChannelBuilder.intercept}, the last one added runs first.
     */
    public Builder intercept(ClientInterceptor... interceptors) {
      for (ClientInterceptor interceptor : interceptors) {
        this.interceptors.add(Objects.requireNonNull(interceptor, "interceptor"));
      }
      return this;
    }

    /** {@link #intercept(ClientInterceptor...)} with a list. */
    public Builder intercept(List<? extends ClientInterceptor> interceptors) {
      return intercept(interceptors.toArray(new ClientInterceptor[0]));
    }

    private static byte[] read(File file) {
      try {
        return Files.readAllBytes(file.toPath());
      } catch (IOException e) {
        throw new UncheckedIOException("cannot read " + file, e);
      }
    }

    private ChannelCredentials channelCredentials() {
      if (credentials != null) {
        return credentials;
      }
      if (!tls) {
        return InsecureChannelCredentials.create();
      }
      TlsChannelCredentials.Builder builder = TlsChannelCredentials.newBuilder();
      try {
        if (trustedCertificates != null) {
          builder.trustManager(new ByteArrayInputStream(trustedCertificates));
        }
        if (clientCertificateChain != null) {
          builder.keyManager(new ByteArrayInputStream(clientCertificateChain), new ByteArrayInputStream(clientPrivateKey));
        }
      } catch (IOException e) {
        throw new UncheckedIOException(e);
      }
      return builder.build();
    }

    public AgentRuntimeClient build() {
      ChannelCredentials channelCredentials = channelCredentials();
      if (callCredentials != null) {
        channelCredentials = CompositeChannelCredentials.create(channelCredentials, callCredentials);
      }
      // One retry layer, the client's: no retry policy on the channel, and none from a resolver's
      // service config (gRPC's transparent retry of a call that never reached the server's
      // application stays: it cannot act twice).
      ManagedChannelBuilder<?> builder = Grpc.newChannelBuilder(target, channelCredentials)
          .disableServiceConfigLookUp();
      if (keepAliveTime != null) {
        builder.keepAliveTime(keepAliveTime.toNanos(), TimeUnit.NANOSECONDS)
            .keepAliveTimeout(keepAliveTimeout.toNanos(), TimeUnit.NANOSECONDS);
      }
      builder.keepAliveWithoutCalls(keepAliveWithoutCalls);
      if (!interceptors.isEmpty()) {
        builder.intercept(List.copyOf(interceptors));
      }
      ManagedChannel channel = builder.build();
      return new AgentRuntimeClient(channel, timeout, retries, retryWindow);
    }
  }

  /**
   * Call credentials sending {@code authorization: Bearer <token>}. They are applied over plaintext
   * too (a loopback server, a proxy that terminates TLS): give a remote server TLS.
   */
  public static final class BearerToken extends CallCredentials {
    private static final Metadata.Key<String> AUTHORIZATION =
        Metadata.Key.of("authorization", Metadata.ASCII_STRING_MARSHALLER);

    private final String value;

    public BearerToken(String token) {
      this.value = "Bearer " + Objects.requireNonNull(token, "token");
    }

    @Override
    public void applyRequestMetadata(RequestInfo requestInfo, Executor appExecutor, MetadataApplier applier) {
      Metadata headers = new Metadata();
      headers.put(AUTHORIZATION, value);
      applier.apply(headers);
    }

    @Override
    public String toString() {
      return "BearerToken[redacted]";
    }
  }

  /**
   * The generated blocking stub on this client's channel (its TLS and call credentials), for what
   * the thin methods do not cover; no default deadline is applied, and its calls are made once
   * (the client's retries and request ids are its methods': set a request's {@code request_id}
   * yourself to repeat a mutating call safely).
   */
  public AgentRuntimeGrpc.AgentRuntimeBlockingStub stub() {
    return stub;
  }

  /**
   * The future-based variant of this client, on the same channel (its TLS, token, interceptors and
   * keepalive) and with the same default deadline and retries: see {@link AgentRuntimeAsyncClient}.
   * Closing this client closes it too.
   */
  public synchronized AgentRuntimeAsyncClient async() {
    if (async == null) {
      async = new AgentRuntimeAsyncClient(channel, timeout, retries, retryWindow);
    }
    return async;
  }

  /** One attempt of a call, with this deadline ({@code null}: none); a failure as an AgentRuntimeException. */
  private <T> T attempt(Duration deadline, Function<AgentRuntimeGrpc.AgentRuntimeBlockingStub, T> rpc) {
    AgentRuntimeGrpc.AgentRuntimeBlockingStub target = stub;
    if (deadline != null) {
      target = target.withDeadlineAfter(deadline.toNanos(), TimeUnit.NANOSECONDS);
    }
    try {
      return rpc.apply(target);
    } catch (StatusRuntimeException e) {
      throw AgentRuntimeException.fromThrowable(e);
    }
  }

  /**
   * A unary call through the client's retry loop (see the class comment): attempts until one
   * succeeds, one fails with an error that is not retried, or the pause before the next would end
   * past the overall deadline (the caller's Context deadline, else the retry window from now);
   * then that attempt's error is thrown. Each attempt's deadline is the default one capped by
   * what is left of the overall one. With retries off: one attempt with the default deadline.
   */
  private <T> T call(Function<AgentRuntimeGrpc.AgentRuntimeBlockingStub, T> rpc) {
    if (!retries) {
      return attempt(timeout, rpc);
    }
    long end = overallEnd();
    for (int attempt = 0; ; attempt++) {
      checkInterrupted();
      long start = System.nanoTime();
      long left = end - start;
      long own = timeout == null ? left : Math.min(Requests.saturatedNanos(timeout), left);
      try {
        return attempt(Duration.ofNanos(Math.max(own, 1)), rpc);
      } catch (AgentRuntimeException e) {
        long now = System.nanoTime();
        boolean ownDeadlinePassed = own < left && now - (start + own) >= 0;
        if (!Retry.retryable(e, gaveUp(), ownDeadlinePassed)) {
          throw e;
        }
        long pause = Retry.pauseNanos(attempt, e);
        if (pause >= end - now) {
          throw e; // no time left for another attempt
        }
        pause(pause);
        channel.resetConnectBackoff(); // try the server now, not at the channel's own (up to 2 min) backoff
      }
    }
  }

  /**
   * When a call begun now must be over, as a {@link System#nanoTime()} value: the caller's
   * Context deadline when it has one, else the retry window from now.
   */
  private long overallEnd() {
    long now = System.nanoTime();
    Deadline deadline = Context.current().getDeadline();
    if (deadline != null) {
      return now + Math.max(deadline.timeRemaining(TimeUnit.NANOSECONDS), 0);
    }
    return now + windowNanos();
  }

  private long windowNanos() {
    return Math.min(Requests.saturatedNanos(retryWindow), Long.MAX_VALUE / 4);
  }

  /**
   * Creates a runtime (one tree) with these agent definitions; an empty id asks the server for one.
   * {@code requestId} (up to 64 characters of {@code [A-Za-z0-9_-]}; {@code null} or empty: a
   * generated UUID) makes the call safe to repeat: a repeat with the same id and the same request
   * gets the first call's answer (the same runtime id, even a generated one) and creates nothing.
   * Every mutating method has such an overload; the others generate the id.
   */
  public String createRuntime(List<AgentDef> agents, String runtimeId, String requestId) {
    CreateRuntimeRequest request = Requests.createRuntime(agents, runtimeId, Retry.requestId(requestId));
    return call(s -> s.createRuntime(request)).getRuntimeId();
  }

  /** Creates a runtime (one tree) with these agent definitions; an empty id asks the server for one. */
  public String createRuntime(List<AgentDef> agents, String runtimeId) {
    return createRuntime(agents, runtimeId, null);
  }

  /** Creates a runtime with a generated id. */
  public String createRuntime(List<AgentDef> agents) {
    return createRuntime(agents, "");
  }

  /**
   * Spawns a handle of {@code agent} under {@code parent} ({@code root} or a handle id) and returns
   * its id; a non-null {@code budget} overrides the agent's (carved by the parent's either way).
   */
  public String spawn(String runtimeId, String agent, String parent, Budget budget) {
    return spawn(runtimeId, agent, parent, budget, null);
  }

  /**
   * {@link #spawn(String, String, String, Budget)} with this request id ({@code null}: generated): a
   * repeat spawns nothing more.
   */
  public String spawn(String runtimeId, String agent, String parent, Budget budget, String requestId) {
    SpawnRequest request = Requests.spawn(runtimeId, agent, parent, budget, Retry.requestId(requestId));
    return call(s -> s.spawn(request)).getHandleId();
  }

  /** Spawns a top-level handle (under {@code root}) with the agent's own budget. */
  public String spawn(String runtimeId, String agent) {
    return spawn(runtimeId, agent, "root", null);
  }

  /** Posts into the handle's inbox; returns the inbox size. Empty channel and sender are the defaults. */
  public int post(String runtimeId, String handleId, String text, String channel, String sender) {
    return post(runtimeId, handleId, text, channel, sender, null);
  }

  /**
   * {@link #post(String, String, String, String, String)} with this request id ({@code null}:
   * generated): a repeat posts nothing more.
   */
  public int post(String runtimeId, String handleId, String text, String channel, String sender, String requestId) {
    return post(Requests.post(runtimeId, handleId, text, channel, sender, Retry.requestId(requestId))).getInboxSize();
  }

  /**
   * Post with the whole request, for the fields the other forms do not take ({@code trust},
   * {@code coalesce_key}); its {@code request_id}, when empty, is generated. Retried like every call.
   */
  public PostResponse post(PostRequest request) {
    PostRequest sent = Requests.post(Objects.requireNonNull(request, "request"));
    return call(s -> s.post(sent));
  }

  public int post(String runtimeId, String handleId, String text) {
    return post(runtimeId, handleId, text, "", "");
  }

  /** Starts a run on the prompt plus the inbox; returns at once ({@code true} when accepted). */
  public boolean wake(String runtimeId, String handleId, String prompt) {
    return wake(runtimeId, handleId, prompt, null);
  }

  /**
   * {@link #wake(String, String, String)} with this request id ({@code null}: generated): a repeat
   * gets the first answer and starts no second run.
   */
  public boolean wake(String runtimeId, String handleId, String prompt, String requestId) {
    WakeRequest request = Requests.wake(runtimeId, handleId, prompt, Retry.requestId(requestId));
    return call(s -> s.wake(request)).getQueued();
  }

  /**
   * The handle's settled (or PENDING) result, however long the run takes; with a non-null
   * {@code timeout}, after that long at most the server's {@code STATUS_TIMEOUT} result (the handle
   * still running). A timeout is the caller's choice, never the transport's: each Wait asks the
   * server for at most {@link #WAIT_SLICE} (30 s), with a call deadline {@link #WAIT_MARGIN} (10 s)
   * past it whatever the client's default timeout, and is repeated while the result is
   * {@code STATUS_TIMEOUT}. A failed Wait is retried as every call is (UNAVAILABLE, a CANCELLED the
   * caller did not cause as a stopping grpc-core server sends: grpc/grpc#41785, the slice's own
   * DEADLINE_EXCEEDED, or any status with a RetryInfo), with backoff (full jitter, up to 100 ms
   * doubling to 5 s, at least the RetryInfo's delay), while the failures in a row last less than
   * the retry window (60 s by default: a success starts it again) and {@code timeout} has not
   * passed; then the failure is thrown (a server answering UNAVAILABLE for ever fails the wait
   * after the window). With retries off a failed Wait is thrown at once.
   *
   * @throws AgentRuntimeException a refusal (NOT_FOUND, ...); the last failure once the window or
   *     {@code timeout} has passed with the server still away; CANCELLED when the calling thread
   *     is interrupted (its interrupt flag is set again) or its Context cancelled
   */
  public TaskResult waitFor(String runtimeId, String handleId, Duration timeout) {
    return sliced(Requests.waitEnd(timeout), slice -> {
      WaitRequest request = Requests.waitSlice(runtimeId, handleId, slice);
      return s -> s.wait(request).getResult();
    }, result -> result.getStatus() != dev.agentruntime.v1.Status.STATUS_TIMEOUT);
  }

  /**
   * The long-wait loop of {@link #waitFor} and {@link #replayRuntime}: each attempt asks the server
   * to wait at most {@link #WAIT_SLICE} (less when {@code end} is nearer), with a call deadline
   * {@link #WAIT_MARGIN} past it whatever the client's default timeout, and is repeated until its
   * answer is {@code settled} or {@code end} (a {@link System#nanoTime()} value; null: never) has
   * passed (then that answer is returned). A failed attempt is retried as every call is, while the
   * failures in a row last less than the retry window (a success starts it again) and {@code end}
   * has not passed; with retries off it is thrown at once.
   */
  private <R> R sliced(Long end, Function<Duration, Function<AgentRuntimeGrpc.AgentRuntimeBlockingStub, R>> attemptFor,
      Predicate<R> settled) {
    int failures = 0; // in a row
    long failingUntil = 0; // System.nanoTime() when the window of this run of failures ends
    while (true) {
      checkInterrupted();
      Duration slice = Requests.nextSlice(end);
      Function<AgentRuntimeGrpc.AgentRuntimeBlockingStub, R> rpc = attemptFor.apply(slice);
      Duration deadline = slice.plus(WAIT_MARGIN);
      long start = System.nanoTime();
      R response;
      try {
        response = attempt(deadline, rpc);
      } catch (AgentRuntimeException e) {
        long now = System.nanoTime();
        if (failures == 0) {
          failingUntil = now + windowNanos();
        }
        boolean ownDeadlinePassed = now - (start + deadline.toNanos()) >= 0;
        if (!retries || !Retry.retryable(e, gaveUp(), ownDeadlinePassed) || Requests.passed(end)) {
          throw e;
        }
        long pause = Retry.pauseNanos(failures, e);
        if (pause >= Math.min(failingUntil - now, Requests.remainingNanos(end))) {
          throw e; // the window (or the caller's timeout) ends first
        }
        failures++;
        pause(pause);
        channel.resetConnectBackoff(); // try the server now, not at the channel's own (up to 2 min) backoff
        continue;
      }
      failures = 0;
      if (settled.test(response) || Requests.passed(end)) {
        return response;
      }
    }
  }

  /** Waits until the handle settles (or suspends), however long that takes. */
  public TaskResult waitFor(String runtimeId, String handleId) {
    return waitFor(runtimeId, handleId, null);
  }

  /**
   * Answers a pending Request and returns the result the resumed handles settle on (retried like
   * every call, with one generated request id: a repeat runs nothing again).
   */
  public TaskResult resume(String runtimeId, Answer answer) {
    return resume(runtimeId, answer, null);
  }

  /** {@link #resume(String, Answer)} with this request id ({@code null}: generated). */
  public TaskResult resume(String runtimeId, Answer answer, String requestId) {
    ResumeRequest request = Requests.resume(runtimeId, answer, Retry.requestId(requestId));
    return call(s -> s.resume(request)).getResult();
  }

  /**
   * Forks the runtime {@code sourceRuntimeId} at its event {@code atSeq} (a Watch seq): a new
   * runtime whose journal is the source's up to the step that made that event, replayed without a
   * model or tool call; the runs in flight at the cut are held ({@code HANDLE_STATE_HELD}) until a
   * Wake. Returns the fork's id, its {@code fork_seq} (the last event it holds) and its held
   * handles. Retried like every call, with one generated request id: a repeat forks nothing more.
   */
  public ForkRuntimeResponse forkRuntime(String sourceRuntimeId, long atSeq) {
    return forkRuntime(sourceRuntimeId, atSeq, null, null, null, "", null);
  }

  /**
   * {@link #forkRuntime(String, long)} with changes at the fork: {@code agents} replace the
   * source's of the same name (a new name is added), {@code messages} replace a handle's last user
   * message, {@code answers} answer Requests pending at the cut (each {@code null}: none);
   * {@code runtimeId} is the fork's id (empty or {@code null}: generated) and {@code requestId}
   * the call's ({@code null}: generated).
   */
  public ForkRuntimeResponse forkRuntime(String sourceRuntimeId, long atSeq, List<AgentDef> agents,
      List<ForkMessage> messages, List<Answer> answers, String runtimeId, String requestId) {
    Objects.requireNonNull(sourceRuntimeId, "sourceRuntimeId");
    ForkRuntimeRequest request = Requests.forkRuntime(sourceRuntimeId, atSeq, agents, messages, answers, runtimeId,
        Retry.requestId(requestId));
    return call(s -> s.forkRuntime(request));
  }

  /** ForkRuntime with the whole request; its {@code request_id}, when empty, is generated. Retried like every call. */
  public ForkRuntimeResponse forkRuntime(ForkRuntimeRequest request) {
    ForkRuntimeRequest sent = Requests.forkRuntime(Objects.requireNonNull(request, "request"));
    return call(s -> s.forkRuntime(sent));
  }

  /**
   * Replays the recorded runtime {@code sourceRuntimeId}'s root prompts in a new runtime, with
   * {@code agents} replacing the recording's definitions of the same name ({@code null} or empty:
   * the recording's own) and {@code unrecordedCalls} saying what a tool call the recording does not
   * have does ({@code null}: the server's default, {@code UNRECORDED_CALLS_RECORDED_ONLY}); returns
   * the recording and the replay side by side, root by root, once every root of the replay has
   * settled, however long that takes. See {@link #replayRuntime(ReplayRuntimeRequest, Duration)}.
   */
  public ReplayRuntimeResponse replayRuntime(String sourceRuntimeId, List<AgentDef> agents,
      UnrecordedCalls unrecordedCalls) {
    return replayRuntime(sourceRuntimeId, agents, unrecordedCalls, "", null, null);
  }

  /**
   * {@link #replayRuntime(String, List, UnrecordedCalls)} with the replay's id ({@code runtimeId};
   * empty or {@code null}: generated), the call's request id ({@code null}: generated) and the
   * caller's {@code timeout} ({@code null}: none).
   */
  public ReplayRuntimeResponse replayRuntime(String sourceRuntimeId, List<AgentDef> agents,
      UnrecordedCalls unrecordedCalls, String runtimeId, String requestId, Duration timeout) {
    Objects.requireNonNull(sourceRuntimeId, "sourceRuntimeId");
    return replayRuntime(Requests.replayRuntime(sourceRuntimeId, agents, unrecordedCalls, runtimeId,
        Retry.requestId(requestId)), timeout);
  }

  /**
   * ReplayRuntime with the whole request (its {@code request_id}, when empty, is generated once; its
   * {@code timeout} is replaced by each attempt's), waited on as {@link #waitFor} waits: each call
   * asks the server to wait at most {@link #WAIT_SLICE} (30 s) for the replay's roots, with a call
   * deadline {@link #WAIT_MARGIN} (10 s) past it whatever the client's default timeout, and while
   * the answer says {@code settled: false} the same request, with the same request id, is sent
   * again: the server starts the replay once and the repeats wait on it. A failed call is retried
   * as a Wait is (failures in a row within the retry window). With a non-null {@code timeout}, the
   * last answer once it has passed, {@code settled: false} when the replay is still running; under
   * a Context deadline, the last answer a second before it (half what is left under 2 s), as the
   * server itself answers, rather than DEADLINE_EXCEEDED.
   *
   * @throws AgentRuntimeException a refusal (NOT_FOUND, INVALID_ARGUMENT, ...); the last failure
   *     once the window or {@code timeout} has passed with the server still away; CANCELLED when the
   *     calling thread is interrupted or its Context cancelled
   */
  public ReplayRuntimeResponse replayRuntime(ReplayRuntimeRequest request, Duration timeout) {
    ReplayRuntimeRequest sent = Requests.replayRuntime(Objects.requireNonNull(request, "request"));
    return sliced(Requests.replayEnd(timeout, Context.current().getDeadline()), slice -> {
      ReplayRuntimeRequest attempt = Requests.replaySlice(sent, slice);
      return s -> s.replayRuntime(attempt);
    }, ReplayRuntimeResponse::getSettled);
  }

  /** Throws CANCELLED (the flag left set) when the calling thread has been interrupted. */
  private static void checkInterrupted() {
    if (Thread.currentThread().isInterrupted()) {
      throw interrupted(null);
    }
  }

  static AgentRuntimeException interrupted(InterruptedException cause) {
    return AgentRuntimeException.cancelledByClient("the calling thread was interrupted", cause);
  }

  /**
   * The pause between two attempts: it ends early when the caller's Context is cancelled (the next
   * attempt then fails at once, and is not retried); an interrupt throws CANCELLED (setting the
   * interrupt flag again).
   */
  private static void pause(long nanos) {
    if (nanos <= 0) {
      return;
    }
    Context context = Context.current();
    CountDownLatch cancelled = new CountDownLatch(1);
    Context.CancellationListener listener = c -> cancelled.countDown();
    context.addListener(listener, Runnable::run);
    try {
      cancelled.await(nanos, TimeUnit.NANOSECONDS);
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
      throw interrupted(e);
    } finally {
      context.removeListener(listener);
    }
  }

  /**
   * Spawn + Wake + Wait: the settled (or PENDING) result of a fresh handle under {@code parent},
   * however long the run takes (see {@link #waitFor(String, String, Duration)}). Its Spawn and its
   * Wake each carry a request id generated once, so their retries act once.
   */
  public TaskResult run(String runtimeId, String agent, String prompt, String parent) {
    return run(runtimeId, agent, prompt, parent, null, null);
  }

  /**
   * {@link #run(String, String, String, String)} with the request ids of its Spawn and its Wake
   * ({@code null}: generated): a repeated run with the same two ids spawns and wakes nothing more,
   * and waits for the same handle.
   */
  public TaskResult run(String runtimeId, String agent, String prompt, String parent, String spawnRequestId,
      String wakeRequestId) {
    String handleId = spawn(runtimeId, agent, parent, null, spawnRequestId);
    wake(runtimeId, handleId, prompt, wakeRequestId);
    return waitFor(runtimeId, handleId, null);
  }

  /** Spawn + Wake + Wait of a fresh top-level handle. */
  public TaskResult run(String runtimeId, String agent, String prompt) {
    return run(runtimeId, agent, prompt, "root");
  }

  /**
   * Spawn + Watch with deltas + Wake: runs a fresh handle of {@code agent} under {@code parent}, hands
   * what its model writes to {@code onDelta} as it streams, and returns the handle's result. Its
   * Spawn and its Wake each carry a request id generated once, as {@link #run} does.
   *
   * <p>The watch is the runtime's from its first event ({@code after_seq} 0) with
   * {@code WatchRequest.deltas} (and batches, as {@link #watch(String, long)} asks for), reconnected
   * exactly as {@link #watch(String, long)} does (from the last event's seq, the last of its batch,
   * the same backoff and limits; a delta not seen before, other than a reset,
   * counts as progress as an event does). The Wake is sent only once the watch has answered (with
   * the handle's {@code spawned} event, at least): a real provider's turn streams only to the
   * watchers subscribed when it starts, and the server subscribes a watcher before it sends its
   * history. {@code onDelta} gets the deltas of this handle only (not its children's), in order
   * and each once, on the calling thread: after a reconnect the server sends a turn still in
   * progress again from index 0, and the pieces already handed over are skipped. A {@code reset}
   * delta is always handed over: what was streamed for its turn so far is void (the provider call
   * is retried, or the turn runs again after a restart), so a UI clears it. The result is the
   * {@code TaskResult} of the handle's first {@code result} event: a PENDING one too (answer it with
   * {@link #resume}).
   *
   * <pre>{@code
   * TaskResult result = client.streamRun(runtimeId, "writer", "write it", "root", delta -> {
   *   if (delta.hasReset()) {
   *     screen.clearTurn(delta.getTurn());
   *   } else if (delta.getPieceCase() == Delta.PieceCase.TEXT) {
   *     screen.append(delta.getText());
   *   }
   * });
   * }</pre>
   *
   * @throws AgentRuntimeException a refused Spawn or Wake, the watch's failure (see {@link WatchStream}),
   *     or CANCELLED when the client is closed or the thread interrupted; an exception of
   *     {@code onDelta} ends the call (and its watch) as it is
   */
  public TaskResult streamRun(String runtimeId, String agent, String prompt, String parent, Consumer<Delta> onDelta) {
    return streamRun(runtimeId, agent, prompt, parent, null, null, onDelta);
  }

  /**
   * {@link #streamRun(String, String, String, String, Consumer)} with the request ids of its Spawn
   * and its Wake ({@code null}: generated): a repeat with the same two ids spawns and wakes nothing
   * more, and streams the same handle again (its finished turns are not streamed twice: only the
   * turns in progress are).
   */
  public TaskResult streamRun(String runtimeId, String agent, String prompt, String parent, String spawnRequestId,
      String wakeRequestId, Consumer<Delta> onDelta) {
    Objects.requireNonNull(onDelta, "onDelta");
    String handleId = spawn(runtimeId, agent, parent, null, spawnRequestId);
    boolean woken = false;
    try (WatchStream events = openWatch(runtimeId, 0, WatchStream.MAX_RETRIES, WatchStream.BACKOFF,
        new DeltaFilter(handleId, onDelta))) {
      while (events.hasNext()) {
        // The first event (the handle's spawned one, from the history) comes on a stream the
        // server has subscribed already (a dropped one is reopened before it): the turn the Wake
        // starts streams to it.
        if (!woken) {
          wake(runtimeId, handleId, prompt, wakeRequestId);
          woken = true;
        }
        Event event = events.next();
        if (event.hasResult() && event.getHandleId().equals(handleId)) {
          return event.getResult();
        }
      }
    }
    // hasNext() is false only once the watch is closed: by closing the client.
    throw AgentRuntimeException.cancelledByClient("the client was closed while streaming " + handleId, null);
  }

  /** Cancels the handle's run and its subtree's; {@code false} when there was nothing to interrupt. */
  public boolean interrupt(String runtimeId, String handleId) {
    return interrupt(runtimeId, handleId, null);
  }

  /** {@link #interrupt(String, String)} with this request id ({@code null}: generated): a repeat gets the first answer. */
  public boolean interrupt(String runtimeId, String handleId, String requestId) {
    InterruptRequest request = Requests.interrupt(runtimeId, handleId, Retry.requestId(requestId));
    return call(s -> s.interrupt(request)).getInterrupted();
  }

  /** Closes the handle and its subtree, leaf first; returns the closed ids. {@code force} interrupts running ones. */
  public List<String> close(String runtimeId, String handleId, boolean force) {
    return close(runtimeId, handleId, force, null);
  }

  /** {@link #close(String, String, boolean)} with this request id ({@code null}: generated): a repeat gets the first answer. */
  public List<String> close(String runtimeId, String handleId, boolean force, String requestId) {
    return List.copyOf(close(Requests.close(runtimeId, handleId, force, Retry.requestId(requestId)))
        .getClosedHandleIdsList());
  }

  /**
   * Close with the whole request, for the field the other forms do not take ({@code grace}); its
   * {@code request_id}, when empty, is generated. Retried like every call.
   */
  public CloseResponse close(CloseRequest request) {
    CloseRequest sent = Requests.close(Objects.requireNonNull(request, "request"));
    return call(s -> s.close(sent));
  }

  public List<String> close(String runtimeId, String handleId) {
    return close(runtimeId, handleId, false);
  }

  /** One handle's view. */
  public HandleView inspect(String runtimeId, String handleId) {
    InspectRequest request = Requests.inspect(runtimeId, handleId);
    return call(s -> s.inspect(request)).getHandle();
  }

  /** Every handle of the runtime, in spawn order: it follows the pages of List to the last. */
  public List<HandleView> list(String runtimeId) {
    return listStream(runtimeId).collect(java.util.stream.Collectors.toUnmodifiableList());
  }

  /**
   * The pages of List ({@code pageSize} handles each; 0: the server's default), fetched lazily: each
   * iteration starts at the first page and calls List once per page it reaches, up to the last one.
   */
  public Iterable<ListResponse> listPages(String runtimeId, int pageSize) {
    return new Pages<>(token -> listPage(runtimeId, pageSize, token), ListResponse::getNextPageToken);
  }

  /** Every handle of the runtime, in spawn order, as a lazy stream over {@link #listPages} (the server's page size). */
  public Stream<HandleView> listStream(String runtimeId) {
    return Pages.stream(listPages(runtimeId, 0), ListResponse::getHandlesList);
  }

  /**
   * One page of List: at most {@code pageSize} handles (0: the server's default) from {@code pageToken}
   * on (empty for the first page); its {@code next_page_token} is empty on the last page.
   */
  public ListResponse listPage(String runtimeId, int pageSize, String pageToken) {
    ListRequest request = Requests.list(runtimeId, pageSize, pageToken);
    return call(s -> s.list(request));
  }

  /**
   * The handle's whole stored transcript, exactly what a resumed turn replays: it follows the pages
   * of GetTranscript to the last.
   */
  public List<Message> transcript(String runtimeId, String handleId) {
    return transcriptStream(runtimeId, handleId).collect(java.util.stream.Collectors.toUnmodifiableList());
  }

  /** The pages of GetTranscript, fetched lazily as {@link #listPages} does. */
  public Iterable<GetTranscriptResponse> transcriptPages(String runtimeId, String handleId, int pageSize) {
    return new Pages<>(token -> transcriptPage(runtimeId, handleId, pageSize, token),
        GetTranscriptResponse::getNextPageToken);
  }

  /** The handle's whole transcript as a lazy stream over {@link #transcriptPages} (the server's page size). */
  public Stream<Message> transcriptStream(String runtimeId, String handleId) {
    return Pages.stream(transcriptPages(runtimeId, handleId, 0), GetTranscriptResponse::getMessagesList);
  }

  /**
   * One page of GetTranscript: at most {@code pageSize} messages (0: the server's default) from
   * {@code pageToken} on (empty for the first page); its {@code next_page_token} is empty on the last page.
   */
  public GetTranscriptResponse transcriptPage(String runtimeId, String handleId, int pageSize, String pageToken) {
    GetTranscriptRequest request = Requests.transcript(runtimeId, handleId, pageSize, pageToken);
    return call(s -> s.getTranscript(request));
  }

  /** Every runtime of the caller's tenant, newest first: it follows the pages of ListRuntimes to the last. */
  public List<RuntimeSummary> listRuntimes() {
    return listRuntimesStream().collect(java.util.stream.Collectors.toUnmodifiableList());
  }

  /** The pages of ListRuntimes, fetched lazily as {@link #listPages} does. */
  public Iterable<ListRuntimesResponse> listRuntimesPages(int pageSize) {
    return listRuntimesPages(pageSize, null);
  }

  /** Every runtime of the caller's tenant, newest first, as a lazy stream over {@link #listRuntimesPages}. */
  public Stream<RuntimeSummary> listRuntimesStream() {
    return listRuntimesStream(null);
  }

  /**
   * One page of ListRuntimes: at most {@code pageSize} runtimes (0: the server's default), newest
   * first, from {@code pageToken} on (empty for the first page); its {@code next_page_token} is empty
   * on the last page.
   */
  public ListRuntimesResponse listRuntimesPage(int pageSize, String pageToken) {
    return listRuntimesPage(pageSize, pageToken, null);
  }

  /**
   * {@link #listRuntimesPage(int, String)} of the forks and replays of {@code forksOf} only (their
   * {@code forked_from}); {@code null} or empty: every runtime.
   */
  public ListRuntimesResponse listRuntimesPage(int pageSize, String pageToken, String forksOf) {
    ListRuntimesRequest request = Requests.listRuntimes(pageSize, pageToken, forksOf);
    return call(s -> s.listRuntimes(request));
  }

  /** The forks and replays of {@code forksOf}, newest first: every page of ListRuntimes with {@code forks_of}. */
  public List<RuntimeSummary> listRuntimes(String forksOf) {
    return listRuntimesStream(forksOf).collect(java.util.stream.Collectors.toUnmodifiableList());
  }

  /** {@link #listRuntimesPages(int)} of the forks and replays of {@code forksOf} only ({@code null} or empty: every runtime). */
  public Iterable<ListRuntimesResponse> listRuntimesPages(int pageSize, String forksOf) {
    return new Pages<>(token -> listRuntimesPage(pageSize, token, forksOf), ListRuntimesResponse::getNextPageToken);
  }

  /** {@link #listRuntimesStream()} of the forks and replays of {@code forksOf} only. */
  public Stream<RuntimeSummary> listRuntimesStream(String forksOf) {
    return Pages.stream(listRuntimesPages(0, forksOf), ListRuntimesResponse::getRuntimesList);
  }

  /**
   * Closes the runtime and deletes everything stored of it; {@code force} interrupts running
   * handles (without it a runtime with running handles is refused).
   */
  public void deleteRuntime(String runtimeId, boolean force) {
    deleteRuntime(runtimeId, force, null);
  }

  /**
   * {@link #deleteRuntime(String, boolean)} with this request id ({@code null}: generated): a repeat
   * gets the first answer (not NOT_FOUND), for as long as the server keeps request ids.
   */
  public void deleteRuntime(String runtimeId, boolean force, String requestId) {
    DeleteRuntimeRequest request = Requests.deleteRuntime(runtimeId, force, Retry.requestId(requestId));
    call(s -> s.deleteRuntime(request));
  }

  public void deleteRuntime(String runtimeId) {
    deleteRuntime(runtimeId, false);
  }

  /**
   * The runtime's events after {@code afterSeq} (0: its whole history), in order, once each, as a
   * blocking iterator that never ends by itself: {@code hasNext()} blocks until the next event and
   * is {@code false} only once the stream is closed. The stream uses this client's channel (its TLS
   * and call credentials) and has no deadline. It asks for batches ({@code WatchRequest.batch}: the
   * events at hand in one response) and hands their events over one at a time.
   *
   * <p>A dropped stream (UNAVAILABLE, or a CANCELLED the caller did not cause, as a stopping grpc-core
   * server sends, grpc/grpc#41785; RESOURCE_EXHAUSTED with {@code ErrorInfo} reason
   * {@code WATCH_LAGGING}, when this consumer fell too far behind; or the server ending it, as a
   * restarting one does) is reopened from the last seq seen, so nothing is missed or seen twice.
   * After {@code maxRetries} reconnects in a row with no event between them (waiting
   * {@code backoff}, doubling, plus up to half again at random, before each but a lagging one),
   * {@code hasNext()} throws the error as
   * an {@link AgentRuntimeException}; so does any other status (NOT_FOUND, PERMISSION_DENIED, ...),
   * and an interrupt of the iterating thread (CANCELLED, the flag set again).
   *
   * <pre>{@code
   * try (WatchStream events = client.watch(runtimeId, 0)) {
   *   while (events.hasNext()) {
   *     Event event = events.next();
   *     System.out.println(event.getSeq() + " " + event.getHandleId() + " " + event.getPayloadCase());
   *   }
   * }
   * }</pre>
   *
   * <p>Close it (from any thread) to stop watching; closing the client closes its watches.
   */
  public WatchStream watch(String runtimeId, long afterSeq, int maxRetries, Duration backoff) {
    Objects.requireNonNull(runtimeId, "runtimeId");
    Objects.requireNonNull(backoff, "backoff");
    if (maxRetries < 0 || afterSeq < 0 || backoff.isNegative()) {
      throw new IllegalArgumentException("afterSeq, maxRetries and backoff must not be negative");
    }
    return openWatch(runtimeId, afterSeq, maxRetries, backoff, null);
  }

  /** A watch closed with the client; with {@code deltas} (else null) it asks for deltas and hands them over. */
  private WatchStream openWatch(String runtimeId, long afterSeq, int maxRetries, Duration backoff,
      DeltaFilter deltas) {
    WatchStream watch = new WatchStream(stub, channel::resetConnectBackoff, runtimeId, afterSeq, maxRetries,
        backoff, retryWindow, watches::remove, deltas);
    watches.add(watch);
    return watch;
  }

  /**
   * {@link #watch(String, long, int, Duration)} giving up after 5 failed reconnects in a row, 1 s
   * doubling between them (at least 31 s in all: long enough for a graceful server restart).
   */
  public WatchStream watch(String runtimeId, long afterSeq) {
    return watch(runtimeId, afterSeq, WatchStream.MAX_RETRIES, WatchStream.BACKOFF);
  }

  /**
   * Serves worker tools ({@code ToolDef.worker}) of {@code queue} over ServeTools, in the
   * background, until the returned worker is closed: {@code handlers} maps each tool name to its
   * handler (their names, sorted, are registered), and at most {@code maxConcurrentCalls} (1 to
   * 1000) calls run at once, on the worker's own threads. The stream uses this client's channel (its
   * TLS and call credentials) and has no deadline; a dropped stream is reopened with backoff, and a
   * refusal stops the worker (see {@link ToolWorker}). {@link #close()} closes the client's workers.
   *
   * <pre>{@code
   * try (ToolWorker worker = client.serveTools("weather",
   *     Map.of("forecast", (arguments, call) -> "sunny in " + arguments.get("city")), 4)) {
   *   worker.awaitRegistered(Duration.ofSeconds(10));
   *   worker.await(); // serves until closed (or refused)
   * }
   * }</pre>
   *
   * @throws IllegalArgumentException no handlers, or {@code maxConcurrentCalls} out of range
   */
  public ToolWorker serveTools(String queue, Map<String, ToolHandler> handlers, int maxConcurrentCalls) {
    Objects.requireNonNull(queue, "queue");
    Objects.requireNonNull(handlers, "handlers");
    if (handlers.isEmpty()) {
      throw new IllegalArgumentException("serveTools needs at least one handler");
    }
    if (maxConcurrentCalls < 1 || maxConcurrentCalls > ToolWorker.MAX_CONCURRENT_CALLS) {
      throw new IllegalArgumentException(
          "maxConcurrentCalls must be between 1 and " + ToolWorker.MAX_CONCURRENT_CALLS + ", got " + maxConcurrentCalls);
    }
    ToolWorker worker = new ToolWorker(asyncStub, queue, handlers, maxConcurrentCalls, workers::remove);
    workers.add(worker);
    worker.start();
    return worker;
  }

  /** {@link #serveTools(String, Map, int)} taking up to 10 calls at once (the Python client's default). */
  public ToolWorker serveTools(String queue, Map<String, ToolHandler> handlers) {
    return serveTools(queue, handlers, 10);
  }

  /**
   * Closes the client's tool workers and watches, fails the async client's pending waits and
   * retries (CANCELLED) and shuts the channel down (closes no handle: see
   * {@link #close(String, String)} for that).
   */
  @Override
  public void close() {
    for (ToolWorker worker : List.copyOf(workers)) {
      worker.close();
    }
    for (WatchStream watch : List.copyOf(watches)) {
      watch.close();
    }
    synchronized (this) {
      if (async != null) {
        async.shutdownScheduler();
      }
    }
    channel.shutdown();
    try {
      if (!channel.awaitTermination(5, TimeUnit.SECONDS)) {
        channel.shutdownNow();
      }
    } catch (InterruptedException e) {
      channel.shutdownNow();
      Thread.currentThread().interrupt();
    }
  }
}
