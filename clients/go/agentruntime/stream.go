package agentruntime

import (
	"context"

	v1 "github.com/agentruntime/agentruntime/clients/go/agentruntime/v1"
)

// StreamRun spawns agent under parent ("" is "root"), wakes it on prompt and calls
// onDelta (nil: none) with what its model turns write as they write it, each piece once
// and in order, then returns the handle's result (its first `result` event). Its Spawn
// and its Wake each carry a request id, as Run's do (WithRunRequestIDs gives them): a
// caller that repeats a StreamRun it lost track of with the same ids gets the same
// handle, not run again, and its pieces and result from the start.
//
// It watches the runtime from its first event with WatchRequest.deltas, reconnecting as
// Watch does (WithRunWatchOptions configures it): from the last event seen, after the same
// failures and delays, and it gives up on the same errors, as an *Error; once ctx is done
// it returns ctx's error as an *Error (CANCELLED or DEADLINE_EXCEEDED), as Run does. After
// a reconnect the server sends each turn still in progress again from its first piece:
// StreamRun skips the pieces it handed over already. A `reset` piece (Delta.GetReset_)
// is always handed over: what was handed over of that turn is void (the provider call is
// retried, or the turn runs again after a restart), and the turn's pieces follow again
// from index 1.
//
//	result, err := client.StreamRun(ctx, runtimeID, "writer", "write it", "root", func(d *v1.Delta) {
//		if d.GetReset_() != nil {
//			fmt.Println("\n[again]") // what was printed of this turn is void
//		}
//		fmt.Print(d.GetText())
//	})
func (c *Client) StreamRun(ctx context.Context, runtimeID, agent, prompt, parent string, onDelta func(*v1.Delta), opts ...RunOption) (*v1.TaskResult, error) {
	if parent == "" {
		parent = "root"
	}
	o := runOptionsOf(opts)
	handleID, err := c.spawnAndWake(ctx, runtimeID, agent, prompt, parent, o)
	if err != nil {
		return nil, err
	}
	pieces := turnCursor{}
	var result *v1.TaskResult
	var failed error
	c.watchStream(ctx, runtimeID, 0, true, o.watch, func(resp *v1.WatchResponse, err error) bool {
		if err != nil {
			failed = err
			return false
		}
		if delta := resp.GetDelta(); delta != nil {
			if delta.GetHandleId() == handleID && pieces.handOver(delta) && onDelta != nil {
				onDelta(delta)
			}
			return true
		}
		event := resp.GetEvent()
		if event.GetHandleId() != handleID {
			return true
		}
		if ended := event.GetTurnEnded(); ended != nil {
			delete(pieces, ended.GetTurn()) // its pieces are not sent again once it ended
		}
		result = event.GetResult()
		return result == nil
	})
	if failed != nil {
		if _, refused := failed.(*Error); !refused { // ctx's own error
			return nil, contextError(failed)
		}
		return nil, failed
	}
	return result, nil
}

// turnCursor is, per model turn of one handle, the index of the next piece not handed
// over yet.
type turnCursor map[int64]int64

// handOver says whether delta is to be handed over, and records it when it is: a piece
// below the turn's next index was handed over before a reconnect; a reset always is (and
// the turn's pieces start again after it).
func (t turnCursor) handOver(delta *v1.Delta) bool {
	turn, index := delta.GetTurn(), delta.GetIndex()
	if delta.GetReset_() != nil {
		t[turn] = 1
		return true
	}
	if index < t[turn] {
		return false
	}
	t[turn] = index + 1
	return true
}
