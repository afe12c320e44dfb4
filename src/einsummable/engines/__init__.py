"""Engines: kernels and executors. Only compile.py and the CLI import this package."""
