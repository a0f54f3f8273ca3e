"""Plumbing every trainer shares: run directories and their lock, the run lifecycle, config
files, checkpoints, metric sinks, stop signals, thread pools and errors. Imports no other klppo
package."""
