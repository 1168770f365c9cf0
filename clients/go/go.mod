module github.com/agentruntime/agentruntime/clients/go

go 1.22.0

require (
	github.com/google/uuid v1.6.0
	google.golang.org/genproto/googleapis/rpc v0.0.0-20250115164207-1a7da9e5054f
	google.golang.org/grpc v1.71.3
	google.golang.org/protobuf v1.36.7
)

require (
	golang.org/x/net v0.34.0 // indirect
	golang.org/x/sys v0.29.0 // indirect
	golang.org/x/text v0.21.0 // indirect
)
