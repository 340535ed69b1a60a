"""The small values a `Plan` holds, each frozen and typed where it crosses from planning to the
pipeline, the printed plan and the manifest: a -D option, an expected output, the private venv.
Each says itself as JSON exactly as the plan and manifest always recorded it."""

from __future__ import annotations

from dataclasses import dataclass


def _evidence(evidence: tuple[str, ...]) -> dict:
    return {"evidence": list(evidence)} if evidence else {}


@dataclass(frozen=True, kw_only=True)
class CMakeOption:
    """`-D{name}={value}`: why (`reason`) and which fact made its rule hold (`because`)."""

    name: str
    value: str
    reason: str | None = None
    because: str | None = None
    evidence: tuple[str, ...] = ()

    def to_json(self) -> dict:
        return {"name": self.name, "value": self.value, "reason": self.reason, "because": self.because,
                **_evidence(self.evidence)}

    @property
    def define(self) -> str:
        return f"-D{self.name}={self.value}"


@dataclass(frozen=True, kw_only=True)
class Output:
    """A file (a glob below the prefix) the install must hold, with the recipe's reason."""

    path: str
    reason: str | None = None
    because: str | None = None
    evidence: tuple[str, ...] = ()

    def to_json(self) -> dict:
        return {"path": self.path, "reason": self.reason, "because": self.because, **_evidence(self.evidence)}


@dataclass(frozen=True, kw_only=True)
class Venv:
    """The recipe's private virtual environment in the work dir: where, what it installs, how."""

    path: str
    requirements: tuple[str, ...]
    packages: tuple[str, ...]
    commands: tuple[tuple[str, ...], ...]
    reason: str
    evidence: tuple[str, ...] = ()

    def to_json(self) -> dict:
        return {"path": self.path, "requirements": list(self.requirements), "packages": list(self.packages),
                "commands": [list(c) for c in self.commands], "reason": self.reason,
                **_evidence(self.evidence)}
