"""Retention GC (gc.py) and state compaction requests (compaction.py)."""
