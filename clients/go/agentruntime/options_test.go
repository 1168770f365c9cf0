package agentruntime

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/status"

	v1 "github.com/agentruntime/agentruntime/clients/go/agentruntime/v1"
)

func TestInterceptorsWrapEveryCallInOrder(t *testing.T) {
	var mu sync.Mutex
	var seen []string
	record := func(s string) {
		mu.Lock()
		defer mu.Unlock()
		seen = append(seen, s)
	}
	unary := func(name string) grpc.UnaryClientInterceptor {
		return func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
			record(name + " " + method[strings.LastIndex(method, "/")+1:])
			return invoker(ctx, method, req, reply, cc, opts...)
		}
	}
	stream := func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
		record("stream " + desc.StreamName)
		return streamer(ctx, desc, cc, method, opts...)
	}
	client, f := dialFake(t,
		WithUnaryInterceptors(unary("outer"), unary("inner")),
		WithStreamInterceptors(stream),
		WithKeepalive(keepalive.ClientParameters{Time: 10 * time.Second, Timeout: 5 * time.Second, PermitWithoutStream: true}))
	f.watch = func(req *v1.WatchRequest, s v1.AgentRuntime_WatchServer) error {
		return s.Send(event(1))
	}
	if _, err := client.ListPage(context.Background(), "rt", 0, ""); err != nil {
		t.Fatal(err)
	}
	// Interceptors see refused calls too, and the calls made through Stub().
	if _, err := client.Spawn(context.Background(), "rt", "a", "root", nil); err == nil {
		t.Fatal("Spawn: want the fake's refusal")
	}
	if _, err := client.Stub().DeleteRuntime(context.Background(), &v1.DeleteRuntimeRequest{RuntimeId: "rt"}); err != nil {
		t.Fatal(err)
	}
	err := client.WatchFunc(context.Background(), "rt", 0, func(*v1.Event) error { return ErrStopWatch })
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"outer List", "inner List", "outer Spawn", "inner Spawn", "outer DeleteRuntime", "inner DeleteRuntime", "stream Watch"}
	mu.Lock()
	defer mu.Unlock()
	if !slices.Equal(seen, want) {
		t.Errorf("interceptors saw %q, want %q", seen, want)
	}
}

func TestWatchFuncReconnectsAndStops(t *testing.T) {
	client, f := dialFake(t)
	var calls counter
	var afterSeqs []int64
	var mu sync.Mutex
	f.watch = func(req *v1.WatchRequest, s v1.AgentRuntime_WatchServer) error {
		mu.Lock()
		afterSeqs = append(afterSeqs, req.GetAfterSeq())
		mu.Unlock()
		if calls.next() == 1 {
			for seq := int64(1); seq <= 3; seq++ {
				if err := s.Send(event(seq)); err != nil {
					return err
				}
			}
			return status.Error(codes.Unavailable, "restarting")
		}
		for _, seq := range []int64{3, 4, 5} { // 3 again: the client must not hand it over twice
			if err := s.Send(event(seq)); err != nil {
				return err
			}
		}
		<-s.Context().Done()
		return nil
	}
	var got []int64
	err := client.WatchFunc(context.Background(), "rt", 0, func(e *v1.Event) error {
		got = append(got, e.GetSeq())
		if e.GetSeq() == 4 {
			return ErrStopWatch
		}
		return nil
	}, WithWatchBackoff(time.Millisecond, 10*time.Millisecond))
	if err != nil {
		t.Fatalf("WatchFunc = %v, want nil after ErrStopWatch", err)
	}
	mu.Lock()
	if !slices.Equal(got, []int64{1, 2, 3, 4}) || !slices.Equal(afterSeqs, []int64{0, 3}) {
		t.Errorf("events %v over streams from %v, want 1..4 over streams from 0 and 3", got, afterSeqs)
	}
	mu.Unlock()

	// The callback's own error ends the watch and comes back as is.
	mine := errors.New("enough")
	err = client.WatchFunc(context.Background(), "rt", 0, func(*v1.Event) error { return mine })
	if !errors.Is(err, mine) {
		t.Errorf("WatchFunc = %v, want the callback's error", err)
	}

	// A refusal that is not worth a reconnect comes back as an *Error at once.
	f.watch = func(*v1.WatchRequest, v1.AgentRuntime_WatchServer) error {
		return status.Error(codes.NotFound, "no runtime rt")
	}
	err = client.WatchFunc(context.Background(), "rt", 0, func(*v1.Event) error { return nil })
	if e, ok := AsError(err); !ok || e.Code != codes.NotFound {
		t.Errorf("WatchFunc on a missing runtime = %v, want NOT_FOUND", err)
	}
}

func TestWatchFuncHandsOverBatchesOneEventAtATime(t *testing.T) {
	// Batches, then, after a restart, a server from before batches (one event in `event`)
	// that then sends batches again: the callback gets 1..6 one at a time and stops in the
	// middle of the last batch.
	client, f := dialFake(t)
	var calls counter
	var mu sync.Mutex
	var afterSeqs []int64
	batches := true
	f.watch = func(req *v1.WatchRequest, s v1.AgentRuntime_WatchServer) error {
		mu.Lock()
		afterSeqs = append(afterSeqs, req.GetAfterSeq())
		batches = batches && req.GetBatch()
		mu.Unlock()
		if calls.next() == 1 {
			if err := sendAll(s, eventBatch(1, 2), eventBatch(3)); err != nil {
				return err
			}
			return status.Error(codes.Unavailable, "restarting")
		}
		if err := sendAll(s, event(4), eventBatch(5, 6, 7)); err != nil {
			return err
		}
		<-s.Context().Done()
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second) // a client blind to batches waits forever
	defer cancel()
	var got []int64
	err := client.WatchFunc(ctx, "rt", 0, func(e *v1.Event) error {
		got = append(got, e.GetSeq())
		if e.GetSeq() == 6 {
			return ErrStopWatch
		}
		return nil
	}, WithWatchBackoff(time.Millisecond, 10*time.Millisecond))
	if err != nil {
		t.Fatalf("WatchFunc = %v after events %v, want nil after ErrStopWatch", err, got)
	}
	mu.Lock()
	defer mu.Unlock()
	if !slices.Equal(got, []int64{1, 2, 3, 4, 5, 6}) || !slices.Equal(afterSeqs, []int64{0, 3}) || !batches {
		t.Errorf("events %v over streams from %v (batches asked: %v), want 1..6 over streams from 0 and 3, batches asked",
			got, afterSeqs, batches)
	}
}

func TestListStopsAtARefusedPage(t *testing.T) {
	client, f := dialFake(t)
	f.listErr = status.Error(codes.InvalidArgument, "bad page_token")
	handles, err := client.List(context.Background(), "rt")
	if e, ok := AsError(err); !ok || e.Code != codes.InvalidArgument || handles != nil {
		t.Errorf("List = %v, %v, want INVALID_ARGUMENT and no handles", handles, err)
	}
}

// Without pings a Watch or a worker's stream behind a NAT or a proxy that dropped the
// connection waits forever: keepalive is on unless the caller turns it off.
func TestKeepaliveIsOnByDefaultWhileCallsAreOpen(t *testing.T) {
	want := keepalive.ClientParameters{Time: 60 * time.Second, Timeout: 20 * time.Second, PermitWithoutStream: false}
	if got := newOptions(nil).keepalive; got != want {
		t.Errorf("default keepalive = %+v, want %+v", got, want)
	}
	custom := keepalive.ClientParameters{Time: 15 * time.Second, Timeout: 5 * time.Second, PermitWithoutStream: true}
	if got := newOptions([]Option{WithKeepalive(custom)}).keepalive; got != custom {
		t.Errorf("WithKeepalive: keepalive = %+v, want %+v", got, custom)
	}
	if got := newOptions([]Option{WithoutKeepalive()}).keepalive; got.Time != 0 {
		t.Errorf("WithoutKeepalive: keepalive = %+v, want no pings", got)
	}
	// Dialed with the default and without keepalive, the client works all the same.
	for _, opts := range [][]Option{nil, {WithoutKeepalive()}} {
		client, _ := dialFake(t, opts...)
		if _, err := client.ListPage(context.Background(), "rt", 0, ""); err != nil {
			t.Fatal(err)
		}
	}
}
