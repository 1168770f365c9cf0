package agentruntime

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
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
	tokens   []string // the page_token of every List, GetTranscript and ListRuntimes call
	forksOf  []string // the forks_of of every ListRuntimes call
	listErr  error    // what List refuses the page at token "p2" with, when set
	deleted  []*v1.DeleteRuntimeRequest
	peerCN   string // the client certificate's common name, over mTLS
	// serveTools plays the server's side of each ServeTools stream (worker_test.go).
	serveTools func(stream v1.AgentRuntime_ServeToolsServer) error
	// wait, resume, inspect, post and watch play the server's side of those RPCs
	// (wait_test.go).
	wait    func(ctx context.Context, req *v1.WaitRequest) (*v1.WaitResponse, error)
	resume  func(ctx context.Context, req *v1.ResumeRequest) (*v1.ResumeResponse, error)
	inspect func(ctx context.Context, req *v1.InspectRequest) (*v1.InspectResponse, error)
	post    func(ctx context.Context, req *v1.PostRequest) (*v1.PostResponse, error)
	watch   func(req *v1.WatchRequest, stream v1.AgentRuntime_WatchServer) error
}

func (f *fake) ListRuntimes(ctx context.Context, req *v1.ListRuntimesRequest) (*v1.ListRuntimesResponse, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	f.auth = md.Get("authorization")
	if p, ok := peer.FromContext(ctx); ok {
		if info, ok := p.AuthInfo.(credentials.TLSInfo); ok && len(info.State.PeerCertificates) > 0 {
			f.peerCN = info.State.PeerCertificates[0].Subject.CommonName
		}
	}
	f.tokens = append(f.tokens, req.GetPageToken())
	f.forksOf = append(f.forksOf, req.GetForksOf())
	page, ok := pages[req.GetPageToken()]
	if !ok {
		return nil, status.Error(codes.InvalidArgument, "bad page_token")
	}
	resp := &v1.ListRuntimesResponse{NextPageToken: page.next}
	for _, id := range page.ids {
		resp.Runtimes = append(resp.Runtimes, &v1.RuntimeSummary{RuntimeId: id})
	}
	return resp, nil
}

func (f *fake) DeleteRuntime(ctx context.Context, req *v1.DeleteRuntimeRequest) (*v1.DeleteRuntimeResponse, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	f.auth = md.Get("authorization")
	f.deleted = append(f.deleted, req)
	return &v1.DeleteRuntimeResponse{}, nil
}

// pages of List and GetTranscript: the items of each page token, and the next token.
var pages = map[string]struct {
	ids  []string
	next string
}{"": {[]string{"a", "b"}, "p2"}, "p2": {[]string{"c", "d"}, "p3"}, "p3": {[]string{"e"}, ""}}

func (f *fake) List(_ context.Context, req *v1.ListRequest) (*v1.ListResponse, error) {
	f.tokens = append(f.tokens, req.GetPageToken())
	if f.listErr != nil && req.GetPageToken() == "p2" {
		return nil, f.listErr
	}
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
		&errdetails.ErrorInfo{Reason: "BUDGET", Domain: "agentruntime.dev", Metadata: map[string]string{"limit": "LIMIT_MAX_CHILDREN"}},
		&errdetails.QuotaFailure{Violations: []*errdetails.QuotaFailure_Violation{{Subject: "tenant:acme", Description: "5 running"}}})
	if err != nil {
		return nil, err
	}
	return nil, st.Err()
}

func dialFake(t *testing.T, opts ...Option) (*Client, *fake) {
	return dialFakeServer(t, nil, opts...)
}

// dialFakeServer serves the fake with the given server options (TLS credentials, ...).
func dialFakeServer(t *testing.T, serverOpts []grpc.ServerOption, opts ...Option) (*Client, *fake) {
	t.Helper()
	lis := bufconn.Listen(1 << 20)
	srv := grpc.NewServer(serverOpts...)
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
	if got := e.QuotaFailure().GetViolations(); len(got) != 1 || got[0].GetSubject() != "tenant:acme" {
		t.Errorf("QuotaFailure = %v", got)
	}
	if !IsResourceExhausted(err) || IsNotFound(err) || IsUnavailable(err) || IsNotFound(nil) {
		t.Errorf("predicates disagree with the code %v", e.Code)
	}
	if !IsResourceExhausted(fmt.Errorf("spawning: %w", err)) {
		t.Errorf("IsResourceExhausted does not see through a wrapped error")
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

func TestListRuntimesFollowsPagesAndDeleteRuntimeSendsForce(t *testing.T) {
	client, f := dialFake(t, WithToken("s3cret"))
	runtimes, err := client.ListRuntimes(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, r := range runtimes {
		ids = append(ids, r.GetRuntimeId())
	}
	if got := strings.Join(ids, ","); got != "a,b,c,d,e" || strings.Join(f.tokens, ",") != ",p2,p3" {
		t.Errorf("ListRuntimes = %s with page tokens %q", got, f.tokens)
	}
	page, err := client.ListRuntimesPage(context.Background(), 2, "p2")
	if err != nil || len(page.GetRuntimes()) != 2 || page.GetNextPageToken() != "p3" {
		t.Errorf("ListRuntimesPage(p2) = %v, %v", page, err)
	}
	if err := client.DeleteRuntime(context.Background(), "rt", true); err != nil {
		t.Fatal(err)
	}
	if len(f.deleted) != 1 || f.deleted[0].GetRuntimeId() != "rt" || !f.deleted[0].GetForce() {
		t.Errorf("DeleteRuntime sent %v", f.deleted)
	}
	// The token rides on calls made through Stub() as well.
	f.auth = nil
	if _, err := client.Stub().DeleteRuntime(context.Background(), &v1.DeleteRuntimeRequest{RuntimeId: "rt"}); err != nil {
		t.Fatal(err)
	}
	if len(f.auth) != 1 || f.auth[0] != "Bearer s3cret" {
		t.Errorf("authorization through Stub() = %v", f.auth)
	}
}

// issue returns a certificate the CA signs for name (server or client use) and its key, as PEM.
func issue(t *testing.T, ca *x509.Certificate, caKey *ecdsa.PrivateKey, name string, usage x509.ExtKeyUsage) (certPEM, keyPEM []byte) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	template := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()),
		Subject:      pkix.Name{CommonName: name},
		DNSNames:     []string{name},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(time.Hour),
		ExtKeyUsage:  []x509.ExtKeyUsage{usage},
	}
	der, err := x509.CreateCertificate(rand.Reader, template, ca, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER})
}

func TestMutualTLSWithCustomCAAndToken(t *testing.T) {
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	caTemplate := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTemplate, caTemplate, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, _ := x509.ParseCertificate(caDER)
	caPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER})
	serverCert, serverKey := issue(t, ca, caKey, "localhost", x509.ExtKeyUsageServerAuth)
	clientCert, clientKey := issue(t, ca, caKey, "ci-bot", x509.ExtKeyUsageClientAuth)

	pair, err := tls.X509KeyPair(serverCert, serverKey)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(caPEM)
	serverTLS := credentials.NewTLS(&tls.Config{Certificates: []tls.Certificate{pair}, ClientCAs: pool, ClientAuth: tls.RequireAndVerifyClientCert})
	serverOpts := []grpc.ServerOption{grpc.Creds(serverTLS)}

	dir := t.TempDir()
	caFile := filepath.Join(dir, "ca.pem")
	certFile, keyFile := filepath.Join(dir, "client.pem"), filepath.Join(dir, "client.key")
	for path, data := range map[string][]byte{caFile: caPEM, certFile: clientCert, keyFile: clientKey} {
		if err := os.WriteFile(path, data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	authority := WithDialOptions(grpc.WithAuthority("localhost"))
	for name, opts := range map[string][]Option{
		"bytes": {WithCA(caPEM), WithClientCertificate(clientCert, clientKey)},
		"files": {WithCAFile(caFile), WithClientCertificateFiles(certFile, keyFile)},
	} {
		client, f := dialFakeServer(t, serverOpts, append(opts, WithToken("s3cret"), authority)...)
		if _, err := client.ListRuntimesPage(context.Background(), 0, ""); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if f.peerCN != "ci-bot" || len(f.auth) != 1 || f.auth[0] != "Bearer s3cret" {
			t.Errorf("%s: the server saw client certificate %q and authorization %v", name, f.peerCN, f.auth)
		}
	}

	// Without the client certificate the handshake fails (made once: no retries); a CA that
	// is not PEM fails Dial.
	client, _ := dialFakeServer(t, serverOpts, WithCA(caPEM), authority, WithoutRetries())
	if _, err := client.ListRuntimesPage(context.Background(), 0, ""); status.Code(err) != codes.Unavailable {
		t.Errorf("without a client certificate: %v, want UNAVAILABLE", err)
	}
	if _, err := Dial("localhost:1", WithCA([]byte("not a certificate"))); err == nil {
		t.Error("Dial accepted a CA with no PEM certificate")
	}
	if _, err := Dial("localhost:1", WithClientCertificateFiles(certFile, filepath.Join(dir, "missing.key"))); err == nil {
		t.Error("Dial accepted a missing key file")
	}
}
