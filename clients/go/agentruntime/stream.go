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
// It watches the runtime from its first event with WatchRequest.deltas (and batch, as
// Watch does) and sends the Wake only once that Watch has answered (the handle's
// `spawned` event, at least): the server subscribes a watcher before it sends the
// history, and a provider's turn streams only to the watchers subscribed when it starts,
// so a Wake sent earlier could run the first turn unseen. It reconnects as Watch does (WithRunWatchOptions configures it),
// from the last event seen, after the same failures and delays, and it gives up on the
// same errors, as an *Error; once ctx is done it returns ctx's error as an *Error
// (CANCELLED or DEADLINE_EXCEEDED), as Run does. After a reconnect the server sends each
// turn still in progress again from its first piece: StreamRun skips the pieces it handed
// over already. A `reset` piece (Delta.GetReset_) is always handed over: what was handed
// over of that turn is void (the provider call is retried, or the turn runs again after a
// restart), and the turn's pieces follow again from index 1.
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
	handleID, err := c.Spawn(ctx, runtimeID, agent, parent, nil, WithRequestID(o.spawnRequestID))
	if err != nil {
		return nil, err
	}
	woken := false
	var result *v1.TaskResult
	var failed error
	c.watchStream(ctx, runtimeID, 0, true, o.watch, func(event *v1.Event, delta *v1.Delta, err error) bool {
		if err != nil {
			failed = err
			return false
		}
		if !woken { // the Watch is subscribed: the first turn will stream to it
			if _, err := c.Wake(ctx, runtimeID, handleID, prompt, WithRequestID(o.wakeRequestID)); err != nil {
				failed = err
				return false
			}
			woken = true
		}
		if delta != nil {
			if delta.GetHandleId() == handleID && onDelta != nil {
				onDelta(delta)
			}
			return true
		}
		if event.GetHandleId() == handleID {
			result = event.GetResult()
		}
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

// freshDeltas is, per model turn in progress, the index of its next piece not handed
// over yet.
type freshDeltas map[turnKey]int64

type turnKey struct {
	handleID string
	turn     int64
}

// take says whether delta is to be handed over, and records it when it is: a piece below
// the turn's next index was handed over before a reconnect; a reset always is (and the
// turn's pieces start again after it).
func (f freshDeltas) take(delta *v1.Delta) bool {
	key, index := turnKey{delta.GetHandleId(), delta.GetTurn()}, delta.GetIndex()
	if delta.GetReset_() != nil {
		f[key] = 1
		return true
	}
	if index < f[key] {
		return false
	}
	f[key] = index + 1
	return true
}

// forget drops the turn event ends: the server sends no piece of a turn that ended again.
func (f freshDeltas) forget(event *v1.Event) {
	if ended := event.GetTurnEnded(); ended != nil {
		delete(f, turnKey{event.GetHandleId(), ended.GetTurn()})
	}
}
