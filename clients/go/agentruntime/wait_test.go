package agentruntime

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	v1 "github.com/agentruntime/agentruntime/clients/go/agentruntime/v1"
)

func (f *fake) Wait(ctx context.Context, req *v1.WaitRequest) (*v1.WaitResponse, error) {
	return f.wait(ctx, req)
}

func (f *fake) Resume(ctx context.Context, req *v1.ResumeRequest) (*v1.ResumeResponse, error) {
	return f.resume(ctx, req)
}

func (f *fake) Inspect(ctx context.Context, req *v1.InspectRequest) (*v1.InspectResponse, error) {
	return f.inspect(ctx, req)
}

func (f *fake) Post(ctx context.Context, req *v1.PostRequest) (*v1.PostResponse, error) {
	return f.post(ctx, req)
}

func (f *fake) Watch(req *v1.WatchRequest, stream v1.AgentRuntime_WatchServer) error {
	return f.watch(req, stream)
}

// counter counts the calls a fake RPC gets, from the server's goroutines.
type counter struct {
	mu sync.Mutex
	n  int
}

// next counts a call and returns its number, from 1.
func (c *counter) next() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.n++
	return c.n
}

func (c *counter) count() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n
}

func taskResult(s v1.Status) *v1.WaitResponse {
	return &v1.WaitResponse{Result: &v1.TaskResult{Status: s}}
}

func TestWaitRepeatsWhileTimeoutUntilSettled(t *testing.T) {
	// The 1 s default deadline must not cut a Wait short: each asks for 30 s.
	client, f := dialFake(t, WithTimeout(time.Second))
	var calls counter
	var mu sync.Mutex
	var asked, deadlines []time.Duration
	f.wait = func(ctx context.Context, req *v1.WaitRequest) (*v1.WaitResponse, error) {
		d, _ := ctx.Deadline()
		mu.Lock()
		asked = append(asked, req.GetTimeout().AsDuration())
		deadlines = append(deadlines, time.Until(d))
		mu.Unlock()
		if calls.next() <= 2 {
			return taskResult(v1.Status_STATUS_TIMEOUT), nil
		}
		return taskResult(v1.Status_STATUS_DONE), nil
	}
	result, err := client.Wait(context.Background(), "rt", "root/a.1", 0)
	if err != nil {
		t.Fatal(err)
	}
	if result.GetStatus() != v1.Status_STATUS_DONE || calls.count() != 3 {
		t.Fatalf("Wait = %v after %d calls, want DONE after 3", result.GetStatus(), calls.count())
	}
	mu.Lock()
	defer mu.Unlock()
	for i := range asked {
		if asked[i] != WaitSlice || deadlines[i] <= 39*time.Second || deadlines[i] > 40*time.Second {
			t.Errorf("call %d asked the server for %v under a deadline of %v, want 30s under 40s", i+1, asked[i], deadlines[i])
		}
	}
}

func TestWaitReturnsTimeoutOnceTheCallerTimeoutPasses(t *testing.T) {
	client, f := dialFake(t)
	var calls counter
	var mu sync.Mutex
	var asked []time.Duration
	f.wait = func(ctx context.Context, req *v1.WaitRequest) (*v1.WaitResponse, error) {
		calls.next()
		timeout := req.GetTimeout().AsDuration()
		mu.Lock()
		asked = append(asked, timeout)
		mu.Unlock()
		// The server answers TIMEOUT after at most 100 ms, a shorter slice than asked.
		select {
		case <-time.After(min(timeout, 100*time.Millisecond)):
		case <-ctx.Done():
		}
		return taskResult(v1.Status_STATUS_TIMEOUT), nil
	}
	start := time.Now()
	result, err := client.Wait(context.Background(), "rt", "root/a.1", 350*time.Millisecond)
	elapsed := time.Since(start)
	if err != nil {
		t.Fatal(err)
	}
	if result.GetStatus() != v1.Status_STATUS_TIMEOUT {
		t.Errorf("Wait = %v, want the server's STATUS_TIMEOUT", result.GetStatus())
	}
	if elapsed < 350*time.Millisecond || elapsed > 3*time.Second {
		t.Errorf("Wait returned after %v, want about 350ms", elapsed)
	}
	if calls.count() < 3 {
		t.Errorf("Wait made %d calls, want it to repeat the RPC until 350ms passed", calls.count())
	}
	mu.Lock()
	defer mu.Unlock()
	if asked[0] <= 340*time.Millisecond || slices.Max(asked) > 350*time.Millisecond {
		t.Errorf("server timeouts asked = %v, want about 350ms first, then what remains of it", asked)
	}
}

func TestWaitWaitsForARestartingServer(t *testing.T) {
	client, f := dialFake(t)
	var calls counter
	f.wait = func(context.Context, *v1.WaitRequest) (*v1.WaitResponse, error) {
		// Wait's own loop goes on through failures in a row shorter than the retry window.
		if calls.next() <= 7 {
			return nil, status.Error(codes.Unavailable, "restarting")
		}
		return taskResult(v1.Status_STATUS_DONE), nil
	}
	result, err := client.Wait(context.Background(), "rt", "root/a.1", 0)
	if err != nil {
		t.Fatal(err)
	}
	if result.GetStatus() != v1.Status_STATUS_DONE || calls.count() != 8 {
		t.Errorf("Wait = %v after %d calls, want DONE after 8", result.GetStatus(), calls.count())
	}

	// A server that stays down is waited for until the caller's timeout, then reported.
	f.wait = func(context.Context, *v1.WaitRequest) (*v1.WaitResponse, error) {
		return nil, status.Error(codes.Unavailable, "down")
	}
	start := time.Now()
	_, err = client.Wait(context.Background(), "rt", "root/a.1", 300*time.Millisecond)
	if e, ok := AsError(err); !ok || e.Code != codes.Unavailable {
		t.Errorf("Wait on a server that stays down = %v, want UNAVAILABLE", err)
	}
	if elapsed := time.Since(start); elapsed < 300*time.Millisecond || elapsed > 5*time.Second {
		t.Errorf("Wait gave up after %v, want soon after its 300ms", elapsed)
	}

	// ... and until ctx is done.
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	_, err = client.Wait(ctx, "rt", "root/a.1", 0)
	if e, ok := AsError(err); !ok || e.Code != codes.DeadlineExceeded && e.Code != codes.Unavailable {
		t.Errorf("Wait past ctx's deadline = %v, want DEADLINE_EXCEEDED", err)
	}
}

func TestRetriesEveryCallOnUnavailableButNoOtherCode(t *testing.T) {
	client, f := dialFake(t)
	var inspects counter
	f.inspect = func(context.Context, *v1.InspectRequest) (*v1.InspectResponse, error) {
		if inspects.next() <= 2 {
			return nil, status.Error(codes.Unavailable, "restarting")
		}
		return &v1.InspectResponse{Handle: &v1.HandleView{HandleId: "root/a.1"}}, nil
	}
	view, err := client.Inspect(context.Background(), "rt", "root/a.1")
	if err != nil || view.GetHandleId() != "root/a.1" || inspects.count() != 3 {
		t.Errorf("Inspect = %v, %v after %d calls, want the handle after 3", view, err, inspects.count())
	}

	// Post is retried too, with one request id on every attempt.
	var posts counter
	var mu sync.Mutex
	var ids []string
	f.post = func(_ context.Context, req *v1.PostRequest) (*v1.PostResponse, error) {
		mu.Lock()
		ids = append(ids, req.GetRequestId())
		mu.Unlock()
		if posts.next() <= 2 {
			return nil, status.Error(codes.Unavailable, "restarting")
		}
		return &v1.PostResponse{Ok: true, InboxSize: 3}, nil
	}
	size, err := client.Post(context.Background(), "rt", "root/a.1", "hi", "", "")
	mu.Lock()
	if err != nil || size != 3 || len(ids) != 3 || ids[0] == "" || ids[0] != ids[2] || ids[1] != ids[2] {
		t.Errorf("Post = %d, %v with request ids %q, want 3 after 3 attempts with one id", size, err, ids)
	}
	mu.Unlock()

	var resumes counter
	f.resume = func(_ context.Context, req *v1.ResumeRequest) (*v1.ResumeResponse, error) {
		if resumes.next() <= 3 {
			return nil, status.Error(codes.Unavailable, "restarting")
		}
		return &v1.ResumeResponse{Result: &v1.TaskResult{Status: v1.Status_STATUS_DONE, Text: req.GetAnswer().GetId()}}, nil
	}
	result, err := client.Resume(context.Background(), "rt", &v1.Answer{Id: "req-1", Ok: true})
	if err != nil || result.GetStatus() != v1.Status_STATUS_DONE || result.GetText() != "req-1" || resumes.count() != 4 {
		t.Errorf("Resume = %v, %v after %d calls, want DONE after 4", result, err, resumes.count())
	}

	// A refusal other than UNAVAILABLE (with no RetryInfo) is not retried.
	resumes = counter{}
	f.resume = func(context.Context, *v1.ResumeRequest) (*v1.ResumeResponse, error) {
		resumes.next()
		return nil, status.Error(codes.FailedPrecondition, "nothing pending")
	}
	if _, err := client.Resume(context.Background(), "rt", &v1.Answer{Id: "req-1"}); status.Code(err) != codes.FailedPrecondition || resumes.count() != 1 {
		t.Errorf("Resume = %v after %d calls, want FAILED_PRECONDITION after 1", err, resumes.count())
	}
}

// event is a response of a server from before batches, one event in `event`.
func event(seq int64) *v1.WatchResponse {
	return &v1.WatchResponse{Event: &v1.Event{Seq: seq, HandleId: "root/a.1"}}
}

// batched is a response of a server that sends batches (WatchRequest.batch): the events
// of responses, in that order, in its `events`, and `event` unset.
func batched(responses ...*v1.WatchResponse) *v1.WatchResponse {
	batch := &v1.WatchResponse{}
	for _, resp := range responses {
		batch.Events = append(batch.Events, resp.GetEvent())
	}
	return batch
}

// eventBatch is a batch of event(seq) for each of seqs.
func eventBatch(seqs ...int64) *v1.WatchResponse {
	batch := &v1.WatchResponse{}
	for _, seq := range seqs {
		batch.Events = append(batch.Events, event(seq).GetEvent())
	}
	return batch
}

func lagging() error {
	st, _ := status.New(codes.ResourceExhausted, "too far behind").WithDetails(
		&errdetails.ErrorInfo{Reason: "WATCH_LAGGING", Domain: "agentruntime.dev"})
	return st.Err()
}
