"""Spark-side entry points of Cutline: the jobs, their CLI and environment checks."""
