// Command consumer is the consumer test's program (make consumer-test copies it into a
// fresh module outside the source tree that requires the released module): it runs a
// scripted agent against the server at AGENTRUNTIME_ADDR, prints the result's figures and
// exits non-zero unless they are the expected ones, then checks that Inspect of a handle
// that does not exist is a NOT_FOUND *agentruntime.Error naming it in its ResourceInfo.
// It uses only what Go 1.22 has (no range over functions).
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/agentruntime/agentruntime/clients/go/agentruntime"
	v1 "github.com/agentruntime/agentruntime/clients/go/agentruntime/v1"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "consumer: FAIL:", err)
		os.Exit(1)
	}
	fmt.Println("consumer: ok")
}

func run() error {
	addr := os.Getenv("AGENTRUNTIME_ADDR")
	if addr == "" {
		return errors.New("AGENTRUNTIME_ADDR is not set")
	}
	client, err := agentruntime.Dial(addr, agentruntime.WithTimeout(30*time.Second))
	if err != nil {
		return err
	}
	defer client.CloseConn()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	greeter := &v1.AgentDef{
		Name:        "greeter",
		Description: "answers at once",
		Script:      &v1.Script{Replies: []*v1.ScriptedReply{{Text: "hello from the release", Tokens: 11}}},
	}
	runtimeID, err := client.CreateRuntime(ctx, []*v1.AgentDef{greeter}, "")
	if err != nil {
		return fmt.Errorf("CreateRuntime: %w", err)
	}
	defer client.DeleteRuntime(context.Background(), runtimeID, true) // best effort: the server may be shared

	result, err := client.Run(ctx, runtimeID, "greeter", "say hello")
	if err != nil {
		return fmt.Errorf("Run: %w", err)
	}
	fmt.Printf("result: handle=%s status=%s text=%q turns=%d own_tokens=%d total_tokens=%d\n",
		result.GetHandleId(), result.GetStatus(), result.GetText(), result.GetTurns(),
		result.GetOwnTokens(), result.GetTotalTokens())
	if result.GetStatus() != v1.Status_STATUS_DONE || result.GetText() != "hello from the release" ||
		result.GetTurns() != 1 || result.GetOwnTokens() != 11 || result.GetTotalTokens() != 11 {
		return errors.New("want STATUS_DONE, \"hello from the release\", 1 turn, 11 own and 11 total tokens")
	}

	_, err = client.Inspect(ctx, runtimeID, "root/nobody.1")
	refused, ok := agentruntime.AsError(err)
	if !ok || !agentruntime.IsNotFound(err) {
		return fmt.Errorf("Inspect of a missing handle: want a NOT_FOUND *agentruntime.Error, got %v", err)
	}
	info := refused.ResourceInfo()
	fmt.Printf("inspect root/nobody.1: code=%s resource=%s %s\n", refused.CodeName(), info.GetResourceType(), info.GetResourceName())
	if info == nil || info.GetResourceName() == "" {
		return errors.New("the NOT_FOUND carries no ResourceInfo naming what was not found")
	}
	return nil
}
