package agentruntime

import (
	"context"
	"errors"
	"io"
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
// makes before it reports the error (default DefaultWatchRetries, or 0 on a client dialed
// WithoutRetries; 0: none).
func WithWatchRetries(n int) WatchOption {
	return func(o *watchOptions) { o.maxRetries = max(n, 0) }
}

// WithWatchBackoff sets the reconnection delay: it starts at initial and doubles after
// each failed reconnect, up to maxDelay, with jitter (the default is 1 s up to 5 s).
func WithWatchBackoff(initial, maxDelay time.Duration) WatchOption {
	return func(o *watchOptions) { o.backoff, o.maxBackoff = initial, maxDelay }
}

// ErrStopWatch, returned by a WatchFunc callback, ends the watch without an error.
var ErrStopWatch = errors.New("agentruntime: stop watching")

// WatchFunc is Watch for callers that do not range over functions (Go 1.22): it calls fn
// with each of the runtime's events after afterSeq (0: its whole history), in order and
// each once, and reconnects exactly as Watch does. It returns when fn returns an error
// (nil when that error is ErrStopWatch, else fn's error as is), when the watch fails (an
// *Error, after the same retries as Watch) or when ctx is done (ctx.Err()).
//
//	err := client.WatchFunc(ctx, runtimeID, 0, func(event *v1.Event) error {
//		fmt.Println(event.GetSeq(), event.GetHandleId())
//		if event.GetResult() != nil {
//			return agentruntime.ErrStopWatch
//		}
//		return nil
//	})
func (c *Client) WatchFunc(ctx context.Context, runtimeID string, afterSeq int64, fn func(*v1.Event) error, opts ...WatchOption) error {
	var failed error
	c.watch(ctx, runtimeID, afterSeq, opts, func(event *v1.Event, err error) bool {
		if err != nil {
			failed = err
			return false
		}
		if err := fn(event); err != nil {
			if !errors.Is(err, ErrStopWatch) {
				failed = err
			}
			return false
		}
		return true
	})
	return failed
}

// watch is Watch's and WatchFunc's one implementation: it hands yield each event (with a
// nil error) until yield returns false, or the final error (with a nil event).
func (c *Client) watch(ctx context.Context, runtimeID string, afterSeq int64, opts []WatchOption, yield func(*v1.Event, error) bool) {
	c.watchStream(ctx, runtimeID, afterSeq, false, opts, func(event *v1.Event, _ *v1.Delta, err error) bool {
		return yield(event, err)
	})
}

// watchStream is the reconnecting watch under Watch, WatchFunc and StreamRun: it hands
// yield each event (with a nil delta and error) and, when deltas is set, each piece of
// every handle's turns (with a nil event and error), until yield returns false, or the
// final error (with neither): each event once, in order, and each piece once (a reset
// every time). It asks for batches (WatchRequest.batch): the events of a response's
// `events` are handed over one at a time, in order, as are those of a server from before
// batches, one a response in `event`. Only events move the seq a reconnect resumes from
// (after a batch, its last event's): deltas have none. An event or a new piece ends a run
// of failures, so a long turn cut several times is followed to its end; the pieces sent
// again after a reconnect are skipped and do not count, nor do resets (the server may send
// them again after each one), so a server that only ever resends is still given up on.
func (c *Client) watchStream(ctx context.Context, runtimeID string, afterSeq int64, deltas bool, opts []WatchOption, yield func(*v1.Event, *v1.Delta, error) bool) {
	o := watchOptions{maxRetries: DefaultWatchRetries, backoff: defaultWatchBackoff, maxBackoff: defaultWatchMaxBackoff}
	if !c.retries {
		o.maxRetries = 0
	}
	for _, opt := range opts {
		opt(&o)
	}
	seen, failures := afterSeq, 0
	fresh := freshDeltas{}
	var failingSince time.Time // the first of the failures in a row
	for {
		req := &v1.WatchRequest{RuntimeId: runtimeID, AfterSeq: seen, Deltas: deltas, Batch: true}
		stopped, err := c.watchOnce(ctx, req, func(resp *v1.WatchResponse) bool {
			if delta := resp.GetDelta(); delta != nil {
				if !deltas || !fresh.take(delta) {
					return true // not asked for, or handed over before the reconnect
				}
				if delta.GetReset_() == nil {
					failures = 0
				}
				return yield(nil, delta, nil)
			}
			events := resp.GetEvents()
			if len(events) == 0 && resp.GetEvent() != nil { // a server from before batches
				events = []*v1.Event{resp.GetEvent()}
			}
			for _, event := range events {
				if event.GetSeq() <= seen {
					continue // already delivered: never twice
				}
				failures, seen = 0, event.GetSeq()
				fresh.forget(event)
				if !yield(event, nil, nil) {
					return false
				}
			}
			return true
		})
		if stopped {
			return
		}
		if ctx.Err() != nil {
			yield(nil, nil, ctx.Err())
			return
		}
		if err == io.EOF { // the server ended the stream (it is shutting down)
			err = status.Error(codes.Unavailable, "the server ended the Watch stream")
		}
		refused := wrap(err).(*Error)
		lagging := refused.Code == codes.ResourceExhausted && refused.ErrorInfo().GetReason() == watchLagging
		if failures == 0 {
			failingSince = time.Now()
		}
		// A drop is UNAVAILABLE, a CANCELLED the caller did not cause (a server shutting
		// down, grpc/grpc#41785) or a refusal with RetryInfo; retryable says no once
		// CloseConn was called.
		if !lagging && !c.retryable(ctx, err, false) || failures >= o.maxRetries ||
			c.conn.GetState() == connectivity.Shutdown { // CloseConn: no way back
			yield(nil, nil, refused)
			return
		}
		var delay time.Duration
		if !lagging { // the consumer was slow, not the server: reconnect at once
			delay = backoffDelay(o.backoff, o.maxBackoff, failures)
			if wait, ok := retryInfo(err); ok {
				delay = max(delay, wait)
			}
			if time.Since(failingSince)+delay >= c.retryWindow { // failing for as long as the window
				yield(nil, nil, refused)
				return
			}
		}
		failures++
		if err := sleep(ctx, delay); err != nil {
			yield(nil, nil, err)
			return
		}
	}
}

// watchOnce runs one Watch stream of req, handing each response to deliver, until
// deliver returns false (stopped) or the stream fails (err: io.EOF when the server
// ended it).
func (c *Client) watchOnce(ctx context.Context, req *v1.WatchRequest, deliver func(*v1.WatchResponse) bool) (stopped bool, err error) {
	streamCtx, cancel := context.WithCancel(ctx)
	defer cancel() // ends the stream, however this returns
	stream, err := c.stub.Watch(streamCtx, req)
	if err != nil {
		return false, err
	}
	for {
		resp, err := stream.Recv()
		if err != nil {
			return false, err
		}
		if !deliver(resp) {
			return true, nil
		}
	}
}
