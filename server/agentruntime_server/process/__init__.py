"""How the server process runs, apart from what it serves: its event loop (uvloop or asyncio's),
its garbage collector's tuning for a long-lived server, and the processes beside it that check
schemas too costly for the event loop (schema_judges.py)."""
