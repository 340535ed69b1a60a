"""A substitute instead of a compile: the configured stores asked in order for the plan's key;
a hit has its key, signature, advisories and every byte checked, is unpacked (through the bundle
rules: no `..`, no absolute path, no link out) into the prefix's staging sibling, and is verified
HERE, on this machine's runtime, before it is swapped in.  A build that was right elsewhere can
be wrong here: lemonade-sdk/llamacpp-rocm #123 was right on ROCm 7.13 and wrong on a later nightly
with the same bytes.  Anything short of that leaves the prefix as it was and says why, in one
line; the build then compiles (or, --substitute-only, stops)."""

from __future__ import annotations

import functools
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING

from rocforge_build import replace
from rocforge_build.credentials import redact, redact_data
from rocforge_build.errors import RocforgeError, disk_failure
from rocforge_build.forge.locations import STAGED, destdir
from rocforge_build.forge.substitute_key import SubstituteOutcome
from rocforge_build.manifest_schema import MANIFEST
from rocforge_build.shellsafe import one_line
from rocforge_build.substitute import artifact, evidence, keys, oci, publishers, signing
from rocforge_build.substitute.stores import open_store

if TYPE_CHECKING:
    from rocforge_build.forge.plan import Plan
    from rocforge_build.forge.substitute_key import SubstitutePolicy


class Miss(RocforgeError):
    """One store's reason not to use what it holds (or that it holds nothing)."""


def attempt(plan: Plan, staging: Path, say) -> SubstituteOutcome:
    """Ask each store for the plan's build; the first one that passes every check here is left
    in `staging` (a complete tree with its manifest, the scratch mark removed)."""
    policy = plan.substitutes
    key = plan.substitute_key
    if key is None:
        return SubstituteOutcome(False, f"no key: {plan.no_substitute_key}")
    trusted = signing.trusted_keys_from_config(list(policy.trusted_keys))
    model = verify_model(policy)
    shown = say
    say = lambda text: shown(redact(text))  # noqa: E731 - every progress line, redacted
    # every configured store's key revocations, before any signature is trusted (substitute/keys.py)
    trusted, revocation_lines, unread = keys.with_revocations(trusted, policy.stores, policy.timeout)
    for line in revocation_lines:
        say(f"substitute: {line}")
    tried: list[str] = []
    for url in policy.stores:
        if url in unread:
            tried.append(redact(one_line(f"{url}: not used: its key revocations could not be read "
                                         f"({unread[url]})")))
            continue
        try:
            record, verified = _from_store(url, plan, staging, trusted, model, say)
        except OSError as exc:  # this machine's disk (the layer, the unpacked tree, a rename):
            # no other store helps, and each step's partial file or tree is already removed
            raise disk_failure(exc, f"pulling a substitute into {staging}") from exc
        except ReferenceMissing:  # no other store changes that: the build stops
            raise
        except artifact.KnownBad as bad:
            return SubstituteOutcome(False, one_line(bad.message), (*tried, redact(one_line(f"{url}: {bad.message}"))),
                                     advisory=one_line(bad.message))
        except Miss as miss:  # rocforge's own words: the store's URL goes first
            tried.append(redact(one_line(f"{url}: {miss.message}")))
            continue
        except RocforgeError as exc:  # a store's errors name the store already
            tried.append(one_line(exc.message))
            continue
        return SubstituteOutcome(True, "", tuple(tried), record,
                                 installed=functools.partial(record_verified, plan, record, verified))
    return SubstituteOutcome(False, "; ".join(tried) or "no store answered", tuple(tried))


def _from_store(url: str, plan: Plan, staging: Path, trusted, model, say) -> tuple[dict, dict | None]:
    policy, key = plan.substitutes, plan.substitute_key
    t0 = time.monotonic()
    with open_store(url, timeout=policy.timeout) as store:
        man, layer, signer, attestations = _choose(store, key, trusted, say)
        say(f"substitute: {store.url} has it ({layer.size / 1e6:.1f} MB, signed by {signer}, "
            f"{len(attestations)} attestation(s)); pulling")
        t_checked = time.monotonic()
        holder = replace.scratch(destdir(plan.prefix), MANIFEST, STAGED)
        try:
            archive = holder / "layer.tar.gz"
            store.fetch_blob(layer, archive, cap=policy.max_layer_bytes)
            t_pulled = time.monotonic()
            _unpack_as_staging(archive, holder, staging, key.digest)
        finally:
            replace.discard(holder, MANIFEST, STAGED)
        t_unpacked = time.monotonic()
    try:
        verdict, lines, verified = verify_here(staging, plan, model, attestations, say)
    except BaseException:  # a crash or a Ctrl-C: the unverified tree never stays beside the prefix
        replace.discard(staging, MANIFEST, STAGED)
        raise
    t_verified = time.monotonic()
    record = {"store": redact(url), "key": key.digest, "manifest": man.digest, "signed_by": signer,
              "attestations": len(attestations), "verified_here": verdict, "verify_lines": lines,
              "pulled_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
              "seconds": {"check": round(t_checked - t0, 3), "pull": round(t_pulled - t_checked, 3),
                          "unpack": round(t_unpacked - t_pulled, 3), "verify": round(t_verified - t_unpacked, 3)}}
    if verdict == "failed":
        _report_failure(url, man, plan, staging, lines, say)
        replace.discard(staging, MANIFEST, STAGED)
        raise Miss("failed here: " + "; ".join(lines[:3]))
    try:
        _write_manifest(staging, plan, record)
    except BaseException:
        replace.discard(staging, MANIFEST, STAGED)
        raise
    replace.unmark_scratch(staging)
    return record, verified


def _choose(store, key, trusted, say) -> tuple[oci.Manifest, oci.Descriptor, str, list[artifact.Attached]]:
    """The newest artifact of `key` that a trusted key's signed index (or the single tag of
    earlier stores) lists and that passes its checks: its key and a trusted signature
    (publishers.candidates; artifact.py); the first refusal when none does.  A trusted advisory
    in force on any of them stops them all: one key's artifacts are the same build."""
    notes: list[str] = []
    found = publishers.candidates(store, key.digest, trusted, notes)
    refused: list[RocforgeError] = []
    chosen = None
    try:
        if not found:
            raise Miss("not in this store")
        if not trusted:
            raise Miss("untrusted: substitute.trusted_keys is empty, so no signature can be trusted")
        for man in found:
            try:
                layer = artifact.check_build(store, man, key)
                # every referrer of the build (signatures, advisories, evidence) read within one
                # download.listing_deadline, however many a store lists and however slowly it answers
                with store.transfer(f"the referrers of {man.digest[:19]}"):
                    signer = artifact.signed_by(store, man, trusted)
                    advisories, _ = artifact.attached(store, man, oci.ADVISORY_TYPE, trusted, notes)
                    if advisories:
                        withdrawals, _ = artifact.attached(store, man, oci.WITHDRAWAL_TYPE, trusted, notes)
                        advisories = artifact.in_force(advisories, withdrawals)
                    if advisories:
                        reason = str(advisories[0].document.get("reason", "no reason given"))[:300]
                        raise artifact.KnownBad(f"known bad: an advisory signed by {advisories[0].signer} "
                                                f"says: {reason}")
                    if chosen is None:
                        attestations, _ = artifact.attached(store, man, oci.EVIDENCE_TYPE, trusted, notes)
                        chosen = man, layer, signer, attestations
            except (artifact.KnownBad, oci.StoreUnreachable):
                raise
            except oci.StoreError as exc:
                refused.append(exc)
        if chosen is not None:
            if refused:
                notes.append(f"{store.url}: {len(refused)} other artifact(s) of this key passed over, the "
                             f"first: {one_line(refused[0].message)}")
            return chosen
    finally:
        for note in notes:
            say(f"substitute: {note}")
    first = refused[0]
    if len(refused) > 1:
        first.message += f" (and {len(refused) - 1} other artifact(s) of this key refused)"
    raise first


def _unpack_as_staging(archive: Path, holder: Path, staging: Path, key_digest: str) -> None:
    """The bundle unpacked through its own rules (ship/bundle_unpack.py) inside `holder`, its
    files checked against bundle.toml, its manifest's key this key, then moved to `staging`."""
    from rocforge_build.discover.builds import read_manifest
    from rocforge_build.ship.bundle_unpack import unpack

    tree = unpack(archive, holder / "tree", index_first=True)
    shipped = read_manifest(tree)
    if not shipped or (shipped.get("substitute_key") or {}).get("digest") != key_digest:
        raise Miss("refused: the bundle's own manifest was made for another key")
    replace.mark_scratch(tree)
    replace.discard(staging, MANIFEST, STAGED)
    staging.parent.mkdir(parents=True, exist_ok=True)
    os.replace(tree, staging)


def _write_manifest(staging: Path, plan: Plan, record: dict) -> None:
    """The shipped manifest, made this machine's: its prefix, stamp, run-time environment and
    exports as this plan has them, and where the build came from."""
    import tomlkit

    path = staging / MANIFEST
    doc = tomlkit.parse(path.read_text(encoding="utf-8"))
    published_at = doc.get("built_at")
    doc["prefix"] = str(plan.prefix)
    doc["stamp"] = plan.stamp
    doc["runtime_env"] = plan.runtime_env
    doc["export_env"] = plan.export_env
    doc["export_env_reasons"] = {k: plan.env_reasons.get(k, "") for k in plan.export_env}
    doc["substituted"] = {**redact_data(record), "built_at": str(published_at or "")}
    # what rocforge put there: the bundle's files (its launcher, bundle.toml and the libraries it
    # carries too), so a later swap or publish tells them from files a user adds
    doc["installed"] = replace.installed_files(staging)
    doc["asked_targets"] = list(plan.asked_targets)  # this machine's request, not the publisher's
    if plan.made_for is not None:
        doc["made_for"] = plan.made_for
    elif "made_for" in doc:
        del doc["made_for"]
    doc["built_at"] = record["pulled_at"]
    tmp = path.with_name(MANIFEST + ".new")
    tmp.write_text(tomlkit.dumps(doc), encoding="utf-8")
    os.replace(tmp, path)


def verify_model(policy: SubstitutePolicy):
    """The model a verify here runs (checked before anything is pulled: a bad
    substitute.verify_model is the user's to fix, not a store's miss), or None."""
    if policy.verify == "none" or not policy.verify_model:
        return None
    from rocforge_build.measure import gguf

    return gguf.check(policy.verify_model)


def verify_here(tree: Path, plan: Plan, model, attestations: list[artifact.Attached], say
                ) -> tuple[str, list[str], dict | None]:
    """("passed" | "failed" | "not verified here", lines, a GPU build's verify row): a CPU build
    measures its own figures and holds them to the published ones; a GPU build is verified
    against this machine's own CPU reference, as `rocforge verify --quick` (or in full).  A
    check that cannot run on the pulled build (a program that crashes) is a failure here."""
    policy: SubstitutePolicy = plan.substitutes
    if policy.verify == "none":
        return "not verified here", ["substitute.verify is none"], None
    if model is None:
        return "not verified here", ["no substitute.verify_model: run `rocforge verify` before "
                                     "serve or tune use it"], None
    if not (tree / "bin" / "llama-perplexity").is_file():
        return "not verified here", ["it has no llama-perplexity to verify with"], None
    try:
        return _checked_here(tree, policy, model, attestations, say)
    except ReferenceMissing:
        raise
    except RocforgeError as exc:
        return "failed", [f"its check could not run here: {exc.message}"], None


def _checked_here(tree: Path, policy: SubstitutePolicy, model, attestations: list[artifact.Attached],
                  say) -> tuple[str, list[str], dict | None]:
    from rocforge_build.measure import verify
    from rocforge_build.measure.llama_tools import LlamaBuild

    build = LlamaBuild.open(tree)

    def progress(text: str) -> None:
        say(f"substitute: verify: {text}")

    if not build.gpu:
        sha = _model_sha(model)
        published = [a.document for a in attestations if a.document.get("passed") is True
                     and a.document.get("own_figures")
                     and (a.document.get("model") or {}).get("sha256") == sha]
        if not published:
            return "not verified here", ["no trusted attestation has figures for this model"], None
        figures, _, _ = evidence.own_figures(tree, str(model.path), progress=progress)
        compared = evidence.compare_own(figures, published[-1]["own_figures"], model.file_type)
        if compared is None:
            return "not verified here", ["the attestations have no figures at the shapes measured here"], None
        ok, lines = compared
        return ("passed" if ok else "failed"), lines, None
    coverage = verify.plan(model, gpu=True, quick=policy.verify == "quick")
    ref = _reference(build, policy, attestations, say)
    result = verify.verify(build, ref, model, coverage, progress=progress, record=False)
    result["model_sha256"] = _model_sha(model)
    lines = [f"{len(result['checks'])} checks against {ref.prefix}: "
             + ("all passed" if result["passed"] else f"{len(result['failed_checks'])} failed")]
    return ("passed" if result["passed"] else "failed"), lines, result


class ReferenceMissing(RocforgeError):
    """--substitute-only, and the CPU reference a pulled GPU build is verified against is in no
    store: nothing may be compiled, so the build stops (a missing reference is not a failed build)."""

    exit_code = 9


def _reference(build, policy: SubstitutePolicy, attestations: list[artifact.Attached], say):
    """The CPU reference a GPU build is verified against here: one on disk, else taken from the
    stores like any substitute (the publisher pushes the one it verified against, and its key is
    this machine's own reference's key when the machines compile alike), else compiled, except
    under --substitute-only, which stops with one line naming the reference."""
    from rocforge_build.measure import verify_reference

    try:
        ref = verify_reference.reference_for(build, None, quiet=True, substitute=attempt,
                                             substitutes=policy.mode)
    except RocforgeError as exc:
        if policy.mode != "only":
            raise
        key = published_reference(attestations)
        raise ReferenceMissing(
            "--substitute-only: the CPU reference to verify the pulled build against"
            + (f" (the publisher's: {key})" if key else "") + f" is not usable from any store: "
            f"{one_line(exc.message)}",
            "nothing was compiled and nothing installed; drop --substitute-only to compile the "
            "reference here, or ask the publisher to publish the build again (publish pushes its reference)") from None
    made = (ref.manifest or {}).get("substituted") if isinstance(ref.manifest, dict) else None
    say(f"substitute: verify: reference {ref.prefix}"
        + (f" (pulled from {made.get('store')})" if isinstance(made, dict) else ""))
    return ref


def published_reference(attestations: list[artifact.Attached]) -> str:
    """The reference key the newest evidence names (shortened), or "": only a sha256 digest is
    taken, so a trusted publisher's other text never reaches the terminal through it."""
    for attached in reversed(attestations):
        pointer = attached.document.get("reference")
        key = pointer.get("key") if isinstance(pointer, dict) else None
        try:
            return oci.check_digest(key, "reference")[:23]
        except oci.StoreError:
            continue
    return ""


def _model_sha(model) -> str:
    from rocforge_build.measure import provenance

    return provenance.model(model)["sha256"]


def _report_failure(url: str, man: oci.Manifest, plan: Plan, tree: Path, lines: list[str], say) -> None:
    """A signed "failed here" with this host's fingerprint (a Vulkan build's: the devices and
    drivers the pulled `tree` sees), attached to the build in the store, when the user allows it
    (substitute.report_failures) and has a signing key."""
    policy = plan.substitutes
    if not policy.report_failures:
        return
    from rocforge_build.measure import provenance
    from rocforge_build.substitute.publish import signing_key_path

    try:
        pair = signing.read_secret_key(signing_key_path(policy.signing_key))
        host = provenance.host()
        if plan.backend == "vulkan":
            host["vulkan"] = provenance.vulkan(tree)
        doc = evidence.document(kind="failed-here", key=plan.substitute_key.digest,
                                host=host, model=None, passed=False,
                                note="; ".join(lines)[:2000])
        with open_store(url, timeout=policy.timeout) as store:
            artifact.attach(store, man, oci.EVIDENCE_TYPE, doc, pair,
                            annotations={"dev.rocforge.kind": "failed-here"})
        say(f"substitute: reported the failed verify to {url}")
    except RocforgeError as exc:
        say(f"substitute: could not report the failed verify to {url}: {exc.message}")


def record_verified(plan: Plan, record: dict, verified: dict | None) -> None:
    """A passing verify here is recorded for the installed prefix as `rocforge verify` records
    one (the results store's row for a GPU build, and the verdict `rocforge env` reads).  It
    opens the prefix, so it runs only once the staged tree has been swapped in."""
    if record.get("verified_here") != "passed":
        return
    from rocforge_build.discover import choices

    policy = plan.substitutes
    reference = (verified or {}).get("reference", "")
    choices.record_verify(plan.prefix, plan.stamp, True, model=policy.verify_model, reference=reference)
    if verified is None:
        return
    from rocforge_build.measure import provenance
    from rocforge_build.measure.llama_tools import LlamaBuild
    from rocforge_build.measure.store import Store

    build = LlamaBuild.open(plan.prefix)
    with Store() as db:
        run_id = db.start_run("verify", ["rocforge", "build", "(substitute verified here)"])
        row = {"host": provenance.host(),
               "prefix": str(plan.prefix), "backend": build.backend, "stamp": plan.stamp,
               "build": build.provenance(), **verified}
        db.add_row(run_id, "verify", row, status="passed")
        db.finish_run(run_id, "passed")
