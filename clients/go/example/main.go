// Command example runs the seed scenario: a scripted coordinator delegates one task to
// a scripted worker, and the coordinator's result carries the whole tree's bill.
//
//	AGENTRUNTIME_ADDR=127.0.0.1:50051 go run ./example
package main

import (
	"context"
	"fmt"
	"log"
	"os"

	"github.com/agentruntime/agentruntime/clients/go/agentruntime"
	v1 "github.com/agentruntime/agentruntime/clients/go/agentruntime/v1"
)

func main() {
	addr := os.Getenv("AGENTRUNTIME_ADDR")
	if addr == "" {
		addr = "127.0.0.1:50051"
	}
	client, err := agentruntime.Dial(addr)
	if err != nil {
		log.Fatal(err)
	}
	defer client.CloseConn()

	// Scripts make the server's embedded model answer, so this runs offline: reply i
	// answers the model call made after i assistant messages.
	coordinator := &v1.AgentDef{
		Name:        "coordinator",
		Description: "splits the work",
		Team:        []string{"worker"},
		Script: &v1.Script{Replies: []*v1.ScriptedReply{
			{ToolCalls: []*v1.ScriptedToolCall{{Name: "task", ArgumentsJson: `{"agent": "worker", "prompt": "look around"}`}}, Tokens: 100},
			{Text: "coordinated", Tokens: 100},
		}},
	}
	worker := &v1.AgentDef{
		Name:        "worker",
		Description: "does the work",
		Script:      &v1.Script{Replies: []*v1.ScriptedReply{{Text: "found it", Tokens: 400}}},
	}

	ctx := context.Background()
	runtimeID, err := client.CreateRuntime(ctx, []*v1.AgentDef{coordinator, worker}, "")
	if err != nil {
		log.Fatal(err)
	}
	result, err := client.Run(ctx, runtimeID, "coordinator", "map the repo")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("status=%s total_tokens=%d own_tokens=%d turns=%d\n",
		result.GetStatus(), result.GetTotalTokens(), result.GetOwnTokens(), result.GetTurns())

	// A refused call is an *agentruntime.Error with the server's google.rpc details.
	_, err = client.Spawn(ctx, runtimeID, "nobody", "root", nil)
	if e, ok := agentruntime.AsError(err); ok {
		info := e.ResourceInfo()
		fmt.Printf("spawn nobody: code=%s resource=%s/%s\n", e.CodeName(), info.GetResourceType(), info.GetResourceName())
	}
}
