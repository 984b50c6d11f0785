"""One hook point as a stack declares it (the record hooks.py resolves)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Hook:
    """One hook point as the stack declares it."""

    overlay: str
    module: str
    qualname: str
    role: str = "check"
    anchors: tuple[str, ...] = ()

    @property
    def where(self) -> str:
        return f"{self.module}:{self.qualname}"
