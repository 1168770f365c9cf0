package agentruntime

import (
	"context"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	v1 "github.com/agentruntime/agentruntime/clients/go/agentruntime/v1"
)

// ForkChanges are what a fork changes at its cut (ForkRuntimeRequest's fields beside the
// source and the cut); nil, or the zero value, changes nothing.
type ForkChanges struct {
	// RuntimeID is the fork's id (a slug, as CreateRuntime's); "" lets the server generate one.
	RuntimeID string
	// Agents replace the source's definitions of the same name (their handles at the cut go
	// on with the replacement, budgets carved again from it); a new name is added.
	Agents []*v1.AgentDef
	// Messages replace a handle's last user message (and what followed it): its next Wake
	// runs on the new text.
	Messages []*v1.ForkMessage
	// Answers answer Requests pending at the cut, as Resume's answer: the answered run is
	// held, and goes on at the next Wake.
	Answers []*v1.Answer
}

// ForkRuntime creates a runtime whose journal is a copy of sourceRuntimeID's up to its
// event atSeq (a Watch seq, 1 or more): every step up to the cut is replayed, never
// executed, and the runs in flight at the cut are held (HANDLE_STATE_HELD) until a Wake
// continues them; the source is never written to. changes (nil: none) are the fork's
// changes at the cut. The response names the fork, its cut (fork_seq: atSeq, or the last
// event of the step that made it) and the held handles.
//
// Like every mutating call it carries a request id, generated once for the call unless
// WithRequestID gives one, the same on every attempt: a repeat gets the fork the first
// call made, the generated id included.
func (c *Client) ForkRuntime(ctx context.Context, sourceRuntimeID string, atSeq int64, changes *ForkChanges, opts ...CallOption) (*v1.ForkRuntimeResponse, error) {
	if changes == nil {
		changes = &ForkChanges{}
	}
	req := &v1.ForkRuntimeRequest{
		SourceRuntimeId: sourceRuntimeID, AtSeq: atSeq, RuntimeId: changes.RuntimeID,
		Agents: changes.Agents, Messages: changes.Messages, Answers: changes.Answers,
		RequestId: requestIDOf(opts),
	}
	resp, err := c.stub.ForkRuntime(c.withAttemptTimeout(ctx), req)
	if err != nil {
		return nil, wrap(err)
	}
	return resp, nil
}

// ReplayChanges configure a replay (ReplayRuntimeRequest's fields beside the source); nil,
// or the zero value, replays the recording with its own definitions.
type ReplayChanges struct {
	// RuntimeID is the replay's id (a slug); "" lets the server generate one.
	RuntimeID string
	// Agents replace the recording's definitions of the same name, as ForkChanges.Agents.
	Agents []*v1.AgentDef
	// UnrecordedCalls says what a tool call the recording does not have gets
	// (UNRECORDED_CALLS_UNSPECIFIED: as UNRECORDED_CALLS_RECORDED_ONLY, an error result).
	UnrecordedCalls v1.UnrecordedCalls
}

// ReplayRuntime runs the root prompts of the recorded runtime sourceRuntimeID again, in a
// new runtime, with changes (nil: the recording's own definitions), and returns, per root
// handle of the recording, the recording and the replay side by side once every root of
// the replay has settled (or is suspended), however long that takes: ctx bounds it.
//
// It waits as Wait does: each ReplayRuntime RPC asks the server to wait at most WaitSlice
// (ReplayRuntimeRequest.timeout), under a deadline of that plus a margin (WithTimeout does
// not apply), and while the response says settled: false the same request is sent again,
// with the same request id (generated once for the call unless WithRequestID gives one), so
// the replay is started once and waited on. A failed RPC the client retries (see Dial) is
// repeated the same way, with full-jitter backoff, while the failures in a row last less
// than the retry window; with WithoutRetries the first failure is returned. Once ctx is
// done it returns CANCELLED or DEADLINE_EXCEEDED as an *Error: the replay goes on on the
// server, and a call with the same request id (and the same changes) waits on it again.
func (c *Client) ReplayRuntime(ctx context.Context, sourceRuntimeID string, changes *ReplayChanges, opts ...CallOption) (*v1.ReplayRuntimeResponse, error) {
	if changes == nil {
		changes = &ReplayChanges{}
	}
	requestID := requestIDOf(opts)
	if requestID == "" {
		requestID = NewRequestID() // once: every RPC of the loop sends it
	}
	// The same request every time: a repeat that differed would be another request for the
	// server (REQUEST_ID_REUSED).
	req := &v1.ReplayRuntimeRequest{
		SourceRuntimeId: sourceRuntimeID, Agents: changes.Agents, UnrecordedCalls: changes.UnrecordedCalls,
		RuntimeId: changes.RuntimeID, Timeout: durationpb.New(WaitSlice), RequestId: requestID,
	}
	var failures failuresInARow
	ownLoop := context.WithValue(ctx, ownLoopKey{}, true)
	for {
		deadline := time.Now().Add(WaitSlice + waitMargin)
		callCtx, cancel := context.WithDeadline(ownLoop, deadline)
		resp, err := c.stub.ReplayRuntime(callCtx, req)
		cancel()
		expired := !time.Now().Before(deadline) // the RPC's own deadline passed (see retrying)
		if err != nil {
			if err := c.retryInLoop(ctx, &failures, err, expired); err != nil {
				return nil, err
			}
			continue
		}
		failures = failuresInARow{}
		if resp.GetSettled() {
			return resp, nil
		}
		if err := ctx.Err(); err != nil {
			return nil, contextError(err)
		}
	}
}

// ListRuntimesOption configures ListRuntimes, ListRuntimesPage and AllRuntimes.
type ListRuntimesOption func(*v1.ListRuntimesRequest)

// WithForksOf lists only the forks of runtimeID (ForkRuntime's source) and its replays
// (ListRuntimesRequest.forks_of); "" lists every runtime.
func WithForksOf(runtimeID string) ListRuntimesOption {
	return func(req *v1.ListRuntimesRequest) { req.ForksOf = runtimeID }
}
