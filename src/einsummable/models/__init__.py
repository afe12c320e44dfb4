"""Models written in the Einsummable language."""
