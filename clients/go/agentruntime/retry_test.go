package agentruntime

import (
	"context"
	"errors"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	v1 "github.com/agentruntime/agentruntime/clients/go/agentruntime/v1"
)

// The tests of this file play the server with flaky, an AgentRuntime service on a
// loopback TCP port that fails the first attempts of every call with a status the test
// chooses and records every attempt it sees (its RPC, its request id, when it came, how
// long its deadline was).

type attempt struct {
	method    string
	requestID string
	at        time.Time
	deadline  time.Duration // 0: none
}

type flaky struct {
	v1.UnimplementedAgentRuntimeServer
	mu       sync.Mutex
	attempts []attempt
	// fail answers attempt n (from 1) of a method: an error, or nil to serve it. It may block
	// on ctx (the attempt's context on the server).
	fail func(ctx context.Context, method string, n int) error
	// wait answers the Wait RPCs fail lets through (default: STATUS_DONE).
	wait func(n int) *v1.TaskResult
	// replay answers the ReplayRuntime RPCs fail lets through, n counting them from 1
	// (default: settled); replays records their requests (fork_test.go).
	replay  func(ctx context.Context, n int) *v1.ReplayRuntimeResponse
	replays []*v1.ReplayRuntimeRequest
	forks   []*v1.ForkRuntimeRequest // the ForkRuntime requests it answered
}

// serve records the attempt and returns fail's answer for it.
func (f *flaky) serve(ctx context.Context, method, requestID string) error {
	var deadline time.Duration
	if d, ok := ctx.Deadline(); ok {
		deadline = time.Until(d)
	}
	f.mu.Lock()
	f.attempts = append(f.attempts, attempt{method, requestID, time.Now(), deadline})
	n := 0
	for _, a := range f.attempts {
		if a.method == method {
			n++
		}
	}
	fail := f.fail
	f.mu.Unlock()
	if fail == nil {
		return nil
	}
	return fail(ctx, method, n)
}

// seen returns the attempts recorded so far, and forgets them.
func (f *flaky) seen() []attempt {
	f.mu.Lock()
	defer f.mu.Unlock()
	seen := f.attempts
	f.attempts = nil
	return seen
}

func (f *flaky) CreateRuntime(ctx context.Context, req *v1.CreateRuntimeRequest) (*v1.CreateRuntimeResponse, error) {
	if err := f.serve(ctx, "CreateRuntime", req.GetRequestId()); err != nil {
		return nil, err
	}
	return &v1.CreateRuntimeResponse{RuntimeId: "rt-1"}, nil
}

func (f *flaky) Spawn(ctx context.Context, req *v1.SpawnRequest) (*v1.SpawnResponse, error) {
	if err := f.serve(ctx, "Spawn", req.GetRequestId()); err != nil {
		return nil, err
	}
	return &v1.SpawnResponse{HandleId: "root/" + req.GetAgent() + ".1"}, nil
}

func (f *flaky) Post(ctx context.Context, req *v1.PostRequest) (*v1.PostResponse, error) {
	if err := f.serve(ctx, "Post", req.GetRequestId()); err != nil {
		return nil, err
	}
	return &v1.PostResponse{Ok: true, InboxSize: 1}, nil
}

func (f *flaky) Wake(ctx context.Context, req *v1.WakeRequest) (*v1.WakeResponse, error) {
	if err := f.serve(ctx, "Wake", req.GetRequestId()); err != nil {
		return nil, err
	}
	return &v1.WakeResponse{Queued: true}, nil
}

func (f *flaky) Resume(ctx context.Context, req *v1.ResumeRequest) (*v1.ResumeResponse, error) {
	if err := f.serve(ctx, "Resume", req.GetRequestId()); err != nil {
		return nil, err
	}
	return &v1.ResumeResponse{Result: &v1.TaskResult{Status: v1.Status_STATUS_DONE, Text: req.GetAnswer().GetId()}}, nil
}

func (f *flaky) Interrupt(ctx context.Context, req *v1.InterruptRequest) (*v1.InterruptResponse, error) {
	if err := f.serve(ctx, "Interrupt", req.GetRequestId()); err != nil {
		return nil, err
	}
	return &v1.InterruptResponse{Interrupted: true}, nil
}

func (f *flaky) Close(ctx context.Context, req *v1.CloseRequest) (*v1.CloseResponse, error) {
	if err := f.serve(ctx, "Close", req.GetRequestId()); err != nil {
		return nil, err
	}
	return &v1.CloseResponse{ClosedHandleIds: []string{req.GetHandleId()}}, nil
}

func (f *flaky) DeleteRuntime(ctx context.Context, req *v1.DeleteRuntimeRequest) (*v1.DeleteRuntimeResponse, error) {
	if err := f.serve(ctx, "DeleteRuntime", req.GetRequestId()); err != nil {
		return nil, err
	}
	return &v1.DeleteRuntimeResponse{}, nil
}

func (f *flaky) Inspect(ctx context.Context, req *v1.InspectRequest) (*v1.InspectResponse, error) {
	if err := f.serve(ctx, "Inspect", ""); err != nil {
		return nil, err
	}
	return &v1.InspectResponse{Handle: &v1.HandleView{HandleId: req.GetHandleId()}}, nil
}

func (f *flaky) Wait(ctx context.Context, req *v1.WaitRequest) (*v1.WaitResponse, error) {
	if err := f.serve(ctx, "Wait", ""); err != nil {
		return nil, err
	}
	f.mu.Lock()
	wait := f.wait
	n := len(f.attempts)
	f.mu.Unlock()
	if wait == nil {
		return &v1.WaitResponse{Result: &v1.TaskResult{Status: v1.Status_STATUS_DONE, HandleId: req.GetHandleId()}}, nil
	}
	return &v1.WaitResponse{Result: wait(n)}, nil
}

func (f *flaky) Watch(req *v1.WatchRequest, stream v1.AgentRuntime_WatchServer) error {
	return f.serve(stream.Context(), "Watch", "")
}

// dialFlaky serves a flaky on a loopback TCP port and dials it.
func dialFlaky(t *testing.T, opts ...Option) (*Client, *flaky) {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	f := &flaky{}
	v1.RegisterAgentRuntimeServer(srv, f)
	go srv.Serve(lis)
	t.Cleanup(srv.Stop)
	client, err := Dial(lis.Addr().String(), opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.CloseConn() })
	return client, f
}

// refusal is a status with the google.rpc details the server attaches to a refusal that
// did nothing: ErrorInfo with reason and RetryInfo with delay.
func refusal(code codes.Code, reason string, delay time.Duration) error {
	st, err := status.New(code, "refused: "+reason).WithDetails(
		&errdetails.ErrorInfo{Reason: reason, Domain: "agentruntime.dev"},
		&errdetails.RetryInfo{RetryDelay: durationpb.New(delay)})
	if err != nil {
		panic(err)
	}
	return st.Err()
}

// firstFail fails the first n attempts of every method with err.
func firstFail(n int, err error) func(context.Context, string, int) error {
	return func(_ context.Context, _ string, attempt int) error {
		if attempt <= n {
			return err
		}
		return nil
	}
}

// mutating calls each mutating method of the client once, with opts.
var mutating = []struct {
	method string
	call   func(ctx context.Context, c *Client, opts ...CallOption) error
}{
	{"CreateRuntime", func(ctx context.Context, c *Client, opts ...CallOption) error {
		id, err := c.CreateRuntime(ctx, nil, "", opts...)
		return check(err, id == "rt-1")
	}},
	{"Spawn", func(ctx context.Context, c *Client, opts ...CallOption) error {
		id, err := c.Spawn(ctx, "rt", "worker", "root", nil, opts...)
		return check(err, id == "root/worker.1")
	}},
	{"Post", func(ctx context.Context, c *Client, opts ...CallOption) error {
		size, err := c.Post(ctx, "rt", "root/worker.1", "hi", "", "", opts...)
		return check(err, size == 1)
	}},
	{"Wake", func(ctx context.Context, c *Client, opts ...CallOption) error {
		queued, err := c.Wake(ctx, "rt", "root/worker.1", "go", opts...)
		return check(err, queued)
	}},
	{"Resume", func(ctx context.Context, c *Client, opts ...CallOption) error {
		result, err := c.Resume(ctx, "rt", &v1.Answer{Id: "req-1", Ok: true}, opts...)
		return check(err, result.GetText() == "req-1")
	}},
	{"Interrupt", func(ctx context.Context, c *Client, opts ...CallOption) error {
		interrupted, err := c.Interrupt(ctx, "rt", "root/worker.1", opts...)
		return check(err, interrupted)
	}},
	{"Close", func(ctx context.Context, c *Client, opts ...CallOption) error {
		closed, err := c.Close(ctx, "rt", "root/worker.1", true, opts...)
		return check(err, slices.Equal(closed, []string{"root/worker.1"}))
	}},
	{"DeleteRuntime", func(ctx context.Context, c *Client, opts ...CallOption) error {
		return c.DeleteRuntime(ctx, "rt", true, opts...)
	}},
	{"ForkRuntime", func(ctx context.Context, c *Client, opts ...CallOption) error {
		resp, err := c.ForkRuntime(ctx, "rt", 6, nil, opts...)
		return check(err, resp.GetRuntimeId() == "rt-fork" && resp.GetForkSeq() == 7)
	}},
}

func check(err error, answered bool) error {
	if err == nil && !answered {
		return errors.New("the call succeeded with another answer than the server's")
	}
	return err
}

// requestIDs are the request ids of the attempts, which must all be of method.
func requestIDs(t *testing.T, attempts []attempt, method string) []string {
	t.Helper()
	ids := []string{}
	for _, a := range attempts {
		if a.method != method {
			t.Fatalf("the server saw %s, want only %s", a.method, method)
		}
		ids = append(ids, a.requestID)
	}
	return ids
}

func TestEveryMutatingCallCarriesOneRequestIDOnEveryAttempt(t *testing.T) {
	// An interceptor of the caller's sees each attempt, with its request id.
	var mu sync.Mutex
	var intercepted []string
	record := func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		if r, ok := req.(interface{ GetRequestId() string }); ok {
			mu.Lock()
			intercepted = append(intercepted, r.GetRequestId())
			mu.Unlock()
		}
		return invoker(ctx, method, req, reply, cc, opts...)
	}
	client, f := dialFlaky(t, WithUnaryInterceptors(record))
	f.fail = firstFail(2, status.Error(codes.Unavailable, "restarting"))
	generated := map[string]bool{}
	for _, m := range mutating {
		for call := 0; call < 2; call++ {
			if err := m.call(context.Background(), client); err != nil {
				t.Fatalf("%s: %v", m.method, err)
			}
			ids := requestIDs(t, f.seen(), m.method)
			if len(ids) != 3 || ids[0] != ids[1] || ids[1] != ids[2] {
				t.Fatalf("%s: request ids of the attempts %q, want 3 attempts with one id", m.method, ids)
			}
			if parsed, err := uuid.Parse(ids[0]); err != nil || parsed.Version() != 4 || parsed.String() != ids[0] {
				t.Errorf("%s: generated request id %q, want a UUID v4 string (%v)", m.method, ids[0], err)
			}
			if generated[ids[0]] {
				t.Errorf("%s: request id %q generated for an earlier call too", m.method, ids[0])
			}
			generated[ids[0]] = true
			mu.Lock()
			if !slices.Equal(intercepted, ids) {
				t.Errorf("%s: the interceptor saw %q, want each attempt's %q", m.method, intercepted, ids)
			}
			intercepted = nil
			mu.Unlock()
		}
		// The caller's own id, on every attempt.
		mine := "mine-" + strings.ToLower(m.method)
		if err := m.call(context.Background(), client, WithRequestID(mine)); err != nil {
			t.Fatalf("%s: %v", m.method, err)
		}
		if ids := requestIDs(t, f.seen(), m.method); !slices.Equal(ids, []string{mine, mine, mine}) {
			t.Errorf("%s with WithRequestID: request ids %q, want %q on each of 3 attempts", m.method, ids, mine)
		}
		mu.Lock()
		intercepted = nil
		mu.Unlock()
	}
}

func TestReadsAreRetriedToo(t *testing.T) {
	client, f := dialFlaky(t)
	f.fail = firstFail(3, status.Error(codes.Canceled, "server shutting down")) // not the caller's
	view, err := client.Inspect(context.Background(), "rt", "root/a.1")
	if err != nil || view.GetHandleId() != "root/a.1" {
		t.Fatalf("Inspect = %v, %v", view, err)
	}
	if n := len(f.seen()); n != 4 {
		t.Errorf("Inspect made %d attempts, want 4", n)
	}
}

func TestRetryInfoIsHonoured(t *testing.T) {
	client, f := dialFlaky(t)
	const delay = 300 * time.Millisecond
	for _, err := range []error{
		refusal(codes.Unavailable, "RUNTIME_MOVING", delay),
		// Any code carrying RetryInfo is retried.
		refusal(codes.ResourceExhausted, "SOMETHING_BUSY", delay),
	} {
		f.fail = firstFail(2, err)
		if _, err := client.Wake(context.Background(), "rt", "root/a.1", "go"); err != nil {
			t.Fatal(err)
		}
		attempts := f.seen()
		if len(attempts) != 3 || attempts[0].requestID != attempts[2].requestID {
			t.Fatalf("after %v: %d attempts %v, want 3 with one request id", status.Code(err), len(attempts), attempts)
		}
		for i := 1; i < len(attempts); i++ {
			if gap := attempts[i].at.Sub(attempts[i-1].at); gap < delay {
				t.Errorf("after %v: attempt %d came %v after the one before, want at least the retry_delay %v",
					status.Code(err), i+1, gap, delay)
			}
		}
	}
}

func TestOtherRefusalsAreNotRetried(t *testing.T) {
	client, f := dialFlaky(t)
	reused, _ := status.New(codes.InvalidArgument, "request id reused").WithDetails(
		&errdetails.ErrorInfo{Reason: "REQUEST_ID_REUSED", Domain: "agentruntime.dev"})
	for _, refused := range []error{
		reused.Err(),
		status.Error(codes.FailedPrecondition, "handle running"),
		status.Error(codes.NotFound, "no runtime rt"),
		status.Error(codes.Internal, "boom"),
		status.Error(codes.DeadlineExceeded, "the server's own deadline"), // not the attempt's
	} {
		f.fail = firstFail(10, refused)
		_, err := client.Spawn(context.Background(), "rt", "worker", "root", nil)
		e, ok := AsError(err)
		if !ok || e.Code != status.Code(refused) || e.Message != status.Convert(refused).Message() {
			t.Errorf("Spawn = %v, want %v", err, refused)
		}
		if n := len(f.seen()); n != 1 {
			t.Errorf("%v was tried %d times, want once", status.Code(refused), n)
		}
	}
	// The details come through: the REQUEST_ID_REUSED reason.
	f.fail = firstFail(10, reused.Err())
	_, err := client.Post(context.Background(), "rt", "root/a.1", "hi", "", "", WithRequestID("post-1"))
	if e, ok := AsError(err); !ok || e.ErrorInfo().GetReason() != "REQUEST_ID_REUSED" {
		t.Errorf("Post = %v, want INVALID_ARGUMENT with reason REQUEST_ID_REUSED", err)
	}
}

func TestNoRetryOnceTheCallerCancels(t *testing.T) {
	client, f := dialFlaky(t)

	// Cancelled while an attempt is in flight.
	arrived := make(chan struct{}, 1)
	f.fail = func(ctx context.Context, _ string, _ int) error {
		arrived <- struct{}{}
		<-ctx.Done()
		return status.FromContextError(ctx.Err()).Err()
	}
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		<-arrived
		cancel()
	}()
	_, err := client.Post(ctx, "rt", "root/a.1", "hi", "", "")
	if status.Code(err) != codes.Canceled {
		t.Errorf("Post cancelled by its caller = %v, want CANCELLED", err)
	}
	if n := len(f.seen()); n != 1 {
		t.Errorf("Post made %d attempts, want 1: none after the caller cancelled", n)
	}

	// Cancelled while waiting for the next attempt (a RetryInfo asking for 10 s).
	f.fail = func(context.Context, string, int) error {
		arrived <- struct{}{}
		return refusal(codes.Unavailable, "RUNTIME_MOVING", 10*time.Second)
	}
	ctx, cancel = context.WithCancel(context.Background())
	go func() {
		<-arrived
		cancel()
	}()
	start := time.Now()
	_, err = client.Wake(ctx, "rt", "root/a.1", "go")
	if status.Code(err) != codes.Canceled || time.Since(start) > 5*time.Second {
		t.Errorf("Wake cancelled during its backoff = %v after %v, want CANCELLED at once", err, time.Since(start))
	}
	if n := len(f.seen()); n != 1 {
		t.Errorf("Wake made %d attempts, want 1", n)
	}

	// The caller's deadline ends the retries: no attempt starts after it.
	f.fail = firstFail(1000, status.Error(codes.Unavailable, "down"))
	ctx, cancel = context.WithTimeout(context.Background(), 400*time.Millisecond)
	defer cancel()
	deadline, _ := ctx.Deadline()
	_, err = client.Spawn(ctx, "rt", "worker", "root", nil)
	if code := status.Code(err); code != codes.Unavailable && code != codes.DeadlineExceeded {
		t.Errorf("Spawn past its ctx deadline = %v, want UNAVAILABLE or DEADLINE_EXCEEDED", err)
	}
	if late := time.Since(deadline); late > time.Second {
		t.Errorf("Spawn returned %v after its ctx deadline", late)
	}
	attempts := f.seen()
	if len(attempts) < 2 {
		t.Errorf("Spawn made %d attempts within 400ms, want retries", len(attempts))
	}
	for i, a := range attempts {
		if !a.at.Before(deadline) {
			t.Errorf("attempt %d started after the caller's deadline", i+1)
		}
	}
}

func TestWithoutRetriesMakesOneAttemptWithARequestID(t *testing.T) {
	client, f := dialFlaky(t, WithoutRetries(), WithTimeout(3*time.Second))
	f.fail = func(ctx context.Context, _ string, _ int) error {
		f.mu.Lock()
		repeat := f.attempts[len(f.attempts)-1].requestID == "again-1" // the caller's repeat, below
		f.mu.Unlock()
		if repeat {
			return nil
		}
		return refusal(codes.Unavailable, "SERVER_DRAINING", time.Millisecond)
	}
	for _, m := range mutating {
		err := m.call(context.Background(), client)
		if status.Code(err) != codes.Unavailable {
			t.Errorf("%s = %v, want the UNAVAILABLE of its one attempt", m.method, err)
		}
		attempts := f.seen()
		if len(attempts) != 1 {
			t.Fatalf("%s made %d attempts, want 1", m.method, len(attempts))
		}
		if _, err := uuid.Parse(attempts[0].requestID); err != nil {
			t.Errorf("%s sent request id %q, want a generated one: %v", m.method, attempts[0].requestID, err)
		}
		// The caller repeats it with its own id (the flaky's next attempt succeeds).
		if err := m.call(context.Background(), client, WithRequestID("again-1")); err != nil {
			t.Errorf("%s repeated: %v", m.method, err)
		}
		if a := f.seen(); len(a) != 1 || a[0].requestID != "again-1" {
			t.Errorf("%s repeated: attempts %v, want one with request id again-1", m.method, a)
		}
		// Without retries, the default per-call deadline is the attempt's, as it was.
		if d := attempts[0].deadline; d <= 2*time.Second || d > 3*time.Second {
			t.Errorf("%s: deadline %v, want the 3s default", m.method, d)
		}
	}
	// Reads are made once too.
	f.fail = firstFail(1000, status.Error(codes.Unavailable, "down"))
	if _, err := client.Inspect(context.Background(), "rt", "root/a.1"); status.Code(err) != codes.Unavailable {
		t.Errorf("Inspect = %v, want UNAVAILABLE", err)
	}
	if n := len(f.seen()); n != 1 {
		t.Errorf("Inspect made %d attempts, want 1", n)
	}
}

func TestTheRetryWindowBoundsACallWithoutDeadline(t *testing.T) {
	const window = 500 * time.Millisecond
	client, f := dialFlaky(t, WithRetryWindow(window))
	f.fail = firstFail(1000, refusal(codes.Unavailable, "STORE_UNAVAILABLE", 20*time.Millisecond))
	start := time.Now()
	_, err := client.Close(context.Background(), "rt", "root/a.1", false)
	elapsed := time.Since(start)
	if e, ok := AsError(err); !ok || e.Code != codes.Unavailable || e.ErrorInfo().GetReason() != "STORE_UNAVAILABLE" {
		t.Errorf("Close on a server that stays down = %v, want its UNAVAILABLE with its reason", err)
	}
	if elapsed > window+time.Second {
		t.Errorf("Close gave up after %v, want within its %v window", elapsed, window)
	}
	attempts := f.seen()
	if len(attempts) < 3 {
		t.Errorf("Close made %d attempts in its window, want retries", len(attempts))
	}
	for i, a := range attempts {
		if a.at.Sub(start) >= window {
			t.Errorf("attempt %d started %v after the first, past the %v window", i+1, a.at.Sub(start), window)
		}
		// Each attempt's deadline is the default per-call one (60 s) capped by the window.
		if a.deadline > window {
			t.Errorf("attempt %d had a deadline of %v, past the window", i+1, a.deadline)
		}
	}
}

func TestAnAttemptsOwnDeadlineIsRetried(t *testing.T) {
	client, f := dialFlaky(t, WithTimeout(200*time.Millisecond))
	f.fail = func(ctx context.Context, _ string, n int) error {
		if n == 1 { // the first attempt hangs until its deadline cuts it off
			<-ctx.Done()
			return status.FromContextError(ctx.Err()).Err()
		}
		return nil
	}
	result, err := client.Resume(context.Background(), "rt", &v1.Answer{Id: "req-1", Ok: true})
	if err != nil || result.GetText() != "req-1" {
		t.Fatalf("Resume = %v, %v, want the second attempt's result", result, err)
	}
	attempts := f.seen()
	if len(attempts) != 2 || attempts[0].requestID != attempts[1].requestID || attempts[0].requestID == "" {
		t.Fatalf("attempts %v, want 2 with one request id", attempts)
	}
	if d := attempts[0].deadline; d <= 100*time.Millisecond || d > 200*time.Millisecond {
		t.Errorf("the first attempt's deadline was %v, want the 200ms per-call one", d)
	}
}

func TestStubCallsAreRetriedWithAGeneratedRequestID(t *testing.T) {
	client, f := dialFlaky(t)
	f.fail = firstFail(1, status.Error(codes.Unavailable, "restarting"))
	req := &v1.PostRequest{RuntimeId: "rt", HandleId: "root/a.1", Text: "hi", CoalesceKey: "tick"}
	resp, err := client.Stub().Post(context.Background(), req)
	if err != nil || resp.GetInboxSize() != 1 {
		t.Fatalf("Stub().Post = %v, %v", resp, err)
	}
	ids := requestIDs(t, f.seen(), "Post")
	if len(ids) != 2 || ids[0] != ids[1] {
		t.Fatalf("request ids %q, want 2 attempts with one id", ids)
	}
	if _, err := uuid.Parse(ids[0]); err != nil {
		t.Errorf("request id %q: %v", ids[0], err)
	}
	if req.GetRequestId() != "" {
		t.Errorf("the caller's message was changed: request_id %q", req.GetRequestId())
	}
	// The caller's own request id is kept.
	req.RequestId = "stub-1"
	if _, err := client.Stub().Post(context.Background(), req); err != nil {
		t.Fatal(err)
	}
	if ids := requestIDs(t, f.seen(), "Post"); !slices.Equal(ids, []string{"stub-1", "stub-1"}) {
		t.Errorf("request ids %q, want stub-1 twice", ids)
	}
}

func TestRunPassesItsRequestIDs(t *testing.T) {
	client, f := dialFlaky(t)
	f.fail = func(_ context.Context, method string, n int) error {
		if method != "Wait" && n <= 1 {
			return status.Error(codes.Unavailable, "restarting")
		}
		return nil
	}
	result, err := client.Run(context.Background(), "rt", "worker", "go")
	if err != nil || result.GetStatus() != v1.Status_STATUS_DONE || result.GetHandleId() != "root/worker.1" {
		t.Fatalf("Run = %v, %v", result, err)
	}
	byMethod := map[string][]string{}
	for _, a := range f.seen() {
		byMethod[a.method] = append(byMethod[a.method], a.requestID)
	}
	spawn, wake := byMethod["Spawn"], byMethod["Wake"]
	if len(spawn) != 2 || spawn[0] != spawn[1] || len(wake) != 2 || wake[0] != wake[1] || spawn[0] == wake[0] {
		t.Errorf("Spawn's request ids %q and Wake's %q: want one id for each, on both attempts", spawn, wake)
	}
	for _, id := range []string{spawn[0], wake[0]} {
		if _, err := uuid.Parse(id); err != nil {
			t.Errorf("request id %q: %v", id, err)
		}
	}

	// The caller's ids.
	f.fail = nil
	if _, err := client.Run(context.Background(), "rt", "worker", "go", WithRunRequestIDs("run-spawn", "run-wake")); err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, a := range f.seen() {
		got[a.method] = a.requestID
	}
	if got["Spawn"] != "run-spawn" || got["Wake"] != "run-wake" {
		t.Errorf("request ids %v, want run-spawn and run-wake", got)
	}
}

func TestWaitGivesUpAfterAWindowOfFailuresInARow(t *testing.T) {
	const window = 600 * time.Millisecond
	client, f := dialFlaky(t, WithRetryWindow(window))
	// A broken store: UNAVAILABLE for ever. Wait reports it after the window, not never.
	f.fail = firstFail(1_000_000, refusal(codes.Unavailable, "STORE_BROKEN", 50*time.Millisecond))
	done := make(chan error, 1)
	start := time.Now()
	go func() {
		_, err := client.Wait(context.Background(), "rt", "root/a.1", 0)
		done <- err
	}()
	select {
	case err := <-done:
		if e, ok := AsError(err); !ok || e.Code != codes.Unavailable || e.ErrorInfo().GetReason() != "STORE_BROKEN" {
			t.Errorf("Wait on a broken store = %v, want its UNAVAILABLE", err)
		}
		if elapsed := time.Since(start); elapsed > window+time.Second {
			t.Errorf("Wait gave up after %v, want about its %v window", elapsed, window)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Wait on a server that refuses for ever still waits after 10s")
	}
	if n := len(f.seen()); n < 3 {
		t.Errorf("Wait made %d attempts, want retries within the window", n)
	}

	// A result in between starts the window over: three runs of two failures (each at
	// least 2 × 150 ms of RetryInfo, at most 150 + 200 ms), 900 ms of failures in all.
	f.fail = func(_ context.Context, _ string, n int) error {
		if n%3 != 0 {
			return refusal(codes.Unavailable, "RUNTIME_MOVING", 150*time.Millisecond)
		}
		return nil
	}
	f.wait = func(n int) *v1.TaskResult {
		if n < 9 {
			return &v1.TaskResult{Status: v1.Status_STATUS_TIMEOUT}
		}
		return &v1.TaskResult{Status: v1.Status_STATUS_DONE}
	}
	result, err := client.Wait(context.Background(), "rt", "root/a.1", 0)
	if err != nil || result.GetStatus() != v1.Status_STATUS_DONE {
		t.Fatalf("Wait = %v, %v, want DONE after runs of failures shorter than the window", result, err)
	}
	if n := len(f.seen()); n != 9 {
		t.Errorf("Wait made %d attempts, want 9", n)
	}
}

func TestWaitWithoutRetriesReportsTheFirstFailure(t *testing.T) {
	client, f := dialFlaky(t, WithoutRetries())
	f.fail = firstFail(1, status.Error(codes.Unavailable, "restarting"))
	if _, err := client.Wait(context.Background(), "rt", "root/a.1", 0); status.Code(err) != codes.Unavailable {
		t.Errorf("Wait = %v, want UNAVAILABLE", err)
	}
	if n := len(f.seen()); n != 1 {
		t.Errorf("Wait made %d attempts, want 1", n)
	}
}

func TestWatchGivesUpAfterAWindowOfFailuresInARow(t *testing.T) {
	const window = 400 * time.Millisecond
	client, f := dialFlaky(t, WithRetryWindow(window))
	f.fail = firstFail(1_000_000, refusal(codes.Unavailable, "STORE_BROKEN", 30*time.Millisecond))
	start := time.Now()
	err := client.WatchFunc(context.Background(), "rt", 0, func(*v1.Event) error { return nil },
		WithWatchRetries(1_000_000), WithWatchBackoff(time.Millisecond, 5*time.Millisecond))
	if e, ok := AsError(err); !ok || e.Code != codes.Unavailable {
		t.Errorf("WatchFunc on a broken store = %v, want UNAVAILABLE", err)
	}
	if elapsed := time.Since(start); elapsed > window+time.Second {
		t.Errorf("WatchFunc gave up after %v, want about its %v window", elapsed, window)
	}
	attempts := f.seen()
	if len(attempts) < 3 {
		t.Fatalf("WatchFunc opened %d streams, want reconnects", len(attempts))
	}
	for i := 1; i < len(attempts); i++ { // the RetryInfo's 30 ms, not the 1-5 ms backoff
		if gap := attempts[i].at.Sub(attempts[i-1].at); gap < 30*time.Millisecond {
			t.Errorf("stream %d opened %v after the one before, want at least the retry_delay", i+1, gap)
		}
	}

	// Without retries, the first failure ends it.
	client, f = dialFlaky(t, WithoutRetries())
	f.fail = firstFail(1, status.Error(codes.Unavailable, "restarting"))
	err = client.WatchFunc(context.Background(), "rt", 0, func(*v1.Event) error { return nil })
	if status.Code(err) != codes.Unavailable || len(f.seen()) != 1 {
		t.Errorf("WatchFunc without retries = %v, want the first stream's UNAVAILABLE", err)
	}
}

func TestFullJitterBackoff(t *testing.T) {
	for n := 0; n < 10; n++ {
		ceiling := min(retryBackoff<<n, retryMaxBackoff)
		var largest time.Duration
		for i := 0; i < 200; i++ {
			d := fullJitter(n)
			if d < 0 || d >= ceiling {
				t.Fatalf("attempt %d: delay %v outside [0, %v)", n, d, ceiling)
			}
			largest = max(largest, d)
		}
		if largest < ceiling/2 { // 200 draws all under half: 2^-200
			t.Errorf("attempt %d: 200 delays all under %v, want them spread up to %v", n, ceiling/2, ceiling)
		}
	}
	// RetryInfo's delay is a floor.
	if d := retryDelay(0, refusal(codes.Unavailable, "RUNTIME_MOVING", 2*time.Second)); d != 2*time.Second {
		t.Errorf("delay after a 2s RetryInfo = %v, want 2s", d)
	}
}
