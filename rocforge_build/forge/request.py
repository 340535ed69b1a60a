"""What a user (or bisect, upgrade, verify) asks to build: the one input of the build pipeline.

The environment is part of the request, resolved once when it is made: the stamp covers it and
every process of the build runs with it, so a caller that names its own (`bisect --nightlies`,
`nightly install --gate`) builds with what it named, not with this process's environment.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType


@dataclass(frozen=True, kw_only=True)
class Request:
    recipe: str  # a packaged recipe's name or a recipe file
    target: str | None  # a GPU target (gfx1151); None or "": a CPU or Vulkan build for no GPU
    backend: str | None = None  # None: the recipe's `[[default]]` rules choose
    ref: str | None = None
    source: str | None = None
    prefix: str | None = None  # None: the default prefix in the builds directory
    jobs: int | None = None
    force: bool = False
    no_cache: bool = False
    distribute: bool = False
    build_targets: tuple[str, ...] = ()  # CMake targets only (--cmake-target); () for all
    # None: this process's environment, copied when the request is made
    environ: Mapping[str, str] = field(default=None, hash=False)  # type: ignore[assignment]
    rocm: str | None = None  # --rocm: the ROCm installation to build with
    # "auto": ask the configured substitute stores first; "off": --no-substitutes; "only":
    # --substitute-only (pull or fail, never compile)
    substitutes: str = "auto"
    # whose prefix this is: None for the user's own build (`build`, `upgrade`); else the rocforge
    # command that builds there for itself ("reference", "tune", "bisect").  A build replaces only
    # a build of its own kind or, for the user's, anything rocforge made (pipeline.owner_problem).
    made_for: str | None = None
    # the configuration (defaults with the user's file over them), read once when the request is
    # made, as the environment is: planning reads this snapshot, never the file again
    settings: Mapping[str, object] = field(default=None, hash=False, compare=False)  # type: ignore[assignment]

    def __post_init__(self) -> None:
        environ = os.environ if self.environ is None else self.environ
        object.__setattr__(self, "environ", MappingProxyType(dict(environ)))
        object.__setattr__(self, "build_targets", tuple(self.build_targets))
        if self.settings is None:
            from rocforge_build import config

            object.__setattr__(self, "settings", MappingProxyType(config.effective()))

    def for_dependency(self, recipe: str, backend: str | None) -> Request:
        """The request of a `[[depends]]` recipe: same target, parallelism and environment."""
        return Request(recipe=recipe, target=self.target, backend=backend, jobs=self.jobs,
                       no_cache=self.no_cache, distribute=self.distribute,
                       environ=self.environ, rocm=self.rocm, substitutes=self.substitutes,
                       made_for=self.made_for, settings=self.settings)
