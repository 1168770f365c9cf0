"""The HTTP/1.1 client of the runtime's two hot outbound paths: model calls (providers/) and
http tools (tools/http.py). Each has its own `HttpClient`: its own keep-alive pool, and for
the tools a resolver under the egress policy.

Why not aiohttp, which this replaced: on the 2-core development machine aiohttp 3.14 spent
70-100 µs of CPU a request at 20 requests in flight, a third of the server's whole cost per
model turn then; this client spends 20-37 µs, because a request here is one write and one
future, with no task, no timer of its own, no cookie jar, tracing hooks or redirect loop
(`bench/http_clients.py`; docs/performance.md). pyreqwest (Rust) was as cheap in an idle
loop, and no cheaper than aiohttp in a busy one: its replies cross threads.
The protocol itself is not ours: responses are parsed by llhttp (Node's parser, through
MagicStack's `httptools`), TLS is the `ssl` module's, connections are the event loop's.

What it does, and no more: POST (or any method) with a body of known length, over
`http://` or `https://` (certificates verified against the system's roots, which
SSL_CERT_FILE / SSL_CERT_DIR extend); responses by Content-Length, chunked, or until the
connection closes; 1xx interim responses skipped; gzip and deflate bodies decoded (not
asked for: `Accept-Encoding: identity` is sent); a bounded body (the rest is never read);
one deadline for the whole exchange (a free connection, connecting, sending, the reply);
keep-alive connections reused newest first and dropped after `keepalive` seconds idle;
at most `pool_size` connections open; through an HTTP proxy's CONNECT tunnel when one is
given (http/proxy.py: the model client takes HTTPS_PROXY, HTTP_PROXY and NO_PROXY). No
redirects are followed and no cookie is kept: neither belongs on these paths."""

from .client import HttpClient, system_resolver
from .wire import (
    BadReply,
    BodyLimit,
    ConnectFailed,
    ConnectionLost,
    HttpError,
    ReplyTimeout,
    Resolver,
    Response,
    encode_headers,
)

__all__ = [
    "BadReply",
    "BodyLimit",
    "ConnectFailed",
    "ConnectionLost",
    "HttpClient",
    "HttpError",
    "ReplyTimeout",
    "Resolver",
    "Response",
    "encode_headers",
    "system_resolver",
]
