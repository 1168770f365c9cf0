//go:build go1.23

package agentruntime

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	v1 "github.com/agentruntime/agentruntime/clients/go/agentruntime/v1"
)

func TestWatchReconnectsFromTheLastSeq(t *testing.T) {
	// A server from before batches: it ignores WatchRequest.batch and sends one event a
	// response, in `event`.
	client, f := dialFake(t, WithToken("s3cret"), WithTimeout(time.Second))
	var mu sync.Mutex
	var afterSeqs []int64
	var auth [][]string
	var deadlines []bool
	batches := true
	closed := make(chan struct{})
	f.watch = func(req *v1.WatchRequest, stream v1.AgentRuntime_WatchServer) error {
		md, _ := metadata.FromIncomingContext(stream.Context())
		_, hasDeadline := stream.Context().Deadline()
		mu.Lock()
		afterSeqs = append(afterSeqs, req.GetAfterSeq())
		batches = batches && req.GetBatch() && !req.GetDeltas()
		auth = append(auth, md.Get("authorization"))
		deadlines = append(deadlines, hasDeadline)
		n := len(afterSeqs)
		mu.Unlock()
		send := func(seqs ...int64) {
			for _, seq := range seqs {
				if err := stream.Send(event(seq)); err != nil {
					t.Errorf("Send: %v", err)
				}
			}
		}
		switch n {
		case 1: // then the server goes down
			send(1, 2, 3)
			return status.Error(codes.Unavailable, "restarting")
		case 2: // then the consumer lags behind
			send(4, 5)
			return lagging()
		case 3: // then the server ends the stream (shutting down); 6 comes again
			send(6)
			return nil
		default: // 6 again (a replay the client must drop), 7, then hold the stream
			send(6, 7)
			<-stream.Context().Done()
			close(closed)
			return nil
		}
	}
	var seqs []int64
	for event, err := range client.Watch(context.Background(), "rt", 0, WithWatchBackoff(time.Millisecond, 10*time.Millisecond)) {
		if err != nil {
			t.Fatal(err)
		}
		seqs = append(seqs, event.GetSeq())
		if event.GetSeq() == 7 {
			break
		}
	}
	if !slices.Equal(seqs, []int64{1, 2, 3, 4, 5, 6, 7}) {
		t.Errorf("events = %v, want 1..7, each once", seqs)
	}
	select {
	case <-closed:
	case <-time.After(5 * time.Second):
		t.Error("breaking out of the loop did not end the stream")
	}
	mu.Lock()
	defer mu.Unlock()
	if !slices.Equal(afterSeqs, []int64{0, 3, 5, 6}) {
		t.Errorf("after_seq of each stream = %v, want [0 3 5 6]", afterSeqs)
	}
	if !batches {
		t.Error("a Watch stream did not ask for batches, or asked for deltas")
	}
	for i := range auth {
		if len(auth[i]) != 1 || auth[i][0] != "Bearer s3cret" || deadlines[i] {
			t.Errorf("stream %d: authorization %v, deadline %v; want the token and no deadline", i+1, auth[i], deadlines[i])
		}
	}
}

func TestWatchReportsTheErrorAfterRetriesInARow(t *testing.T) {
	client, f := dialFake(t)
	var calls counter
	var mu sync.Mutex
	var afterSeqs []int64
	f.watch = func(req *v1.WatchRequest, stream v1.AgentRuntime_WatchServer) error {
		mu.Lock()
		afterSeqs = append(afterSeqs, req.GetAfterSeq())
		mu.Unlock()
		if calls.next() == 1 {
			stream.Send(event(11))
		}
		return status.Error(codes.Unavailable, "down")
	}
	var seqs []int64
	var last error
	for event, err := range client.Watch(context.Background(), "rt", 10, WithWatchRetries(3), WithWatchBackoff(time.Millisecond, 5*time.Millisecond)) {
		if err != nil {
			last = err
			continue // the sequence ends after its error
		}
		seqs = append(seqs, event.GetSeq())
	}
	if e, ok := AsError(last); !ok || e.Code != codes.Unavailable {
		t.Errorf("Watch ended with %v, want UNAVAILABLE", last)
	}
	// The first stream, then 3 reconnects with no event between them.
	mu.Lock()
	defer mu.Unlock()
	if !slices.Equal(seqs, []int64{11}) || !slices.Equal(afterSeqs, []int64{10, 11, 11, 11}) {
		t.Errorf("events %v, after_seq of each stream %v; want [11] and [10 11 11 11]", seqs, afterSeqs)
	}

	// Any other refusal ends it at once.
	calls = counter{}
	f.watch = func(*v1.WatchRequest, v1.AgentRuntime_WatchServer) error {
		calls.next()
		return status.Error(codes.NotFound, "no runtime rt")
	}
	for _, err := range client.Watch(context.Background(), "rt", 0) {
		last = err
	}
	if status.Code(last) != codes.NotFound || calls.count() != 1 {
		t.Errorf("Watch = %v after %d streams, want NOT_FOUND after 1", last, calls.count())
	}

	// A cancelled ctx ends it with ctx's error.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	f.watch = func(_ *v1.WatchRequest, stream v1.AgentRuntime_WatchServer) error {
		stream.Send(event(1))
		<-stream.Context().Done()
		return nil
	}
	for event, err := range client.Watch(ctx, "rt", 0) {
		if event != nil {
			cancel()
			continue
		}
		last = err
	}
	if last != context.Canceled {
		t.Errorf("Watch after cancel = %v, want context.Canceled", last)
	}
}

func TestWatchReconnectsAfterAStreamTheServerCancelled(t *testing.T) {
	client, f := dialFake(t)
	var mu sync.Mutex
	var afterSeqs []int64
	f.watch = func(req *v1.WatchRequest, stream v1.AgentRuntime_WatchServer) error {
		mu.Lock()
		afterSeqs = append(afterSeqs, req.GetAfterSeq())
		n := len(afterSeqs)
		mu.Unlock()
		if n == 1 { // then the server, shutting down, ends the stream with CANCELLED (grpc/grpc#41785)
			for seq := int64(1); seq <= 3; seq++ {
				stream.Send(event(seq))
			}
			return status.Error(codes.Canceled, "server shutting down")
		}
		stream.Send(event(3)) // a replay the client must drop
		stream.Send(event(4))
		<-stream.Context().Done()
		return nil
	}
	var seqs []int64
	for event, err := range client.Watch(context.Background(), "rt", 0, WithWatchBackoff(time.Millisecond, 10*time.Millisecond)) {
		if err != nil {
			t.Fatal(err)
		}
		seqs = append(seqs, event.GetSeq())
		if event.GetSeq() == 4 {
			break
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if !slices.Equal(seqs, []int64{1, 2, 3, 4}) || !slices.Equal(afterSeqs, []int64{0, 3}) {
		t.Errorf("events %v, after_seq of each stream %v; want [1 2 3 4] and [0 3]", seqs, afterSeqs)
	}
}

func TestWatchHandsOverBatchesOneEventAtATime(t *testing.T) {
	// A server that sends batches: their events come one at a time, in order; a reconnect
	// resumes after the last event of the last batch; breaking out in the middle of a
	// batch hands over none of the rest of it.
	client, f := dialFake(t)
	var mu sync.Mutex
	var requests []*v1.WatchRequest
	closed := make(chan struct{})
	f.watch = func(req *v1.WatchRequest, stream v1.AgentRuntime_WatchServer) error {
		mu.Lock()
		requests = append(requests, req)
		n := len(requests)
		mu.Unlock()
		if n == 1 { // two batches, then the server goes down
			if err := sendAll(stream, eventBatch(1, 2, 3), eventBatch(4, 5)); err != nil {
				return err
			}
			return status.Error(codes.Unavailable, "restarting")
		}
		// 5 again (a replay the client must drop), then 6 to 8 in one batch; hold the stream.
		if err := sendAll(stream, eventBatch(5, 6, 7, 8)); err != nil {
			return err
		}
		<-stream.Context().Done()
		close(closed)
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second) // a client blind to batches waits forever
	defer cancel()
	var seqs []int64
	for event, err := range client.Watch(ctx, "rt", 0, WithWatchBackoff(time.Millisecond, 10*time.Millisecond)) {
		if err != nil {
			t.Fatalf("Watch after events %v: %v", seqs, err)
		}
		seqs = append(seqs, event.GetSeq())
		if event.GetSeq() == 7 {
			break
		}
	}
	if !slices.Equal(seqs, []int64{1, 2, 3, 4, 5, 6, 7}) {
		t.Errorf("events = %v, want 1..7, each once, and not 8 after the break", seqs)
	}
	select {
	case <-closed:
	case <-time.After(5 * time.Second):
		t.Error("breaking out of the loop in a batch did not end the stream")
	}
	mu.Lock()
	defer mu.Unlock()
	var afterSeqs []int64
	for _, req := range requests {
		if !req.GetBatch() || req.GetDeltas() || req.GetRuntimeId() != "rt" {
			t.Errorf("Watch %v, want batches and no deltas on rt", req)
		}
		afterSeqs = append(afterSeqs, req.GetAfterSeq())
	}
	if !slices.Equal(afterSeqs, []int64{0, 5}) {
		t.Errorf("after_seq of each stream = %v, want [0 5]: the last event of the last batch", afterSeqs)
	}
}
