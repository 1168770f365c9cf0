"""Every bound the runtime puts on what it is sent: the fixed ones as constants, the ones an
operator may change as `Limits` (filled from the settings). docs/limits.md."""

from __future__ import annotations

from dataclasses import dataclass

KIB = 1024
MIB = 1024 * KIB

# Definitions (checked at CreateRuntime).
MAX_AGENTS = 100
MAX_TOOLS_PER_AGENT = 128
MAX_TEAM = 100
MAX_GUARDRAILS = 128
MAX_SCRIPT_REPLIES = 1000
MAX_NAME_CHARS = 64
MAX_DESCRIPTION_BYTES = 16 * KIB
MAX_INSTRUCTIONS_BYTES = 256 * KIB
MAX_MODEL_CHARS = 256
MAX_SCHEMA_BYTES = 64 * KIB  # a tool's input_schema, as compact JSON
MAX_SCHEMA_DEPTH = 32
# A JSON value sent to clients in a google.protobuf.Value or Struct (a typed answer, a pending
# Request's data): a client's protobuf parser stops at 100 levels of messages, and each object
# level takes three (a Value, its Struct, the map entry), below the reply's own few.
MAX_VALUE_DEPTH = 32
# Nodes of a schema with every reference expanded (a reference back into its own path counts
# once): what one validation may have to walk, whatever the arguments.
MAX_SCHEMA_EXPANDED_NODES = 10_000
MAX_PATTERN_CHARS = 1024  # completion.must_match and every schema pattern
MAX_URL_CHARS = 2048
MAX_HEADERS = 32
MAX_MCP_SERVERS = 8  # per agent
# What a runtime keeps of its MCP servers' listings, over all its agents (descriptions, and
# schemas as JSON): as much as a CreateRuntime request holds by default, so listings do not
# make a runtime's definitions larger than a caller could send them (each listing is also read
# to 4 MiB at most: tools/mcp_limits.py).
MAX_LISTED_BYTES = 4 * MIB
MAX_HEADER_NAME_CHARS = 128
MAX_HEADER_VALUE_BYTES = 8 * KIB
MAX_TOOL_TIMEOUT = 600.0  # seconds
MAX_WALL_TIME = 30 * 86400.0
MAX_SCRIPT_DELAY = 600.0
MAX_STREAM_CHUNK_CHARS = 100_000  # a scripted reply's streamed piece
MAX_STREAM_PAUSE = 60.0  # between a scripted reply's streamed pieces
MAX_WAIT_TIMEOUT = 86400.0
MAX_CLOSE_GRACE = 600.0
MIN_HEARTBEAT = 1.0
MAX_HEARTBEAT = 30 * 86400.0
MAX_ARGUMENTS_BYTES = 256 * KIB  # a scripted tool call's arguments
MAX_OUTPUT_TOKENS = 10_000_000  # AgentDef.max_output_tokens

# Numbers from outside: what one model reply may report. More is a provider fault, and
# keeps every cumulative figure far below a store's 64-bit integers.
MAX_REPLY_TOKENS = 100_000_000

# Ids a caller sends to address things (longer ids cannot exist).
MAX_ID_CHARS = 512


@dataclass(frozen=True)
class Limits:
    """The bounds an operator sets (see Settings); the defaults are the settings' defaults."""

    max_text_bytes: int = 256 * KIB  # a Post, a Wake prompt, a Resume output, a tool's output
    max_inbox_bytes: int = 1 * MIB
    max_handles: int = 10_000  # per runtime
    request_id_ttl: float = 86400.0  # seconds a call's request id answers its repeats, at least
    request_ids_kept: int = 1000  # per runtime: the answers of its newest calls with request ids
    max_concurrent_model_calls: int = 64  # the server's, over all runtimes


@dataclass(frozen=True)
class Quotas:
    """The quotas of a tenant (AGENTRUNTIME_QUOTA_*, or its own in the tokens file); 0: no quota.
    Counted by tenancy/."""

    runtimes: int = 0
    running_handles: int = 0
    tokens_per_day: int = 0
    handles_per_minute: int = 0
    store_bytes: int = 0
    cost_per_day: int = 0  # micro-units of the price table's currency (priced calls count)
    watch_streams: int = 0  # Watch streams open at once, those this process follows a runtime for
    worker_streams: int = 0  # ServeTools streams open at once (registered workers)
