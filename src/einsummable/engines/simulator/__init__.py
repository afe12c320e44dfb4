"""The simulator: a TaskGraph replayed on a modelled Cluster, nothing computed.

``simulate.run`` prices each task (hardware/cost.py) and replays the graph (``replay``);
``cluster.run`` does the same for a machine-level graph of a cluster's shares.
"""
