"""`agentruntime console`: a web console for people, in its own process.

It talks to a runtime only through the public gRPC API (the Python client), with the
credentials of the person signed in, so it shows what that tenant may see and does what that
token's scopes allow. Pages are rendered on the server (Jinja2, every text escaped); one small
script keeps a runtime's tree live from a server-sent event stream that relays Watch."""
