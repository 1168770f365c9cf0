package agentruntime

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	v1 "github.com/agentruntime/agentruntime/clients/go/agentruntime/v1"
)

func (f *fake) ServeTools(stream v1.AgentRuntime_ServeToolsServer) error {
	if f.serveTools == nil {
		return status.Error(codes.Unimplemented, "no ServeTools in this test")
	}
	return f.serveTools(stream)
}

func workerCall(id, name, arguments string) *v1.ServeToolsResponse {
	return &v1.ServeToolsResponse{Message: &v1.ServeToolsResponse_Call{Call: &v1.WorkerCall{
		Id:        id,
		Call:      &v1.ToolCall{Id: "tc-" + id, Name: name, ArgumentsJson: arguments, IdempotencyKey: "rt/root/a.1/tc-" + id},
		RuntimeId: "rt", HandleId: "root/a.1",
	}}}
}

func registered(workerID string) *v1.ServeToolsResponse {
	return &v1.ServeToolsResponse{Message: &v1.ServeToolsResponse_Registered{Registered: &v1.WorkerRegistered{WorkerId: workerID}}}
}

// serve runs ServeTools in a goroutine; the channel gets what it returned.
func serve(ctx context.Context, client *Client, handlers map[string]ToolHandler, opts ...ServeOption) <-chan error {
	done := make(chan error, 1)
	go func() { done <- client.ServeTools(ctx, "billing", handlers, opts...) }()
	return done
}

func TestServeToolsRunsHandlersAndSendsOutputs(t *testing.T) {
	client, f := dialFake(t, WithToken("s3cret"), WithTimeout(7*time.Second))
	var (
		registration *v1.WorkerRegistration
		auth         []string
		hasDeadline  bool
	)
	calls := []*v1.ServeToolsResponse{
		workerCall("c1", "upper", `{"text": "hi"}`),
		workerCall("c2", "fail", `{}`),
		workerCall("c3", "refund", `{}`),
		workerCall("c4", "upper", `[1, 2]`),
		workerCall("c5", "upper", ``),
		workerCall("c6", "echo", `{"n": 1}`),
		workerCall("c7", "pair", `{}`),
		workerCall("c8", "pair", `{}`),
		workerCall("c9", "panics", `{}`),
	}
	outputs := make(chan map[string]*v1.ToolOutput, 1)
	f.serveTools = func(stream v1.AgentRuntime_ServeToolsServer) error {
		md, _ := metadata.FromIncomingContext(stream.Context())
		auth = md.Get("authorization")
		_, hasDeadline = stream.Context().Deadline()
		first, err := stream.Recv()
		if err != nil {
			return err
		}
		registration = first.GetRegistration()
		if err := stream.Send(registered("w-1")); err != nil {
			return err
		}
		for _, call := range calls {
			if err := stream.Send(call); err != nil {
				return err
			}
		}
		got := map[string]*v1.ToolOutput{}
		for len(got) < len(calls) {
			req, err := stream.Recv()
			if err != nil {
				return err
			}
			got[req.GetOutput().GetCallId()] = req.GetOutput()
		}
		outputs <- got
		<-stream.Context().Done() // until the worker is stopped
		return nil
	}

	// The two "pair" calls each wait for the other: they pass only if they run at once.
	var pairMu sync.Mutex
	pairs, together := 0, make(chan struct{})
	handlers := map[string]ToolHandler{
		"upper": func(_ context.Context, args map[string]any, _ *v1.WorkerCall) (string, error) {
			text, _ := args["text"].(string)
			return strings.ToUpper(text), nil
		},
		"fail": func(context.Context, map[string]any, *v1.WorkerCall) (string, error) {
			return "", errors.New("card declined")
		},
		"echo": func(_ context.Context, args map[string]any, call *v1.WorkerCall) (string, error) {
			return fmt.Sprintf("%v %s %s %s", args["n"], call.GetRuntimeId(), call.GetHandleId(), call.GetCall().GetIdempotencyKey()), nil
		},
		"pair": func(ctx context.Context, _ map[string]any, _ *v1.WorkerCall) (string, error) {
			pairMu.Lock()
			if pairs++; pairs == 2 {
				close(together)
			}
			pairMu.Unlock()
			select {
			case <-together:
				return "together", nil
			case <-time.After(5 * time.Second):
				return "", errors.New("ran alone")
			}
		},
		"panics": func(context.Context, map[string]any, *v1.WorkerCall) (string, error) {
			panic("boom")
		},
	}
	var ids []string
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := serve(ctx, client, handlers, WithMaxConcurrentCalls(3), WithRegistered(func(id string) { ids = append(ids, id) }))

	var got map[string]*v1.ToolOutput
	select {
	case got = <-outputs:
	case err := <-done:
		t.Fatalf("ServeTools returned early: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("the outputs did not come back")
	}
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Errorf("ServeTools after cancel = %v, want context.Canceled", err)
	}

	want := map[string]struct {
		output  string
		isError bool
	}{
		"c1": {"HI", false},
		"c2": {"card declined", true},
		"c3": {`this worker has no handler for "refund"`, true},
		"c4": {"arguments_json is not a JSON object: [1, 2]", true},
		"c5": {"", false},
		"c6": {"1 rt root/a.1 rt/root/a.1/tc-c6", false},
		"c7": {"together", false},
		"c8": {"together", false},
		"c9": {`the handler of "panics" panicked: boom`, true},
	}
	for id, w := range want {
		o := got[id]
		if o.GetOutput() != w.output || o.GetIsError() != w.isError {
			t.Errorf("output of %s = %q (is_error %v), want %q (is_error %v)", id, o.GetOutput(), o.GetIsError(), w.output, w.isError)
		}
	}
	if registration.GetQueue() != "billing" || registration.GetMaxConcurrentCalls() != 3 ||
		!slices.Equal(registration.GetTools(), []string{"echo", "fail", "pair", "panics", "upper"}) {
		t.Errorf("registration = %v, want queue billing, the sorted names, 3 at once", registration)
	}
	if len(auth) != 1 || auth[0] != "Bearer s3cret" {
		t.Errorf("authorization = %v", auth)
	}
	if hasDeadline {
		t.Error("the ServeTools stream has a deadline; it must live until cancelled")
	}
	if !slices.Equal(ids, []string{"w-1"}) {
		t.Errorf("registered ids = %v", ids)
	}
}

func TestServeToolsDefaultsToTenCalls(t *testing.T) {
	client, f := dialFake(t)
	got := make(chan *v1.WorkerRegistration, 1)
	f.serveTools = func(stream v1.AgentRuntime_ServeToolsServer) error {
		first, err := stream.Recv()
		if err != nil {
			return err
		}
		got <- first.GetRegistration()
		return status.Error(codes.InvalidArgument, "enough")
	}
	handler := func(context.Context, map[string]any, *v1.WorkerCall) (string, error) { return "", nil }
	client.ServeTools(context.Background(), "q", map[string]ToolHandler{"b": handler, "a": handler})
	r := <-got
	if r.GetMaxConcurrentCalls() != DefaultMaxConcurrentCalls || !slices.Equal(r.GetTools(), []string{"a", "b"}) {
		t.Errorf("registration = %v", r)
	}
	if err := client.ServeTools(context.Background(), "q", nil); err == nil {
		t.Error("ServeTools without handlers did not fail")
	}
}

func TestServeToolsRefusedRegistrationReturnsAtOnce(t *testing.T) {
	for _, code := range []codes.Code{codes.InvalidArgument, codes.Unauthenticated, codes.PermissionDenied} {
		client, f := dialFake(t)
		var mu sync.Mutex
		attempts := 0
		f.serveTools = func(stream v1.AgentRuntime_ServeToolsServer) error {
			mu.Lock()
			attempts++
			mu.Unlock()
			if _, err := stream.Recv(); err != nil {
				return err
			}
			return status.Error(code, "refused")
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		called := false
		err := client.ServeTools(ctx, "billing", map[string]ToolHandler{
			"upper": func(context.Context, map[string]any, *v1.WorkerCall) (string, error) { return "", nil },
		}, WithBackoff(time.Millisecond, time.Millisecond), WithRegistered(func(string) { called = true }))
		cancel()
		e, ok := AsError(err)
		if !ok || e.Code != code || e.Message != "refused" {
			t.Errorf("%v: ServeTools = %v, want the refusal as an *Error", code, err)
		}
		mu.Lock()
		if attempts != 1 || called {
			t.Errorf("%v: %d attempts (registered: %v), want 1 and no registration", code, attempts, called)
		}
		mu.Unlock()
	}
}

func TestServeToolsReconnectsAndCancelsLostCalls(t *testing.T) {
	client, f := dialFake(t)
	var mu sync.Mutex
	attempt := 0
	started := make(chan struct{})
	output := make(chan *v1.ToolOutput, 1)
	f.serveTools = func(stream v1.AgentRuntime_ServeToolsServer) error {
		mu.Lock()
		attempt++
		n := attempt
		mu.Unlock()
		if _, err := stream.Recv(); err != nil {
			return err
		}
		switch n {
		case 1: // the server is going away before it registers anyone
			return status.Error(codes.Unavailable, "draining")
		case 2: // a call, then the server ends the stream while it runs
			if err := stream.Send(registered("w-2")); err != nil {
				return err
			}
			if err := stream.Send(workerCall("c1", "block", `{}`)); err != nil {
				return err
			}
			<-started
			return nil
		}
		if err := stream.Send(registered(fmt.Sprintf("w-%d", n))); err != nil {
			return err
		}
		if err := stream.Send(workerCall("c2", "upper", `{"text": "again"}`)); err != nil {
			return err
		}
		req, err := stream.Recv()
		if err != nil {
			return err
		}
		output <- req.GetOutput()
		<-stream.Context().Done()
		return nil
	}
	lost := make(chan error, 1)
	handlers := map[string]ToolHandler{
		"block": func(ctx context.Context, _ map[string]any, _ *v1.WorkerCall) (string, error) {
			close(started)
			<-ctx.Done()
			lost <- ctx.Err()
			return "", ctx.Err()
		},
		"upper": func(_ context.Context, args map[string]any, _ *v1.WorkerCall) (string, error) {
			return strings.ToUpper(args["text"].(string)), nil
		},
	}
	var (
		ids     []string
		reasons []string
	)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := serve(ctx, client, handlers,
		WithBackoff(time.Millisecond, 4*time.Millisecond),
		WithRegistered(func(id string) { ids = append(ids, id) }),
		WithReconnecting(func(err error, delay time.Duration) {
			if delay > 4*time.Millisecond {
				t.Errorf("delay %v past the 4ms cap", delay)
			}
			if err == io.EOF {
				reasons = append(reasons, "EOF")
			} else {
				reasons = append(reasons, status.Code(err).String())
			}
		}))
	select {
	case o := <-output:
		if o.GetCallId() != "c2" || o.GetOutput() != "AGAIN" || o.GetIsError() {
			t.Errorf("output after reconnecting = %v", o)
		}
	case err := <-done:
		t.Fatalf("ServeTools returned: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("no output after reconnecting")
	}
	select {
	case err := <-lost:
		if !errors.Is(err, context.Canceled) {
			t.Errorf("the lost call's context ended with %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Error("the call of the lost stream was not cancelled")
	}
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Errorf("ServeTools after cancel = %v", err)
	}
	if !slices.Equal(ids, []string{"w-2", "w-3"}) || !slices.Equal(reasons, []string{"Unavailable", "EOF"}) {
		t.Errorf("registered %v, reconnected after %v; want [w-2 w-3] after [Unavailable EOF]", ids, reasons)
	}
}

func TestBackoffDelayDoublesUpToTheCap(t *testing.T) {
	for failures, ceiling := range []time.Duration{250, 500, 1000, 2000, 4000, 8000, 10000, 10000} {
		ceiling *= time.Millisecond
		for range 50 {
			d := backoffDelay(250*time.Millisecond, 10*time.Second, failures)
			if d < ceiling/2 || d > ceiling {
				t.Fatalf("after %d failures: %v, want between %v and %v", failures, d, ceiling/2, ceiling)
			}
		}
	}
	if d := backoffDelay(250*time.Millisecond, 10*time.Second, 1000); d > 10*time.Second {
		t.Errorf("after 1000 failures: %v", d)
	}
}

// A cap of "never mind" (MaxInt64) once let the doubling wrap to a negative or zero delay after
// about 34 failures: a worker then reconnected in a busy loop through a long outage.
func TestBackoffDelayWithNoCapNeverWraps(t *testing.T) {
	for failures := range 100 {
		ceiling := time.Second << min(failures, 33)
		if failures > 33 {
			ceiling = math.MaxInt64
		}
		d := backoffDelay(time.Second, math.MaxInt64, failures)
		if d < ceiling/2 || d > ceiling {
			t.Fatalf("after %d failures: %v, want between %v and %v", failures, d, ceiling/2, ceiling)
		}
	}
}

func TestServeToolsStopsWhenTheConnectionIsClosed(t *testing.T) {
	client, f := dialFake(t)
	registeredOnce := make(chan struct{})
	f.serveTools = func(stream v1.AgentRuntime_ServeToolsServer) error {
		if _, err := stream.Recv(); err != nil {
			return err
		}
		if err := stream.Send(registered("w-1")); err != nil {
			return err
		}
		close(registeredOnce)
		<-stream.Context().Done()
		return nil
	}
	done := serve(context.Background(), client, map[string]ToolHandler{
		"upper": func(context.Context, map[string]any, *v1.WorkerCall) (string, error) { return "", nil },
	}, WithBackoff(time.Millisecond, time.Millisecond))
	<-registeredOnce
	client.CloseConn()
	select {
	case err := <-done:
		if status.Code(err) != codes.Canceled {
			t.Errorf("ServeTools after CloseConn = %v, want CANCELLED", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("ServeTools kept reconnecting on a closed connection")
	}
}
