"""Output: what the runtime asks of a sink (sink.py), and the Delta sink, two-phase and fenced
per attempt (delta_sink.py)."""
