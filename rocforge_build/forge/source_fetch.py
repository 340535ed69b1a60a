"""How a source reaches the cache, whatever asks for it: git refs resolved (and remembered, so a
later run without network still knows them), bare mirrors and the commits exported from them,
submodules, and archives unpacked.  forge/sources.py decides which of these a kind of source uses.

Everything lives under `paths.cache_dir()/sources/`: `git/` (one bare mirror per URL), `trees/`
(pristine trees by identity) and `refs.json` (what each named ref last resolved to).
"""

from __future__ import annotations

import hashlib
import json
import re
import sys
from pathlib import Path

from rocforge_build import ownership, paths
from rocforge_build.errors import NetworkError, UsageError
from rocforge_build.ownership import COMPLETE, MARK, write_mark
from rocforge_build.proc import GIT_ALLOW_PROTOCOL, CommandFailed, run
from rocforge_build.progress import Heartbeat

_SHA_RE = re.compile(r"^[0-9a-f]{40}$")


def is_commit(ref: str) -> bool:
    """A full commit sha: it names one tree without asking the remote."""
    return bool(_SHA_RE.match(ref))


def trees_dir() -> Path:
    return paths.cache_dir() / "sources" / "trees"


def is_complete(tree: Path) -> bool:
    """A cached tree that was put in place whole (its completeness stamp is written last)."""
    return (tree / COMPLETE).is_file()


# -- git refs -------------------------------------------------------------------------------------

def git_mirror(url: str) -> Path:
    """The bare mirror of `url`, named by the URL's sha256 (workflows/cleanup.py recognises it so)."""
    return paths.cache_dir() / "sources" / "git" / (hashlib.sha256(url.encode()).hexdigest()[:16] + ".git")


def _refs_file() -> Path:
    return paths.cache_dir() / "sources" / "refs.json"


def _remembered_refs() -> dict:
    try:
        data = json.loads(_refs_file().read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def remembered_commit(url: str, ref: str) -> str | None:
    """The commit `ref` of `url` resolved to when the remote last answered, if any."""
    known = _remembered_refs().get(f"{url} {ref}")
    return known if isinstance(known, str) and is_commit(known) else None


def _remember_ref(url: str, ref: str, sha: str) -> None:
    """What `ref` meant the last time the remote answered: a plan or build with no network
    then works from the source cache (the commit's tree is cached by identity)."""
    refs = _remembered_refs()
    if refs.get(f"{url} {ref}") == sha:
        return
    refs[f"{url} {ref}"] = sha
    target = _refs_file()
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        paths.write_whole(target, json.dumps(refs, indent=1, sort_keys=True))
    except OSError:
        pass  # only the offline fallback is lost


def resolve_git_ref(url: str, ref: str) -> str:
    """The commit `ref` names in `url`: one `git ls-remote`, else (offline) what the cache knows."""
    if is_commit(ref):
        return ref
    try:
        out = run(["git", "ls-remote", url, ref, f"{ref}^{{}}"], timeout=120).stdout
    except CommandFailed as exc:
        known = remembered_commit(url, ref)
        if known:  # offline: what the cache knows
            sys.stderr.write(f"rocforge: {url} is unreachable; using {ref} = {known[:12]} "
                             "from the source cache\n")
            return known
        mirror = git_mirror(url)
        if mirror.is_dir():  # a mirror fetched in full knows the ref itself
            try:
                return run(["git", "-C", mirror, "rev-parse", f"{ref}^{{commit}}"]).stdout.strip()
            except CommandFailed:
                pass
        raise NetworkError(f"git ls-remote {url} {ref} failed", exc.output.strip()[-400:] or None) from exc
    found: dict[str, str] = {}
    for line in out.splitlines():
        sha, _, name = line.partition("\t")
        found[name] = sha
    for name in (f"refs/tags/{ref}^{{}}", f"refs/tags/{ref}", f"refs/heads/{ref}", ref):
        if name in found:
            _remember_ref(url, ref, found[name])
            return found[name]
    if found:
        sha = next(iter(found.values()))
        _remember_ref(url, ref, sha)
        return sha
    raise UsageError(f"git ref {ref!r} not found in {url}", "give a tag, branch or full commit sha")


# -- git trees ------------------------------------------------------------------------------------

def mirror_has(url: str, commit: str) -> bool:
    mirror = git_mirror(url)
    return mirror.is_dir() and run(["git", "-C", mirror, "cat-file", "-e", f"{commit}^{{commit}}"],
                                   check=False).returncode == 0


def git_export(url: str, commit: str, dest: Path, progress: bool = True) -> None:
    """The commit's tree from the bare mirror (fetched into it first when missing).  Not on a
    terminal, a line every interval: `git URL [step/3] ELAPSED: fetch|archive|unpack ...`."""
    ownership.check_tree_replaceable(dest, "a source tree", (MARK, COMPLETE))  # before any fetch
    mirror = git_mirror(url)
    if not mirror.is_dir():
        mirror.parent.mkdir(parents=True, exist_ok=True)
        run(["git", "init", "-q", "--bare", mirror])
        write_mark(mirror, "a git mirror (forge/sources.py)")
    with Heartbeat(f"git {url}", enabled=progress) as beat:
        have = run(["git", "-C", mirror, "cat-file", "-e", f"{commit}^{{commit}}"], check=False)
        if have.returncode != 0:
            beat.update(1, 3, f"git fetch --depth 1 {commit[:12]}")
            got = run(["git", "-C", mirror, "fetch", "-q", "--depth", "1", url, commit],
                      check=False, timeout=3600)
            if got.returncode != 0:  # servers that refuse a sha want: fetch everything
                beat.update(detail="git fetch --tags (every branch: the server refuses a commit want)")
                try:
                    run(["git", "-C", mirror, "fetch", "-q", "--tags", url, "+refs/heads/*:refs/heads/*"],
                        timeout=3600)
                except CommandFailed as exc:
                    raise NetworkError(f"git fetch {url} failed", exc.output.strip()[-400:] or None) from exc
        with ownership.scratch_dir(mirror.parent, ".archive-", "a git archive") as tmp:
            tarball = tmp / "src.tar"
            beat.update(2, 3, f"git archive {commit[:12]}")
            run(["git", "-C", mirror, "archive", "--format=tar", "-o", tarball, commit], timeout=3600)
            beat.update(3, 3, f"unpacking into {dest}")
            extract(tarball, dest, strip=False)


def checkout_submodules(tree: Path, env: dict) -> None:
    """Check out the submodules (shallow).  Their URLs come from the fetched repository, not the
    user: file:// only where the user's git config allows it for submodules (protocol.file.allow
    = always; git's default refuses it since CVE-2022-39253), never a helper such as ext::."""
    allowed = run(["git", "-C", tree, "config", "--get", "protocol.file.allow"], env=env,
                  check=False).stdout.strip() == "always"
    protocols = GIT_ALLOW_PROTOCOL.split(":")
    sub_env = {**env, "GIT_ALLOW_PROTOCOL": ":".join(
        p for p in protocols if p != "file" or allowed)}
    run(["git", "-C", tree, "submodule", "update", "-q", "--init", "--recursive", "--depth", "1"],
        env=sub_env, timeout=3600)


# -- archives -------------------------------------------------------------------------------------

def extract(archive: Path, dest: Path, *, strip: bool = True) -> None:
    """Extract safely (extract.py) into a staging dir, then put it at `dest` as a whole
    (`ownership.install_tree`); a single top directory is stripped.  `dest` is complete or not
    stamped, never half-written and stamped."""
    from rocforge_build.extract import safe_extract, staging, write_own_file

    ownership.check_tree_replaceable(dest, "a source tree", (MARK, COMPLETE))  # before any work
    with staging(dest.parent, ".extract-", "a source tree being unpacked") as tmp:
        safe_extract(archive, tmp)
        top = tmp
        entries = [p for p in tmp.iterdir() if p.name != MARK]
        if strip and len(entries) == 1 and entries[0].is_dir():
            top = entries[0]
        write_own_file(top / MARK, "made by rocforge: a source tree\n")  # cache clean: ours
        write_own_file(top / COMPLETE, str(archive) + "\n")  # last, never through a link
        ownership.install_tree(top, dest, "a source tree", marks=(MARK, COMPLETE))
