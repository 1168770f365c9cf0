//go:build go1.23

// Command conformance runs the shared vectors (tests/vectors, see its README) through
// the Go client against the server at AGENTRUNTIME_ADDR, the same way the Python runner
// (clients/python/conformance/run.py) does.
//
//	cd clients/go && AGENTRUNTIME_ADDR=127.0.0.1:50051 go run ./conformance
package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/agentruntime/agentruntime/clients/go/agentruntime"
	v1 "github.com/agentruntime/agentruntime/clients/go/agentruntime/v1"
)

// callTimeout is the vectors' README's deadline for every call, Wait included (the
// client's WithTimeout for most; Wait's own context, since WithTimeout does not bound it).
const callTimeout = 60 * time.Second

// An inspect step with "poll" re-reads every pollEvery, for at most pollFor.
const (
	pollEvery = 50 * time.Millisecond
	pollFor   = 10 * time.Second
)

type vector struct {
	Name    string                       `json:"name"`
	Workers []workerEntry                `json:"workers"`
	Agents  []json.RawMessage            `json:"agents"`
	Steps   []map[string]json.RawMessage `json:"steps"`
}

// workerEntry is one of a vector's workers (README: Workers); MaxConcurrentCalls nil: 1.
type workerEntry struct {
	Queue              string   `json:"queue"`
	Tools              []string `json:"tools"`
	MaxConcurrentCalls *int     `json:"max_concurrent_calls"`
}

type spawnArgs struct {
	Parent string          `json:"parent"`
	Agent  string          `json:"agent"`
	Budget json.RawMessage `json:"budget"`
}

type wakeArgs struct {
	Handle string `json:"handle"`
	Prompt string `json:"prompt"`
}

// waitOptions are the wait step's arguments (README: Waiting, restarts and watching); any
// other is a broken vector.
var waitOptions = []string{"handle", "client_timeout_ms", "restart_server_after_ms"}

type resumeArgs struct {
	OK      bool            `json:"ok"`
	ID      string          `json:"id"`
	Reason  string          `json:"reason"`
	Outputs []string        `json:"outputs"`
	Data    json.RawMessage `json:"data"`
}

// postArgs: handle and text are required (nil: absent).
type postArgs struct {
	Handle      *string `json:"handle"`
	Text        *string `json:"text"`
	Sender      string  `json:"sender"`
	Channel     string  `json:"channel"`
	Trust       *string `json:"trust"`
	CoalesceKey string  `json:"coalesce_key"`
}

// closeArgs: handle is required; GraceMs nil sends no grace.
type closeArgs struct {
	Handle  *string `json:"handle"`
	Force   bool    `json:"force"`
	GraceMs *int64  `json:"grace_ms"`
}

// listRuntimesArgs: page_size of every page (0: the server's default).
type listRuntimesArgs struct {
	PageSize int32 `json:"page_size"`
}

type deleteRuntimeArgs struct {
	Force bool `json:"force"`
}

// createRuntimeArgs: agents is required (nil: absent or null), each an AgentDef in proto3 JSON.
type createRuntimeArgs struct {
	Agents *[]json.RawMessage `json:"agents"`
}

type inspectArgs struct {
	Handle *string `json:"handle"`
	Poll   bool    `json:"poll"`
}

// pageArgs are a list step's arguments and a transcript step's, Handle aside.
type pageArgs struct {
	Handle    string `json:"handle"`
	PageSize  int32  `json:"page_size"`
	PageToken string `json:"page_token"`
}

// nextToken is the page_token that means "the next_page_token of the last step of the
// same verb that succeeded".
const nextToken = "$next"

// state is what a vector's steps carry over to later steps.
type state struct {
	// The vector's runtime: the one it created, then the last fork a fork step made.
	runtimeID string
	// The runtime the last fork step forked (its source); "" before any fork.
	forkSource string
	// The Request the next resume answers: the last STATUS_PENDING result seen.
	lastPending *v1.Request
	// The next_page_token of the last list / transcript step that succeeded (nil: none yet).
	nextList, nextTranscript *string
}

// expectedError is a step's expect_error (parseExpectedError reads it); a nil key is
// not checked.
type expectedError struct {
	Code       string
	Limit      *string
	Reason     *string           // the ErrorInfo's reason ("" when there is none)
	Resource   *expectedResource // the ResourceInfo's type and name
	Violations *[]string         // the BadRequest's field violations' fields, in order
}

// expectedResource is an expect_error's `resource`: the ResourceInfo's type and name.
type expectedResource struct {
	Type string `json:"type"`
	Name string `json:"name"`
}

var verbs = []string{
	"spawn", "wake", "wait", "resume", "list", "transcript", "post", "close", "inspect",
	"list_runtimes", "delete_runtime", "create_runtime", "interrupt", "watch", "stream_run",
	"fork", "replay",
}

func main() {
	addr := serverAddress()
	dir := envOr("AGENTRUNTIME_VECTORS", filepath.Join("..", "..", "tests", "vectors"))
	paths, err := filepath.Glob(filepath.Join(dir, "*.json")) // sorted by file name
	if err == nil && len(paths) == 0 {
		err = fmt.Errorf("no *.json vectors in %s (run from clients/go or set AGENTRUNTIME_VECTORS)", dir)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "conformance:", err)
		os.Exit(2)
	}
	client, err := agentruntime.Dial(addr, connectionOptions()...)
	if err != nil {
		fmt.Fprintln(os.Stderr, "conformance:", err)
		os.Exit(2)
	}
	defer client.CloseConn()

	passed, failed := 0, 0
	for _, path := range paths {
		name, err := runFile(client, path)
		if err != nil {
			failed++
			fmt.Printf("FAIL %s: %v\n", name, err)
		} else {
			passed++
			fmt.Printf("ok   %s\n", name)
		}
	}
	fmt.Printf("conformance: %d passed, %d failed\n", passed, failed)
	if failed > 0 {
		os.Exit(1)
	}
}

// connectionOptions: the call deadline, plus TLS and the token from the environment
// (tests/vectors/README.md); each unset or empty variable leaves its option out.
func connectionOptions() []agentruntime.Option {
	opts := []agentruntime.Option{agentruntime.WithTimeout(callTimeout)}
	if ca := os.Getenv("AGENTRUNTIME_CA_FILE"); ca != "" {
		opts = append(opts, agentruntime.WithCAFile(ca))
	}
	cert, key := os.Getenv("AGENTRUNTIME_CLIENT_CERT_FILE"), os.Getenv("AGENTRUNTIME_CLIENT_KEY_FILE")
	if cert != "" || key != "" {
		opts = append(opts, agentruntime.WithClientCertificateFiles(cert, key))
	}
	if token := os.Getenv("AGENTRUNTIME_TOKEN"); token != "" {
		opts = append(opts, agentruntime.WithToken(token))
	}
	return opts
}

// serverAddress is AGENTRUNTIME_ADDR, or the default server's.
func serverAddress() string { return envOr("AGENTRUNTIME_ADDR", "127.0.0.1:50051") }

func envOr(key, fallback string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return fallback
}

// runFile returns the vector's name (the file's, if the vector cannot be read) and why
// it failed.
func runFile(client *agentruntime.Client, path string) (string, error) {
	name := strings.TrimSuffix(filepath.Base(path), ".json")
	data, err := os.ReadFile(path)
	if err != nil {
		return name, err
	}
	var v vector
	if err := json.Unmarshal(data, &v); err != nil {
		return name, fmt.Errorf("bad vector: %w", err)
	}
	if v.Name != "" {
		name = v.Name
	}
	return name, run(context.Background(), client, &v)
}

func run(ctx context.Context, client *agentruntime.Client, v *vector) error {
	stop, err := startWorkers(ctx, client, v.Workers)
	if err != nil {
		return err
	}
	defer stop() // after the last step, passed or not
	return runSteps(ctx, client, v)
}

// workerHandlers are the README's worker tools, the same in every language.
var workerHandlers = map[string]agentruntime.ToolHandler{
	"upper": func(_ context.Context, arguments map[string]any, _ *v1.WorkerCall) (string, error) {
		text, err := textArgument(arguments)
		return upperASCII(text), err
	},
	"reverse": func(_ context.Context, arguments map[string]any, _ *v1.WorkerCall) (string, error) {
		text, err := textArgument(arguments)
		runes := []rune(text)
		slices.Reverse(runes)
		return string(runes), err
	},
}

func textArgument(arguments map[string]any) (string, error) {
	text, ok := arguments["text"].(string)
	if !ok {
		return "", fmt.Errorf("the text argument must be a string, got %s", show(arguments["text"]))
	}
	return text, nil
}

// upperASCII upper-cases the ASCII letters of s and leaves every other character as is.
func upperASCII(s string) string {
	return strings.Map(func(r rune) rune {
		if 'a' <= r && r <= 'z' {
			return r - 'a' + 'A'
		}
		return r
	}, s)
}

// startWorkers starts the vector's workers with the client's ServeTools, on its
// connection (TLS and token included), and waits until the server has registered each
// (within the call deadline). stop cancels them and waits until they have returned.
func startWorkers(ctx context.Context, client *agentruntime.Client, entries []workerEntry) (stop func(), err error) {
	ctx, cancel := context.WithCancel(ctx)
	var served sync.WaitGroup
	stop = func() {
		cancel()
		served.Wait()
	}
	for i, entry := range entries {
		handlers := map[string]agentruntime.ToolHandler{}
		for _, name := range entry.Tools {
			handler, ok := workerHandlers[name]
			if !ok {
				stop()
				return nil, fmt.Errorf("workers[%d]: no handler for tool %q (a broken vector)", i, name)
			}
			handlers[name] = handler
		}
		limit := 1
		if entry.MaxConcurrentCalls != nil {
			limit = *entry.MaxConcurrentCalls
		}
		registered := make(chan struct{})
		var once sync.Once
		ended := make(chan error, 1)
		served.Add(1)
		go func() {
			defer served.Done()
			ended <- client.ServeTools(ctx, entry.Queue, handlers, agentruntime.WithMaxConcurrentCalls(limit),
				agentruntime.WithRegistered(func(string) { once.Do(func() { close(registered) }) }))
		}()
		select {
		case <-registered:
		case err := <-ended:
			stop()
			return nil, fmt.Errorf("workers[%d]: ServeTools: %w", i, err)
		case <-time.After(callTimeout):
			stop()
			return nil, fmt.Errorf("workers[%d]: not registered within %v", i, callTimeout)
		}
	}
	return stop, nil
}

func runSteps(ctx context.Context, client *agentruntime.Client, v *vector) error {
	agents := make([]*v1.AgentDef, len(v.Agents))
	for i, raw := range v.Agents {
		agents[i] = &v1.AgentDef{}
		if err := protojson.Unmarshal(raw, agents[i]); err != nil {
			return fmt.Errorf("agents[%d]: %w", i, err)
		}
	}
	runtimeID, err := client.CreateRuntime(ctx, agents, "")
	if err != nil {
		return fmt.Errorf("CreateRuntime: %w", err)
	}
	token, err := runToken()
	if err != nil {
		return err
	}
	st := state{runtimeID: runtimeID}
	for i, step := range v.Steps {
		where := fmt.Sprintf("step %d", i+1)
		if err := runStep(ctx, client, token, step, &st); err != nil {
			return fmt.Errorf("%s: %w", where, err)
		}
	}
	return nil
}

// runStep runs one step and checks its expect or expect_error; a mutating verb's step
// with "repeat" is sent twice (README: Request ids and repeats) and each answer checked.
func runStep(ctx context.Context, client *agentruntime.Client, token string, step map[string]json.RawMessage, st *state) error {
	runtimeID := st.runtimeID // after a fork step, the fork
	verb, args, err := verbOf(step)
	if err != nil {
		return err
	}
	requestID, repeat, err := requestOptions(step, verb, token)
	if err != nil {
		return err
	}
	if !slices.Contains(mutatingVerbs, verb) {
		outcome, err := do(ctx, client, runtimeID, verb, args, step, st)
		return checkOutcome(step, outcome, err)
	}
	send, err := prepare(ctx, client, runtimeID, verb, args, st)
	if err != nil {
		return err
	}
	answers := []answer{send(requestID)}
	if repeat {
		answers = append(answers, send(requestID))
	}
	if verb == "create_runtime" { // the runtime it created, deleted once after every answer
		for _, a := range answers {
			if created := a.response.(*v1.CreateRuntimeResponse).GetRuntimeId(); a.err == nil && created != "" {
				if err := client.DeleteRuntime(ctx, created, false); err != nil {
					return fmt.Errorf("deleting the runtime the step created: %v", err)
				}
				break
			}
		}
	}
	if repeat {
		if err := sameAnswers(answers[0], answers[1]); err != nil {
			return err
		}
	}
	for i, a := range answers {
		if err := checkOutcome(step, a.outcome, a.err); err != nil {
			if repeat {
				return fmt.Errorf("answer %d of 2: %w", i+1, err)
			}
			return err
		}
	}
	return nil
}

// answer is one call of a mutating verb's step: what its expect is checked against (nil
// for wake, delete_runtime and create_runtime), the whole response message, or the error.
type answer struct {
	outcome  map[string]any
	response proto.Message
	err      error
}

// sameAnswers says whether a repeat was answered as the first call was: both succeeded
// with equal responses (protobuf equality of the whole message), or both were refused
// with the same code and message.
func sameAnswers(first, repeat answer) error {
	e1, refused1 := first.err.(*agentruntime.Error)
	e2, refused2 := repeat.err.(*agentruntime.Error)
	for _, err := range []error{first.err, repeat.err} {
		if _, refused := err.(*agentruntime.Error); err != nil && !refused {
			return err // the vector's own error
		}
	}
	switch {
	case refused1 && refused2:
		if e1.Code != e2.Code || e1.Message != e2.Message {
			return fmt.Errorf("the repeat was refused with %v, the first call with %v", e2, e1)
		}
	case refused1 || refused2:
		return fmt.Errorf("the first call answered %v, the repeat %v", describe(first), describe(repeat))
	case !proto.Equal(first.response, repeat.response):
		return fmt.Errorf("the repeat answered %v, the first call %v", describe(repeat), describe(first))
	}
	return nil
}

func describe(a answer) string {
	if a.err != nil {
		return a.err.Error()
	}
	text, _ := protojson.Marshal(a.response)
	return fmt.Sprintf("%s %s", a.response.ProtoReflect().Descriptor().Name(), text)
}

// checkOutcome checks a call's outcome or refusal against the step's expect or
// expect_error. A refusal comes as an *agentruntime.Error; any other error is the vector's.
func checkOutcome(step map[string]json.RawMessage, outcome map[string]any, err error) error {
	var callErr *agentruntime.Error
	if errors.As(err, &callErr) {
		return checkError(step, callErr)
	}
	if err != nil {
		return err
	}
	if raw, ok := step["expect_error"]; ok {
		want, err := parseExpectedError(raw)
		if err != nil {
			return fmt.Errorf("bad expect_error: %w", err)
		}
		return fmt.Errorf("expected %s, but the call succeeded", want.Code)
	}
	if raw, ok := step["expect"]; ok {
		if outcome == nil {
			return errors.New("this verb has nothing to expect")
		}
		var want map[string]any
		if err := json.Unmarshal(raw, &want); err != nil {
			return fmt.Errorf("bad expect: %w", err)
		}
		return check("expect", normalize(outcome), want)
	}
	return nil
}

// mutatingVerbs are the verbs whose step may carry request_id and repeat.
var mutatingVerbs = []string{"spawn", "post", "wake", "resume", "interrupt", "close", "create_runtime", "delete_runtime"}

// requestIDPattern is a step's request_id: at most 40 characters of [A-Za-z0-9_-].
var requestIDPattern = regexp.MustCompile(`^[A-Za-z0-9_-]{1,40}$`)

// runToken is the 16 random hex digits a vector run puts before its steps' request ids
// (the server is shared, and a CreateRuntime's request id is recorded per tenant).
func runToken() (string, error) {
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", err
	}
	return hex.EncodeToString(b[:]), nil
}

// requestOptions reads a step's request_id (sent as "<token>-<request_id>"; "" when
// absent: the client generates one) and repeat. Either on a verb that is not mutating, a
// repeat without a request_id, or either of another JSON type is a broken vector.
func requestOptions(step map[string]json.RawMessage, verb, token string) (requestID string, repeat bool, err error) {
	rawID, hasID := step["request_id"]
	rawRepeat, hasRepeat := step["repeat"]
	if !hasID && !hasRepeat {
		return "", false, nil
	}
	if !slices.Contains(mutatingVerbs, verb) {
		return "", false, fmt.Errorf("request_id and repeat are for the verbs %v, not %s (a broken vector)", mutatingVerbs, verb)
	}
	if hasRepeat {
		if !hasID {
			return "", false, errors.New("repeat without a request_id (a broken vector)")
		}
		if err := json.Unmarshal(rawRepeat, &repeat); err != nil || bytes.Equal(bytes.TrimSpace(rawRepeat), []byte("null")) {
			return "", false, fmt.Errorf("repeat must be a boolean, got %s (a broken vector)", rawRepeat)
		}
	}
	var id *string
	if err := json.Unmarshal(rawID, &id); err != nil || id == nil || !requestIDPattern.MatchString(*id) {
		return "", false, fmt.Errorf("request_id must be a string of 1 to 40 of [A-Za-z0-9_-], got %s (a broken vector)", rawID)
	}
	return token + "-" + *id, repeat, nil
}

// prepare reads a mutating verb's arguments and builds its request once; send makes the
// call with the request id (or, for "", a generated one), each time with the same request.
func prepare(ctx context.Context, client *agentruntime.Client, runtimeID, verb string, args json.RawMessage, st *state) (send func(requestID string) answer, err error) {
	// The step's request id, when it gives one (else the client's own generated one).
	with := func(requestID string) []agentruntime.CallOption {
		if requestID == "" {
			return nil
		}
		return []agentruntime.CallOption{agentruntime.WithRequestID(requestID)}
	}
	switch verb {
	case "spawn":
		var a spawnArgs
		if err := json.Unmarshal(args, &a); err != nil {
			return nil, err
		}
		var budget *v1.Budget
		if len(a.Budget) > 0 {
			budget = &v1.Budget{}
			if err := protojson.Unmarshal(a.Budget, budget); err != nil {
				return nil, fmt.Errorf("budget: %w", err)
			}
		}
		return func(requestID string) answer {
			id, err := client.Spawn(ctx, runtimeID, a.Agent, a.Parent, budget, with(requestID)...)
			return answer{map[string]any{"handle_id": id}, &v1.SpawnResponse{HandleId: id}, err}
		}, nil
	case "wake":
		var a wakeArgs
		if err := json.Unmarshal(args, &a); err != nil {
			return nil, err
		}
		return func(requestID string) answer {
			queued, err := client.Wake(ctx, runtimeID, a.Handle, a.Prompt, with(requestID)...)
			return answer{nil, &v1.WakeResponse{Queued: queued}, err}
		}, nil
	case "resume":
		reply, err := buildAnswer(args, st.lastPending)
		if err != nil {
			return nil, err
		}
		return func(requestID string) answer {
			result, err := client.Resume(ctx, runtimeID, reply, with(requestID)...)
			if err != nil {
				return answer{err: err}
			}
			return answer{resultFields(result, &st.lastPending), &v1.ResumeResponse{Result: result}, nil}
		}, nil
	case "interrupt":
		var a struct {
			Handle *string `json:"handle"`
		}
		if err := strictArgs(args, &a); err != nil {
			return nil, err
		}
		if a.Handle == nil {
			return nil, errors.New("interrupt needs handle")
		}
		return func(requestID string) answer {
			interrupted, err := client.Interrupt(ctx, runtimeID, *a.Handle, with(requestID)...)
			return answer{map[string]any{"interrupted": interrupted}, &v1.InterruptResponse{Interrupted: interrupted}, err}
		}, nil
	case "post":
		var a postArgs
		if err := strictArgs(args, &a); err != nil {
			return nil, err
		}
		if a.Handle == nil || a.Text == nil {
			return nil, errors.New("post needs handle and text")
		}
		trust := v1.Trust_TRUST_UNSPECIFIED
		if a.Trust != nil {
			number, ok := v1.Trust_value[*a.Trust]
			if !ok {
				return nil, fmt.Errorf("trust %q is not a value of Trust", *a.Trust)
			}
			trust = v1.Trust(number)
		}
		// Through Stub() (the thin Post has no trust nor coalesce_key): the client's retries
		// and, when the step gives none, its generated request id apply all the same.
		return func(requestID string) answer {
			req := &v1.PostRequest{
				RuntimeId: runtimeID, HandleId: *a.Handle, Text: *a.Text, Sender: a.Sender, Channel: a.Channel,
				Trust: trust, CoalesceKey: a.CoalesceKey, RequestId: requestID,
			}
			ctx, cancel := context.WithTimeout(ctx, callTimeout)
			defer cancel()
			resp, err := client.Stub().Post(ctx, req)
			if err != nil {
				return answer{err: asError(err)}
			}
			return answer{map[string]any{"inbox_size": resp.GetInboxSize()}, resp, nil}
		}, nil
	case "close":
		var a closeArgs
		if err := strictArgs(args, &a); err != nil {
			return nil, err
		}
		if a.Handle == nil {
			return nil, errors.New("close needs handle")
		}
		// Through Stub() (the thin Close has no grace), as post.
		return func(requestID string) answer {
			req := &v1.CloseRequest{RuntimeId: runtimeID, HandleId: *a.Handle, Force: a.Force, RequestId: requestID}
			if a.GraceMs != nil {
				req.Grace = durationpb.New(time.Duration(*a.GraceMs) * time.Millisecond)
			}
			ctx, cancel := context.WithTimeout(ctx, callTimeout)
			defer cancel()
			resp, err := client.Stub().Close(ctx, req)
			if err != nil {
				return answer{err: asError(err)}
			}
			closed := append([]string{}, resp.GetClosedHandleIds()...)
			return answer{map[string]any{"closed": closed, "count": len(closed)}, resp, nil}
		}, nil
	case "delete_runtime":
		var a deleteRuntimeArgs
		if err := strictArgs(args, &a); err != nil {
			return nil, err
		}
		return func(requestID string) answer {
			err := client.DeleteRuntime(ctx, runtimeID, a.Force, with(requestID)...)
			return answer{nil, &v1.DeleteRuntimeResponse{}, err}
		}, nil
	default: // create_runtime: another runtime (generated id), deleted by runStep
		var a createRuntimeArgs
		if err := strictArgs(args, &a); err != nil {
			return nil, err
		}
		if a.Agents == nil {
			return nil, errors.New("create_runtime needs agents, a list")
		}
		agents := make([]*v1.AgentDef, len(*a.Agents))
		for i, raw := range *a.Agents {
			agents[i] = &v1.AgentDef{}
			if err := protojson.Unmarshal(raw, agents[i]); err != nil {
				return nil, fmt.Errorf("agents[%d]: %w", i, err)
			}
		}
		return func(requestID string) answer {
			created, err := client.CreateRuntime(ctx, agents, "", with(requestID)...)
			return answer{nil, &v1.CreateRuntimeResponse{RuntimeId: created}, err}
		}, nil
	}
}

// buildAnswer is a resume step's Answer (and a fork step's `answer`): for the Request of the
// last STATUS_PENDING result the vector saw, its id unless the arguments give one, the
// outputs for its calls in order, and data.
func buildAnswer(args json.RawMessage, lastPending *v1.Request) (*v1.Answer, error) {
	var a resumeArgs
	if err := json.Unmarshal(args, &a); err != nil {
		return nil, err
	}
	reply := &v1.Answer{Id: a.ID, Ok: a.OK, Reason: a.Reason}
	if len(a.Data) > 0 {
		if !bytes.HasPrefix(bytes.TrimSpace(a.Data), []byte("{")) {
			return nil, fmt.Errorf("data must be an object, got %s", a.Data)
		}
		reply.Data = &structpb.Struct{}
		if err := protojson.Unmarshal(a.Data, reply.Data); err != nil {
			return nil, fmt.Errorf("data: %w", err)
		}
	}
	if reply.Id == "" {
		reply.Id = lastPending.GetId()
	}
	calls := lastPending.GetCalls()
	if len(a.Outputs) > len(calls) {
		return nil, fmt.Errorf("resume gives %d outputs, the pending Request has %d calls", len(a.Outputs), len(calls))
	}
	for i, text := range a.Outputs {
		reply.Outputs = append(reply.Outputs, &v1.ToolOutput{CallId: calls[i].GetId(), Output: text})
	}
	return reply, nil
}

// do runs one step of a verb that is not mutating in the README's sense (wait, watch, list,
// transcript, inspect, list_runtimes, stream_run, fork, replay: no request_id nor repeat)
// and returns what its expect is checked against. A refused call comes back as an
// *agentruntime.Error; any other error is the vector's.
func do(ctx context.Context, client *agentruntime.Client, runtimeID, verb string, args json.RawMessage, step map[string]json.RawMessage, st *state) (map[string]any, error) {
	switch verb {
	case "fork":
		return fork(ctx, client, args, st)
	case "replay":
		return replay(ctx, client, runtimeID, args)
	case "wait":
		result, err := wait(ctx, client, runtimeID, args)
		if err != nil {
			return nil, err
		}
		return resultFields(result, &st.lastPending), nil
	case "watch":
		return watch(ctx, client, runtimeID, args)
	case "stream_run":
		return streamRun(ctx, client, runtimeID, args)
	case "list":
		a, err := parsePageArgs(args, st.nextList)
		if err != nil {
			return nil, err
		}
		resp, err := client.ListPage(ctx, runtimeID, a.PageSize, a.PageToken)
		if err != nil {
			return nil, err
		}
		next := resp.GetNextPageToken()
		st.nextList = &next
		handles := resp.GetHandles()
		views := map[string]any{}
		for _, h := range handles {
			views[h.GetHandleId()] = viewFields(h)
		}
		return map[string]any{"count": len(handles), "handles": views, "next_page_token_empty": next == ""}, nil
	case "inspect":
		var a inspectArgs
		if err := strictArgs(args, &a); err != nil {
			return nil, err
		}
		if a.Handle == nil {
			return nil, errors.New("inspect needs handle")
		}
		if !a.Poll {
			view, err := client.Inspect(ctx, runtimeID, *a.Handle)
			if err != nil {
				return nil, err
			}
			return viewFields(view), nil
		}
		return poll(ctx, client, runtimeID, *a.Handle, step)
	case "list_runtimes":
		var a listRuntimesArgs
		if err := strictArgs(args, &a); err != nil {
			return nil, err
		}
		return listRuntimes(ctx, client, runtimeID, st.forkSource, a.PageSize)
	default: // transcript
		a, err := parsePageArgs(args, st.nextTranscript)
		if err != nil {
			return nil, err
		}
		resp, err := client.TranscriptPage(ctx, runtimeID, a.Handle, a.PageSize, a.PageToken)
		if err != nil {
			return nil, err
		}
		next := resp.GetNextPageToken()
		st.nextTranscript = &next
		roles := []string{}
		messages := []any{}
		for _, m := range resp.GetMessages() {
			roles = append(roles, m.GetRole())
			messages = append(messages, map[string]any{"role": m.GetRole(), "trust": m.GetTrust().String(), "content": m.GetContent()})
		}
		return map[string]any{"count": len(roles), "roles": roles, "messages": messages, "next_page_token_empty": next == ""}, nil
	}
}

// wait is the wait step: the client's Wait (no overall timeout of its own; ctx bounds it
// by the vectors' 60 s), through a second client whose default per-call deadline is
// client_timeout_ms when the step gives it, and across a run of the restart hook
// restart_server_after_ms into the wait when the step asks (README: Waiting, restarts and
// watching; the Python runner's _wait).
func wait(ctx context.Context, client *agentruntime.Client, runtimeID string, args json.RawMessage) (*v1.TaskResult, error) {
	var a map[string]json.RawMessage
	if err := strictArgs(args, &a); err != nil {
		return nil, err
	}
	var unknown []string
	for key := range a {
		if !slices.Contains(waitOptions, key) {
			unknown = append(unknown, key)
		}
	}
	if len(unknown) > 0 {
		slices.Sort(unknown)
		return nil, fmt.Errorf("unknown wait arguments %v", unknown)
	}
	var handle *string
	if err := json.Unmarshal(a["handle"], &handle); a["handle"] == nil || err != nil || handle == nil {
		return nil, fmt.Errorf("wait needs handle, a string, got %s", a["handle"])
	}
	clientTimeout, err := millis(a, "client_timeout_ms")
	if err != nil {
		return nil, err
	}
	restartAfter, err := millis(a, "restart_server_after_ms")
	if err != nil {
		return nil, err
	}
	var restarted <-chan error
	if restartAfter != nil {
		hook := os.Getenv("AGENTRUNTIME_RESTART_HOOK")
		if hook == "" {
			return nil, errors.New("restart_server_after_ms needs AGENTRUNTIME_RESTART_HOOK (scripts/with-server.sh sets it)")
		}
		cancelled := make(chan struct{})
		defer close(cancelled) // a wait that ends first calls off a hook not yet started
		restarted = restartServer(hook, time.Duration(*restartAfter)*time.Millisecond, cancelled)
	}
	// Wait is not bounded by the client's WithTimeout: the vectors' 60 s is the ctx's.
	ctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	waiter := client
	if clientTimeout != nil {
		opts := append(connectionOptions(), agentruntime.WithTimeout(time.Duration(*clientTimeout)*time.Millisecond))
		short, err := agentruntime.Dial(serverAddress(), opts...)
		if err != nil {
			return nil, err
		}
		defer short.CloseConn()
		waiter = short
	}
	result, err := waiter.Wait(ctx, runtimeID, *handle, 0)
	if err != nil {
		return nil, err
	}
	if restarted != nil {
		if err := <-restarted; err != nil { // the hook's own failure fails the step, even when the wait got through
			return nil, err
		}
	}
	return result, nil
}

// millis is an optional argument that must be a non-negative integer (nil: absent).
func millis(a map[string]json.RawMessage, key string) (*int64, error) {
	raw, ok := a[key]
	if !ok || string(bytes.TrimSpace(raw)) == "null" { // null is absent, as in the Python runner
		return nil, nil
	}
	var value int64
	if err := json.Unmarshal(raw, &value); err != nil || value < 0 || bytes.ContainsAny(raw, ".eE") {
		return nil, fmt.Errorf("%s must be a non-negative integer, got %s", key, raw)
	}
	return &value, nil
}

// restartServer runs the restart hook (sh -c "$AGENTRUNTIME_RESTART_HOOK") after the delay,
// unless cancelled is closed first, and sends its outcome (nil when called off). A hook
// already started is let finish: killing it halfway could leave no server.
func restartServer(hook string, after time.Duration, cancelled <-chan struct{}) <-chan error {
	done := make(chan error, 1)
	go func() {
		timer := time.NewTimer(after)
		defer timer.Stop()
		select {
		case <-cancelled:
			done <- nil
			return
		case <-timer.C:
		}
		cmd := exec.Command("sh", "-c", hook)
		cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr // files, not pipes: the restarted server may keep them
		if err := cmd.Run(); err != nil {
			done <- fmt.Errorf("the restart hook failed: %w", err)
			return
		}
		done <- nil
	}()
	return done
}

// eventString is an event as the watch step writes it: its handle id, its payload's field
// name and, for state_changed, the state's enum value name.
func eventString(event *v1.Event) string {
	kind := payloadName(event)
	text := event.GetHandleId() + " " + kind
	if kind == "state_changed" {
		text += " " + event.GetStateChanged().GetState().String()
	}
	return text
}

// payloadName is the name of the event's payload field in the proto ("" when unset).
func payloadName(event *v1.Event) string {
	message := event.ProtoReflect()
	field := message.WhichOneof(message.Descriptor().Oneofs().ByName(protoreflect.Name("payload")))
	if field == nil {
		return ""
	}
	return string(field.Name())
}

// watch is the watch step: the client's Watch on this vector's runtime from its first
// event until handle's first result event, within the 60 s call deadline, with the seqs
// 1, 2, 3 ... (the Python runner's _watch).
func watch(ctx context.Context, client *agentruntime.Client, runtimeID string, args json.RawMessage) (map[string]any, error) {
	var a struct {
		Handle *string `json:"handle"`
	}
	if err := strictArgs(args, &a); err != nil {
		return nil, err
	}
	if a.Handle == nil {
		return nil, errors.New("watch needs handle")
	}
	ctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	events := []string{}
	for event, err := range client.Watch(ctx, runtimeID, 0) {
		if err != nil {
			if ctx.Err() != nil {
				return nil, fmt.Errorf("no result event of %s within %v; events: %s", *a.Handle, callTimeout, show(events))
			}
			return nil, err
		}
		if event.GetSeq() != int64(len(events)+1) {
			return nil, fmt.Errorf("event seq %d after %d events (a gap or a repeat)", event.GetSeq(), len(events))
		}
		events = append(events, eventString(event))
		if event.GetResult() != nil && event.GetHandleId() == *a.Handle {
			break
		}
	}
	return map[string]any{"count": len(events), "events": events}, nil
}

// streamRun is the stream_run step: the client's StreamRun within the 60 s call deadline,
// the handle's text pieces joined in order (a reset empties what was joined of its turn)
// and counted, beside the result's fields as a wait step's (README: Waiting, restarts and
// watching).
func streamRun(ctx context.Context, client *agentruntime.Client, runtimeID string, args json.RawMessage) (map[string]any, error) {
	var a struct {
		Agent  *string `json:"agent"`
		Prompt *string `json:"prompt"`
		Parent *string `json:"parent"`
	}
	if err := strictArgs(args, &a); err != nil {
		return nil, err
	}
	if a.Agent == nil || a.Prompt == nil {
		return nil, errors.New("stream_run needs agent and prompt")
	}
	parent := "root"
	if a.Parent != nil {
		parent = *a.Parent
	}
	ctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	var turns []int64 // in the order their first piece came
	joined := map[int64]*strings.Builder{}
	count := 0
	result, err := client.StreamRun(ctx, runtimeID, *a.Agent, *a.Prompt, parent, func(d *v1.Delta) {
		turn := d.GetTurn()
		if joined[turn] == nil {
			turns = append(turns, turn)
			joined[turn] = &strings.Builder{}
		}
		switch d.GetPiece().(type) {
		case *v1.Delta_Reset_:
			joined[turn].Reset()
		case *v1.Delta_Text:
			joined[turn].WriteString(d.GetText())
			count++
		}
	})
	if err != nil {
		return nil, err
	}
	var text strings.Builder
	for _, turn := range turns {
		text.WriteString(joined[turn].String())
	}
	var pending *v1.Request // a resume answers a wait's or a resume's Request, not this one's
	outcome := resultFields(result, &pending)
	outcome["joined"] = text.String()
	outcome["text_deltas"] = count
	return outcome, nil
}

// forkArgs are a fork step's arguments: at_seq is required (nil: absent).
type forkArgs struct {
	AtSeq    *json.RawMessage  `json:"at_seq"`
	Agents   []json.RawMessage `json:"agents"`
	Messages []json.RawMessage `json:"messages"`
	Answer   json.RawMessage   `json:"answer"`
}

// fork is the fork step: the client's ForkRuntime of this vector's runtime at at_seq, with
// the step's agents, messages and answer (a resume step's Answer for the last pending
// Request), a generated fork id and the client's request id. Once it succeeds the fork is
// this vector's runtime, and the runtime it forked its source (README: Forks and replays).
func fork(ctx context.Context, client *agentruntime.Client, args json.RawMessage, st *state) (map[string]any, error) {
	var a forkArgs
	if err := strictArgs(args, &a); err != nil {
		return nil, err
	}
	if a.AtSeq == nil {
		return nil, errors.New("fork needs at_seq")
	}
	atSeq, err := integer(*a.AtSeq)
	if err != nil {
		return nil, fmt.Errorf("at_seq: %w", err)
	}
	changes := &agentruntime.ForkChanges{}
	if changes.Agents, err = agentDefs(a.Agents); err != nil {
		return nil, err
	}
	for i, raw := range a.Messages {
		if !bytes.HasPrefix(bytes.TrimSpace(raw), []byte("{")) {
			return nil, fmt.Errorf("messages[%d] must be an object, got %s", i, raw)
		}
		message := &v1.ForkMessage{}
		if err := protojson.Unmarshal(raw, message); err != nil {
			return nil, fmt.Errorf("messages[%d]: %w", i, err)
		}
		changes.Messages = append(changes.Messages, message)
	}
	if len(a.Answer) > 0 {
		if !bytes.HasPrefix(bytes.TrimSpace(a.Answer), []byte("{")) {
			return nil, fmt.Errorf("answer must be an object, got %s", a.Answer)
		}
		reply, err := buildAnswer(a.Answer, st.lastPending)
		if err != nil {
			return nil, fmt.Errorf("answer: %w", err)
		}
		changes.Answers = []*v1.Answer{reply}
	}
	resp, err := client.ForkRuntime(ctx, st.runtimeID, atSeq, changes)
	if err != nil {
		return nil, err
	}
	st.forkSource, st.runtimeID = st.runtimeID, resp.GetRuntimeId()
	return map[string]any{"fork_seq": resp.GetForkSeq(), "held": append([]string{}, resp.GetHeldHandleIds()...)}, nil
}

// replay is the replay step: the client's ReplayRuntime of this vector's runtime (which
// stays this vector's runtime), with the step's agents and unrecorded_calls, within the
// 60 s call deadline; its diffs by root handle id (README: Forks and replays).
func replay(ctx context.Context, client *agentruntime.Client, runtimeID string, args json.RawMessage) (map[string]any, error) {
	var a struct {
		Agents          []json.RawMessage `json:"agents"`
		UnrecordedCalls *string           `json:"unrecorded_calls"`
	}
	if err := strictArgs(args, &a); err != nil {
		return nil, err
	}
	changes := &agentruntime.ReplayChanges{}
	var err error
	if changes.Agents, err = agentDefs(a.Agents); err != nil {
		return nil, err
	}
	if a.UnrecordedCalls != nil {
		number, ok := v1.UnrecordedCalls_value[*a.UnrecordedCalls]
		if !ok {
			return nil, fmt.Errorf("unrecorded_calls %q is not a value of UnrecordedCalls", *a.UnrecordedCalls)
		}
		changes.UnrecordedCalls = v1.UnrecordedCalls(number)
	}
	ctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	resp, err := client.ReplayRuntime(ctx, runtimeID, changes)
	if err != nil {
		return nil, err
	}
	diffs := map[string]any{}
	for _, d := range resp.GetDiffs() {
		var pending *v1.Request // a resume answers a wait's or a resume's Request, not a replay's
		diffs[d.GetHandleId()] = map[string]any{
			"changed":        append([]string{}, d.GetChanged()...),
			"recorded":       resultFields(d.GetRecorded(), &pending),
			"replayed":       resultFields(d.GetReplayed(), &pending),
			"recorded_calls": callNames(d.GetRecordedCalls()),
			"replayed_calls": callNames(d.GetReplayedCalls()),
		}
	}
	return map[string]any{"changed_count": resp.GetChangedCount(), "count": len(resp.GetDiffs()), "diffs": diffs}, nil
}

// callNames are the names of a ReplayDiff's calls, in order.
func callNames(calls []*v1.ReplayCall) []string {
	names := []string{}
	for _, call := range calls {
		names = append(names, call.GetName())
	}
	return names
}

// agentDefs reads a list of AgentDef in proto3 JSON (nil for none).
func agentDefs(raws []json.RawMessage) ([]*v1.AgentDef, error) {
	var agents []*v1.AgentDef
	for i, raw := range raws {
		agent := &v1.AgentDef{}
		if err := protojson.Unmarshal(raw, agent); err != nil {
			return nil, fmt.Errorf("agents[%d]: %w", i, err)
		}
		agents = append(agents, agent)
	}
	return agents, nil
}

// integer is a JSON integer (not 1.0, not "1", not null).
func integer(raw json.RawMessage) (int64, error) {
	var value int64
	if err := json.Unmarshal(raw, &value); err != nil || bytes.ContainsAny(raw, ".eE") {
		return 0, fmt.Errorf("must be an integer, got %s", raw)
	}
	return value, nil
}

// listRuntimes follows every page of ListRuntimes (of pageSize each) and says whether this
// vector's runtime is among them and, when it is, its summary's counts, its cut and
// whether it was forked from forkSource (the last fork step's source; "": no fork step).
func listRuntimes(ctx context.Context, client *agentruntime.Client, runtimeID, forkSource string, pageSize int32) (map[string]any, error) {
	outcome := map[string]any{"contains_this_runtime": false}
	token := ""
	for {
		resp, err := client.ListRuntimesPage(ctx, pageSize, token)
		if err != nil {
			return nil, err
		}
		for _, r := range resp.GetRuntimes() {
			if r.GetRuntimeId() == runtimeID {
				outcome["contains_this_runtime"] = true
				outcome["this_runtime"] = map[string]any{
					"handle_count":       r.GetHandleCount(),
					"running_count":      r.GetRunningCount(),
					"suspended_count":    r.GetSuspendedCount(),
					"total_tokens":       r.GetTotalTokens(),
					"total_cost":         costFields(r.GetTotalCost()),
					"fork_seq":           r.GetForkSeq(),
					"forked_from_source": forkSource != "" && r.GetForkedFrom() == forkSource,
				}
			}
		}
		if token = resp.GetNextPageToken(); token == "" {
			return outcome, nil
		}
	}
}

// viewFields is a HandleView as the vectors name it (list and inspect).
func viewFields(h *v1.HandleView) map[string]any {
	return map[string]any{
		"state":           h.GetState().String(),
		"turns":           h.GetTurns(),
		"own_tokens":      h.GetOwnTokens(),
		"total_tokens":    h.GetTotalTokens(),
		"own_usage":       usageFields(h.GetOwnUsage()),
		"total_usage":     usageFields(h.GetTotalUsage()),
		"own_cost":        costFields(h.GetOwnCost()),
		"total_cost":      costFields(h.GetTotalCost()),
		"inherited_usage": usageFields(h.GetInheritedUsage()),
		"inherited_cost":  costFields(h.GetInheritedCost()),
		"tool_calls":      h.GetToolCalls(),
		"pending_kind":    h.GetPendingKind(),
		"inbox_size":      h.GetInboxSize(),
	}
}

// usageFields is a Usage as the vectors name it; an unset one reads as its zeros.
func usageFields(u *v1.Usage) map[string]any {
	return map[string]any{
		"input_tokens":       u.GetInputTokens(),
		"cache_read_tokens":  u.GetCacheReadTokens(),
		"cache_write_tokens": u.GetCacheWriteTokens(),
		"output_tokens":      u.GetOutputTokens(),
		"reasoning_tokens":   u.GetReasoningTokens(),
		"total_tokens":       u.GetTotalTokens(),
		"estimated":          u.GetEstimated(),
	}
}

// costFields is a Cost as the vectors name it; an unset one reads as its zeros.
func costFields(c *v1.Cost) map[string]any {
	return map[string]any{"micros": c.GetMicros(), "currency": c.GetCurrency(), "priced": c.GetPriced()}
}

// poll re-reads Inspect until the step's expect holds; a refused Inspect (NOT_FOUND
// before the handle is spawned) does not hold yet. After pollFor it fails with the last
// reason.
func poll(ctx context.Context, client *agentruntime.Client, runtimeID, handle string, step map[string]json.RawMessage) (map[string]any, error) {
	raw, ok := step["expect"]
	var want map[string]any
	if ok {
		if err := json.Unmarshal(raw, &want); err != nil {
			return nil, fmt.Errorf("bad expect: %w", err)
		}
	}
	if _, hasError := step["expect_error"]; want == nil || hasError {
		return nil, errors.New("a polling inspect needs an expect object and no expect_error")
	}
	deadline := time.Now().Add(pollFor)
	for {
		view, err := client.Inspect(ctx, runtimeID, handle)
		if err == nil {
			outcome := viewFields(view)
			if err = check("expect", normalize(outcome), want); err == nil {
				return outcome, nil
			}
		} else if _, refused := agentruntime.AsError(err); !refused {
			return nil, err
		}
		if time.Now().After(deadline) {
			// %v, not %w: a refusal at the end is the vector's failure, not a step's expected error.
			return nil, fmt.Errorf("still not as expected after polling for %v: %v", pollFor, err)
		}
		time.Sleep(pollEvery)
	}
}

// strictArgs decodes a step's arguments, which must be an object.
func strictArgs(args json.RawMessage, into any) error {
	if !bytes.HasPrefix(bytes.TrimSpace(args), []byte("{")) {
		return fmt.Errorf("the step's arguments must be an object, got %s", args)
	}
	return json.Unmarshal(args, into)
}

// asError turns a refusal of a call made on the generated stub into the *agentruntime.Error
// the thin client's methods return.
func asError(err error) error {
	st := status.Convert(err)
	e := &agentruntime.Error{Code: st.Code(), Message: st.Message()}
	for _, d := range st.Details() {
		if m, ok := d.(proto.Message); ok {
			e.Details = append(e.Details, m)
		}
	}
	return e
}

// parsePageArgs reads a list or transcript step's arguments and replaces a page_token of
// "$next" with next, the token the last step of the same verb returned.
func parsePageArgs(args json.RawMessage, next *string) (pageArgs, error) {
	var a pageArgs
	if !bytes.HasPrefix(bytes.TrimSpace(args), []byte("{")) {
		return a, fmt.Errorf("the step's arguments must be an object, got %s", args)
	}
	if err := json.Unmarshal(args, &a); err != nil {
		return a, err
	}
	if a.PageToken == nextToken {
		if next == nil {
			return a, errors.New("page_token $next, but no earlier step of this verb returned a next_page_token")
		}
		a.PageToken = *next
	}
	return a, nil
}

// verbOf finds the step's one verb key; the README allows exactly one.
func verbOf(step map[string]json.RawMessage) (string, json.RawMessage, error) {
	var found []string
	for _, verb := range verbs {
		if _, ok := step[verb]; ok {
			found = append(found, verb)
		}
	}
	if len(found) != 1 {
		keys := make([]string, 0, len(step))
		for k := range step {
			keys = append(keys, k)
		}
		return "", nil, fmt.Errorf("want exactly one verb of %v, got keys %v", verbs, keys)
	}
	return found[0], step[found[0]], nil
}

// resultFields is the TaskResult as the vectors name it, and remembers a PENDING
// result's Request for the next resume.
func resultFields(r *v1.TaskResult, lastPending **v1.Request) map[string]any {
	if r.GetStatus() == v1.Status_STATUS_PENDING {
		*lastPending = r.GetPending()
	}
	p := r.GetPending()
	callNames := []string{} // not nil: an absent Request has [] names, as in Python
	for _, call := range p.GetCalls() {
		callNames = append(callNames, call.GetName())
	}
	return map[string]any{
		"handle_id":       r.GetHandleId(),
		"text":            r.GetText(),
		"is_error":        r.GetIsError(),
		"status":          r.GetStatus().String(),
		"limit":           r.GetLimit().String(),
		"turns":           r.GetTurns(),
		"total_tokens":    r.GetTotalTokens(),
		"own_tokens":      r.GetOwnTokens(),
		"own_usage":       usageFields(r.GetOwnUsage()),
		"total_usage":     usageFields(r.GetTotalUsage()),
		"own_cost":        costFields(r.GetOwnCost()),
		"total_cost":      costFields(r.GetTotalCost()),
		"inherited_usage": usageFields(r.GetInheritedUsage()),
		"inherited_cost":  costFields(r.GetInheritedCost()),
		"tool_calls":      r.GetToolCalls(),
		"pending": map[string]any{
			"kind":       p.GetKind(),
			"path":       append([]string{}, p.GetPath()...),
			"call_names": callNames,
		},
		"failure": failureFields(r.GetFailure()),
		"output":  outputJSON(r),
		"decoded": decodedFields(r),
	}
}

// outputJSON is the result's output as encoding/json reads it (so numbers compare by
// value), nil (JSON null) when it is unset.
func outputJSON(r *v1.TaskResult) any {
	if r.GetOutput() == nil {
		return nil
	}
	data, err := protojson.Marshal(r.GetOutput())
	if err != nil {
		return "unreadable output: " + err.Error()
	}
	var value any
	if err := json.Unmarshal(data, &value); err != nil {
		return "unreadable output: " + err.Error()
	}
	return value
}

// classification is the vectors' decoded type (README: Expectations, `decoded`).
type classification struct {
	Label      string   `json:"label"`
	Confidence float64  `json:"confidence"`
	Tags       []string `json:"tags"`
}

// decodedFields is the result's output decoded by the client's DecodeOutput into a
// classification, as the vectors name its fields; when it cannot be decoded, the error's
// text (so a `decoded` expectation reports it).
func decodedFields(r *v1.TaskResult) any {
	var c classification
	if err := agentruntime.DecodeOutput(r, &c); err != nil {
		return "DecodeOutput: " + err.Error()
	}
	tags := []any{}
	for _, tag := range c.Tags {
		tags = append(tags, tag)
	}
	return map[string]any{"label": c.Label, "confidence": c.Confidence, "tags": tags}
}

// failureFields is the TaskResult's Failure as the vectors name it; nil (JSON null) when
// the result has none.
func failureFields(f *v1.Failure) any {
	if f == nil {
		return nil
	}
	return map[string]any{
		"reason":      f.GetReason().String(),
		"provider":    f.GetProvider(),
		"http_status": f.GetHttpStatus(),
		"retryable":   f.GetRetryable(),
		"detail":      f.GetDetail(),
	}
}

func checkError(step map[string]json.RawMessage, got *agentruntime.Error) error {
	raw, ok := step["expect_error"]
	if !ok {
		return fmt.Errorf("unexpected error %v", got)
	}
	want, err := parseExpectedError(raw)
	if err != nil {
		return fmt.Errorf("bad expect_error: %w", err)
	}
	if got.CodeName() != want.Code {
		return fmt.Errorf("expected %s, got %v", want.Code, got)
	}
	if want.Limit != nil {
		limit, ok := got.ErrorInfo().GetMetadata()["limit"]
		if !ok {
			limit = "<none>"
		}
		if limit != *want.Limit {
			return fmt.Errorf("expected ErrorInfo limit %s, got %s", *want.Limit, limit)
		}
	}
	return checkDetails(got, want)
}

// parseExpectedError reads an expect_error strictly: an object with a string `code` and,
// when present, a string `limit` and `reason`, a `resource` object of exactly the strings
// `type` and `name`, and `violations`, a list of strings (null is none of these). Any other
// type is a broken vector, the vector's FAIL.
func parseExpectedError(raw json.RawMessage) (expectedError, error) {
	var want expectedError
	var keys map[string]any
	if err := json.Unmarshal(raw, &keys); err != nil || keys == nil {
		return want, fmt.Errorf("expected an object, got %s", raw)
	}
	str := func(key string) (*string, error) {
		value, ok := keys[key]
		if !ok {
			return nil, nil
		}
		if s, ok := value.(string); ok {
			return &s, nil
		}
		return nil, fmt.Errorf("%s must be a string, got %s", key, show(value))
	}
	code, err := str("code")
	if err != nil {
		return want, err
	}
	if code == nil {
		return want, errors.New("missing code")
	}
	want.Code = *code
	if want.Limit, err = str("limit"); err != nil {
		return want, err
	}
	if want.Reason, err = str("reason"); err != nil {
		return want, err
	}
	if value, ok := keys["resource"]; ok {
		object, isObject := value.(map[string]any)
		typ, typeOK := object["type"].(string)
		name, nameOK := object["name"].(string)
		if !isObject || len(object) != 2 || !typeOK || !nameOK {
			return want, fmt.Errorf(`resource must be an object {"type", "name"} of strings, got %s`, show(value))
		}
		want.Resource = &expectedResource{Type: typ, Name: name}
	}
	if value, ok := keys["violations"]; ok {
		list, isList := value.([]any)
		fields := make([]string, 0, len(list))
		for _, item := range list {
			if field, ok := item.(string); ok {
				fields = append(fields, field)
			}
		}
		if !isList || len(fields) != len(list) {
			return want, fmt.Errorf("violations must be a list of strings, got %s", show(value))
		}
		want.Violations = &fields
	}
	return want, nil
}

// checkDetails checks an expect_error's `reason` (the ErrorInfo's, "" when there is none),
// `resource` (the ResourceInfo's type and name) and `violations` (the BadRequest's field
// violations' fields, in order), each only when present: tests/vectors/README.md,
// Expectations; the Python runner's _check_details.
func checkDetails(got *agentruntime.Error, want expectedError) error {
	if want.Reason != nil {
		if reason := got.ErrorInfo().GetReason(); reason != *want.Reason {
			return fmt.Errorf("expected ErrorInfo reason %q, got %q", *want.Reason, reason)
		}
	}
	if want.Resource != nil {
		info := got.ResourceInfo()
		if info == nil {
			return fmt.Errorf("expected ResourceInfo %s, got none", show(want.Resource))
		}
		gotResource := expectedResource{Type: info.GetResourceType(), Name: info.GetResourceName()}
		if gotResource != *want.Resource {
			return fmt.Errorf("expected ResourceInfo %s, got %s", show(want.Resource), show(gotResource))
		}
	}
	if want.Violations != nil {
		request := got.BadRequest()
		if request == nil {
			return fmt.Errorf("expected BadRequest fields %s, got no BadRequest", show(*want.Violations))
		}
		fields := []string{}
		for _, violation := range request.GetFieldViolations() {
			fields = append(fields, violation.GetField())
		}
		if !slices.Equal(fields, *want.Violations) {
			return fmt.Errorf("expected BadRequest fields %s, got %s", show(*want.Violations), show(fields))
		}
	}
	return nil
}

// normalize gives the actual values the types encoding/json decodes the expected ones
// into (float64, []any, map[string]any), so equality is plain DeepEqual.
func normalize(v map[string]any) map[string]any {
	data, err := json.Marshal(v)
	if err != nil {
		panic(err) // only strings, numbers, bools, slices and maps: cannot fail
	}
	var out map[string]any
	if err := json.Unmarshal(data, &out); err != nil {
		panic(err)
	}
	return out
}

// wholeValues are the result fields an expect compares whole (JSON equality), not only
// the keys it names: a wait's `output` and `decoded`.
var wholeValues = map[string]bool{"output": true, "decoded": true}

// check compares only the keys present in want, recursing into objects (but for
// wholeValues at the top), and reports every mismatch in key order (so a failure reads
// the same on every run).
func check(where string, got, want map[string]any) error {
	var bad []string
	for _, key := range slices.Sorted(maps.Keys(want)) {
		path, w := where+"."+key, want[key]
		g, ok := got[key]
		field, isContains := strings.CutSuffix(key, "_contains")
		switch wm, isObject := w.(map[string]any); {
		case isContains && !ok:
			// `<field>_contains`: the actual <field> is a string holding this substring.
			ws, wantString := w.(string)
			gs, gotString := got[field].(string)
			if !wantString {
				bad = append(bad, fmt.Sprintf("%s: expected a string to look for, got %s", path, show(w)))
			} else if !gotString || !strings.Contains(gs, ws) {
				bad = append(bad, fmt.Sprintf("%s: expected a %s containing %s, got %s", path, field, show(w), show(got[field])))
			}
		case !ok:
			bad = append(bad, path+": missing from the result")
		case wholeValues[key] && where == "expect":
			if !reflect.DeepEqual(g, w) {
				bad = append(bad, fmt.Sprintf("%s: expected %s, got %s", path, show(w), show(g)))
			}
		case isObject:
			if gm, ok := g.(map[string]any); !ok {
				bad = append(bad, fmt.Sprintf("%s: expected an object, got %s", path, show(g)))
			} else if err := check(path, gm, wm); err != nil {
				bad = append(bad, err.Error())
			}
		case listOfObjects(g, w):
			// A list of objects (a transcript's `messages`): entry i checks object i, only its keys.
			gl, wl := g.([]any), w.([]any)
			if len(wl) > len(gl) {
				bad = append(bad, fmt.Sprintf("%s: expected at least %d entries, got %d", path, len(wl), len(gl)))
				break
			}
			for i, item := range wl {
				at := fmt.Sprintf("%s[%d]", path, i)
				wi, wok := item.(map[string]any)
				gi, gok := gl[i].(map[string]any)
				if !wok || !gok {
					bad = append(bad, fmt.Sprintf("%s: expected %s, got %s", at, show(item), show(gl[i])))
				} else if err := check(at, gi, wi); err != nil {
					bad = append(bad, err.Error())
				}
			}
		case !reflect.DeepEqual(g, w):
			bad = append(bad, fmt.Sprintf("%s: expected %s, got %s", path, show(w), show(g)))
		}
	}
	if len(bad) == 0 {
		return nil
	}
	return errors.New(strings.Join(bad, "; "))
}

// listOfObjects says both are lists and either holds an object.
func listOfObjects(got, want any) bool {
	gl, gok := got.([]any)
	wl, wok := want.([]any)
	if !gok || !wok {
		return false
	}
	for _, item := range append(slices.Clone(gl), wl...) {
		if _, ok := item.(map[string]any); ok {
			return true
		}
	}
	return false
}

func show(v any) string {
	data, _ := json.Marshal(v)
	return string(data)
}
