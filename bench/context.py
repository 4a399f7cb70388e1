"""What every benchmark section gets: the mode, a scratch directory, and the peers it may start."""

from __future__ import annotations

from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class BenchContext:
    quick: bool  # quick mode: the whole run under 3 minutes, fewer samples
    workdir: Path  # scratch space of this run; each section makes its own subdirectory
    cleanup: ExitStack = field(default_factory=ExitStack)  # peers and threads to stop at the end

    def dir(self, name: str) -> Path:
        path = self.workdir / name
        path.mkdir(parents=True, exist_ok=True)
        return path

    def samples(self, quick: int, full: int) -> int:
        return quick if self.quick else full
