package agentruntime

import (
	"context"
	"fmt"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"

	v1 "github.com/agentruntime/agentruntime/clients/go/agentruntime/v1"
)

// streamer plays the server of a StreamRun: it spawns and wakes (recording the requests)
// and answers the n-th Watch stream (from 1) with watch.
type streamer struct {
	v1.UnimplementedAgentRuntimeServer
	mu           sync.Mutex
	spawns       []*v1.SpawnRequest
	wakes        []*v1.WakeRequest
	watches      []*v1.WatchRequest
	spawn        error // what Spawn refuses with, when set
	wakeRefusals int   // how many Wakes to answer UNAVAILABLE first
	watch        func(n int, stream v1.AgentRuntime_WatchServer) error
}

func (s *streamer) Spawn(_ context.Context, req *v1.SpawnRequest) (*v1.SpawnResponse, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.spawns = append(s.spawns, req)
	if s.spawn != nil {
		return nil, s.spawn
	}
	return &v1.SpawnResponse{HandleId: req.GetParentId() + "/" + req.GetAgent() + ".1"}, nil
}

func (s *streamer) Wake(_ context.Context, req *v1.WakeRequest) (*v1.WakeResponse, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.wakes = append(s.wakes, req)
	if s.wakeRefusals > 0 {
		s.wakeRefusals--
		return nil, status.Error(codes.Unavailable, "restarting")
	}
	return &v1.WakeResponse{Queued: true}, nil
}

// woken says whether a Wake was answered.
func (s *streamer) woken() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.wakes) > 0 && s.wakeRefusals == 0
}

func (s *streamer) Watch(req *v1.WatchRequest, stream v1.AgentRuntime_WatchServer) error {
	s.mu.Lock()
	s.watches = append(s.watches, req)
	n := len(s.watches)
	s.mu.Unlock()
	return s.watch(n, stream)
}

func dialStreamer(t *testing.T, opts ...Option) (*Client, *streamer) {
	t.Helper()
	lis := bufconn.Listen(1 << 20)
	srv := grpc.NewServer()
	s := &streamer{}
	v1.RegisterAgentRuntimeServer(srv, s)
	go srv.Serve(lis)
	t.Cleanup(srv.Stop)
	dialer := func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }
	client, err := Dial("passthrough:///bufnet", append(opts, WithDialOptions(grpc.WithContextDialer(dialer)))...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.CloseConn() })
	return client, s
}

// text and reset are deltas of a handle's turn; turnEvent, ended and resultEvent its events.
func text(handle string, turn, index int64, piece string) *v1.WatchResponse {
	return &v1.WatchResponse{Delta: &v1.Delta{HandleId: handle, Turn: turn, Index: index, Piece: &v1.Delta_Text{Text: piece}}}
}

func reset(handle string, turn int64) *v1.WatchResponse {
	return &v1.WatchResponse{Delta: &v1.Delta{HandleId: handle, Turn: turn, Piece: &v1.Delta_Reset_{Reset_: &v1.DeltaReset{Reason: "retry"}}}}
}

func spawned(seq int64, handle string) *v1.WatchResponse {
	return &v1.WatchResponse{Event: &v1.Event{Seq: seq, HandleId: handle, Payload: &v1.Event_Spawned{Spawned: &v1.HandleSpawned{}}}}
}

func turnEvent(seq int64, handle string, turn int64) *v1.WatchResponse {
	return &v1.WatchResponse{Event: &v1.Event{Seq: seq, HandleId: handle, Payload: &v1.Event_TurnStarted{TurnStarted: &v1.TurnStarted{Turn: turn}}}}
}

func ended(seq int64, handle string, turn int64) *v1.WatchResponse {
	return &v1.WatchResponse{Event: &v1.Event{Seq: seq, HandleId: handle, Payload: &v1.Event_TurnEnded{TurnEnded: &v1.TurnEnded{Turn: turn}}}}
}

func resultEvent(seq int64, handle, text string) *v1.WatchResponse {
	result := &v1.TaskResult{HandleId: handle, Status: v1.Status_STATUS_DONE, Text: text}
	return &v1.WatchResponse{Event: &v1.Event{Seq: seq, HandleId: handle, Payload: &v1.Event_Result{Result: result}}}
}

func sendAll(stream v1.AgentRuntime_WatchServer, responses ...*v1.WatchResponse) error {
	for _, resp := range responses {
		if err := stream.Send(resp); err != nil {
			return err
		}
	}
	return nil
}

// piece is a delta as the tests compare them: "turn:text", or "turn:reset".
func piece(d *v1.Delta) string {
	if d.GetReset_() != nil {
		return fmt.Sprintf("%d:reset", d.GetTurn())
	}
	return fmt.Sprintf("%d:%s", d.GetTurn(), d.GetText())
}

func TestStreamRunHandsOverEachPieceOnceAcrossReconnects(t *testing.T) {
	client, s := dialStreamer(t)
	const me, other = "root/lead.1/writer.1", "root/other.1"
	closed := make(chan struct{})
	s.watch = func(n int, stream v1.AgentRuntime_WatchServer) error {
		switch n {
		case 1: // cut in the middle of turn 1
			if err := sendAll(stream, turnEvent(1, me, 1), text(me, 1, 0, "Hel"), text(other, 1, 0, "not mine"),
				text(me, 1, 1, "lo")); err != nil {
				return err
			}
			return status.Error(codes.Unavailable, "restarting")
		case 2: // turn 1 again from 0, its end, then turn 2 retried, cut again
			if err := sendAll(stream, text(me, 1, 0, "Hel"), text(me, 1, 1, "lo"), text(me, 1, 2, " world"),
				ended(2, me, 1), turnEvent(3, me, 2), text(me, 2, 0, "abc"), reset(me, 2), text(me, 2, 1, "ab")); err != nil {
				return err
			}
			return status.Error(codes.Unavailable, "restarting")
		default: // turn 2 from its reset, another handle's result, then this one's
			if err := sendAll(stream, reset(me, 2), text(me, 2, 1, "ab"), text(me, 2, 2, "cd"),
				resultEvent(4, other, "theirs"), ended(5, me, 2), resultEvent(6, me, "Hello world abcd")); err != nil {
				return err
			}
			<-stream.Context().Done()
			close(closed)
			return nil
		}
	}
	var got []string
	result, err := client.StreamRun(context.Background(), "rt", "writer", "write it", "root/lead.1",
		func(d *v1.Delta) { got = append(got, piece(d)) },
		WithRunRequestIDs("run-spawn", "run-wake"), WithRunWatchOptions(WithWatchBackoff(time.Millisecond, 10*time.Millisecond)))
	if err != nil || result.GetHandleId() != me || result.GetText() != "Hello world abcd" {
		t.Fatalf("StreamRun = %v, %v, want %s's result", result, err, me)
	}
	// After a reset the turn's pieces come again from index 1, even those handed over before it.
	want := []string{"1:Hel", "1:lo", "1: world", "2:abc", "2:reset", "2:ab", "2:reset", "2:ab", "2:cd"}
	if !slices.Equal(got, want) {
		t.Errorf("pieces %q, want %q", got, want)
	}
	select {
	case <-closed:
	case <-time.After(5 * time.Second):
		t.Error("StreamRun returned without ending its Watch stream")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	var afterSeqs []int64
	for _, w := range s.watches {
		if !w.GetDeltas() || !w.GetBatch() || w.GetRuntimeId() != "rt" {
			t.Errorf("Watch %v, want deltas and batches on rt", w)
		}
		afterSeqs = append(afterSeqs, w.GetAfterSeq())
	}
	if !slices.Equal(afterSeqs, []int64{0, 1, 3}) {
		t.Errorf("after_seq of each stream = %v, want [0 1 3]: the last event seen, deltas never", afterSeqs)
	}
	if len(s.spawns) != 1 || s.spawns[0].GetParentId() != "root/lead.1" || s.spawns[0].GetAgent() != "writer" ||
		s.spawns[0].GetRequestId() != "run-spawn" {
		t.Errorf("Spawns %v, want one of writer under root/lead.1 with request id run-spawn", s.spawns)
	}
	if len(s.wakes) != 1 || s.wakes[0].GetHandleId() != me || s.wakes[0].GetPrompt() != "write it" ||
		s.wakes[0].GetRequestId() != "run-wake" {
		t.Errorf("Wakes %v, want one of %s on the prompt with request id run-wake", s.wakes, me)
	}
}

func TestStreamRunTakesBatchedEventsOneAtATime(t *testing.T) {
	// Batches of events, deltas one a response between them: the pieces come once each, the
	// reconnect resumes after the last event of the last batch, and the handle's result in
	// the middle of a batch ends the run.
	client, s := dialStreamer(t)
	const me, other = "root/writer.1", "root/other.1"
	closed := make(chan struct{})
	s.watch = func(n int, stream v1.AgentRuntime_WatchServer) error {
		if n == 1 { // cut in the middle of turn 1
			if err := sendAll(stream, batched(spawned(1, me), turnEvent(2, me, 1)), text(me, 1, 0, "Hel"),
				text(me, 1, 1, "lo")); err != nil {
				return err
			}
			return status.Error(codes.Unavailable, "restarting")
		}
		if err := sendAll(stream, text(me, 1, 0, "Hel"), text(me, 1, 1, "lo"), text(me, 1, 2, " world"),
			batched(ended(3, me, 1), resultEvent(4, other, "theirs"), resultEvent(5, me, "Hello world"), turnEvent(6, other, 2)),
			text(other, 2, 0, "after the result")); err != nil {
			return err
		}
		<-stream.Context().Done()
		close(closed)
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second) // a client blind to batches waits forever
	defer cancel()
	var got []string
	result, err := client.StreamRun(ctx, "rt", "writer", "write it", "root",
		func(d *v1.Delta) { got = append(got, piece(d)) },
		WithRunWatchOptions(WithWatchBackoff(time.Millisecond, 10*time.Millisecond)))
	if err != nil || result.GetHandleId() != me || result.GetText() != "Hello world" {
		t.Fatalf("StreamRun = %v, %v after pieces %q, want %s's result", result, err, got, me)
	}
	if want := []string{"1:Hel", "1:lo", "1: world"}; !slices.Equal(got, want) {
		t.Errorf("pieces %q, want %q", got, want)
	}
	select {
	case <-closed:
	case <-time.After(5 * time.Second):
		t.Error("StreamRun returned without ending its Watch stream")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	var afterSeqs []int64
	for _, w := range s.watches {
		if !w.GetDeltas() || !w.GetBatch() {
			t.Errorf("Watch %v, want deltas and batches", w)
		}
		afterSeqs = append(afterSeqs, w.GetAfterSeq())
	}
	if !slices.Equal(afterSeqs, []int64{0, 2}) {
		t.Errorf("after_seq of each stream = %v, want [0 2]: the last event of the last batch", afterSeqs)
	}
	if len(s.wakes) != 1 {
		t.Errorf("Wakes %v, want one", s.wakes)
	}
}

func TestStreamRunWakesOnceItsWatchAnswered(t *testing.T) {
	// A provider's turn streams only to the watchers subscribed when it starts, and the
	// server subscribes a Watch before it answers with the history: a Wake sent before the
	// first answer could run the first turn unseen. The first stream drops before it
	// answers; the first Wake is refused once and retried with its request id.
	client, s := dialStreamer(t)
	const me = "root/writer.1"
	s.wakeRefusals = 1
	var wakesBeforeAnswer []int
	s.watch = func(n int, stream v1.AgentRuntime_WatchServer) error {
		s.mu.Lock()
		wakesBeforeAnswer = append(wakesBeforeAnswer, len(s.wakes))
		s.mu.Unlock()
		if n == 1 {
			return status.Error(codes.Unavailable, "restarting")
		}
		if err := sendAll(stream, spawned(1, me)); err != nil {
			return err
		}
		for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
			if s.woken() {
				break
			}
			if time.Now().After(deadline) {
				return status.Error(codes.Internal, "no Wake after the Watch answered")
			}
		}
		if err := sendAll(stream, turnEvent(2, me, 1), text(me, 1, 0, "Hi"), resultEvent(3, me, "Hi")); err != nil {
			return err
		}
		<-stream.Context().Done()
		return nil
	}
	var got []string
	result, err := client.StreamRun(context.Background(), "rt", "writer", "go", "root", func(d *v1.Delta) { got = append(got, piece(d)) },
		WithRunRequestIDs("run-spawn", "run-wake"), WithRunWatchOptions(WithWatchBackoff(time.Millisecond, time.Millisecond)))
	if err != nil || result.GetText() != "Hi" || !slices.Equal(got, []string{"1:Hi"}) {
		t.Fatalf("StreamRun = %v, %v after pieces %q, want Hi, streamed", result, err, got)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if !slices.Equal(wakesBeforeAnswer, []int{0, 0}) {
		t.Errorf("Wakes before each Watch stream's first answer: %v, want none", wakesBeforeAnswer)
	}
	if len(s.wakes) != 2 || s.wakes[0].GetRequestId() != "run-wake" || s.wakes[1].GetRequestId() != "run-wake" {
		t.Errorf("Wakes %v, want the refused one and its retry, both with request id run-wake", s.wakes)
	}
}

func TestStreamRunFollowsATurnCutSeveralTimes(t *testing.T) {
	// Each stream sends the turn again from index 0, then one new piece, and drops: the new
	// pieces are progress, so WithWatchRetries(1) is not used up; the resent ones are not.
	client, s := dialStreamer(t)
	const me = "root/writer.1"
	s.watch = func(n int, stream v1.AgentRuntime_WatchServer) error {
		var responses []*v1.WatchResponse
		if n == 1 {
			responses = append(responses, spawned(1, me), turnEvent(2, me, 1))
		}
		for i := range n {
			responses = append(responses, text(me, 1, int64(i), fmt.Sprint(i)))
		}
		if n < 5 {
			if err := sendAll(stream, responses...); err != nil {
				return err
			}
			return status.Error(codes.Unavailable, "restarting")
		}
		if err := sendAll(stream, append(responses, ended(3, me, 1), resultEvent(4, me, "01234"))...); err != nil {
			return err
		}
		<-stream.Context().Done()
		return nil
	}
	var got []string
	result, err := client.StreamRun(context.Background(), "rt", "writer", "go", "root", func(d *v1.Delta) { got = append(got, d.GetText()) },
		WithRunWatchOptions(WithWatchRetries(1), WithWatchBackoff(time.Millisecond, time.Millisecond)))
	if err != nil || result.GetText() != "01234" || strings.Join(got, ",") != "0,1,2,3,4" {
		t.Fatalf("StreamRun = %v, %v after pieces %q, want the result after 0..4 once each", result, err, got)
	}
}

func TestStreamRunSpawnsUnderRootByDefaultAndTakesNoCallback(t *testing.T) {
	client, s := dialStreamer(t)
	s.watch = func(_ int, stream v1.AgentRuntime_WatchServer) error {
		if err := sendAll(stream, text("root/writer.1", 1, 0, "hi"), resultEvent(1, "root/writer.1", "hi")); err != nil {
			return err
		}
		<-stream.Context().Done()
		return nil
	}
	result, err := client.StreamRun(context.Background(), "rt", "writer", "go", "", nil)
	if err != nil || result.GetText() != "hi" {
		t.Fatalf("StreamRun = %v, %v", result, err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if parent := s.spawns[0].GetParentId(); parent != "root" {
		t.Errorf("spawned under %q, want root", parent)
	}
	if a, b := s.spawns[0].GetRequestId(), s.wakes[0].GetRequestId(); a == "" || b == "" || a == b {
		t.Errorf("request ids %q and %q, want one generated for each", a, b)
	}
}

func TestStreamRunReportsRefusalsAndTheCallersDeadline(t *testing.T) {
	client, s := dialStreamer(t)
	s.spawn = status.Error(codes.NotFound, "no agent writer")
	s.watch = func(int, v1.AgentRuntime_WatchServer) error {
		t.Error("StreamRun watched after its Spawn was refused")
		return nil
	}
	_, err := client.StreamRun(context.Background(), "rt", "writer", "go", "root", nil)
	if e, ok := AsError(err); !ok || e.Code != codes.NotFound {
		t.Errorf("StreamRun with a refused Spawn = %v, want its NOT_FOUND", err)
	}

	// A refused Watch ends it with that refusal, after Watch's reconnects (none on this one).
	s.mu.Lock()
	s.spawn = nil
	s.mu.Unlock()
	s.watch = func(int, v1.AgentRuntime_WatchServer) error { return status.Error(codes.PermissionDenied, "not yours") }
	_, err = client.StreamRun(context.Background(), "rt", "writer", "go", "root", nil)
	if e, ok := AsError(err); !ok || e.Code != codes.PermissionDenied {
		t.Errorf("StreamRun with a refused Watch = %v, want its PERMISSION_DENIED", err)
	}

	// A run that never ends is the caller's deadline's, as an *Error as Run's is.
	s.watch = func(_ int, stream v1.AgentRuntime_WatchServer) error {
		if err := sendAll(stream, text("root/writer.1", 1, 0, "thinking it over")); err != nil {
			return err
		}
		<-stream.Context().Done()
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	var got []string
	_, err = client.StreamRun(ctx, "rt", "writer", "go", "root", func(d *v1.Delta) { got = append(got, d.GetText()) })
	if e, ok := AsError(err); !ok || e.Code != codes.DeadlineExceeded {
		t.Errorf("StreamRun past its deadline = %v, want DEADLINE_EXCEEDED", err)
	}
	if strings.Join(got, "") != "thinking it over" {
		t.Errorf("pieces %q before the deadline, want the one sent", got)
	}
}

func TestStreamRunCountsFailuresInARowAcrossDeltas(t *testing.T) {
	// A turn sent again after each reconnect is no progress: two drops in a row with only
	// resent pieces between them use up WithWatchRetries(1) (the window only bounds a
	// broken count).
	client, s := dialStreamer(t, WithRetryWindow(2*time.Second))
	s.watch = func(_ int, stream v1.AgentRuntime_WatchServer) error {
		if err := sendAll(stream, text("root/writer.1", 1, 0, "again")); err != nil {
			return err
		}
		return status.Error(codes.Unavailable, "restarting")
	}
	var got []string
	_, err := client.StreamRun(context.Background(), "rt", "writer", "go", "root", func(d *v1.Delta) { got = append(got, piece(d)) },
		WithRunWatchOptions(WithWatchRetries(1), WithWatchBackoff(time.Millisecond, time.Millisecond)))
	if e, ok := AsError(err); !ok || e.Code != codes.Unavailable {
		t.Errorf("StreamRun = %v, want UNAVAILABLE after one reconnect", err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.watches) != 2 || !slices.Equal(got, []string{"1:again"}) {
		t.Errorf("%d streams handed over %q, want 2 streams and the piece once", len(s.watches), got)
	}
}

func TestWatchAsksForNoDeltasAndSkipsAnySent(t *testing.T) {
	client, s := dialStreamer(t)
	s.watch = func(_ int, stream v1.AgentRuntime_WatchServer) error {
		if err := sendAll(stream, text("root/a.1", 1, 0, "unasked"), event(1)); err != nil {
			return err
		}
		<-stream.Context().Done()
		return nil
	}
	var seqs []int64
	err := client.WatchFunc(context.Background(), "rt", 0, func(e *v1.Event) error {
		seqs = append(seqs, e.GetSeq())
		return ErrStopWatch
	})
	if err != nil || !slices.Equal(seqs, []int64{1}) {
		t.Errorf("WatchFunc = %v after events %v, want event 1 alone", err, seqs)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.watches[0].GetDeltas() || !s.watches[0].GetBatch() {
		t.Errorf("Watch %v, want batches and no deltas", s.watches[0])
	}
}
