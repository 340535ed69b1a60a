"""llama-swap configuration (YAML): the only code that writes it, through PyYAML's safe dumper,
so every value is one scalar whatever it holds.

llama-swap reads `cmd` as a shell-like command line and expands `${...}` macros in it and in
`env` (github.com/mostlygeek/llama-swap, config.example.yaml); a word holding `${` would be read
as a macro, and one with a line break would be split by its comment stripping: both refused.
"""

from __future__ import annotations

from rocforge_build import shellsafe
from rocforge_build.errors import UsageError


def _checked(value: str, where: str) -> str:
    problem = shellsafe.word_problem(value)
    if problem:
        raise UsageError(f"{where}: {problem}", "use --format shell or systemd")
    if "${" in value:
        raise UsageError(f"{where}: {value!r} holds '${{', which llama-swap would read as a macro",
                         "use --format shell or systemd")
    return value


def models_entry(*, comment: str, model: str, argv: list[str], env: dict[str, str]) -> str:
    """A `models:` table with one entry, `model`, that runs `argv` (plus `--port ${PORT}`)."""
    import yaml

    words = [_checked(w, "the preset's command") for w in argv]
    entry: dict = {"cmd": " ".join(shellsafe.sh_word(w) for w in words) + " --port ${PORT}"}
    if env:
        for k, v in env.items():
            shellsafe.check_env(k, v, "the preset's environment")
            _checked(v, f"the preset's environment: {k}")
        entry["env"] = [f"{k}={v}" for k, v in env.items()]
    entry["proxy"] = "http://127.0.0.1:${PORT}"
    entry["checkEndpoint"] = "/health"
    body = yaml.safe_dump({"models": {model: entry}}, sort_keys=False, allow_unicode=True,
                          default_flow_style=False, width=1 << 16)
    return shellsafe.comment(comment) + "\n" + body
