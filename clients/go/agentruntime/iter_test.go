//go:build go1.23

package agentruntime

import (
	"context"
	"slices"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

func TestIteratorsFollowPagesLazily(t *testing.T) {
	client, f := dialFake(t)
	ctx := context.Background()
	var handles, messages, runtimes []string
	for view, err := range client.AllHandles(ctx, "rt", 2) {
		if err != nil {
			t.Fatal(err)
		}
		handles = append(handles, view.GetHandleId())
	}
	for message, err := range client.AllMessages(ctx, "rt", "root/a.1", 0) {
		if err != nil {
			t.Fatal(err)
		}
		messages = append(messages, message.GetContent())
	}
	for summary, err := range client.AllRuntimes(ctx, 0) {
		if err != nil {
			t.Fatal(err)
		}
		runtimes = append(runtimes, summary.GetRuntimeId())
	}
	want := []string{"a", "b", "c", "d", "e"}
	if !slices.Equal(handles, want) || !slices.Equal(messages, want) || !slices.Equal(runtimes, want) {
		t.Errorf("AllHandles %v, AllMessages %v, AllRuntimes %v, want %v each", handles, messages, runtimes, want)
	}

	// Breaking out after the first page's items fetches no more pages.
	f.tokens = nil
	for view := range client.AllHandles(ctx, "rt", 0) {
		if view.GetHandleId() == "b" {
			break
		}
	}
	if !slices.Equal(f.tokens, []string{""}) {
		t.Errorf("pages fetched before the break: %q, want only the first", f.tokens)
	}

	// A refused page ends the sequence with its *Error, after the pages before it.
	f.listErr = status.Error(codes.InvalidArgument, "bad page_token")
	var got []string
	var failed error
	for view, err := range client.AllHandles(ctx, "rt", 0) {
		if err != nil {
			failed = err
			break
		}
		got = append(got, view.GetHandleId())
	}
	if e, ok := AsError(failed); !ok || e.Code != codes.InvalidArgument || !slices.Equal(got, []string{"a", "b"}) {
		t.Errorf("AllHandles with a refused second page: %v then %v, want a, b then INVALID_ARGUMENT", got, failed)
	}
}

func TestAllRuntimesSendsForksOfOnEveryPage(t *testing.T) {
	client, f := dialFake(t)
	var runtimes []string
	for summary, err := range client.AllRuntimes(context.Background(), 0, WithForksOf("src")) {
		if err != nil {
			t.Fatal(err)
		}
		runtimes = append(runtimes, summary.GetRuntimeId())
	}
	if !slices.Equal(runtimes, []string{"a", "b", "c", "d", "e"}) || !slices.Equal(f.forksOf, []string{"src", "src", "src"}) {
		t.Errorf("AllRuntimes(WithForksOf) = %v with forks_of %q, want every page asked for src's forks", runtimes, f.forksOf)
	}
}
