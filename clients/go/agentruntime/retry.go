package agentruntime

import (
	"context"
	"math/rand/v2"
	"time"

	"github.com/google/uuid"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// DefaultRetryWindow bounds the retries of a call whose context has no deadline (and a run
// of consecutive failures of Wait and Watch), unless WithRetryWindow says otherwise.
const DefaultRetryWindow = 60 * time.Second

// Retries wait with full jitter: attempt n (from 0) is followed by a delay drawn uniformly
// from [0, min(retryMaxBackoff, retryBackoff·2^n)), and at least the RetryInfo's
// retry_delay when the error carries one.
const (
	retryBackoff    = 100 * time.Millisecond
	retryMaxBackoff = 5 * time.Second
)

// WithoutRetries turns the client's retries off: every call is made once and its error
// returned as it is; Wait returns the first failure, and Watch reconnects only when
// WithWatchRetries asks it to. Mutating calls still carry a request id (generated or
// given), so the caller can repeat them safely.
func WithoutRetries() Option {
	return func(o *options) { o.retries = false }
}

// WithRetryWindow sets how long a call whose context has no deadline is retried
// (DefaultRetryWindow), measured from its first attempt; a context's deadline bounds the
// retries instead. Wait and Watch give up after a run of consecutive failures this long.
// A window of 0 or less leaves the default.
func WithRetryWindow(d time.Duration) Option {
	return func(o *options) {
		if d > 0 {
			o.retryWindow = d
		}
	}
}

// CallOption configures one call of a mutating method (CreateRuntime, Spawn, Post,
// Wake, Resume, Interrupt, Close, DeleteRuntime, ForkRuntime, ReplayRuntime).
type CallOption func(*callOptions)

type callOptions struct {
	requestID string
}

// WithRequestID sends the call with this request id (up to 64 characters of
// [A-Za-z0-9_-]; a UUID is the usual choice) instead of a generated one. The server
// answers a repeat of the same request with the same id with the first answer, without
// acting again, so a caller that does not know whether a call took effect (its process
// restarted, say) can send it again with the id it used. The same id with another
// request is refused: INVALID_ARGUMENT with ErrorInfo reason REQUEST_ID_REUSED.
func WithRequestID(id string) CallOption {
	return func(o *callOptions) { o.requestID = id }
}

// requestIDOf is the request id the call options give ("" when none: the client
// generates one).
func requestIDOf(opts []CallOption) string {
	var o callOptions
	for _, opt := range opts {
		opt(&o)
	}
	return o.requestID
}

// RunOption configures Run and StreamRun.
type RunOption func(*runOptions)

type runOptions struct {
	spawnRequestID, wakeRequestID string
	watch                         []WatchOption
}

// WithRunRequestIDs gives Run (or StreamRun) the request ids of its Spawn and of its Wake
// (an empty one is generated), so that a caller that repeats a Run it lost track of gets
// the handle the first one spawned and does not run it again.
func WithRunRequestIDs(spawnID, wakeID string) RunOption {
	return func(o *runOptions) { o.spawnRequestID, o.wakeRequestID = spawnID, wakeID }
}

// WithRunWatchOptions configures StreamRun's watch as they configure Watch (its
// reconnects: WithWatchRetries, WithWatchBackoff). Run, which waits without watching,
// has no use for them.
func WithRunWatchOptions(opts ...WatchOption) RunOption {
	return func(o *runOptions) { o.watch = append(o.watch, opts...) }
}

// runOptionsOf reads Run's and StreamRun's options, with a fresh request id for the Spawn
// and the Wake the caller gave none for.
func runOptionsOf(opts []RunOption) runOptions {
	var o runOptions
	for _, opt := range opts {
		opt(&o)
	}
	if o.spawnRequestID == "" {
		o.spawnRequestID = NewRequestID()
	}
	if o.wakeRequestID == "" {
		o.wakeRequestID = NewRequestID()
	}
	return o
}

// NewRequestID returns a fresh request id: a random (version 4) UUID, the kind the client
// generates for a mutating call made without WithRequestID.
func NewRequestID() string { return uuid.NewString() }

// Private context keys: the client's own methods tell the retrying interceptor the
// per-attempt deadline to apply (Stub()'s calls carry none), and Wait that its RPCs are
// retried by its own loop.
type (
	attemptTimeoutKey struct{}
	ownLoopKey        struct{}
)

// withAttemptTimeout marks a call of the client's own methods: each attempt gets the
// client's default per-call deadline (WithTimeout).
func (c *Client) withAttemptTimeout(ctx context.Context) context.Context {
	return context.WithValue(ctx, attemptTimeoutKey{}, c.timeout)
}

// withRequestID gives req a request id when it has a request_id field and none is set:
// a copy of req, so that a caller's message (through Stub()) is left as it was. Every
// attempt of the call then carries that one id.
func withRequestID(req any) any {
	message, ok := req.(proto.Message)
	if !ok {
		return req
	}
	field := message.ProtoReflect().Descriptor().Fields().ByName("request_id")
	if field == nil || field.Kind() != protoreflect.StringKind || message.ProtoReflect().Get(field).String() != "" {
		return req
	}
	message = proto.Clone(message)
	message.ProtoReflect().Set(field, protoreflect.ValueOfString(NewRequestID()))
	return message
}

// retrying is the client's one retry layer, the outermost unary interceptor (the
// interceptors of WithUnaryInterceptors see each attempt): it gives a mutating request
// with no request id a generated one, the same on every attempt, and repeats the call
// while retryable says so, with full-jitter backoff (at least the RetryInfo's
// retry_delay), until ctx's deadline or, when ctx has none, the retry window. Each
// attempt's deadline is the client's default per-call deadline (its own methods' calls;
// Stub()'s have none), capped by what is left of that overall one. Wait's own loop
// (ownLoopKey) and, with WithoutRetries, every call are made once.
func (c *Client) retrying(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn,
	invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	req = withRequestID(req)
	perAttempt, _ := ctx.Value(attemptTimeoutKey{}).(time.Duration)
	if !c.retries || ctx.Value(ownLoopKey{}) != nil {
		if _, ok := ctx.Deadline(); !ok && perAttempt > 0 {
			var cancel context.CancelFunc
			ctx, cancel = context.WithTimeout(ctx, perAttempt)
			defer cancel()
		}
		return invoker(ctx, method, req, reply, cc, opts...)
	}
	end, ok := ctx.Deadline()
	if !ok {
		end = time.Now().Add(c.retryWindow)
	}
	for attempt := 0; ; attempt++ {
		deadline := end
		if perAttempt > 0 {
			deadline = minTime(end, time.Now().Add(perAttempt))
		}
		attemptCtx, cancel := context.WithDeadline(ctx, deadline)
		err := invoker(attemptCtx, method, req, reply, cc, opts...)
		cancel()
		// Its own deadline has passed (the DEADLINE_EXCEEDED may be the server's answer to
		// the propagated deadline, come before attemptCtx's own timer fired).
		expired := !time.Now().Before(deadline)
		if err == nil {
			return nil
		}
		if !c.retryable(ctx, err, expired) {
			return err
		}
		delay := retryDelay(attempt, err)
		if !time.Now().Add(delay).Before(end) { // no time left for another attempt
			return err
		}
		if err := sleep(ctx, delay); err != nil {
			return status.FromContextError(err).Err()
		}
		if m, ok := reply.(proto.Message); ok {
			proto.Reset(m)
		}
	}
}

// retryable says whether an attempt of a call made under ctx that failed with err is
// worth repeating: never once ctx is done (the caller's cancellation or deadline) or
// CloseConn was called; on UNAVAILABLE; on a CANCELLED the caller did not cause (grpc-core
// ends a call that reaches a server as it begins to shut down with CANCELLED,
// grpc/grpc#41785); on a DEADLINE_EXCEEDED of the attempt's own deadline (expired); and
// on any status whose details carry RetryInfo.
func (c *Client) retryable(ctx context.Context, err error, expired bool) bool {
	if ctx.Err() != nil || c.conn.GetState() == connectivity.Shutdown {
		return false
	}
	switch status.Code(err) {
	case codes.Unavailable, codes.Canceled:
		return true
	case codes.DeadlineExceeded:
		if expired {
			return true
		}
	}
	_, ok := retryInfo(err)
	return ok
}

// retryInfo is the retry_delay of the RetryInfo in err's status details, if it has one.
func retryInfo(err error) (time.Duration, bool) {
	for _, d := range status.Convert(err).Details() {
		if info, ok := d.(*errdetails.RetryInfo); ok {
			return max(info.GetRetryDelay().AsDuration(), 0), true
		}
	}
	return 0, false
}

// retryDelay is the wait after the failed attempt n (from 0): full jitter, uniform in
// [0, min(retryMaxBackoff, retryBackoff·2^n)), and at least the RetryInfo's retry_delay.
func retryDelay(attempt int, err error) time.Duration {
	delay := fullJitter(attempt)
	if wait, ok := retryInfo(err); ok {
		delay = max(delay, wait)
	}
	return delay
}

// fullJitter is uniform in [0, min(retryMaxBackoff, retryBackoff·2^attempt)).
func fullJitter(attempt int) time.Duration {
	ceiling := retryBackoff
	for i := 0; i < attempt && ceiling < retryMaxBackoff; i++ {
		ceiling *= 2
	}
	ceiling = min(ceiling, retryMaxBackoff)
	return rand.N(ceiling)
}

func minTime(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}
