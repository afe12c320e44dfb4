"""The plan's predictions, which the report reads: bytes and flops per block (traffic), the step
time (summary, overlap), the memory peak (memory) and the report's figures (figures)."""
