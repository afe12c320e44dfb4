"""The user-facing builders: they only append nodes to an EinGraph."""
