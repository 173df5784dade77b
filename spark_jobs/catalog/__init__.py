"""The checkpoint catalog on Delta tables: their schemas and reads (tables.py), the writer
(delta_catalog.py)."""
