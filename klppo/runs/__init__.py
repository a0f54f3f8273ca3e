"""Run directories, metrics sinks, seeding, sweeps."""
