package agentruntime

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"

	v1 "github.com/agentruntime/agentruntime/clients/go/agentruntime/v1"
)

// fake answers Spawn the way the real server refuses a spawn past max_children, and
// records what the client sent.
type fake struct {
	v1.UnimplementedAgentRuntimeServer
	auth     []string
	deadline time.Duration
	tokens   []string // the page_token of every List and GetTranscript call
}

// pages of List and GetTranscript: the items of each page token, and the next token.
var pages = map[string]struct {
	ids  []string
	next string
}{"": {[]string{"a", "b"}, "p2"}, "p2": {[]string{"c", "d"}, "p3"}, "p3": {[]string{"e"}, ""}}

func (f *fake) List(_ context.Context, req *v1.ListRequest) (*v1.ListResponse, error) {
	f.tokens = append(f.tokens, req.GetPageToken())
	page, ok := pages[req.GetPageToken()]
	if !ok {
		return nil, status.Error(codes.InvalidArgument, "bad page_token")
	}
	resp := &v1.ListResponse{NextPageToken: page.next}
	for _, id := range page.ids {
		resp.Handles = append(resp.Handles, &v1.HandleView{HandleId: id})
	}
	return resp, nil
}

func (f *fake) GetTranscript(_ context.Context, req *v1.GetTranscriptRequest) (*v1.GetTranscriptResponse, error) {
	f.tokens = append(f.tokens, req.GetPageToken())
	page, ok := pages[req.GetPageToken()]
	if !ok {
		return nil, status.Error(codes.InvalidArgument, "bad page_token")
	}
	resp := &v1.GetTranscriptResponse{NextPageToken: page.next}
	for _, id := range page.ids {
		resp.Messages = append(resp.Messages, &v1.Message{Content: id})
	}
	return resp, nil
}

func (f *fake) Spawn(ctx context.Context, _ *v1.SpawnRequest) (*v1.SpawnResponse, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	f.auth = md.Get("authorization")
	if d, ok := ctx.Deadline(); ok {
		f.deadline = time.Until(d)
	}
	st, err := status.New(codes.ResourceExhausted, "max_children reached").WithDetails(
		&errdetails.ErrorInfo{Reason: "BUDGET", Domain: "agentruntime.dev", Metadata: map[string]string{"limit": "LIMIT_MAX_CHILDREN"}})
	if err != nil {
		return nil, err
	}
	return nil, st.Err()
}

func dialFake(t *testing.T, opts ...Option) (*Client, *fake) {
	t.Helper()
	lis := bufconn.Listen(1 << 20)
	srv := grpc.NewServer()
	f := &fake{}
	v1.RegisterAgentRuntimeServer(srv, f)
	go srv.Serve(lis)
	t.Cleanup(srv.Stop)
	dialer := func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }
	opts = append(opts, WithDialOptions(grpc.WithContextDialer(dialer)))
	client, err := Dial("passthrough:///bufnet", opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.CloseConn() })
	return client, f
}

func TestRefusedCallCarriesCodeAndDetails(t *testing.T) {
	client, f := dialFake(t, WithToken("s3cret"), WithTimeout(7*time.Second))
	_, err := client.Spawn(context.Background(), "rt", "helper", "root/lead.1", nil)
	e, ok := AsError(err)
	if !ok {
		t.Fatalf("want *Error, got %T %v", err, err)
	}
	if e.Code != codes.ResourceExhausted || e.CodeName() != "RESOURCE_EXHAUSTED" {
		t.Errorf("code = %v / %s", e.Code, e.CodeName())
	}
	if got := e.ErrorInfo().GetMetadata()["limit"]; got != "LIMIT_MAX_CHILDREN" {
		t.Errorf("ErrorInfo limit = %q", got)
	}
	if e.BadRequest() != nil || e.ResourceInfo() != nil {
		t.Errorf("unexpected details %v", e.Details)
	}
	if got, want := e.Error(), "RESOURCE_EXHAUSTED: max_children reached"; got != want {
		t.Errorf("Error() = %q, want %q", got, want)
	}
	if status.Code(err) != codes.ResourceExhausted {
		t.Errorf("status.Code does not see through *Error")
	}
	if len(f.auth) != 1 || f.auth[0] != "Bearer s3cret" {
		t.Errorf("authorization = %v", f.auth)
	}
	if f.deadline <= 6*time.Second || f.deadline > 7*time.Second {
		t.Errorf("deadline = %v, want the 7s default", f.deadline)
	}
}

func TestCallerDeadlineWins(t *testing.T) {
	client, f := dialFake(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	client.Spawn(ctx, "rt", "helper", "root", nil)
	if f.deadline <= time.Second || f.deadline > 2*time.Second {
		t.Errorf("deadline = %v, want the caller's 2s", f.deadline)
	}
	if len(f.auth) != 0 {
		t.Errorf("authorization sent without a token: %v", f.auth)
	}
}

func TestListAndTranscriptFollowPages(t *testing.T) {
	client, f := dialFake(t)
	handles, err := client.List(context.Background(), "rt")
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, h := range handles {
		ids = append(ids, h.GetHandleId())
	}
	if got := strings.Join(ids, ","); got != "a,b,c,d,e" {
		t.Errorf("List = %s, want every page's handles a,b,c,d,e", got)
	}
	messages, err := client.Transcript(context.Background(), "rt", "root/a.1")
	if err != nil {
		t.Fatal(err)
	}
	var contents []string
	for _, m := range messages {
		contents = append(contents, m.GetContent())
	}
	if got := strings.Join(contents, ","); got != "a,b,c,d,e" {
		t.Errorf("Transcript = %s, want every page's messages a,b,c,d,e", got)
	}
	if got := strings.Join(f.tokens, ","); got != ",p2,p3,,p2,p3" {
		t.Errorf("page tokens sent = %q", got)
	}
	page, err := client.ListPage(context.Background(), "rt", 2, "p3")
	if err != nil || len(page.GetHandles()) != 1 || page.GetNextPageToken() != "" {
		t.Errorf("ListPage(p3) = %v, %v", page, err)
	}
}
