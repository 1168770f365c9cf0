package agentruntime

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	v1 "github.com/agentruntime/agentruntime/clients/go/agentruntime/v1"
)

// The tests of this file answer calls with the CANCELLED grpc-core gives the calls that
// reach a server as it begins to shut down, before a handler took them
// (grpc/grpc#41785): a dropped call, retried like UNAVAILABLE (every call is safe to
// repeat: the mutating ones carry a request id).

// shutdownCancelled is that CANCELLED, as the fake answers it.
func shutdownCancelled() error { return status.Error(codes.Canceled, "server shutting down") }

func TestWaitRetriesACancelledTheCallerDidNotCause(t *testing.T) {
	client, f := dialFake(t)
	for _, cancelled := range []int{1, 4} {
		var calls counter
		f.wait = func(context.Context, *v1.WaitRequest) (*v1.WaitResponse, error) {
			if calls.next() <= cancelled {
				return nil, shutdownCancelled()
			}
			return taskResult(v1.Status_STATUS_DONE), nil
		}
		result, err := client.Wait(context.Background(), "rt", "root/a.1", 0)
		if err != nil || result.GetStatus() != v1.Status_STATUS_DONE || calls.count() != cancelled+1 {
			t.Errorf("Wait after %d CANCELLED = %v, %v after %d calls, want DONE after %d",
				cancelled, result.GetStatus(), err, calls.count(), cancelled+1)
		}
	}
}

func TestResumeRetriesACancelledTheCallerDidNotCause(t *testing.T) {
	client, f := dialFake(t)
	for _, cancelled := range []int{1, 4} {
		var calls counter
		f.resume = func(_ context.Context, req *v1.ResumeRequest) (*v1.ResumeResponse, error) {
			if calls.next() <= cancelled {
				return nil, shutdownCancelled()
			}
			return &v1.ResumeResponse{Result: &v1.TaskResult{Status: v1.Status_STATUS_DONE, Text: req.GetAnswer().GetId()}}, nil
		}
		result, err := client.Resume(context.Background(), "rt", &v1.Answer{Id: "req-1", Ok: true})
		if err != nil || result.GetStatus() != v1.Status_STATUS_DONE || result.GetText() != "req-1" || calls.count() != cancelled+1 {
			t.Errorf("Resume after %d CANCELLED = %v, %v after %d calls, want DONE after %d",
				cancelled, result, err, calls.count(), cancelled+1)
		}
	}
}

func TestEveryCallRetriesACancelledTheCallerDidNotCause(t *testing.T) {
	client, f := dialFake(t)
	var inspects counter
	f.inspect = func(context.Context, *v1.InspectRequest) (*v1.InspectResponse, error) {
		if inspects.next() <= 2 {
			return nil, shutdownCancelled()
		}
		return &v1.InspectResponse{Handle: &v1.HandleView{HandleId: "root/a.1"}}, nil
	}
	view, err := client.Inspect(context.Background(), "rt", "root/a.1")
	if err != nil || view.GetHandleId() != "root/a.1" || inspects.count() != 3 {
		t.Errorf("Inspect = %v, %v after %d calls, want the handle after 3", view, err, inspects.count())
	}

	// Post too: its request id, the same on every attempt, makes a repeat harmless.
	var posts counter
	var mu sync.Mutex
	var ids []string
	f.post = func(_ context.Context, req *v1.PostRequest) (*v1.PostResponse, error) {
		mu.Lock()
		ids = append(ids, req.GetRequestId())
		mu.Unlock()
		if posts.next() <= 2 {
			return nil, shutdownCancelled()
		}
		return &v1.PostResponse{Ok: true, InboxSize: 1}, nil
	}
	size, err := client.Post(context.Background(), "rt", "root/a.1", "hi", "", "")
	mu.Lock()
	defer mu.Unlock()
	if err != nil || size != 1 || len(ids) != 3 || ids[0] == "" || ids[0] != ids[1] || ids[1] != ids[2] {
		t.Errorf("Post = %d, %v with request ids %q, want 1 after 3 attempts with one request id", size, err, ids)
	}
}

func TestWaitEndsAtOnceWhenTheCallerCancels(t *testing.T) {
	client, f := dialFake(t)
	var calls counter
	waiting := make(chan struct{})
	f.wait = func(ctx context.Context, _ *v1.WaitRequest) (*v1.WaitResponse, error) {
		if calls.next() == 1 {
			return nil, shutdownCancelled() // not the caller's: retried
		}
		close(waiting)
		<-ctx.Done() // until the caller cancels
		return nil, status.FromContextError(ctx.Err()).Err()
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var cancelled time.Time
	go func() {
		<-waiting
		cancelled = time.Now()
		cancel()
	}()
	_, err := client.Wait(ctx, "rt", "root/a.1", 0)
	returned := time.Now()
	if status.Code(err) != codes.Canceled || strings.Contains(err.Error(), "shutting down") {
		t.Errorf("Wait after the caller cancelled = %v, want the caller's CANCELLED", err)
	}
	if calls.count() != 2 {
		t.Fatalf("Wait made %d calls, want 2 (the server's CANCELLED retried once)", calls.count())
	}
	if d := returned.Sub(cancelled); d > time.Second {
		t.Errorf("Wait returned %v after the caller cancelled, want at once", d)
	}
	time.Sleep(500 * time.Millisecond) // past any backoff: no retry comes
	if calls.count() != 2 {
		t.Errorf("the server saw %d calls, want no retry after the caller cancelled", calls.count())
	}
}

func TestWaitEndsWhenTheConnIsClosed(t *testing.T) {
	// A call on a closed connection fails with CANCELLED: no way back, not retried.
	client, f := dialFake(t)
	var calls counter
	waiting := make(chan struct{})
	f.wait = func(ctx context.Context, _ *v1.WaitRequest) (*v1.WaitResponse, error) {
		if calls.next() == 1 {
			close(waiting)
		}
		<-ctx.Done()
		return nil, status.FromContextError(ctx.Err()).Err()
	}
	go func() {
		<-waiting
		client.CloseConn()
	}()
	done := make(chan error, 1)
	go func() {
		_, err := client.Wait(context.Background(), "rt", "root/a.1", 0)
		done <- err
	}()
	select {
	case err := <-done:
		if err == nil {
			t.Error("Wait on a closed connection returned no error")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Wait on a closed connection still retries after 5s")
	}
}
