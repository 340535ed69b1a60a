"""A bundle's `run` launcher (POSIX sh): the only code that writes it.

Every value is single-quoted but for `${here}`, the bundle's own directory found at run time,
which is the one expansion a value may ask for; names pass `shellsafe.check_env`.
"""

from __future__ import annotations

from rocforge_build import shellsafe
from rocforge_build.errors import ConfigError

HERE = "${here}"


def value(text: str) -> str:
    """`text` for sh with only `${here}` expanded (in double quotes: a path with spaces stays one)."""
    quoted = '"${here}"'.join(shellsafe.sh_quote(p) if p else "" for p in text.split(HERE))
    return quoted or "''"


def render(*, head: list[str], where: str, env: dict[str, str], left_out: dict[str, str],
           gfx_override: tuple[str, str] | None) -> str:
    """The launcher: `head` as comments, `env` exported (PATH prepended), `left_out` named in
    comments, `gfx_override` (reason, value) as HSA_OVERRIDE_GFX_VERSION unless the caller set it."""
    lines = [shellsafe.SHEBANG, *(shellsafe.comment(h) for h in head),
             'here=$(CDPATH= cd -- "$(dirname -- "$0")" && pwd -P) || exit 1',
             'export PATH="${here}/bin${PATH:+:$PATH}"']
    for k, v in env.items():
        shellsafe.check_env(k, v, where, ConfigError)
        lines.append(f'export PATH={value(v)}":$PATH"' if k == "PATH" else f"export {k}={value(v)}")
    for k, v in left_out.items():
        lines.append(shellsafe.comment(f"left out: {k}={v} (a path on the build machine)"))
    if gfx_override is not None:
        why, gfx = gfx_override
        shellsafe.check_env("HSA_OVERRIDE_GFX_VERSION", gfx, where, ConfigError)
        lines += [shellsafe.comment(why), '[ -n "${HSA_OVERRIDE_GFX_VERSION-}" ] || '
                  f"HSA_OVERRIDE_GFX_VERSION={shellsafe.sh_quote(gfx)}; export HSA_OVERRIDE_GFX_VERSION"]
    lines += [
        'if [ $# -eq 0 ]; then',
        '    echo "usage: $0 PROGRAM [ARGS...]; programs:" $(ls "${here}/bin" 2>/dev/null) >&2',
        '    exit 2',
        'fi',
        'prog=$1; shift',
        'case $prog in */*) ;; *) prog="${here}/bin/${prog}" ;; esac',
        'exec "$prog" "$@"',
    ]
    return "\n".join(lines) + "\n"
