"""What a store holds, for people and scripts: its builds by key, and for one build its key
document, who signed it and every attestation (hosts, ROCm, kernel, firmware, verdicts per
shape) and advisory attached to it; and an advisory published against a build.  Everything shown
comes from a store and is printed through `one_line`: a store cannot drive the terminal."""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass
from pathlib import Path

from rocforge_build import __version__
from rocforge_build.errors import UsageError
from rocforge_build.forge.substitute_key import TAG_PREFIX
from rocforge_build.measure.serving import SERVING_FIELDS, serving_known
from rocforge_build.shellsafe import one_line
from rocforge_build.substitute import artifact, oci, publishers, signing
from rocforge_build.substitute.evidence import SERVING as OWN_SERVING
from rocforge_build.substitute.stores import open_store

MAX_LISTED = 1000
_HEX = re.compile(r"[0-9a-f]{12,64}")


@dataclass(frozen=True)
class Listed:
    key: str
    manifest: str
    recipe: str
    target: str
    backend: str
    created: str
    verified: str  # "true" | "false": what the publisher marked
    signed_by: str  # a trusted key id, or why not
    attestations: int
    index: str = ""  # the tag it was found under: a publisher's index, or the single tag of earlier stores

    def to_json(self) -> dict:
        return dict(self.__dict__)


def _text(value, most: int = 200) -> str:
    return one_line(str(value))[:most]


def list_builds(url: str, trusted: list[signing.PublicKey], *, timeout: float) -> list[Listed]:
    """Every build of every key the store names: the artifacts each trusted key's signed index
    lists (publishers.py) and the one under a key's single tag of earlier stores, each once; an
    index signed by no trusted key, or whose signature does not hold, is one row saying so."""
    out: list[Listed] = []
    by_id = {k.key_id: k for k in trusted}
    with open_store(url, timeout=timeout) as store:
        keys: dict[str, set[str | None]] = {}
        for tag in store.tags():
            parsed = publishers.parse_tag(tag)
            if parsed is not None:
                keys.setdefault(parsed[0], set()).add(parsed[1])
        for key in sorted(keys):
            seen: set[str] = set()
            for kid in sorted(keys[key], key=lambda k: (k is not None, k or "")):  # the single tag first
                if len(out) >= MAX_LISTED:
                    return out
                if kid is None:
                    tag = TAG_PREFIX + key.removeprefix("sha256:")
                    try:
                        out += _listed(store, store.manifest(tag), trusted, tag, seen)
                    except oci.StoreError as exc:
                        out.append(_ignored(key, tag, f"unreadable: {exc.message}"))
                    continue
                tag = publishers.publisher_tag(key, kid)
                if kid not in by_id:
                    out.append(_ignored(key, tag, f"ignored: the index of {kid}, a key that is not trusted"))
                    continue
                try:
                    entries = publishers.read_index(store, key, by_id[kid]) or []
                except publishers.IndexRefused as exc:
                    out.append(_ignored(key, tag, f"ignored: {exc.message}"))
                    continue
                for entry in entries:
                    if entry.digest in seen or len(out) >= MAX_LISTED:
                        continue
                    try:
                        man = store.manifest(entry.digest)
                    except oci.StoreError as exc:
                        out.append(_ignored(key, tag, f"unreadable: {exc.message}", entry.digest))
                        continue
                    out += _listed(store, man, trusted, tag, seen)
    return out


def _ignored(key: str, tag: str, why: str, manifest: str = "") -> Listed:
    return Listed(key, manifest, "", "", "", "", "", _text(why, 300), 0, tag)


def _listed(store: oci.Store, man: oci.Manifest, trusted: list[signing.PublicKey], tag: str,
            seen: set[str]) -> list[Listed]:
    if man.digest in seen:
        return []
    seen.add(man.digest)
    try:
        signer = artifact.signed_by(store, man, trusted) if trusted else "no trusted keys set"
    except oci.StoreError as exc:
        signer = f"refused: {exc.message}"
    a = man.annotations
    return [Listed(man.config.digest, man.digest, _text(a.get("dev.rocforge.recipe", "")),
                   _text(a.get("dev.rocforge.target", "")), _text(a.get("dev.rocforge.backend", "")),
                   _text(a.get("org.opencontainers.image.created", "")),
                   _text(a.get("dev.rocforge.verified", "")), _text(signer, 300),
                   len(store.referrers(man.digest, oci.EVIDENCE_TYPE)), tag)]


def describe_list(builds: list[Listed]) -> list[str]:
    if not builds:
        return ["no rocforge builds in this store"]
    lines = []
    for b in builds:
        if not b.recipe and b.signed_by.startswith(("ignored: ", "unreadable: ")):
            lines.append(f"{_text(b.key.removeprefix('sha256:'), 16)}  {b.signed_by}")
            continue
        lines.append(f"{_text(b.key.removeprefix('sha256:'), 16)}  {b.recipe or '?'} {b.target or '(no GPU target)'} "
                     f"{b.backend}  {b.created}  {b.attestations} attestation(s)  "
                     f"{'unverified  ' if b.verified == 'false' else ''}signed: {b.signed_by}")
    return lines


def resolve(store: oci.Store, ref: str, trusted: list[signing.PublicKey] | None = None) -> oci.Manifest:
    """A build's manifest by its key digest, its tag, or 12+ leading hex digits of its key."""
    ref = ref.strip()
    hexpart = ref.removeprefix("sha256:").removeprefix(TAG_PREFIX)
    if not _HEX.fullmatch(hexpart):
        raise UsageError(f"{_text(ref, 80)!r} is not a key (sha256:HEX, {TAG_PREFIX}HEX or 12+ hex digits)",
                         "`rocforge store list URL` lists the keys")
    if len(hexpart) == 64:
        matches = {"sha256:" + hexpart}
    else:
        matches = {parsed[0] for parsed in map(publishers.parse_tag, store.tags())
                   if parsed is not None and parsed[0].startswith("sha256:" + hexpart)}
    if len(matches) != 1:
        raise UsageError(f"{hexpart} names {len(matches)} builds in {store.url}",
                         "give more digits of the key (`rocforge store list URL`)")
    found = all_of(store, matches.pop(), trusted or [])
    for man in found if trusted else []:  # the newest a trusted key signed, else the newest
        try:
            artifact.signed_by(store, man, trusted)
            return man
        except oci.StoreUnreachable:
            raise
        except oci.StoreError:
            continue
    return found[0]


def all_of(store: oci.Store, key: str, trusted: list[signing.PublicKey]) -> list[oci.Manifest]:
    """A key's builds, newest first: those the trusted keys' signed indexes list and the one
    under the single tag of earlier stores (publishers.candidates); NotFound when none."""
    notes: list[str] = []
    found = publishers.candidates(store, key, trusted, notes)
    if not found:
        raise oci.NotFound(f"{store.url}: no build of {key[:19]}" + (f" ({notes[0]})" if notes else ""))
    return found


def show(url: str, ref: str, trusted: list[signing.PublicKey], *, timeout: float) -> dict:
    with open_store(url, timeout=timeout) as store:
        man = resolve(store, ref, trusted)
        try:
            key_doc = json.loads(store.read_blob(man.config, artifact.MAX_DOCUMENT))
        except (ValueError, RecursionError):
            key_doc = None
        try:
            signer = artifact.signed_by(store, man, trusted)
        except oci.StoreError as exc:
            signer = f"refused: {exc.message}"
        evidence, left_out = artifact.attached(store, man, oci.EVIDENCE_TYPE, trusted)
        advisories, adv_left = artifact.attached(store, man, oci.ADVISORY_TYPE, trusted)
        withdrawals, wd_left = artifact.attached(store, man, oci.WITHDRAWAL_TYPE, trusted) if advisories else ([], [])
    standing = {a.digest for a in artifact.in_force(advisories, withdrawals)}
    why_withdrawn = {(str(w.document.get("withdraws")), w.signer): w for w in withdrawals}
    return {"key": man.config.digest, "manifest": man.digest, "key_fields": key_doc,
            "annotations": man.annotations, "signed_by": signer,
            "layer_bytes": sum(layer.size for layer in man.layers),
            "attestations": [_attestation(a) for a in evidence],
            "advisories": [{"digest": a.digest, "signer": a.signer,
                            "reason": _text(a.document.get("reason", ""), 500),
                            "made_at": _text(a.document.get("made_at", "")),
                            "withdrawn": None if a.digest in standing else {
                                "reason": _text(why_withdrawn[a.digest, a.signer].document.get("reason", ""), 500),
                                "made_at": _text(why_withdrawn[a.digest, a.signer].document.get("made_at", ""))}}
                           for a in advisories],
            "left_out": [_text(x, 300) for x in (left_out + adv_left + wd_left)]}


def _dict(value) -> dict:
    return value if isinstance(value, dict) else {}


def _list(value, most: int = 256) -> list:
    return value[:most] if isinstance(value, list) else []


def _scalar(value):
    """A JSON scalar as it is (numbers, true/false, null), anything else as one line of text:
    what a document says is shown, never run or printed raw."""
    if value is None or isinstance(value, (bool, int, float)):
        return value
    return _text(value)


def _attestation(a: artifact.Attached) -> dict:
    """One trusted evidence document, read field by field: a field of the wrong type is left out
    (its signer vouched for the bytes, not for their shape)."""
    d = a.document
    host = _dict(d.get("host"))
    shapes = [{k: _scalar(c.get(k)) for k in ("ctx", "batch", "ubatch", "fa", "ngl", *SERVING_FIELDS, "passed",
                                               "kld_mean", "top1", "ppl", "ppl_ref")}
              for row in _list(d.get("verify"), 64) if isinstance(row, dict)
              for c in _list(row.get("checks"), 256) if isinstance(c, dict)]
    gpus = [_text(g.get("gfx") or g.get("name"), 40) for g in _list(host.get("gpus"), 16) if isinstance(g, dict)]
    return {"signer": a.signer, "kind": _scalar(d.get("kind")), "passed": _scalar(d.get("passed")),
            "made_at": _scalar(d.get("made_at")), "rocforge": _scalar(d.get("rocforge")),
            "host": {**{k: _scalar(host.get(k)) for k in ("kernel", "os", "cpu", "rocm", "firmware",
                                                        "cmdline", "iommu", "gtt_bytes")},
                     "gpus": gpus, "firmware_packages": [_text(p) for p in _list(host.get("firmware_packages"), 32)],
                     "vulkan": _vulkan(_dict(host.get("vulkan")))},
            "model_sha256": _scalar(_dict(d.get("model")).get("sha256")),
            "own_figures": [{k: _scalar(f.get(k)) for k in ("ctx", "chunks", "fa", "ppl", *OWN_SERVING)}
                            for f in _list(d.get("own_figures"), 16) if isinstance(f, dict)],
            "shapes": shapes, "note": _text(d.get("note", ""), 300)}


def _vulkan(v: dict) -> dict | None:
    """A Vulkan host's devices (name, driver) and ICD manifests, as the publisher's build saw them."""
    if not v:
        return None
    return {"devices": [{"name": _text(d.get("name"), 120), "driver": _text(d.get("driver"), 80)}
                        for d in _list(v.get("devices"), 16) if isinstance(d, dict)],
            "icds": [{"file": _text(i.get("file"), 200), "library": _text(i.get("library"), 200),
                      "api_version": _text(i.get("api_version"), 40) if i.get("api_version") else None}
                     for i in _list(v.get("icds"), 32) if isinstance(i, dict)],
            "error": _text(v.get("error", ""), 200)}


def describe_show(shown: dict) -> list[str]:
    """Lines for people; every value came through `_attestation` (one line each) or JSON."""
    fields = shown.get("key_fields") or {}
    lines = [f"key       {shown['key']}", f"manifest  {shown['manifest']}",
             f"signed    {_text(shown['signed_by'], 300)}",
             f"size      {shown['layer_bytes'] / 1e6:.1f} MB"]
    if isinstance(fields, dict):
        for name in ("recipe", "source", "target", "backend", "toolchain", "glibc", "machine"):
            if name in fields:
                lines.append(f"  {name:<10}{_text(json.dumps(fields[name], sort_keys=True), 160)}")
    for adv in shown["advisories"]:
        if adv["withdrawn"] is None:
            lines.append(f"ADVISORY  {adv['digest'][:19]} by {adv['signer']} ({adv['made_at']}): {adv['reason']}")
        else:
            lines.append(f"withdrawn advisory {adv['digest'][:19]} by {adv['signer']} ({adv['made_at']}): "
                         f"{adv['reason']}; withdrawn {adv['withdrawn']['made_at']}: {adv['withdrawn']['reason']}")
    if not shown["attestations"]:
        lines.append("no trusted attestations")
    for a in shown["attestations"]:
        h = a["host"]
        verdict = "passed" if a["passed"] is True else "FAILED" if a["passed"] is False else "no verdict"
        lines.append(f"attestation {a['kind']} by {a['signer']} {a['made_at']}: {verdict}")
        lines.append(f"  host: kernel {h['kernel']}, ROCm {h['rocm']}, GPUs {', '.join(h['gpus']) or 'none'}, "
                     f"firmware {h['firmware']}")
        if h.get("vulkan") is not None:
            vk = h["vulkan"]
            devices = "; ".join(f"{d['name']} (driver {d['driver']})" for d in vk["devices"]) or "no device"
            icds = ", ".join(Path(i["file"]).name + (f" (Vulkan {i['api_version']})" if i["api_version"] else "")
                             for i in vk["icds"]) or "none"
            lines.append(f"  vulkan: {devices}; ICDs {icds}" + (f" ({vk['error']})" if vk["error"] else ""))
        for sh in a["shapes"][:64]:
            batch = f" b {sh['batch']}" if sh["batch"] is not None else ""  # recorded since verify kept it
            lines.append(f"  ctx {sh['ctx']}{batch} ub {sh['ubatch']} fa {sh['fa']} ngl {sh['ngl']}, {_serving(sh)}: "
                         f"{'passed' if sh['passed'] is True else 'FAILED'} (KLD {sh['kld_mean']}, "
                         f"top-1 {sh['top1']})")
        for f in a["own_figures"]:
            lines.append(f"  own PPL at ctx {f['ctx']} fa {f['fa']}, {_own_serving(f)}: {f['ppl']}")
        if a["note"]:
            lines.append(f"  note: {a['note']}")
    for x in shown["left_out"]:
        lines.append(f"left out: {x}")
    return lines


def _serving(shape: dict) -> str:
    """A check's serving dimensions as `llama-server` would hold them (KV cache type, how the
    weights were loaded, slots); a check stored before they were recorded says so rather than
    passing for llama.cpp's defaults."""
    if not serving_known(shape):
        return "serving not recorded"
    return f"kv {shape['kv']} load {shape['load']} slots {shape['parallel']}"


def _own_serving(f: dict) -> str:
    """An own figure's batch and serving dimensions, as far as its document records them."""
    if all(f.get(k) is None for k in OWN_SERVING):
        return "serving not recorded"
    return (f"b {f.get('batch')} ub {f.get('ubatch')}, kv {f.get('kv')} load {f.get('load')} "
            f"slots {f.get('parallel')}")


def advise(url: str, ref: str, reason: str, key_file: Path, trusted: list[signing.PublicKey], *,
           timeout: float) -> str:
    """A signed advisory that the build is bad, attached to it: build and upgrade refuse a
    substitute with one (and a compile of the same key, unless forced)."""
    reason = reason.strip()
    if not reason or len(reason) > 500 or one_line(reason) != reason:
        raise UsageError("--reason must be one line of at most 500 characters")
    pair = signing.read_secret_key(key_file)
    with open_store(url, timeout=timeout) as store:
        man = resolve(store, ref, trusted)
        doc = {"schema": "rocforge.advisory/1", "key": man.config.digest, "reason": reason,
               "rocforge": __version__, "made_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        made = artifact.attach(store, man, oci.ADVISORY_TYPE, doc, pair)
    return made.digest


def withdraw(url: str, ref: str, advisory: str, reason: str, key_file: Path,
             trusted: list[signing.PublicKey], *, timeout: float) -> str:
    """A signed withdrawal of one of this key's advisories on a build (named by its digest or its
    first 12+ hex digits): build and upgrade then use the build again.  Only the advisory's own
    signer can withdraw it (`artifact.in_force`), so the key must be the one that signed it."""
    reason = reason.strip()
    if not reason or len(reason) > 500 or one_line(reason) != reason:
        raise UsageError("--reason must be one line of at most 500 characters")
    wanted = advisory.lower().removeprefix("sha256:")
    if not re.fullmatch(r"[0-9a-f]{12,64}", wanted):
        raise UsageError(f"--withdraw {one_line(advisory)[:80]!r} is not an advisory's digest",
                         "`rocforge store show URL KEY` lists each advisory with its digest")
    pair = signing.read_secret_key(key_file)
    with open_store(url, timeout=timeout) as store:
        first = resolve(store, ref, [*trusted, pair.public])
        refs = []
        for man in all_of(store, first.config.digest, [*trusted, pair.public]):  # whichever build holds it
            refs = [r for r in store.referrers(man.digest, oci.ADVISORY_TYPE)
                    if r.digest.removeprefix("sha256:").startswith(wanted)]
            if refs:
                break
        if len(refs) != 1:
            raise UsageError(f"the build has {'no' if not refs else 'more than one'} advisory "
                             f"{wanted[:19]}...", "`rocforge store show URL KEY` lists its advisories")
        says = one_line(str(refs[0].annotations.get(artifact.SIGNER, "no key")))[:16]
        if says != pair.key_id:
            raise UsageError(f"the advisory {refs[0].digest[:19]} says it was signed by {says}: only "
                             f"that key can withdraw it, not {pair.key_id}")
        mine, _ = artifact.attached(store, man, oci.ADVISORY_TYPE, [pair.public])
        if not any(a.digest == refs[0].digest for a in mine):
            raise UsageError(f"the advisory {refs[0].digest[:19]} names {pair.key_id} but its signature "
                             "by that key does not hold: there is nothing of this key's to withdraw")
        doc = {"schema": "rocforge.advisory-withdrawal/1", "key": man.config.digest,
               "withdraws": refs[0].digest, "reason": reason, "rocforge": __version__,
               "made_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        made = artifact.attach(store, man, oci.WITHDRAWAL_TYPE, doc, pair)
    return made.digest
