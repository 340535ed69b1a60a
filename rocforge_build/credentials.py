"""Credentials never in URLs, never in text.  `url_refusal` is the one rule every store URL meets
wherever it comes from (`config set` and every read of the config through config_values,
--to and `store URL` on the command line, each store's own parse): a URL is shown in progress
lines, messages and manifests, so one holding user:password@ or a ?query (a token=, an
X-Amz-Signature=) is refused in one line that does not repeat it, saying where the credentials
go instead.  `redact` is the one redaction of text rocforge prints, logs, raises or stores: a
URL's user:password@, an Authorization header or a Bearer/Basic token, a query's credential
parameters, and any credential rocforge was given (ROCFORGE_STORE_PASSWORD, the AWS secret,
docker's and a token service's answers, `remember`ed as they are read), since a server may
repeat any of them in its answer.  Stdlib only, `re` imported on first use (RocforgeError calls
`redact`; `rocforge env` imports errors)."""

from __future__ import annotations

import os

MASK = "[redacted]"
USERNAME_ENV = "ROCFORGE_STORE_USERNAME"
PASSWORD_ENV = "ROCFORGE_STORE_PASSWORD"
REGISTRY_CREDENTIALS_HINT = (f"set {USERNAME_ENV} and {PASSWORD_ENV} (a token as the password where "
                             "the registry gives one), or log in with `docker login HOST`")
_CREDENTIALS_HINTS = {
    "oci": REGISTRY_CREDENTIALS_HINT, "oci+http": REGISTRY_CREDENTIALS_HINT,
    "s3": "boto3 reads an S3 store's credentials from its own settings: AWS_ACCESS_KEY_ID and "
          "AWS_SECRET_ACCESS_KEY, AWS_PROFILE or ~/.aws/credentials",
    "https": "an https:// store is read with the credentials ~/.netrc gives its host "
             "(machine HOST login USER password SECRET)",
    "file": "a file:// store needs no credentials: file:///DIR",
}
# the variables whose values are credentials rocforge (or boto3 for it) sends
SECRET_ENV = (PASSWORD_ENV, "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN")
_MIN_SECRET = 4  # a shorter "secret" would blank ordinary words and digits
_known: set[str] = set()
_patterns: list | None = None


def credentials_hint(scheme: str) -> str:
    """Where the credentials of a store of `scheme` go instead of its URL."""
    return _CREDENTIALS_HINTS.get(scheme.lower(), REGISTRY_CREDENTIALS_HINT)


def url_problem(url: str) -> str | None:
    """What in `url` carries (or may carry) a credential, in words that do not repeat it; None
    when nothing does."""
    _, sep, rest = url.partition("://")
    authority = rest if sep else url
    for stop in "/?#":
        authority = authority.split(stop, 1)[0]
    if "@" in authority:
        return ("holds credentials (user:password@); they do not belong in a store URL, which "
                "is shown in messages and records")
    if "?" in url or "#" in url:
        return ("holds a ?query or #fragment (where a token or signature would be a credential); "
                "a store URL has none")
    return None


def url_refusal(url: str, what: str = "store URL") -> tuple[str, str] | None:
    """(the one line, the hint) refusing a URL that holds credentials, the URL not repeated; None
    for a URL without.  The caller raises it as a UsageError (errors.py imports this module)."""
    problem = url_problem(url)
    if not problem:
        return None
    scheme = url.partition("://")[0] if "://" in url else ""
    return f"{what}: {problem} (not repeated here)", credentials_hint(scheme)


def remember(secret: object) -> None:
    """A credential read at run time (a docker helper's secret, a bearer token): never shown."""
    if isinstance(secret, str) and len(secret) >= _MIN_SECRET:
        _known.add(secret)


def _compiled() -> list:
    """The patterns, compiled once on first use: `rocforge env` never pays for `re`."""
    global _patterns
    if _patterns is None:
        import re

        _patterns = [
            # scheme://user:password@host: everything to the authority's last '@'
            (re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)[^/?#\s\"'<>]*@"), r"\1"),
            # an Authorization header as text, JSON or a repr: its whole value
            (re.compile(r"(?i)(authorization[\"']?\s*[:=]\s*[\"']?)(?:(basic|bearer|token|digest)\s+)?"
                        r"[^\s\"',;}]+"), lambda m: f"{m.group(1)}{m.group(2) + ' ' if m.group(2) else ''}{MASK}"),
            (re.compile(r"\b(Bearer|Basic|bearer|basic|BEARER|BASIC)\s+(?!realm\b)[A-Za-z0-9._~+/-]{8,}=*"),
             rf"\1 {MASK}"),
            # a query's credential parameters (pre-signed URLs, tokens)
            (re.compile(r"(?i)([?&;](?:[a-z0-9_.-]*token|x-amz-signature|x-amz-credential|"
                        r"x-amz-security-token|sig|signature|password|passwd|secret|api[_-]?key|"
                        r"access[_-]?key)=)[^&#\s\"'<>]*"), rf"\1{MASK}"),
        ]
    return _patterns


def secrets_now() -> list[str]:
    """The credentials to blank: those remembered and those in the environment, longest first."""
    found = set(_known)
    for name in SECRET_ENV:
        value = os.environ.get(name)
        if value and len(value) >= _MIN_SECRET:
            found.add(value)
            found.add(value.strip())
    return sorted((s for s in found if len(s) >= _MIN_SECRET), key=len, reverse=True)


def redact(text: object, _secrets: list[str] | None = None) -> str:
    """`text` with every credential it may carry replaced (see the module docstring)."""
    text = text if isinstance(text, str) else str(text)
    for secret in secrets_now() if _secrets is None else _secrets:
        if secret in text:  # as a whole word: a token "anon" leaves "anonymous" be
            import re

            text = re.sub(rf"(?<![A-Za-z0-9]){re.escape(secret)}(?![A-Za-z0-9])", MASK, text)
    if "://" not in text and not any(w in text.lower() for w in ("auth", "bearer", "basic", "=")):
        return text  # the common case: nothing a pattern could match
    for pattern, replacement in _compiled():
        text = pattern.sub(replacement, text)
    return text


def redact_data(value, _secrets: list[str] | None = None):
    """`redact` over every text of JSON-like data (dicts, lists, tuples, strings), keys too."""
    found = secrets_now() if _secrets is None else _secrets
    if isinstance(value, str):
        return redact(value, found)
    if isinstance(value, dict):
        return {redact_data(k, found): redact_data(v, found) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [redact_data(v, found) for v in value]
    return value
