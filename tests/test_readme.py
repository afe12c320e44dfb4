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


def test_readme_torch_snippet_runs_on_the_first_program():
    torch = __import__("pytest").importorskip("torch")
    text = (Path(__file__).parent.parent / "README.md").read_text()
    first, torch_snippet = re.findall(r"```python\n(.*?)```", text, re.S)[:2]
    assert "like=\"torch\"" in torch_snippet
    scope: dict = {}
    exec(compile(first + torch_snippet, "README.md", "exec"), scope)
    X, W, B = scope["X"], scope["W"], scope["B"]
    assert isinstance(scope["out"]["m"], torch.Tensor)
    np.testing.assert_allclose(scope["out"]["m"].numpy(), np.maximum(X @ W + B, 0).max(1), rtol=1e-4)
