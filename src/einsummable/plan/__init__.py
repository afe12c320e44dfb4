"""EinDecomp and its baselines: partitions of every node, placed on a cluster."""
