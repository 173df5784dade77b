"""The checkpoint catalog on Delta tables (delta_catalog.py)."""
