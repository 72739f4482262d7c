"""The trace simulator: capacity model, per-rung policies, events."""
