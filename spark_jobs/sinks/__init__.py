"""Output: the Delta sink, two-phase and fenced per attempt (delta_sink.py)."""
