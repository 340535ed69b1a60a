"""Shell emission for a `Resolution`: bash, zsh, fish, json and dotenv.

Scripts compute path lists when they are sourced: an entry already in the list stays where it
is, a missing one goes in front, so sourcing twice changes nothing and the user's entries are
kept (the same rule as `resolver.prepend_list`, which gives json/dotenv their final strings).
Every value is single-quoted, so any path (spaces, quotes, `$`, backslashes) round-trips.
Reasons become one-line comments; names and values pass `shellsafe.check_env` first (a build
manifest the resolver read may have been edited).  Stdlib only: this runs on every shell start-up.
"""

from __future__ import annotations

from rocforge_build.discover import envwarnings
from rocforge_build.discover.resolver import PATH_VARS, Resolution
from rocforge_build.errors import UsageError
from rocforge_build.shellsafe import check_env, comment, fish_quote, sh_quote

SHELLS = ("bash", "zsh", "fish", "json", "dotenv")
_ORDER = ("ROCM_PATH", "HIP_PATH", "HIP_PLATFORM", "HIP_CLANG_PATH", "HIP_DEVICE_LIB_PATH",
          "ROCR_VISIBLE_DEVICES", "HSA_OVERRIDE_GFX_VERSION", "ROCBLAS_USE_HIPBLASLT")


def ordered_vars(res: Resolution) -> list[str]:
    keys = [k for k in _ORDER if k in res.env]
    keys += sorted(k for k in res.env if k not in _ORDER and k not in PATH_VARS)
    keys += [k for k in PATH_VARS if k in res.env]
    return keys


def _reason(res: Resolution, key: str) -> str | None:
    d = res.decision(key)
    return d.reason if d else None


def _header(res: Resolution, shell: str) -> list[str]:
    inst = res.rocm
    stack = (f"ROCm {inst.path} ({inst.layout} {inst.version or 'version unknown'})" if inst else
             "no ROCm installation found: only builds that need none (CPU, Vulkan) are set up")
    lines = [comment(f"rocforge env --shell {shell}: {stack}, target {res.target or 'none'}")]
    for key in ("rocm", "target", "builds", "builds on PATH", "builds not on PATH"):
        reason = _reason(res, key)
        if reason:
            lines.append(comment(f"{key}: {reason}"))
    return lines


def _warnings(res: Resolution) -> list[str]:
    return envwarnings.as_comments(res.warnings)


def _check_value(key: str, value: str | None) -> None:
    """The last check before a name and value are printed: whatever reached the resolution
    (a ROCm path, a build's export) must be a plain name and a one-line value."""
    check_env(key, value, "rocforge env would print")


class _Syntax:
    """How one shell spells the four statements a script needs."""

    def __init__(self, quote, prepend, set_, unset, after_prepend=None):
        self.quote, self.prepend, self.set, self.unset = quote, prepend, set_, unset
        self.after_prepend = after_prepend


def _posix_prepend(key: str, q: str) -> list[str]:
    return [f'case ":${{{key}-}}:" in *:{q}:*) ;; *) {key}={q}"${{{key}:+:${{{key}}}}}" ;; esac']


def _fish_prepend(key: str, q: str) -> list[str]:
    return [f"if not contains -- {q} ${key}", f"    set -gx {key} {q} ${key}", "end"]


_POSIX = _Syntax(sh_quote, _posix_prepend, lambda k, q: f"export {k}={q}",
                 lambda k: f"unset {k}", after_prepend=lambda k: [f"export {k}"])
_FISH = _Syntax(fish_quote, _fish_prepend, lambda k, q: f"set -gx {k} {q}",
                lambda k: f"set -q {k}; and set -e {k}")


def _render_script(res: Resolution, shell: str, syntax: _Syntax) -> str:
    out = _header(res, shell)
    for key in ordered_vars(res):
        reason = _reason(res, key)
        if reason:
            out.append(comment(f"{key}: {reason}"))
        if key in res.prepend:
            for entry in reversed(res.prepend[key]):
                _check_value(key, entry)
                out += syntax.prepend(key, syntax.quote(entry))
            if syntax.after_prepend:
                out += syntax.after_prepend(key)
            continue
        value = res.env[key]
        if value is None:
            _check_value(key, None)
            out.append(syntax.unset(key))
        else:
            _check_value(key, value)
            out.append(syntax.set(key, syntax.quote(value)))
    out += _warnings(res)
    return "\n".join(out) + "\n"


def render_posix(res: Resolution, shell: str = "bash") -> str:
    return _render_script(res, shell, _POSIX)


def render_fish(res: Resolution) -> str:
    return _render_script(res, "fish", _FISH)


def render_json(res: Resolution) -> str:
    import json

    for key in ordered_vars(res):
        _check_value(key, None)
    return json.dumps({k: res.env[k] for k in ordered_vars(res)}, indent=2) + "\n"


def render_dotenv(res: Resolution) -> str:
    """`KEY=value` lines with literal values (Docker/Podman `--env-file` semantics: no quoting,
    no expansion); variables to unset are listed as comments, since the format cannot unset."""
    out = _header(res, "dotenv")
    for key in ordered_vars(res):
        value = res.env[key]
        if value is None:
            _check_value(key, None)
            out.append(comment(f"unset {key}: {_reason(res, key) or ''}"))
            continue
        _check_value(key, value)
        out.append(f"{key}={value}")
    out += _warnings(res)
    return "\n".join(out) + "\n"


def check_lists(res: Resolution) -> None:
    """A directory with ':' in it cannot go on PATH-like lists: ':' separates their entries, so
    it would become two relative entries (directories looked up from wherever the user is: a
    hijack risk), and fish, which splits PATH on ':', would add it again on every source."""
    for key, entries in res.prepend.items():
        for entry in entries:
            if ":" in entry:
                raise UsageError(
                    f"{key} would get {entry!r}, which contains ':' (the {key} separator); "
                    "rocforge refuses ROCm and prefix paths with ':'",
                    "rename the directory, or make a link without ':' to it and pass that "
                    "(e.g. ln -s 'DIR:X' /opt/rocm-x; rocforge env --rocm /opt/rocm-x)")


def render(res: Resolution, shell: str) -> str:
    check_lists(res)
    if shell in ("bash", "zsh"):
        return render_posix(res, shell)
    if shell == "fish":
        return render_fish(res)
    if shell == "json":
        return render_json(res)
    if shell == "dotenv":
        return render_dotenv(res)
    raise UsageError(f"unknown shell {shell!r}", f"choose one of {', '.join(SHELLS)}")
