// Package agentruntime is a thin client for the AgentRuntime gRPC service: one method
// per RPC, plain Go arguments in, generated messages out, and every refused call as an
// *Error that carries the gRPC code and the server's google.rpc details.
//
//	client, err := agentruntime.Dial("127.0.0.1:50051")
//	if err != nil { ... }
//	defer client.CloseConn()
//	result, err := client.Run(ctx, runtimeID, "coordinator", "map the repo")
package agentruntime

import (
	"context"
	"crypto/tls"
	"errors"
	"time"

	"google.golang.org/genproto/googleapis/rpc/code"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	v1 "github.com/agentruntime/agentruntime/clients/go/agentruntime/v1"
)

// DefaultTimeout is the per-call deadline when neither WithTimeout nor the caller's
// context sets one; it matches the Python client.
const DefaultTimeout = 60 * time.Second

// waitSlack keeps the call deadline of a Wait with a server-side timeout above that
// timeout, so the server answers STATUS_TIMEOUT instead of the client cutting it off.
const waitSlack = 5 * time.Second

// Client talks to one AgentRuntime server. It is safe for concurrent use.
type Client struct {
	conn    *grpc.ClientConn
	stub    v1.AgentRuntimeClient
	token   string
	timeout time.Duration
}

type options struct {
	creds    credentials.TransportCredentials
	token    string
	timeout  time.Duration
	dialOpts []grpc.DialOption
}

// Option configures Dial.
type Option func(*options)

// WithTLS dials over TLS; a nil config uses the system roots.
func WithTLS(config *tls.Config) Option {
	return func(o *options) { o.creds = credentials.NewTLS(config) }
}

// WithCredentials dials with the given transport credentials (mTLS, ALTS, ...).
func WithCredentials(creds credentials.TransportCredentials) Option {
	return func(o *options) { o.creds = creds }
}

// WithToken sends `authorization: Bearer <token>` on every call.
func WithToken(token string) Option {
	return func(o *options) { o.token = token }
}

// WithTimeout sets the deadline of calls whose context has none; 0 means no deadline.
func WithTimeout(d time.Duration) Option {
	return func(o *options) { o.timeout = d }
}

// WithDialOptions passes extra options to grpc.NewClient (interceptors, keepalive, ...).
func WithDialOptions(opts ...grpc.DialOption) Option {
	return func(o *options) { o.dialOpts = append(o.dialOpts, opts...) }
}

// Dial creates a client for target (host:port, or any gRPC target URI). Like
// grpc.NewClient it does not connect yet: the first call does. Plaintext unless
// WithTLS or WithCredentials is given.
func Dial(target string, opts ...Option) (*Client, error) {
	o := options{creds: insecure.NewCredentials(), timeout: DefaultTimeout}
	for _, opt := range opts {
		opt(&o)
	}
	dialOpts := append([]grpc.DialOption{grpc.WithTransportCredentials(o.creds)}, o.dialOpts...)
	conn, err := grpc.NewClient(target, dialOpts...)
	if err != nil {
		return nil, err
	}
	return &Client{conn: conn, stub: v1.NewAgentRuntimeClient(conn), token: o.token, timeout: o.timeout}, nil
}

// CloseConn closes the connection (Close is the RPC that closes a handle).
func (c *Client) CloseConn() error { return c.conn.Close() }

// Stub returns the generated client, for what the thin methods do not cover.
func (c *Client) Stub() v1.AgentRuntimeClient { return c.stub }

// call prepares a context: the token as metadata (not per-RPC credentials, which
// gRPC-Go refuses to send over plaintext, while the server accepts it either way) and
// the default deadline when the caller gave none.
func (c *Client) call(ctx context.Context, timeout time.Duration) (context.Context, context.CancelFunc) {
	if c.token != "" {
		ctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+c.token)
	}
	if _, ok := ctx.Deadline(); ok || timeout <= 0 {
		return ctx, func() {}
	}
	return context.WithTimeout(ctx, timeout)
}

// CreateRuntime creates a runtime with the given agents; an empty runtimeID lets the
// server generate one. It returns the runtime's id.
func (c *Client) CreateRuntime(ctx context.Context, agents []*v1.AgentDef, runtimeID string) (string, error) {
	ctx, cancel := c.call(ctx, c.timeout)
	defer cancel()
	resp, err := c.stub.CreateRuntime(ctx, &v1.CreateRuntimeRequest{RuntimeId: runtimeID, Agents: agents})
	if err != nil {
		return "", wrap(err)
	}
	return resp.GetRuntimeId(), nil
}

// Spawn creates a handle of agent under parent ("root", or "" for root, or a handle
// id); a non-nil budget overrides the agent's. It returns the handle id.
func (c *Client) Spawn(ctx context.Context, runtimeID, agent, parent string, budget *v1.Budget) (string, error) {
	ctx, cancel := c.call(ctx, c.timeout)
	defer cancel()
	resp, err := c.stub.Spawn(ctx, &v1.SpawnRequest{RuntimeId: runtimeID, ParentId: parent, Agent: agent, Budget: budget})
	if err != nil {
		return "", wrap(err)
	}
	return resp.GetHandleId(), nil
}

// Post puts text into the handle's inbox (channel and sender may be empty) and
// returns the inbox size.
func (c *Client) Post(ctx context.Context, runtimeID, handleID, text, channel, sender string) (int, error) {
	ctx, cancel := c.call(ctx, c.timeout)
	defer cancel()
	resp, err := c.stub.Post(ctx, &v1.PostRequest{RuntimeId: runtimeID, HandleId: handleID, Text: text, Channel: channel, Sender: sender})
	if err != nil {
		return 0, wrap(err)
	}
	return int(resp.GetInboxSize()), nil
}

// Wake starts a run of the handle and returns at once; the bool says it was accepted.
func (c *Client) Wake(ctx context.Context, runtimeID, handleID, prompt string) (bool, error) {
	ctx, cancel := c.call(ctx, c.timeout)
	defer cancel()
	resp, err := c.stub.Wake(ctx, &v1.WakeRequest{RuntimeId: runtimeID, HandleId: handleID, Prompt: prompt})
	if err != nil {
		return false, wrap(err)
	}
	return resp.GetQueued(), nil
}

// Wait blocks until the handle settles. A timeout > 0 is the server-side wait (the
// result is then STATUS_TIMEOUT if it passes); 0 waits until the call's deadline.
func (c *Client) Wait(ctx context.Context, runtimeID, handleID string, timeout time.Duration) (*v1.TaskResult, error) {
	req := &v1.WaitRequest{RuntimeId: runtimeID, HandleId: handleID}
	deadline := c.timeout
	if timeout > 0 {
		req.Timeout = durationpb.New(timeout)
		if deadline > 0 {
			deadline = max(deadline, timeout+waitSlack)
		}
	}
	ctx, cancel := c.call(ctx, deadline)
	defer cancel()
	resp, err := c.stub.Wait(ctx, req)
	if err != nil {
		return nil, wrap(err)
	}
	return resp.GetResult(), nil
}

// Resume answers a pending Request and returns the root's settled (or again PENDING)
// result.
func (c *Client) Resume(ctx context.Context, runtimeID string, answer *v1.Answer) (*v1.TaskResult, error) {
	ctx, cancel := c.call(ctx, c.timeout)
	defer cancel()
	resp, err := c.stub.Resume(ctx, &v1.ResumeRequest{RuntimeId: runtimeID, Answer: answer})
	if err != nil {
		return nil, wrap(err)
	}
	return resp.GetResult(), nil
}

// Run spawns agent under root, wakes it on prompt and waits for its result.
func (c *Client) Run(ctx context.Context, runtimeID, agent, prompt string) (*v1.TaskResult, error) {
	handleID, err := c.Spawn(ctx, runtimeID, agent, "root", nil)
	if err != nil {
		return nil, err
	}
	if _, err := c.Wake(ctx, runtimeID, handleID, prompt); err != nil {
		return nil, err
	}
	return c.Wait(ctx, runtimeID, handleID, 0)
}

// Interrupt cancels the handle's run and its subtree's; false means nothing ran.
func (c *Client) Interrupt(ctx context.Context, runtimeID, handleID string) (bool, error) {
	ctx, cancel := c.call(ctx, c.timeout)
	defer cancel()
	resp, err := c.stub.Interrupt(ctx, &v1.InterruptRequest{RuntimeId: runtimeID, HandleId: handleID})
	if err != nil {
		return false, wrap(err)
	}
	return resp.GetInterrupted(), nil
}

// Close closes the handle and its subtree, leaf first, and returns the closed ids;
// force interrupts running handles instead of refusing.
func (c *Client) Close(ctx context.Context, runtimeID, handleID string, force bool) ([]string, error) {
	ctx, cancel := c.call(ctx, c.timeout)
	defer cancel()
	resp, err := c.stub.Close(ctx, &v1.CloseRequest{RuntimeId: runtimeID, HandleId: handleID, Force: force})
	if err != nil {
		return nil, wrap(err)
	}
	return resp.GetClosedHandleIds(), nil
}

// Inspect returns one handle's view.
func (c *Client) Inspect(ctx context.Context, runtimeID, handleID string) (*v1.HandleView, error) {
	ctx, cancel := c.call(ctx, c.timeout)
	defer cancel()
	resp, err := c.stub.Inspect(ctx, &v1.InspectRequest{RuntimeId: runtimeID, HandleId: handleID})
	if err != nil {
		return nil, wrap(err)
	}
	return resp.GetHandle(), nil
}

// List returns every handle of the runtime, in spawn order: it follows the pages of
// List until the last one.
func (c *Client) List(ctx context.Context, runtimeID string) ([]*v1.HandleView, error) {
	var handles []*v1.HandleView
	token := ""
	for {
		resp, err := c.ListPage(ctx, runtimeID, 0, token)
		if err != nil {
			return nil, err
		}
		handles = append(handles, resp.GetHandles()...)
		if token = resp.GetNextPageToken(); token == "" {
			return handles, nil
		}
	}
}

// ListPage returns one page of List: at most pageSize handles (0: the server's
// default) from pageToken on ("" for the first page). Its NextPageToken is empty on the
// last page.
func (c *Client) ListPage(ctx context.Context, runtimeID string, pageSize int32, pageToken string) (*v1.ListResponse, error) {
	ctx, cancel := c.call(ctx, c.timeout)
	defer cancel()
	resp, err := c.stub.List(ctx, &v1.ListRequest{RuntimeId: runtimeID, PageSize: pageSize, PageToken: pageToken})
	if err != nil {
		return nil, wrap(err)
	}
	return resp, nil
}

// Transcript returns the handle's whole stored transcript: it follows the pages of
// GetTranscript until the last one.
func (c *Client) Transcript(ctx context.Context, runtimeID, handleID string) ([]*v1.Message, error) {
	var messages []*v1.Message
	token := ""
	for {
		resp, err := c.TranscriptPage(ctx, runtimeID, handleID, 0, token)
		if err != nil {
			return nil, err
		}
		messages = append(messages, resp.GetMessages()...)
		if token = resp.GetNextPageToken(); token == "" {
			return messages, nil
		}
	}
}

// TranscriptPage returns one page of GetTranscript: at most pageSize messages (0: the
// server's default) from pageToken on ("" for the first page). Its NextPageToken is
// empty on the last page.
func (c *Client) TranscriptPage(ctx context.Context, runtimeID, handleID string, pageSize int32, pageToken string) (*v1.GetTranscriptResponse, error) {
	ctx, cancel := c.call(ctx, c.timeout)
	defer cancel()
	req := &v1.GetTranscriptRequest{RuntimeId: runtimeID, HandleId: handleID, PageSize: pageSize, PageToken: pageToken}
	resp, err := c.stub.GetTranscript(ctx, req)
	if err != nil {
		return nil, wrap(err)
	}
	return resp, nil
}

// Error is a refused call: the gRPC code, the server's message and the google.rpc
// details it attached (*errdetails.BadRequest, *errdetails.ErrorInfo,
// *errdetails.ResourceInfo).
type Error struct {
	Code    codes.Code
	Message string
	Details []proto.Message
	status  *status.Status
}

// Error reads like the Python client's: `RESOURCE_EXHAUSTED: message`.
func (e *Error) Error() string { return e.CodeName() + ": " + e.Message }

// CodeName is the canonical name of the code (`RESOURCE_EXHAUSTED`), the spelling the
// conformance vectors and other languages use; Code.String() gives `ResourceExhausted`.
func (e *Error) CodeName() string {
	if name, ok := code.Code_name[int32(e.Code)]; ok {
		return name
	}
	return e.Code.String()
}

// GRPCStatus lets status.FromError and status.Code see through the wrapper.
func (e *Error) GRPCStatus() *status.Status { return e.status }

// ErrorInfo returns the ErrorInfo detail (its metadata["limit"] names the budget a
// RESOURCE_EXHAUSTED hit), or nil.
func (e *Error) ErrorInfo() *errdetails.ErrorInfo { return detail[*errdetails.ErrorInfo](e) }

// BadRequest returns the field violations of an INVALID_ARGUMENT, or nil.
func (e *Error) BadRequest() *errdetails.BadRequest { return detail[*errdetails.BadRequest](e) }

// ResourceInfo names what a NOT_FOUND did not find, or nil.
func (e *Error) ResourceInfo() *errdetails.ResourceInfo { return detail[*errdetails.ResourceInfo](e) }

func detail[T proto.Message](e *Error) T {
	for _, d := range e.Details {
		if t, ok := d.(T); ok {
			return t
		}
	}
	var zero T
	return zero
}

// AsError returns err as an *Error when it is one (or wraps one).
func AsError(err error) (*Error, bool) {
	var e *Error
	ok := errors.As(err, &e)
	return e, ok
}

func wrap(err error) error {
	st := status.Convert(err)
	e := &Error{Code: st.Code(), Message: st.Message(), status: st}
	// Details that fail to decode (a type this binary does not link) come back as
	// errors and are skipped; importing errdetails registers the three the server sends.
	for _, d := range st.Details() {
		if m, ok := d.(proto.Message); ok {
			e.Details = append(e.Details, m)
		}
	}
	return e
}
