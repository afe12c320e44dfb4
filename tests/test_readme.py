"""The README's first program runs as written."""

import re
from pathlib import Path

import numpy as np


def test_readme_first_program_runs():
    text = (Path(__file__).parent.parent / "README.md").read_text()
    code = re.search(r"```python\n(.*?)```", text, re.S).group(1)
    scope: dict = {}
    exec(compile(code, "README.md", "exec"), scope)
    X, W, B = scope["X"], scope["W"], scope["B"]
    m = np.maximum(X @ W + B, 0).max(1)
    np.testing.assert_allclose(scope["out"]["m"], m, rtol=1e-4)
    assert scope["out"]["dw"].shape == (256, 128)
