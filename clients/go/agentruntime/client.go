// Package agentruntime is a thin client for the AgentRuntime gRPC service: one method
// per RPC, plain Go arguments in, generated messages out, and every refused call as an
// *Error that carries the gRPC code and the server's google.rpc details.
//
//	client, err := agentruntime.Dial("127.0.0.1:50051")
//	if err != nil { ... }
//	defer client.CloseConn()
//	result, err := client.Run(ctx, runtimeID, "coordinator", "map the repo")
//
// Over TLS with a private CA, a client certificate (mTLS) and a bearer token:
//
//	client, err := agentruntime.Dial("agents.example.com:443",
//		agentruntime.WithCAFile("ca.pem"),
//		agentruntime.WithClientCertificateFiles("client.pem", "client.key"),
//		agentruntime.WithToken(token))
//
// Every call is retried when the server refused it without acting or could not be
// reached (see Dial), and every mutating call carries a request id, generated once per
// call unless WithRequestID gives one, so that a repeat gets the first answer and
// nothing happens twice:
//
//	handleID, err := client.Spawn(ctx, runtimeID, "worker", "root", nil,
//		agentruntime.WithRequestID(orderID)) // the same handle, however often it is sent
package agentruntime

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"time"

	"google.golang.org/genproto/googleapis/rpc/code"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	v1 "github.com/agentruntime/agentruntime/clients/go/agentruntime/v1"
)

// DefaultTimeout is the deadline of each attempt of a call unless WithTimeout says
// otherwise (within the caller's context's deadline); it matches the Python client.
const DefaultTimeout = 60 * time.Second

// The connection's keepalive unless WithKeepalive or WithoutKeepalive says otherwise: while
// a call is open, an HTTP/2 PING after DefaultKeepaliveTime without activity, and the
// connection closed (its calls fail with UNAVAILABLE; Watch and ServeTools reconnect) when
// no ack comes within DefaultKeepaliveTimeout. Without it a Watch or a worker's stream
// behind a NAT or a proxy that dropped the connection waits forever. An idle connection is
// not pinged.
const (
	DefaultKeepaliveTime    = 60 * time.Second
	DefaultKeepaliveTimeout = 20 * time.Second
)

// WaitSlice is the longest one Wait RPC asks the server to wait (WaitRequest.timeout):
// well under any proxy's idle cut-off. Wait and Run repeat the RPC while the handle runs.
const WaitSlice = 30 * time.Second

// waitMargin keeps the deadline of a Wait RPC above its server-side timeout, so the
// server answers STATUS_TIMEOUT instead of the client cutting the call off.
const waitMargin = 10 * time.Second

// Client talks to one AgentRuntime server. It is safe for concurrent use.
type Client struct {
	conn        *grpc.ClientConn
	stub        v1.AgentRuntimeClient
	timeout     time.Duration
	retries     bool
	retryWindow time.Duration
}

type options struct {
	creds     credentials.TransportCredentials
	tls       *tls.Config // WithTLS (nil: not asked)
	useTLS    bool
	caPEM     []byte
	caFile    string
	certPEM   []byte
	keyPEM    []byte
	certFile  string
	keyFile   string
	perRPC    []credentials.PerRPCCredentials
	timeout   time.Duration
	keepalive keepalive.ClientParameters // Time 0: no pings
	dialOpts  []grpc.DialOption
	retries   bool
	// retryWindow bounds the retries of a call whose ctx has no deadline.
	retryWindow time.Duration
}

// Option configures Dial.
type Option func(*options)

// WithTLS dials over TLS with config (nil: the system roots). WithCA and
// WithClientCertificate add to a copy of it.
func WithTLS(config *tls.Config) Option {
	return func(o *options) { o.useTLS, o.tls = true, config }
}

// WithCA dials over TLS and verifies the server against the CA certificates in pem
// (PEM-encoded) instead of the system roots.
func WithCA(pem []byte) Option {
	return func(o *options) { o.useTLS, o.caPEM, o.caFile = true, pem, "" }
}

// WithCAFile is WithCA with the PEM read from a file (when Dial runs).
func WithCAFile(path string) Option {
	return func(o *options) { o.useTLS, o.caFile, o.caPEM = true, path, nil }
}

// WithClientCertificate dials over TLS and presents the PEM certificate (chain) and its
// private key to the server (mTLS). The key may be PKCS#8, PKCS#1 or SEC 1.
func WithClientCertificate(certPEM, keyPEM []byte) Option {
	return func(o *options) {
		o.useTLS, o.certPEM, o.keyPEM, o.certFile, o.keyFile = true, certPEM, keyPEM, "", ""
	}
}

// WithClientCertificateFiles is WithClientCertificate with the PEM read from files
// (when Dial runs).
func WithClientCertificateFiles(certFile, keyFile string) Option {
	return func(o *options) {
		o.useTLS, o.certFile, o.keyFile, o.certPEM, o.keyPEM = true, certFile, keyFile, nil, nil
	}
}

// WithCredentials dials with the given transport credentials (ALTS, a custom TLS
// setup, ...); it overrides WithTLS, WithCA and WithClientCertificate.
func WithCredentials(creds credentials.TransportCredentials) Option {
	return func(o *options) { o.creds = creds }
}

// WithToken sends `authorization: Bearer <token>` on every call, those made through
// Stub() included. An empty token sends nothing.
func WithToken(token string) Option {
	return func(o *options) {
		if token != "" {
			o.perRPC = append(o.perRPC, BearerToken(token))
		}
	}
}

// WithPerRPCCredentials adds credentials asked for on every call (an OAuth token
// source, ...).
func WithPerRPCCredentials(creds credentials.PerRPCCredentials) Option {
	return func(o *options) { o.perRPC = append(o.perRPC, creds) }
}

// WithTimeout sets the deadline of each attempt of a call (DefaultTimeout; 0: none), capped
// by the context's deadline or, when it has none, by what is left of the retry window
// (WithRetryWindow). Wait, Watch and ServeTools are not bounded by it, nor Stub()'s calls.
func WithTimeout(d time.Duration) Option {
	return func(o *options) { o.timeout = d }
}

// WithDialOptions passes extra options to grpc.NewClient (anything the options here do
// not cover); they come after the client's own, so they win where both set something.
func WithDialOptions(opts ...grpc.DialOption) Option {
	return func(o *options) { o.dialOpts = append(o.dialOpts, opts...) }
}

// WithKeepalive replaces the default keepalive (DefaultKeepaliveTime and
// DefaultKeepaliveTimeout, only while a call is open): Time without activity before a
// ping, Timeout to wait for the ack, PermitWithoutStream to ping with no call in flight
// too; a zero Time sends no pings. A dead peer or a NAT that dropped the connection is
// noticed within Time + Timeout; long Waits, Watch and ServeTools streams benefit most.
// grpc-go raises a Time under 10 s to 10 s; the agentruntime server accepts pings every
// second or more, with or without a call in flight (a proxy in between may be stricter).
func WithKeepalive(params keepalive.ClientParameters) Option {
	return func(o *options) { o.keepalive = params }
}

// WithoutKeepalive sends no keepalive pings (grpc-go's own default): a stream whose
// connection silently died then waits until its context ends.
func WithoutKeepalive() Option {
	return func(o *options) { o.keepalive = keepalive.ClientParameters{} }
}

// WithUnaryInterceptors adds interceptors around every unary call (all RPCs but Watch
// and ServeTools, Stub()'s included), chained in the order given: the first is the
// outermost. They see each attempt the client's retries make as a call of its own, with
// the request id it carries.
func WithUnaryInterceptors(interceptors ...grpc.UnaryClientInterceptor) Option {
	return func(o *options) { o.dialOpts = append(o.dialOpts, grpc.WithChainUnaryInterceptor(interceptors...)) }
}

// WithStreamInterceptors adds interceptors around every streaming call (Watch and
// ServeTools, each reconnection a call of its own), chained in the order given.
func WithStreamInterceptors(interceptors ...grpc.StreamClientInterceptor) Option {
	return func(o *options) { o.dialOpts = append(o.dialOpts, grpc.WithChainStreamInterceptor(interceptors...)) }
}

// BearerToken is per-RPC credentials sending `authorization: Bearer <token>`. It does
// not require transport security, so that a plaintext connection to a loopback server
// (or to a proxy that terminates TLS) can carry it too: give a remote server TLS.
type BearerToken string

// GetRequestMetadata implements credentials.PerRPCCredentials.
func (t BearerToken) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{"authorization": "Bearer " + string(t)}, nil
}

// RequireTransportSecurity implements credentials.PerRPCCredentials.
func (t BearerToken) RequireTransportSecurity() bool { return false }

// transportCredentials resolves the TLS options: plaintext unless one of them was given.
func (o *options) transportCredentials() (credentials.TransportCredentials, error) {
	if o.creds != nil {
		return o.creds, nil
	}
	if !o.useTLS {
		return insecure.NewCredentials(), nil
	}
	config := &tls.Config{MinVersion: tls.VersionTLS12}
	if o.tls != nil {
		config = o.tls.Clone()
	}
	if o.caFile != "" {
		pem, err := os.ReadFile(o.caFile)
		if err != nil {
			return nil, fmt.Errorf("agentruntime: CA file: %w", err)
		}
		o.caPEM = pem
	}
	if o.caPEM != nil {
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(o.caPEM) {
			return nil, errors.New("agentruntime: the CA holds no PEM certificate")
		}
		config.RootCAs = pool
	}
	if o.certFile != "" || o.keyFile != "" {
		cert, err := tls.LoadX509KeyPair(o.certFile, o.keyFile)
		if err != nil {
			return nil, fmt.Errorf("agentruntime: client certificate: %w", err)
		}
		config.Certificates = append(config.Certificates, cert)
	} else if o.certPEM != nil || o.keyPEM != nil {
		cert, err := tls.X509KeyPair(o.certPEM, o.keyPEM)
		if err != nil {
			return nil, fmt.Errorf("agentruntime: client certificate: %w", err)
		}
		config.Certificates = append(config.Certificates, cert)
	}
	return credentials.NewTLS(config), nil
}

// newOptions applies opts to the defaults.
func newOptions(opts []Option) options {
	o := options{
		timeout: DefaultTimeout, keepalive: keepalive.ClientParameters{Time: DefaultKeepaliveTime, Timeout: DefaultKeepaliveTimeout},
		retries: true, retryWindow: DefaultRetryWindow,
	}
	for _, opt := range opts {
		opt(&o)
	}
	return o
}

// Dial creates a client for target (host:port, or any gRPC target URI). Like
// grpc.NewClient it does not connect yet: the first call does. Plaintext unless
// WithTLS, WithCA(File), WithClientCertificate(Files) or WithCredentials is given; a
// CA or certificate that cannot be read or parsed is an error here.
//
// Every unary call (Stub()'s too) is retried by the client, never by gRPC: on
// UNAVAILABLE, on a CANCELLED the caller did not cause (a server shutting down,
// grpc/grpc#41785), on an attempt's own deadline and on any status carrying
// google.rpc.RetryInfo, with full-jitter backoff, until ctx's deadline or the retry
// window (DefaultRetryWindow; WithRetryWindow, WithoutRetries). A mutating call carries
// a request id, generated once per call unless WithRequestID gives one, the same on
// every attempt: the server answers a repeat with the first answer and does not act
// twice. Keepalive is on (see DefaultKeepaliveTime; WithKeepalive, WithoutKeepalive).
func Dial(target string, opts ...Option) (*Client, error) {
	o := newOptions(opts)
	creds, err := o.transportCredentials()
	if err != nil {
		return nil, err
	}
	c := &Client{timeout: o.timeout, retries: o.retries, retryWindow: o.retryWindow}
	// The retrying interceptor first, so that it is the outermost: the interceptors of
	// WithUnaryInterceptors, which come after it, see each attempt.
	dialOpts := []grpc.DialOption{grpc.WithTransportCredentials(creds), grpc.WithChainUnaryInterceptor(c.retrying)}
	if o.keepalive.Time > 0 { // before WithDialOptions', so that a keepalive given there wins
		dialOpts = append(dialOpts, grpc.WithKeepaliveParams(o.keepalive))
	}
	for _, c := range o.perRPC {
		dialOpts = append(dialOpts, grpc.WithPerRPCCredentials(c))
	}
	conn, err := grpc.NewClient(target, append(dialOpts, o.dialOpts...)...)
	if err != nil {
		return nil, err
	}
	c.conn, c.stub = conn, v1.NewAgentRuntimeClient(conn)
	return c, nil
}

// CloseConn closes the connection (Close is the RPC that closes a handle).
func (c *Client) CloseConn() error { return c.conn.Close() }

// Stub returns the generated client, for what the thin methods do not cover. Its
// calls carry the token too and are retried like the client's own (a mutating request
// without a request id is sent, as a copy, with a generated one); the default per-call
// deadline is not applied: ctx's deadline, or the retry window, bounds them.
func (c *Client) Stub() v1.AgentRuntimeClient { return c.stub }

// CreateRuntime creates a runtime with the given agents; an empty runtimeID lets the
// server generate one. It returns the runtime's id. A repeat with the same request id
// (WithRequestID) returns the runtime the first call created, the generated id included.
func (c *Client) CreateRuntime(ctx context.Context, agents []*v1.AgentDef, runtimeID string, opts ...CallOption) (string, error) {
	req := &v1.CreateRuntimeRequest{RuntimeId: runtimeID, Agents: agents, RequestId: requestIDOf(opts)}
	resp, err := c.stub.CreateRuntime(c.withAttemptTimeout(ctx), req)
	if err != nil {
		return "", wrap(err)
	}
	return resp.GetRuntimeId(), nil
}

// Spawn creates a handle of agent under parent ("root", or "" for root, or a handle
// id); a non-nil budget overrides the agent's. It returns the handle id.
func (c *Client) Spawn(ctx context.Context, runtimeID, agent, parent string, budget *v1.Budget, opts ...CallOption) (string, error) {
	req := &v1.SpawnRequest{RuntimeId: runtimeID, ParentId: parent, Agent: agent, Budget: budget, RequestId: requestIDOf(opts)}
	resp, err := c.stub.Spawn(c.withAttemptTimeout(ctx), req)
	if err != nil {
		return "", wrap(err)
	}
	return resp.GetHandleId(), nil
}

// Post puts text into the handle's inbox (channel and sender may be empty) and
// returns the inbox size.
func (c *Client) Post(ctx context.Context, runtimeID, handleID, text, channel, sender string, opts ...CallOption) (int, error) {
	req := &v1.PostRequest{RuntimeId: runtimeID, HandleId: handleID, Text: text, Channel: channel, Sender: sender, RequestId: requestIDOf(opts)}
	resp, err := c.stub.Post(c.withAttemptTimeout(ctx), req)
	if err != nil {
		return 0, wrap(err)
	}
	return int(resp.GetInboxSize()), nil
}

// Wake starts a run of the handle and returns at once; the bool says it was accepted.
func (c *Client) Wake(ctx context.Context, runtimeID, handleID, prompt string, opts ...CallOption) (bool, error) {
	req := &v1.WakeRequest{RuntimeId: runtimeID, HandleId: handleID, Prompt: prompt, RequestId: requestIDOf(opts)}
	resp, err := c.stub.Wake(c.withAttemptTimeout(ctx), req)
	if err != nil {
		return false, wrap(err)
	}
	return resp.GetQueued(), nil
}

// Wait returns the handle's settled (or PENDING) result, however long the run takes.
// With timeout > 0 it returns the server's STATUS_TIMEOUT result (the handle still
// running) once that much time has passed; 0 waits until the handle settles or ctx is
// done. A timeout is the caller's choice, never the transport's: each Wait RPC asks the
// server for at most WaitSlice, under a deadline of that plus a margin (the client's
// WithTimeout does not apply), and is repeated while the result is STATUS_TIMEOUT. A
// failed RPC that the client retries (UNAVAILABLE, a CANCELLED the caller did not cause,
// an RPC's own deadline, a status carrying RetryInfo: see Dial) is repeated with
// full-jitter backoff, at least the RetryInfo's retry_delay, while the failures in a row
// last less than the retry window (WithRetryWindow; a result starts it over): a server
// that restarts is waited for, one that refuses for ever is reported after the window.
func (c *Client) Wait(ctx context.Context, runtimeID, handleID string, timeout time.Duration) (*v1.TaskResult, error) {
	var end time.Time
	if timeout > 0 {
		end = time.Now().Add(timeout)
	}
	over := func() bool { return timeout > 0 && !time.Now().Before(end) }
	var failures failuresInARow
	ownLoop := context.WithValue(ctx, ownLoopKey{}, true)
	for {
		slice := WaitSlice
		if timeout > 0 {
			slice = max(min(slice, time.Until(end)), 0)
		}
		req := &v1.WaitRequest{RuntimeId: runtimeID, HandleId: handleID, Timeout: durationpb.New(slice)}
		deadline := time.Now().Add(slice + waitMargin)
		callCtx, cancel := context.WithDeadline(ownLoop, deadline)
		resp, err := c.stub.Wait(callCtx, req)
		cancel()
		expired := !time.Now().Before(deadline) // the RPC's own deadline passed (see retrying)
		if err != nil {
			if over() {
				return nil, wrap(err)
			}
			if err := c.retryInLoop(ctx, &failures, err, expired); err != nil {
				return nil, err
			}
			continue
		}
		failures = failuresInARow{}
		if result := resp.GetResult(); result.GetStatus() != v1.Status_STATUS_TIMEOUT || over() {
			return result, nil
		}
	}
}

// Resume answers a pending Request and returns the root's settled (or again PENDING)
// result. A repeat with the same request id (the one generated for this call, on each of
// its attempts, or WithRequestID's) gets the first answer and runs nothing again.
func (c *Client) Resume(ctx context.Context, runtimeID string, answer *v1.Answer, opts ...CallOption) (*v1.TaskResult, error) {
	req := &v1.ResumeRequest{RuntimeId: runtimeID, Answer: answer, RequestId: requestIDOf(opts)}
	resp, err := c.stub.Resume(c.withAttemptTimeout(ctx), req)
	if err != nil {
		return nil, wrap(err)
	}
	return resp.GetResult(), nil
}

// failuresInARow is the run of consecutive failed RPCs of a loop that retries them
// itself (Wait, ReplayRuntime): how many, and when the first came.
type failuresInARow struct {
	n     int
	since time.Time
}

// retryInLoop decides, for a loop that makes its RPCs under ownLoopKey (so the retrying
// interceptor makes each once), whether the RPC that failed with err is made again: when
// the client retries, err is retryable (expired: the RPC's own deadline passed) and the
// failures in a row, with the delay before the next attempt, stay within the retry window.
// Then it sleeps that delay (full jitter, at least the RetryInfo's retry_delay) and returns
// nil; otherwise it returns the error to give the caller (err, or ctx's once it is done).
func (c *Client) retryInLoop(ctx context.Context, failures *failuresInARow, err error, expired bool) error {
	if failures.n == 0 {
		failures.since = time.Now()
	}
	if !c.retries || !c.retryable(ctx, err, expired) {
		return wrap(err)
	}
	delay := retryDelay(failures.n, err)
	if time.Since(failures.since)+delay >= c.retryWindow {
		return wrap(err)
	}
	if err := sleep(ctx, delay); err != nil {
		return contextError(err)
	}
	failures.n++
	return nil
}

// contextError is ctx's error as an *Error (CANCELLED or DEADLINE_EXCEEDED), like the
// error of a call that ctx cut short.
func contextError(err error) error { return wrap(status.FromContextError(err).Err()) }

// sleep waits for d, or until ctx is done (then it returns ctx's error).
func sleep(ctx context.Context, d time.Duration) error {
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-timer.C:
		return nil
	}
}

// Run spawns agent under root, wakes it on prompt and waits for its result, however
// long the run takes (Wait with no timeout; ctx bounds it). Its Spawn and its Wake each
// carry a request id, generated unless WithRunRequestIDs gives them, so that their
// retries neither spawn a second handle nor run it twice.
func (c *Client) Run(ctx context.Context, runtimeID, agent, prompt string, opts ...RunOption) (*v1.TaskResult, error) {
	o := runOptionsOf(opts)
	handleID, err := c.spawnAndWake(ctx, runtimeID, agent, prompt, "root", o)
	if err != nil {
		return nil, err
	}
	return c.Wait(ctx, runtimeID, handleID, 0)
}

// spawnAndWake starts Run's run: a handle of agent under parent, woken on prompt, each
// call with its request id (StreamRun wakes only once its Watch answered).
func (c *Client) spawnAndWake(ctx context.Context, runtimeID, agent, prompt, parent string, o runOptions) (string, error) {
	handleID, err := c.Spawn(ctx, runtimeID, agent, parent, nil, WithRequestID(o.spawnRequestID))
	if err != nil {
		return "", err
	}
	if _, err := c.Wake(ctx, runtimeID, handleID, prompt, WithRequestID(o.wakeRequestID)); err != nil {
		return "", err
	}
	return handleID, nil
}

// Interrupt cancels the handle's run and its subtree's; false means nothing ran.
func (c *Client) Interrupt(ctx context.Context, runtimeID, handleID string, opts ...CallOption) (bool, error) {
	req := &v1.InterruptRequest{RuntimeId: runtimeID, HandleId: handleID, RequestId: requestIDOf(opts)}
	resp, err := c.stub.Interrupt(c.withAttemptTimeout(ctx), req)
	if err != nil {
		return false, wrap(err)
	}
	return resp.GetInterrupted(), nil
}

// Close closes the handle and its subtree, leaf first, and returns the closed ids;
// force interrupts running handles instead of refusing.
func (c *Client) Close(ctx context.Context, runtimeID, handleID string, force bool, opts ...CallOption) ([]string, error) {
	req := &v1.CloseRequest{RuntimeId: runtimeID, HandleId: handleID, Force: force, RequestId: requestIDOf(opts)}
	resp, err := c.stub.Close(c.withAttemptTimeout(ctx), req)
	if err != nil {
		return nil, wrap(err)
	}
	return resp.GetClosedHandleIds(), nil
}

// Inspect returns one handle's view.
func (c *Client) Inspect(ctx context.Context, runtimeID, handleID string) (*v1.HandleView, error) {
	resp, err := c.stub.Inspect(c.withAttemptTimeout(ctx), &v1.InspectRequest{RuntimeId: runtimeID, HandleId: handleID})
	if err != nil {
		return nil, wrap(err)
	}
	return resp.GetHandle(), nil
}

// List returns every handle of the runtime, in spawn order: it follows the pages of
// List until the last one.
func (c *Client) List(ctx context.Context, runtimeID string) ([]*v1.HandleView, error) {
	return collect(c.handlePages(ctx, runtimeID, 0))
}

// ListPage returns one page of List: at most pageSize handles (0: the server's
// default) from pageToken on ("" for the first page). Its NextPageToken is empty on the
// last page.
func (c *Client) ListPage(ctx context.Context, runtimeID string, pageSize int32, pageToken string) (*v1.ListResponse, error) {
	resp, err := c.stub.List(c.withAttemptTimeout(ctx), &v1.ListRequest{RuntimeId: runtimeID, PageSize: pageSize, PageToken: pageToken})
	if err != nil {
		return nil, wrap(err)
	}
	return resp, nil
}

// Transcript returns the handle's whole stored transcript: it follows the pages of
// GetTranscript until the last one.
func (c *Client) Transcript(ctx context.Context, runtimeID, handleID string) ([]*v1.Message, error) {
	return collect(c.messagePages(ctx, runtimeID, handleID, 0))
}

// TranscriptPage returns one page of GetTranscript: at most pageSize messages (0: the
// server's default) from pageToken on ("" for the first page). Its NextPageToken is
// empty on the last page.
func (c *Client) TranscriptPage(ctx context.Context, runtimeID, handleID string, pageSize int32, pageToken string) (*v1.GetTranscriptResponse, error) {
	req := &v1.GetTranscriptRequest{RuntimeId: runtimeID, HandleId: handleID, PageSize: pageSize, PageToken: pageToken}
	resp, err := c.stub.GetTranscript(c.withAttemptTimeout(ctx), req)
	if err != nil {
		return nil, wrap(err)
	}
	return resp, nil
}

// ListRuntimes returns every runtime of the caller's tenant, newest first: it follows
// the pages of ListRuntimes until the last one. WithForksOf lists only a runtime's forks
// and replays.
func (c *Client) ListRuntimes(ctx context.Context, opts ...ListRuntimesOption) ([]*v1.RuntimeSummary, error) {
	return collect(c.runtimePages(ctx, 0, opts))
}

// ListRuntimesPage returns one page of ListRuntimes: at most pageSize runtimes (0: the
// server's default), newest first, from pageToken on ("" for the first page). Its
// NextPageToken is empty on the last page. Give every page the same options.
func (c *Client) ListRuntimesPage(ctx context.Context, pageSize int32, pageToken string, opts ...ListRuntimesOption) (*v1.ListRuntimesResponse, error) {
	req := &v1.ListRuntimesRequest{PageSize: pageSize, PageToken: pageToken}
	for _, opt := range opts {
		opt(req)
	}
	resp, err := c.stub.ListRuntimes(c.withAttemptTimeout(ctx), req)
	if err != nil {
		return nil, wrap(err)
	}
	return resp, nil
}

// DeleteRuntime closes the runtime and deletes everything stored of it; force
// interrupts running handles (without it a runtime with running handles is refused).
// A repeat with the same request id (WithRequestID) gets the first answer, not NOT_FOUND.
func (c *Client) DeleteRuntime(ctx context.Context, runtimeID string, force bool, opts ...CallOption) error {
	req := &v1.DeleteRuntimeRequest{RuntimeId: runtimeID, Force: force, RequestId: requestIDOf(opts)}
	if _, err := c.stub.DeleteRuntime(c.withAttemptTimeout(ctx), req); err != nil {
		return wrap(err)
	}
	return nil
}

// Error is a refused call: the gRPC code, the server's message and the google.rpc
// details it attached (*errdetails.BadRequest, *errdetails.ErrorInfo,
// *errdetails.ResourceInfo, *errdetails.QuotaFailure, *errdetails.RetryInfo). The Is* functions below test an
// error's code.
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

// RetryInfo says how long the server asked to wait before trying again (an UNAVAILABLE
// it sent without acting: a runtime moving between replicas, a draining server, ...), or
// nil.
func (e *Error) RetryInfo() *errdetails.RetryInfo { return detail[*errdetails.RetryInfo](e) }

// ResourceInfo names what a NOT_FOUND did not find, or nil.
func (e *Error) ResourceInfo() *errdetails.ResourceInfo { return detail[*errdetails.ResourceInfo](e) }

// QuotaFailure names the tenant quota a RESOURCE_EXHAUSTED hit (its violations' subject,
// e.g. `tenant:acme`), or nil.
func (e *Error) QuotaFailure() *errdetails.QuotaFailure { return detail[*errdetails.QuotaFailure](e) }

// IsNotFound reports whether err (an *Error, or any error carrying a gRPC status) is
// NOT_FOUND: no such runtime, handle or pending request (ResourceInfo says which).
func IsNotFound(err error) bool { return status.Code(err) == codes.NotFound }

// IsInvalidArgument reports an INVALID_ARGUMENT (BadRequest lists the fields).
func IsInvalidArgument(err error) bool { return status.Code(err) == codes.InvalidArgument }

// IsFailedPrecondition reports a FAILED_PRECONDITION (ErrorInfo's reason says which, e.g.
// HANDLE_RUNNING for a Wake of a running handle).
func IsFailedPrecondition(err error) bool { return status.Code(err) == codes.FailedPrecondition }

// IsResourceExhausted reports a RESOURCE_EXHAUSTED: a budget (ErrorInfo's limit) or a
// tenant quota (QuotaFailure).
func IsResourceExhausted(err error) bool { return status.Code(err) == codes.ResourceExhausted }

// IsAlreadyExists reports an ALREADY_EXISTS (CreateRuntime with an id in use).
func IsAlreadyExists(err error) bool { return status.Code(err) == codes.AlreadyExists }

// IsUnavailable reports an UNAVAILABLE: the server could not be reached (or is stopping,
// or the runtime is moving: ErrorInfo's reason says which), and went on so until the
// call's deadline or the retry window passed (the client retries every call; unless
// WithoutRetries).
func IsUnavailable(err error) bool { return status.Code(err) == codes.Unavailable }

// IsUnauthenticated reports a missing or rejected token.
func IsUnauthenticated(err error) bool { return status.Code(err) == codes.Unauthenticated }

// IsPermissionDenied reports a token without the scope the call needs.
func IsPermissionDenied(err error) bool { return status.Code(err) == codes.PermissionDenied }

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
	// errors and are skipped; importing errdetails registers those the server sends.
	for _, d := range st.Details() {
		if m, ok := d.(proto.Message); ok {
			e.Details = append(e.Details, m)
		}
	}
	return e
}
