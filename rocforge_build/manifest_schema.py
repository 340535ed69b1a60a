"""The build manifest (`rocforge-manifest.toml`) as a store: its file name, its size bound and the
schema every reader holds it to.  It sits with the shared helpers because forge writes it while
discover, measure, ship and ownership read it back.

`rocforge env` reads manifests on every shell start-up, so this is stdlib only (no pathlib).
"""

from __future__ import annotations

from rocforge_build import schema
from rocforge_build.errors import ConfigError

MANIFEST = "rocforge-manifest.toml"
MANIFEST_MAX = 4 << 20  # a manifest is a few kB: 4 MiB is far past any rocforge writes

# What pipeline.write_manifest writes and every reader relies on, checked once where a manifest is
# read (`checked_manifest`): a manifest is a file a user can edit, copy or be handed.  Names in
# export_env are left to the env emitter, which leaves a bad one out with a warning and keeps the
# rest of the build (tests/test_trust_emit.py); its values must be text, as plan.export_env holds.
# Every other text field is one line (no line break, NUL, escape or other control character):
# doctor and listings print them for people, and rocforge's recipes cannot put one there.  The
# exports and their reasons are judged entry by entry where they are used (a bad one is left out
# of `rocforge env` with a warning, a reason printed on one line), so a build keeps its good ones.
_TEXT = schema.Str(empty=True, one_line=True)
_EXPORTED = schema.Str(empty=True)
_SCALAR_TABLE = schema.TableOf(schema.Scalar())


class RecipeName(schema.Spec):
    """A recipe's name as a file name and a word of use.toml: letters, digits, '.', '_' and '-',
    not starting with '.' or '-' (never a path, a line break or a Unicode separator)."""

    what = "a plain recipe name (letters, digits, '.', '_' and '-')"
    _OK = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-")

    def take(self, value, path):
        if (not isinstance(value, str) or not value or value[0] in ".-" or len(value) > 200
                or not set(value) <= self._OK):
            raise schema.Bad(path, f"{value!r:.160} is not {self.what}")
        return value


class CMakeTarget(schema.Spec):
    """A CMake target name as --cmake-target takes it (argtypes.cmake_target_problem): an upgrade
    asks ninja for the manifest's `asked_targets` again, so an edited one is held to the flag's rule."""

    what = "a CMake target name"

    def take(self, value, path):
        from rocforge_build import argtypes  # only for a build that named targets: env stays light

        problem = argtypes.cmake_target_problem(value)
        if problem:
            raise schema.Bad(path, problem[:200])
        return value


MANIFEST_SCHEMA = schema.Record({
    "recipe": schema.Record({"name": RecipeName(), "file": schema.Optional(_TEXT)}),
    "target": schema.Str(one_line=True, empty=True),  # "": a CPU or Vulkan build for no GPU target
    "backend": schema.Str(one_line=True),
    "stamp": schema.Optional(schema.Str(one_line=True)),
    "prefix": schema.Optional(schema.AbsPath()),
    "built_at": schema.Optional(_TEXT),
    "source": schema.Optional(schema.Record({
        "version": schema.Optional(_TEXT), "commit": schema.Optional(_TEXT),
        "location": schema.Optional(_TEXT), "kind": schema.Optional(_TEXT)}), {}),
    "toolchain": schema.Optional(schema.Record({
        "kind": schema.Optional(schema.Str(one_line=True)), "rocm_path": schema.Optional(_TEXT)}), {}),
    "outputs": schema.Optional(schema.ListOf(schema.Str(one_line=True)), []),
    # verify tools built on request (libexec/test-backend-ops): rocforge verify runs them
    "verify_tools": schema.Optional(schema.ListOf(schema.Str(one_line=True)), []),
    "env": schema.Optional(_SCALAR_TABLE, {}),
    "runtime_env": schema.Optional(schema.EnvTable(), {}),
    "export_env": schema.Optional(schema.TableOf(_EXPORTED), {}),
    "export_env_reasons": schema.Optional(schema.TableOf(_EXPORTED), {}),
    "dependencies": schema.Optional(schema.ListOf(schema.Record({})), []),
    # the substitute key's canonical JSON (forge/substitute_key.py) and its digest
    "substitute_key": schema.Optional(schema.Record({
        "digest": schema.Str(one_line=True), "document": schema.Str(one_line=True)})),
    # every file and link rocforge installed, relative to the prefix (replace.installed_files)
    "installed": schema.Optional(schema.ListOf(schema.Str(one_line=True)), []),
    # --cmake-target as asked (absent: written before rocforge recorded it), and the rocforge
    # command whose own build this is (none: the user's)
    "asked_targets": schema.Optional(schema.ListOf(CMakeTarget(), most=256)),  # argtypes.CMAKE_TARGETS_MAX
    "made_for": schema.Optional(schema.Str(one_line=True)),
    # where a substituted build came from (substitute/pull.py)
    "substituted": schema.Optional(schema.Record({})),
})


MANIFEST_HINT = ("rocforge wrote this file when it built the prefix and reads every field back: move "
                 "the prefix aside and build it again (`rocforge build`)")


def checked_manifest(data: object, path: str) -> dict:
    """A manifest's TOML held to MANIFEST_SCHEMA, or a ConfigError naming the file and the field."""
    return schema.check(data, MANIFEST_SCHEMA, str(path), ConfigError, MANIFEST_HINT)
