"""Containerfiles: the only code that writes their instructions and fills their templates.

A Containerfile line ends at a newline (no quoting carries one over), so a value with a line
break, CR or NUL is refused, never folded.  `ENV`/`LABEL` values are double-quoted with `\\`, `"`
and `$` escaped (the Dockerfile reference, "Environment replacement"); words of a shell-form
`RUN` are quoted for sh (`shellsafe.sh_word`); an argv becomes the JSON exec form.  Templates
are `string.Template` text, filled only with values these functions made.
"""

from __future__ import annotations

import string

from rocforge_build import shellsafe
from rocforge_build.errors import ConfigError, reason

HINT = "a Containerfile value must be one line"


def value(text: str, where: str = "Containerfile value") -> str:
    """A double-quoted ENV/LABEL value that reaches the image byte for byte."""
    problem = shellsafe.env_value_problem(text)
    if problem:
        raise ConfigError(f"{where}: {problem}", HINT)
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("$", "\\$") + '"'


def _pairs(items: dict[str, str], kind: str, sep: str) -> str:
    for k in items:
        if kind == "ENV":
            shellsafe.check_env(k, None, f"ENV {k}", ConfigError)
        elif not k or any(c.isspace() or c in '="\\$' or not c.isprintable() for c in k):
            raise ConfigError(f"LABEL {k!r}: a label key is one word without '=', quotes or '$'")
    return sep.join(f"{k}={value(v, f'{kind} {k}')}" for k, v in items.items())


def env(items: dict[str, str]) -> str:
    """One `ENV` instruction setting every name."""
    return "ENV " + _pairs(items, "ENV", " \\\n    ")


def label_pairs(items: dict[str, str]) -> str:
    """The `key="value"` pairs of a `LABEL` instruction (a template may write `LABEL` itself)."""
    return _pairs(items, "LABEL", " \\\n      ")


def label(items: dict[str, str]) -> str:
    """One `LABEL` instruction."""
    return "LABEL " + label_pairs(items)


def shell_words(argv: list[str], where: str) -> str:
    """Words for a shell-form `RUN`, each quoted for sh, followed by a space each."""
    for w in argv:
        problem = shellsafe.word_problem(w)
        if problem:
            raise ConfigError(f"{where}: {problem}", HINT)
    return "".join(f"{shellsafe.sh_word(w)} " for w in argv)


def run(body: str, mount: str | None = None) -> str:
    """A shell-form `RUN` of a body from rocforge's own data (containers/variants.toml)."""
    return f"RUN {mount} \\\n    {body}" if mount else f"RUN {body}"


def fill(template: str, values: dict[str, str], where: str) -> str:
    """A template with `${name}` fields filled; a bad field is one line naming the template."""
    try:
        return string.Template(template).substitute(values)
    except (KeyError, ValueError) as exc:
        raise ConfigError(f"{where}: bad template field {reason(exc)}",
                          "fields are ${name}; write $$ for a literal $") from exc
