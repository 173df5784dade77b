"""Dagster definitions for Cutline: assets, jobs, sensors, schedules, checks, resources."""
