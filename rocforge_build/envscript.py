"""Shell emission for a `Resolution`: bash, zsh, fish, json and dotenv.

Scripts compute path lists when they are sourced: an entry already in the list stays where it
is, a missing one goes in front, so sourcing twice changes nothing and the user's entries are
kept (the same rule as `resolver.prepend_list`, which gives json/dotenv their final strings).
Every value is single-quoted, so any path (spaces, quotes, `$`, backslashes) round-trips.
Reasons become comments.  Stdlib only: this runs on every shell start-up.
"""

from __future__ import annotations

from rocforge_build.errors import UsageError
from rocforge_build.resolver import PATH_VARS, Resolution

SHELLS = ("bash", "zsh", "fish", "json", "dotenv")
_ORDER = ("ROCM_PATH", "HIP_PATH", "HIP_PLATFORM", "HIP_CLANG_PATH", "HIP_DEVICE_LIB_PATH",
          "ROCR_VISIBLE_DEVICES", "HSA_OVERRIDE_GFX_VERSION", "ROCBLAS_USE_HIPBLASLT")


def ordered_vars(res: Resolution) -> list[str]:
    keys = [k for k in _ORDER if k in res.env]
    keys += sorted(k for k in res.env if k not in _ORDER and k not in PATH_VARS)
    keys += [k for k in PATH_VARS if k in res.env]
    return keys


def sh_quote(value: str) -> str:
    """POSIX single quotes (bash, zsh): only `'` needs care."""
    return "'" + value.replace("'", "'\\''") + "'"


def fish_quote(value: str) -> str:
    """fish single quotes: `\\` and `'` are the only escapes."""
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _comment(text: str) -> str:
    return "# " + " ".join(str(text).split())


def _reason(res: Resolution, key: str) -> str | None:
    d = res.decision(key)
    return d.reason if d else None


def _header(res: Resolution, shell: str) -> list[str]:
    inst = res.rocm
    lines = [_comment(f"rocforge env --shell {shell}: ROCm {inst.path} ({inst.layout} "
                      f"{inst.version or 'version unknown'}), target {res.target or 'none'}")]
    for key in ("rocm", "target", "builds"):
        reason = _reason(res, key)
        if reason:
            lines.append(_comment(f"{key}: {reason}"))
    return lines


def _warnings(res: Resolution) -> list[str]:
    return [_comment(f"warning: {w}") for w in res.warnings]


def _check_value(key: str, value: str) -> None:
    if "\n" in value or "\0" in value:
        raise UsageError(f"{key} would contain a newline or NUL byte: {value!r}",
                         "rename the directory; environment values cannot carry it safely")


def render_posix(res: Resolution, shell: str = "bash") -> str:
    out = _header(res, shell)
    for key in ordered_vars(res):
        reason = _reason(res, key)
        if reason:
            out.append(_comment(f"{key}: {reason}"))
        if key in res.prepend:
            for entry in reversed(res.prepend[key]):
                _check_value(key, entry)
                q = sh_quote(entry)
                out.append(f'case ":${{{key}-}}:" in *:{q}:*) ;; '
                           f'*) {key}={q}"${{{key}:+:${{{key}}}}}" ;; esac')
            out.append(f"export {key}")
            continue
        value = res.env[key]
        if value is None:
            out.append(f"unset {key}")
        else:
            _check_value(key, value)
            out.append(f"export {key}={sh_quote(value)}")
    out += _warnings(res)
    return "\n".join(out) + "\n"


def render_fish(res: Resolution) -> str:
    out = _header(res, "fish")
    for key in ordered_vars(res):
        reason = _reason(res, key)
        if reason:
            out.append(_comment(f"{key}: {reason}"))
        if key in res.prepend:
            for entry in reversed(res.prepend[key]):
                _check_value(key, entry)
                q = fish_quote(entry)
                out.append(f"if not contains -- {q} ${key}")
                out.append(f"    set -gx {key} {q} ${key}")
                out.append("end")
            continue
        value = res.env[key]
        if value is None:
            out.append(f"set -q {key}; and set -e {key}")
        else:
            _check_value(key, value)
            out.append(f"set -gx {key} {fish_quote(value)}")
    out += _warnings(res)
    return "\n".join(out) + "\n"


def render_json(res: Resolution) -> str:
    import json

    return json.dumps({k: res.env[k] for k in ordered_vars(res)}, indent=2) + "\n"


def render_dotenv(res: Resolution) -> str:
    """`KEY=value` lines with literal values (Docker/Podman `--env-file` semantics: no quoting,
    no expansion); variables to unset are listed as comments, since the format cannot unset."""
    out = _header(res, "dotenv")
    for key in ordered_vars(res):
        value = res.env[key]
        if value is None:
            out.append(_comment(f"unset {key}: {_reason(res, key) or ''}"))
            continue
        _check_value(key, value)
        out.append(f"{key}={value}")
    out += _warnings(res)
    return "\n".join(out) + "\n"


def render(res: Resolution, shell: str) -> str:
    if shell in ("bash", "zsh"):
        return render_posix(res, shell)
    if shell == "fish":
        return render_fish(res)
    if shell == "json":
        return render_json(res)
    if shell == "dotenv":
        return render_dotenv(res)
    raise UsageError(f"unknown shell {shell!r}", f"choose one of {', '.join(SHELLS)}")
