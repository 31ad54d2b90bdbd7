"""The one exception type the format layer raises for a bad or unsupported GGUF file.

Every message names the file (when there is one) and the problem, so that a user who
points vLLM at a broken or unsupported file learns which file and what to do.
"""

from __future__ import annotations

import os


class GGUFError(ValueError):
    """A GGUF file (or a tensor in it) is malformed, truncated or unsupported."""

    def __init__(self, message: str, path: str | os.PathLike | None = None) -> None:
        self.path = None if path is None else os.fspath(path)
        self.reason = message
        text = message if self.path is None else f"{self.path}: {message}"
        super().__init__(text)
