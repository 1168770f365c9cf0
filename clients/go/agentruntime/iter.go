//go:build go1.23

package agentruntime

import (
	"context"
	"iter"

	v1 "github.com/agentruntime/agentruntime/clients/go/agentruntime/v1"
)

// Watch returns the runtime's events after afterSeq (0: its whole history), in order and
// each once, as a sequence for range; it never ends by itself. The stream uses the
// client's connection (TLS and the token apply as for every call) and has no deadline.
// (Go 1.22, which cannot range over functions: WatchFunc, the same watch with a callback.)
// It asks the server for batches (WatchRequest.batch, several events a response) and hands
// their events over one at a time; a server from before batches works as well.
//
// A dropped stream (UNAVAILABLE; a CANCELLED the caller did not cause, which grpc-core
// gives calls at a server's shutdown, grpc/grpc#41785; the server ending it; or
// RESOURCE_EXHAUSTED with ErrorInfo reason WATCH_LAGGING when the consumer fell too far
// behind) is reopened from the last seq seen, so nothing is missed and nothing is seen
// twice; a lagging consumer reconnects at once, the others after a delay with
// exponential backoff and jitter (WithWatchBackoff), at least the RetryInfo's retry_delay
// when the refusal carries one (any refusal with RetryInfo is reconnected after). After
// WithWatchRetries reconnects in a row (default 5; 0 on a client dialed WithoutRetries)
// with no event between them, once such failures in a row have lasted the retry window
// (WithRetryWindow), or on any other refusal (NOT_FOUND, UNAUTHENTICATED, ...), the
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
	return func(yield func(*v1.Event, error) bool) {
		c.watch(ctx, runtimeID, afterSeq, opts, yield)
	}
}

// AllHandles returns the runtime's handles in spawn order, one List page of pageSize
// (0: the server's default) at a time, fetched as the loop reaches it; a refused page
// ends the sequence with its *Error. (Go 1.22: List, or ListPage page by page.)
//
//	for view, err := range client.AllHandles(ctx, runtimeID, 0) { ... }
func (c *Client) AllHandles(ctx context.Context, runtimeID string, pageSize int32) iter.Seq2[*v1.HandleView, error] {
	return func(yield func(*v1.HandleView, error) bool) {
		eachItem(c.handlePages(ctx, runtimeID, pageSize), yield)
	}
}

// AllMessages returns the handle's stored transcript, one GetTranscript page of pageSize
// (0: the server's default) at a time; a refused page ends the sequence with its *Error.
// (Go 1.22: Transcript, or TranscriptPage page by page.)
func (c *Client) AllMessages(ctx context.Context, runtimeID, handleID string, pageSize int32) iter.Seq2[*v1.Message, error] {
	return func(yield func(*v1.Message, error) bool) {
		eachItem(c.messagePages(ctx, runtimeID, handleID, pageSize), yield)
	}
}

// AllRuntimes returns the caller's runtimes, newest first, one ListRuntimes page of
// pageSize (0: the server's default) at a time; a refused page ends the sequence with its
// *Error; WithForksOf lists only a runtime's forks and replays. (Go 1.22: ListRuntimes, or
// ListRuntimesPage page by page.)
func (c *Client) AllRuntimes(ctx context.Context, pageSize int32, opts ...ListRuntimesOption) iter.Seq2[*v1.RuntimeSummary, error] {
	return func(yield func(*v1.RuntimeSummary, error) bool) {
		eachItem(c.runtimePages(ctx, pageSize, opts), yield)
	}
}
