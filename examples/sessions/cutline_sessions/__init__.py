"""A user's package of Cutline jobs (see README.md)."""
