package agentruntime

import (
	"context"
	"io"
	"iter"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/status"

	v1 "github.com/agentruntime/agentruntime/clients/go/agentruntime/v1"
)

// DefaultWatchRetries is how many reconnects in a row, with no event between them,
// Watch makes before it reports the error, unless WithWatchRetries says otherwise.
const DefaultWatchRetries = 5

// Watch reconnects with a delay that starts at defaultWatchBackoff and doubles, with
// jitter, up to defaultWatchMaxBackoff.
const (
	defaultWatchBackoff    = time.Second
	defaultWatchMaxBackoff = 5 * time.Second
)

// watchLagging is the ErrorInfo reason of the RESOURCE_EXHAUSTED a Watch consumer gets
// when it fell too far behind the runtime's events.
const watchLagging = "WATCH_LAGGING"

type watchOptions struct {
	maxRetries int
	backoff    time.Duration
	maxBackoff time.Duration
}

// WatchOption configures Watch.
type WatchOption func(*watchOptions)

// WithWatchRetries sets how many reconnects in a row, with no event between them, Watch
// makes before it reports the error (default DefaultWatchRetries; 0: none).
func WithWatchRetries(n int) WatchOption {
	return func(o *watchOptions) { o.maxRetries = max(n, 0) }
}

// WithWatchBackoff sets the reconnection delay: it starts at initial and doubles after
// each failed reconnect, up to maxDelay, with jitter (the default is 250 ms up to 5 s).
func WithWatchBackoff(initial, maxDelay time.Duration) WatchOption {
	return func(o *watchOptions) { o.backoff, o.maxBackoff = initial, maxDelay }
}

// Watch returns the runtime's events after afterSeq (0: its whole history), in order and
// each once, as a sequence for range; it never ends by itself. The stream uses the
// client's connection (TLS and the token apply as for every call) and has no deadline.
//
// A dropped stream (UNAVAILABLE, the server ending it, or RESOURCE_EXHAUSTED with
// ErrorInfo reason WATCH_LAGGING when the consumer fell too far behind) is reopened from
// the last seq seen, so nothing is missed and nothing is seen twice; a lagging consumer
// reconnects at once, the others after a delay with exponential backoff and jitter
// (WithWatchBackoff). After WithWatchRetries reconnects in a row (default 5) with no
// event between them, or on any other refusal (NOT_FOUND, UNAUTHENTICATED, ...), the
// sequence ends with the error as an *Error; once ctx is done it ends with ctx.Err().
// Breaking out of the loop closes the stream.
//
//	for event, err := range client.Watch(ctx, runtimeID, 0) {
//		if err != nil {
//			return err
//		}
//		fmt.Println(event.GetSeq(), event.GetHandleId())
//	}
func (c *Client) Watch(ctx context.Context, runtimeID string, afterSeq int64, opts ...WatchOption) iter.Seq2[*v1.Event, error] {
	o := watchOptions{maxRetries: DefaultWatchRetries, backoff: defaultWatchBackoff, maxBackoff: defaultWatchMaxBackoff}
	for _, opt := range opts {
		opt(&o)
	}
	return func(yield func(*v1.Event, error) bool) {
		seen, failures := afterSeq, 0
		for {
			stopped, err := c.watchOnce(ctx, runtimeID, seen, func(event *v1.Event) bool {
				if event.GetSeq() <= seen {
					return true // already delivered: never twice
				}
				failures, seen = 0, event.GetSeq()
				return yield(event, nil)
			})
			if stopped {
				return
			}
			if ctx.Err() != nil {
				yield(nil, ctx.Err())
				return
			}
			if err == io.EOF { // the server ended the stream (it is shutting down)
				err = status.Error(codes.Unavailable, "the server ended the Watch stream")
			}
			refused := wrap(err).(*Error)
			lagging := refused.Code == codes.ResourceExhausted && refused.ErrorInfo().GetReason() == watchLagging
			if !lagging && refused.Code != codes.Unavailable || failures >= o.maxRetries ||
				c.conn.GetState() == connectivity.Shutdown { // CloseConn: no way back
				yield(nil, refused)
				return
			}
			var delay time.Duration
			if !lagging { // the consumer was slow, not the server: reconnect at once
				delay = backoffDelay(o.backoff, o.maxBackoff, failures)
			}
			failures++
			if err := sleep(ctx, delay); err != nil {
				yield(nil, err)
				return
			}
		}
	}
}

// watchOnce runs one Watch stream from afterSeq, handing each event to deliver, until
// deliver returns false (stopped) or the stream fails (err: io.EOF when the server
// ended it).
func (c *Client) watchOnce(ctx context.Context, runtimeID string, afterSeq int64, deliver func(*v1.Event) bool) (stopped bool, err error) {
	streamCtx, cancel := context.WithCancel(ctx)
	defer cancel() // ends the stream, however this returns
	stream, err := c.stub.Watch(streamCtx, &v1.WatchRequest{RuntimeId: runtimeID, AfterSeq: afterSeq})
	if err != nil {
		return false, err
	}
	for {
		resp, err := stream.Recv()
		if err != nil {
			return false, err
		}
		if !deliver(resp.GetEvent()) {
			return true, nil
		}
	}
}
