"""agentruntime: generated gRPC stubs (agentruntime.v1) and a thin client (agentruntime.client)."""
