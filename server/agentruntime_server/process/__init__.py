"""How the server process runs, apart from what it serves: its event loop (uvloop or asyncio's)
and its garbage collector's tuning for a long-lived server."""
