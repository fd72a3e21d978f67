"""Orchestration functions: they take the orchestrator `o` and submit tasks through it."""
