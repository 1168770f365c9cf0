package agentruntime

import (
	"context"

	v1 "github.com/agentruntime/agentruntime/clients/go/agentruntime/v1"
)

// pager fetches the page at token ("" for the first) and returns its items and the next
// page's token ("" after the last page).
type pager[T any] func(token string) (items []T, next string, err error)

// eachItem hands yield every item of every page, fetching each page when the one before
// is used up, until yield returns false; a refused page is handed over as the error
// (with a zero item) and ends it. List, Transcript and ListRuntimes (collect) and their
// go1.23 iterators (AllHandles, AllMessages, AllRuntimes) share it.
func eachItem[T any](fetch pager[T], yield func(T, error) bool) {
	token := ""
	for {
		items, next, err := fetch(token)
		if err != nil {
			var zero T
			yield(zero, err)
			return
		}
		for _, item := range items {
			if !yield(item, nil) {
				return
			}
		}
		if next == "" {
			return
		}
		token = next
	}
}

// collect is every item of every page, or the first refusal.
func collect[T any](fetch pager[T]) ([]T, error) {
	var all []T
	var failed error
	eachItem(fetch, func(item T, err error) bool {
		if err != nil {
			failed = err
			return false
		}
		all = append(all, item)
		return true
	})
	if failed != nil {
		return nil, failed
	}
	return all, nil
}

func (c *Client) handlePages(ctx context.Context, runtimeID string, pageSize int32) pager[*v1.HandleView] {
	return func(token string) ([]*v1.HandleView, string, error) {
		resp, err := c.ListPage(ctx, runtimeID, pageSize, token)
		return resp.GetHandles(), resp.GetNextPageToken(), err
	}
}

func (c *Client) messagePages(ctx context.Context, runtimeID, handleID string, pageSize int32) pager[*v1.Message] {
	return func(token string) ([]*v1.Message, string, error) {
		resp, err := c.TranscriptPage(ctx, runtimeID, handleID, pageSize, token)
		return resp.GetMessages(), resp.GetNextPageToken(), err
	}
}

func (c *Client) runtimePages(ctx context.Context, pageSize int32, opts []ListRuntimesOption) pager[*v1.RuntimeSummary] {
	return func(token string) ([]*v1.RuntimeSummary, string, error) {
		resp, err := c.ListRuntimesPage(ctx, pageSize, token, opts...)
		return resp.GetRuntimes(), resp.GetNextPageToken(), err
	}
}
