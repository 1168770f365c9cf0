package agentruntime

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/google/uuid"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	v1 "github.com/agentruntime/agentruntime/clients/go/agentruntime/v1"
)

// The flaky server of retry_test.go, playing ForkRuntime and ReplayRuntime.

func (f *flaky) ForkRuntime(ctx context.Context, req *v1.ForkRuntimeRequest) (*v1.ForkRuntimeResponse, error) {
	if err := f.serve(ctx, "ForkRuntime", req.GetRequestId()); err != nil {
		return nil, err
	}
	f.mu.Lock()
	f.forks = append(f.forks, req)
	f.mu.Unlock()
	id := req.GetRuntimeId()
	if id == "" {
		id = "rt-fork"
	}
	return &v1.ForkRuntimeResponse{RuntimeId: id, ForkSeq: req.GetAtSeq() + 1, HeldHandleIds: []string{"root/a.1"}}, nil
}

func (f *flaky) ReplayRuntime(ctx context.Context, req *v1.ReplayRuntimeRequest) (*v1.ReplayRuntimeResponse, error) {
	if err := f.serve(ctx, "ReplayRuntime", req.GetRequestId()); err != nil {
		return nil, err
	}
	f.mu.Lock()
	f.replays = append(f.replays, req)
	n, replay := len(f.replays), f.replay
	f.mu.Unlock()
	if replay == nil {
		return settledReplay(), nil
	}
	return replay(ctx, n), nil
}

func settledReplay() *v1.ReplayRuntimeResponse {
	return &v1.ReplayRuntimeResponse{RuntimeId: "rt-replay", Settled: true, ChangedCount: 1, Diffs: []*v1.ReplayDiff{{
		HandleId: "root/a.1", Changed: []string{"text"},
		Recorded: &v1.TaskResult{Status: v1.Status_STATUS_DONE, Text: "before"},
		Replayed: &v1.TaskResult{Status: v1.Status_STATUS_DONE, Text: "after"},
	}}}
}

// unsettledFor answers settled: false to the first n ReplayRuntime RPCs, then settles.
func unsettledFor(n int) func(context.Context, int) *v1.ReplayRuntimeResponse {
	return func(_ context.Context, call int) *v1.ReplayRuntimeResponse {
		if call <= n {
			return &v1.ReplayRuntimeResponse{RuntimeId: "rt-replay"}
		}
		return settledReplay()
	}
}

// takeReplays returns the ReplayRuntime requests the server answered, and forgets them.
func (f *flaky) takeReplays() []*v1.ReplayRuntimeRequest {
	f.mu.Lock()
	defer f.mu.Unlock()
	replays := f.replays
	f.replays = nil
	return replays
}

func TestReplayRepeatsWhileUnsettledWithOneRequestID(t *testing.T) {
	// The 1 s default deadline must not cut a replay short: each RPC asks for WaitSlice.
	client, f := dialFlaky(t, WithTimeout(time.Second))
	f.replay = unsettledFor(2)
	agents := []*v1.AgentDef{{Name: "fetcher", Description: "fetches"}}
	changes := &ReplayChanges{RuntimeID: "rt-replay", Agents: agents, UnrecordedCalls: v1.UnrecordedCalls_UNRECORDED_CALLS_LIVE}
	resp, err := client.ReplayRuntime(context.Background(), "rt", changes)
	if err != nil {
		t.Fatal(err)
	}
	if !resp.GetSettled() || resp.GetChangedCount() != 1 || resp.GetDiffs()[0].GetReplayed().GetText() != "after" {
		t.Fatalf("ReplayRuntime = %v, want the settled response", resp)
	}
	attempts, requests := f.seen(), f.takeReplays()
	ids := requestIDs(t, attempts, "ReplayRuntime")
	if len(ids) != 3 || ids[0] != ids[1] || ids[1] != ids[2] {
		t.Fatalf("request ids %q, want 3 RPCs (2 unsettled, then settled) with one id", ids)
	}
	if parsed, err := uuid.Parse(ids[0]); err != nil || parsed.Version() != 4 {
		t.Errorf("generated request id %q, want a UUID v4 (%v)", ids[0], err)
	}
	for i, req := range requests {
		// Every RPC sends the same request: a different one would be another request for
		// the server (REQUEST_ID_REUSED).
		if !proto.Equal(req, requests[0]) {
			t.Errorf("RPC %d sent %v, the first %v: want the same request", i+1, req, requests[0])
		}
		if req.GetSourceRuntimeId() != "rt" || req.GetRuntimeId() != "rt-replay" || len(req.GetAgents()) != 1 ||
			req.GetAgents()[0].GetName() != "fetcher" || req.GetUnrecordedCalls() != v1.UnrecordedCalls_UNRECORDED_CALLS_LIVE {
			t.Errorf("RPC %d sent %v, want the source, the changes and the policy", i+1, req)
		}
		if req.GetTimeout().AsDuration() != WaitSlice {
			t.Errorf("RPC %d asked the server to wait %v, want WaitSlice", i+1, req.GetTimeout().AsDuration())
		}
		if d := attempts[i].deadline; d <= WaitSlice+waitMargin-time.Second || d > WaitSlice+waitMargin {
			t.Errorf("RPC %d had a deadline of %v, want WaitSlice plus the margin (not the 1s default)", i+1, d)
		}
	}

	// Another call generates another id; the caller's own id is sent on every RPC.
	f.replay = unsettledFor(1)
	if _, err := client.ReplayRuntime(context.Background(), "rt", nil); err != nil {
		t.Fatal(err)
	}
	again := requestIDs(t, f.seen(), "ReplayRuntime")
	if len(again) != 2 || again[0] != again[1] || again[0] == ids[0] {
		t.Errorf("a second replay sent request ids %q, want 2 RPCs with one new id", again)
	}
	if requests := f.takeReplays(); requests[0].GetAgents() != nil || requests[0].GetRuntimeId() != "" ||
		requests[0].GetUnrecordedCalls() != v1.UnrecordedCalls_UNRECORDED_CALLS_UNSPECIFIED {
		t.Errorf("nil changes sent %v, want none", requests[0])
	}
	f.replay = unsettledFor(2)
	if _, err := client.ReplayRuntime(context.Background(), "rt", nil, WithRequestID("mine-1")); err != nil {
		t.Fatal(err)
	}
	if mine := requestIDs(t, f.seen(), "ReplayRuntime"); !slices.Equal(mine, []string{"mine-1", "mine-1", "mine-1"}) {
		t.Errorf("with WithRequestID: request ids %q, want mine-1 on each of 3 RPCs", mine)
	}
}

func TestReplayRetriesFailuresWithTheSameRequestID(t *testing.T) {
	client, f := dialFlaky(t)
	f.fail = firstFail(2, status.Error(codes.Unavailable, "restarting"))
	f.replay = unsettledFor(1)
	resp, err := client.ReplayRuntime(context.Background(), "rt", nil)
	if err != nil || !resp.GetSettled() {
		t.Fatalf("ReplayRuntime = %v, %v, want settled", resp, err)
	}
	ids := requestIDs(t, f.seen(), "ReplayRuntime")
	// Two UNAVAILABLE, one unsettled, one settled: one id.
	if len(ids) != 4 || len(slices.Compact(slices.Clone(ids))) != 1 {
		t.Errorf("request ids %q, want 4 RPCs with one id", ids)
	}

	// A refusal the client does not retry ends it at once.
	f.fail = firstFail(10, status.Error(codes.NotFound, "no runtime rt"))
	if _, err := client.ReplayRuntime(context.Background(), "rt", nil); !IsNotFound(err) {
		t.Errorf("ReplayRuntime of a missing runtime = %v, want NOT_FOUND", err)
	} else if _, ok := AsError(err); !ok {
		t.Errorf("the refusal is a %T, want an *Error", err)
	}
	if n := len(f.seen()); n != 1 {
		t.Errorf("a NOT_FOUND was sent %d times, want once", n)
	}
}

func TestReplayWithoutRetriesStillWaitsForTheReplay(t *testing.T) {
	client, f := dialFlaky(t, WithoutRetries())
	f.fail = firstFail(1, status.Error(codes.Unavailable, "down"))
	if _, err := client.ReplayRuntime(context.Background(), "rt", nil); !IsUnavailable(err) {
		t.Errorf("ReplayRuntime = %v, want the UNAVAILABLE of its first RPC", err)
	}
	if n := len(f.seen()); n != 1 {
		t.Errorf("made %d RPCs, want 1", n)
	}
	// settled: false is no failure: the request is sent again all the same.
	f.fail = nil
	f.replay = unsettledFor(2)
	if resp, err := client.ReplayRuntime(context.Background(), "rt", nil); err != nil || !resp.GetSettled() {
		t.Errorf("ReplayRuntime = %v, %v, want settled", resp, err)
	}
	if ids := requestIDs(t, f.seen(), "ReplayRuntime"); len(ids) != 3 || ids[0] != ids[2] {
		t.Errorf("request ids %q, want 3 RPCs with one id", ids)
	}
}

func TestReplayEndsWhenTheCallersContextEnds(t *testing.T) {
	client, f := dialFlaky(t)
	// The server answers settled: false every 20 ms, for ever.
	f.replay = func(ctx context.Context, _ int) *v1.ReplayRuntimeResponse {
		select {
		case <-time.After(20 * time.Millisecond):
		case <-ctx.Done():
		}
		return &v1.ReplayRuntimeResponse{RuntimeId: "rt-replay"}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	start := time.Now()
	resp, err := client.ReplayRuntime(ctx, "rt", nil)
	if e, ok := AsError(err); !ok || e.Code != codes.DeadlineExceeded || resp != nil {
		t.Errorf("ReplayRuntime = %v, %v, want DEADLINE_EXCEEDED as an *Error", resp, err)
	}
	if elapsed := time.Since(start); elapsed > 2*time.Second {
		t.Errorf("returned %v after the start, want at the 300ms deadline", elapsed)
	}
	if ids := requestIDs(t, f.seen(), "ReplayRuntime"); len(ids) < 3 || len(slices.Compact(slices.Clone(ids))) != 1 {
		t.Errorf("request ids %q, want several RPCs with one id", ids)
	}

	// A caller's cancellation while an RPC waits on the server ends it at once, unretried.
	f.replay = func(ctx context.Context, _ int) *v1.ReplayRuntimeResponse {
		<-ctx.Done()
		return &v1.ReplayRuntimeResponse{}
	}
	ctx, cancel = context.WithCancel(context.Background())
	time.AfterFunc(100*time.Millisecond, cancel)
	start = time.Now()
	if _, err := client.ReplayRuntime(ctx, "rt", nil); status.Code(err) != codes.Canceled {
		t.Errorf("ReplayRuntime = %v, want CANCELLED", err)
	}
	if elapsed := time.Since(start); elapsed > 2*time.Second {
		t.Errorf("returned %v after the start, want at the cancellation", elapsed)
	}
	if n := len(f.seen()); n != 1 {
		t.Errorf("made %d RPCs, want 1", n)
	}
}

func TestForkRuntimeSendsItsChangesAndRetriesWithOneRequestID(t *testing.T) {
	client, f := dialFlaky(t, WithTimeout(3*time.Second))
	f.fail = firstFail(2, status.Error(codes.Unavailable, "restarting"))
	changes := &ForkChanges{
		RuntimeID: "rt-f",
		Agents:    []*v1.AgentDef{{Name: "committer", Description: "commits"}},
		Messages:  []*v1.ForkMessage{{HandleId: "root/a.1", Text: "try again"}},
		Answers:   []*v1.Answer{{Id: "req-1", Ok: false, Reason: "change freeze"}},
	}
	resp, err := client.ForkRuntime(context.Background(), "rt", 6, changes, WithRequestID("fork-1"))
	if err != nil {
		t.Fatal(err)
	}
	if resp.GetRuntimeId() != "rt-f" || resp.GetForkSeq() != 7 || !slices.Equal(resp.GetHeldHandleIds(), []string{"root/a.1"}) {
		t.Errorf("ForkRuntime = %v, want the server's response", resp)
	}
	attempts := f.seen()
	if ids := requestIDs(t, attempts, "ForkRuntime"); !slices.Equal(ids, []string{"fork-1", "fork-1", "fork-1"}) {
		t.Errorf("request ids %q, want fork-1 on each of 3 attempts", ids)
	}
	for i, a := range attempts {
		if a.deadline <= 2*time.Second || a.deadline > 3*time.Second {
			t.Errorf("attempt %d had a deadline of %v, want the 3s default", i+1, a.deadline)
		}
	}
	f.mu.Lock()
	req := f.forks[0]
	f.forks = nil
	f.mu.Unlock()
	want := &v1.ForkRuntimeRequest{
		SourceRuntimeId: "rt", AtSeq: 6, RuntimeId: "rt-f", Agents: changes.Agents,
		Messages: changes.Messages, Answers: changes.Answers, RequestId: "fork-1",
	}
	if !proto.Equal(req, want) {
		t.Errorf("ForkRuntime sent %v, want %v", req, want)
	}
}

func TestListRuntimesSendsForksOf(t *testing.T) {
	client, f := dialFake(t)
	runtimes, err := client.ListRuntimes(context.Background(), WithForksOf("src"))
	if err != nil || len(runtimes) != 5 {
		t.Fatalf("ListRuntimes = %v, %v", runtimes, err)
	}
	if !slices.Equal(f.forksOf, []string{"src", "src", "src"}) {
		t.Errorf("forks_of of the pages %q, want src on each", f.forksOf)
	}
	f.forksOf = nil
	if _, err := client.ListRuntimesPage(context.Background(), 2, "p2", WithForksOf("src")); err != nil {
		t.Fatal(err)
	}
	if _, err := client.ListRuntimes(context.Background()); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(f.forksOf, []string{"src", "", "", ""}) {
		t.Errorf("forks_of %q, want src for the page asked with it and none without", f.forksOf)
	}
}
