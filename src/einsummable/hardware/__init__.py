"""The hardware model: the cluster the planner plans for and the simulator simulates, and its calibration."""
