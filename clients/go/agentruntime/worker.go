package agentruntime

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/status"

	v1 "github.com/agentruntime/agentruntime/clients/go/agentruntime/v1"
)

// ToolHandler runs one call of a worker tool (ToolDef.worker). arguments is the call's
// arguments_json as encoding/json decodes an object (numbers are float64); call is the
// whole WorkerCall (its ToolCall with the idempotency key, the runtime and handle that
// made it, its deadline). The returned string is the tool's output; an error is sent as
// an error result whose output is the error's message, for the model to see.
//
// ctx is cancelled when ServeTools stops or the stream the call came on is lost (the
// server then holds the call in doubt, and an output could no longer be delivered), and
// carries the call's deadline when the server sets one.
type ToolHandler func(ctx context.Context, arguments map[string]any, call *v1.WorkerCall) (string, error)

// DefaultMaxConcurrentCalls is how many calls ServeTools takes at once unless
// WithMaxConcurrentCalls says otherwise.
const DefaultMaxConcurrentCalls = 10

// ServeTools reconnects with a delay that starts at defaultBackoff and doubles, with
// jitter, up to defaultMaxBackoff.
const (
	defaultBackoff    = 250 * time.Millisecond
	defaultMaxBackoff = 10 * time.Second
)

type serveOptions struct {
	maxConcurrentCalls int
	registered         func(workerID string)
	reconnecting       func(err error, delay time.Duration)
	backoff            time.Duration
	maxBackoff         time.Duration
}

// ServeOption configures ServeTools.
type ServeOption func(*serveOptions)

// WithMaxConcurrentCalls sets how many calls the worker takes at once (the server never
// sends more); the default is DefaultMaxConcurrentCalls, the server allows 1 to 1000.
func WithMaxConcurrentCalls(n int) ServeOption {
	return func(o *serveOptions) { o.maxConcurrentCalls = n }
}

// WithRegistered calls fn with the worker id the server gives each registration: once
// per (re)connection, before the first call of that connection is run.
func WithRegistered(fn func(workerID string)) ServeOption {
	return func(o *serveOptions) { o.registered = fn }
}

// WithReconnecting calls fn when the stream is lost and ServeTools is about to connect
// again after delay; err says why (an *Error, or io.EOF when the server ended the
// stream).
func WithReconnecting(fn func(err error, delay time.Duration)) ServeOption {
	return func(o *serveOptions) { o.reconnecting = fn }
}

// WithBackoff sets the reconnection delay: it starts at initial and doubles after each
// failed attempt, up to maxDelay, with jitter (the default is 250 ms up to 10 s).
func WithBackoff(initial, maxDelay time.Duration) ServeOption {
	return func(o *serveOptions) { o.backoff, o.maxBackoff = initial, maxDelay }
}

// ServeTools serves the worker tools of queue (ToolDef.worker) over the ServeTools
// stream until ctx is cancelled, then returns ctx.Err(). handlers maps each tool name to
// its handler; the worker registers for exactly those names. The stream uses the
// client's connection, so TLS and the token apply as for every call; it has no deadline.
//
// Each call runs in a goroutine of its own (the server sends at most the
// WithMaxConcurrentCalls limit at once) and its output is sent back on the stream: a
// handler's error, an unknown tool name or arguments that are not a JSON object become
// an error result, and so does a panic in a handler.
//
// A lost stream (UNAVAILABLE, CANCELLED by the server or a proxy, UNKNOWN, or the server
// ending it) is reopened with exponential backoff and jitter; calls still running on the
// lost stream have their context cancelled (the server holds them in doubt). Any other
// refusal (INVALID_ARGUMENT for a bad registration, UNAUTHENTICATED, PERMISSION_DENIED,
// ...) is returned at once as an *Error. ServeTools returns only once its handlers have.
//
//	err := client.ServeTools(ctx, "billing", map[string]agentruntime.ToolHandler{
//		"charge": func(ctx context.Context, args map[string]any, call *v1.WorkerCall) (string, error) {
//			return charge(ctx, args["amount"], call.GetCall().GetIdempotencyKey())
//		},
//	}, agentruntime.WithMaxConcurrentCalls(4))
func (c *Client) ServeTools(ctx context.Context, queue string, handlers map[string]ToolHandler, opts ...ServeOption) error {
	o := serveOptions{maxConcurrentCalls: DefaultMaxConcurrentCalls, backoff: defaultBackoff, maxBackoff: defaultMaxBackoff}
	for _, opt := range opts {
		opt(&o)
	}
	if len(handlers) == 0 {
		// No names would register for every tool of the queue, each call then failing.
		return errors.New("agentruntime: ServeTools needs at least one handler")
	}
	names := make([]string, 0, len(handlers))
	for name, handler := range handlers {
		if handler == nil {
			return fmt.Errorf("agentruntime: ServeTools: the handler of %q is nil", name)
		}
		names = append(names, name)
	}
	slices.Sort(names)
	registration := &v1.ServeToolsRequest{Message: &v1.ServeToolsRequest_Registration{Registration: &v1.WorkerRegistration{
		Queue: queue, Tools: names, MaxConcurrentCalls: int32(min(o.maxConcurrentCalls, 1<<30)),
	}}}

	var running sync.WaitGroup // every handler goroutine, of every stream
	defer running.Wait()
	failures := 0
	for {
		registered, err := c.serveToolsOnce(ctx, registration, handlers, o.registered, &running)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if !reconnectable(err) || c.conn.GetState() == connectivity.Shutdown { // CloseConn: no way back
			return wrap(err)
		}
		if registered {
			failures = 0 // the stream worked: start the backoff over
		}
		delay := backoffDelay(o.backoff, o.maxBackoff, failures)
		failures++
		if err != io.EOF {
			err = wrap(err)
		}
		if o.reconnecting != nil {
			o.reconnecting(err, delay)
		}
		timer := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			timer.Stop()
			return ctx.Err()
		case <-timer.C:
		}
	}
}

// reconnectable says whether a lost stream is worth opening again: the server ended it,
// or the connection (or a proxy, or a restarting server) dropped it.
func reconnectable(err error) bool {
	if err == io.EOF {
		return true
	}
	switch status.Code(err) {
	case codes.Unavailable, codes.Canceled, codes.Unknown:
		return true
	}
	return false
}

// backoffDelay is the wait before attempt failures+1: half of
// min(maxDelay, initial·2^failures) plus a random part of the other half.
func backoffDelay(initial, maxDelay time.Duration, failures int) time.Duration {
	ceiling := initial
	for i := 0; i < failures && ceiling < maxDelay; i++ {
		if ceiling > maxDelay/2 { // doubling it would pass the cap, or wrap past MaxInt64 to a busy loop
			ceiling = maxDelay
			break
		}
		ceiling *= 2
	}
	ceiling = min(ceiling, maxDelay)
	if ceiling <= 0 {
		return 0
	}
	half := ceiling / 2
	return half + rand.N(ceiling-half+1)
}

// serveToolsOnce runs one stream until it fails and returns the error that ended it
// (io.EOF when the server closed it) and whether the server accepted the registration.
func (c *Client) serveToolsOnce(ctx context.Context, registration *v1.ServeToolsRequest, handlers map[string]ToolHandler,
	onRegistered func(string), running *sync.WaitGroup) (registered bool, err error) {
	// Cancelling streamCtx ends the stream and the calls it brought.
	streamCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := c.stub.ServeTools(streamCtx)
	if err != nil {
		return false, err
	}
	// A gRPC stream takes one Send at a time; Recv runs alongside in this goroutine.
	var sendMu sync.Mutex
	send := func(req *v1.ServeToolsRequest) error {
		sendMu.Lock()
		defer sendMu.Unlock()
		return stream.Send(req)
	}
	// A failed Send (io.EOF) means the stream is over: Recv returns the reason.
	_ = send(registration)
	for {
		resp, err := stream.Recv()
		if err != nil {
			return registered, err
		}
		switch m := resp.GetMessage().(type) {
		case *v1.ServeToolsResponse_Registered:
			registered = true
			if onRegistered != nil {
				onRegistered(m.Registered.GetWorkerId())
			}
		case *v1.ServeToolsResponse_Call:
			call := m.Call
			running.Add(1)
			go func() {
				defer running.Done()
				output := runTool(streamCtx, handlers, call)
				// Lost with the stream if it failed meanwhile: the server holds the call in doubt.
				_ = send(&v1.ServeToolsRequest{Message: &v1.ServeToolsRequest_Output{Output: output}})
			}()
		}
	}
}

// runTool runs the call's handler and makes its ToolOutput; every failure is an error
// result.
func runTool(ctx context.Context, handlers map[string]ToolHandler, call *v1.WorkerCall) *v1.ToolOutput {
	output, err := invoke(ctx, handlers, call)
	if err != nil {
		return &v1.ToolOutput{CallId: call.GetId(), Output: err.Error(), IsError: true}
	}
	return &v1.ToolOutput{CallId: call.GetId(), Output: output}
}

func invoke(ctx context.Context, handlers map[string]ToolHandler, call *v1.WorkerCall) (output string, err error) {
	name := call.GetCall().GetName()
	handler, ok := handlers[name]
	if !ok {
		return "", fmt.Errorf("this worker has no handler for %q", name)
	}
	arguments := map[string]any{}
	if raw := call.GetCall().GetArgumentsJson(); raw != "" {
		var decoded any
		if err := json.Unmarshal([]byte(raw), &decoded); err != nil {
			return "", fmt.Errorf("arguments_json is not JSON: %v", err)
		}
		object, ok := decoded.(map[string]any)
		if !ok {
			return "", fmt.Errorf("arguments_json is not a JSON object: %s", raw)
		}
		arguments = object
	}
	if deadline := call.GetDeadline(); deadline != nil {
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, deadline.AsTime())
		defer cancel()
	}
	defer func() {
		if p := recover(); p != nil {
			output, err = "", fmt.Errorf("the handler of %q panicked: %v", name, p)
		}
	}()
	return handler(ctx, arguments, call)
}
