"""The IRs: scalar expressions, the Einsummable op and the EinGraph."""
