"""Cutline's example jobs, in a package of their own (see README.md)."""
