"""The TaskGraph IR and the lowering from (EinGraph, Plan)."""
