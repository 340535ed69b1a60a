"""GPU discovery: the KFD sysfs topology first, `rocminfo` output as the fallback.

KFD (amdkfd `kfd_topology.c`, `node_show`) writes one `key value` line per property to
`/sys/class/kfd/kfd/topology/nodes/<N>/properties`; CPU nodes report `simd_count 0` and
`gfx_target_version 0`.  GPU nodes are kept in KFD order, which is the order ROCR enumerates
agents in — so a GPU's `index` is the number `ROCR_VISIBLE_DEVICES` takes.

iGPU or dGPU: KFD has no explicit flag (libhsakmt asks the DRM driver for
`AMDGPU_IDS_FLAGS_FUSION`), so the decision is, in order: an APU node (CPU cores and SIMDs on
one node, as CRAT-described APUs report), the target table's `kind`, else "dgpu".  rocminfo
prints `Memory Properties: APU` for APU agents.

Stdlib only: `rocforge env` runs this on every shell start-up.
"""

from __future__ import annotations

import os
import re

from rocforge_build import errors
from rocforge_build.discover import targets
from rocforge_build.discover.envcache import touch
from rocforge_build.errors import DetectionError
from rocforge_build.records import FRESH, Record, fresh, init
from rocforge_build.rootfs import Root, open_regular

KFD_NODES = "/sys/class/kfd/kfd/topology/nodes"  # an inner path
AMD_VENDOR_ID = 0x1002


class Gpu(Record):
    __slots__ = ("index", "node", "gfx", "gfx_target_version", "kind", "kind_reason",
                 "compute_units", "device_id", "unique_id", "marketing_name", "drm_render_minor",
                 "source", "extra")
    _hidden = ("extra",)

    def __init__(self,
                 index: int,  # position among GPU agents (ROCR_VISIBLE_DEVICES index)
                 node: int | None,  # KFD topology node (HSA_OVERRIDE_GFX_VERSION_<node>)
                 gfx: str, gfx_target_version: int,
                 kind: str,  # "igpu" | "dgpu"
                 kind_reason: str, compute_units: int | None = None,
                 device_id: int | None = None,  # PCI device id
                 # KFD unique_id as 16 hex digits (ROCR's GPU-<uuid>), None if 0
                 unique_id: str | None = None,
                 marketing_name: str | None = None, drm_render_minor: int | None = None,
                 source: str = "kfd",  # "kfd" | "rocminfo" | "--target"
                 extra: dict = FRESH):
        init(self, index, node, gfx, gfx_target_version, kind, kind_reason, compute_units,
             device_id, unique_id, marketing_name, drm_render_minor, source, fresh(extra))

    @property
    def known(self) -> bool:
        return targets.known(self.gfx)

    @property
    def target(self) -> targets.Target | None:
        return targets.get_target(self.gfx) if self.known else None

    @property
    def is_igpu(self) -> bool:
        return self.kind == "igpu"

    def describe(self) -> str:
        where = f"node {self.node}" if self.node is not None else self.source
        cus = f", {self.compute_units} CUs" if self.compute_units else ""
        return f"{self.gfx} {self.kind} ({where}{cus})"

    def to_json(self) -> dict:
        return {
            "index": self.index,
            "node": self.node,
            "gfx": self.gfx,
            "gfx_target_version": self.gfx_target_version,
            "known": self.known,
            "kind": self.kind,
            "kind_reason": self.kind_reason,
            "compute_units": self.compute_units,
            "device_id": None if self.device_id is None else f"0x{self.device_id:04x}",
            "unique_id": self.unique_id,
            "marketing_name": self.marketing_name,
            "drm_render_minor": self.drm_render_minor,
            "source": self.source,
        }


class Discovery(Record):
    __slots__ = ("gpus", "source", "warnings")

    def __init__(self, gpus: tuple[Gpu, ...],
                 source: str,  # "kfd" | "rocminfo" | "none"
                 warnings: tuple[str, ...] = ()):
        init(self, gpus, source, warnings)


# -- KFD ---------------------------------------------------------------------------------------
def parse_properties(text: str, where: str) -> dict[str, int]:
    """`key value` lines (values unsigned decimal, as sysfs_show_32/64bit_prop print them)."""
    props: dict[str, int] = {}
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        parts = line.split()
        if len(parts) != 2 or not parts[1].isdigit() or not re.fullmatch(r"[a-z0-9_]+", parts[0]):
            raise DetectionError(
                f"{where}:{lineno}: not a KFD `key value` line: {line.strip()[:60]!r}",
                "the KFD topology looks corrupt; check the amdgpu driver (dmesg) or the --root",
            )
        props[parts[0]] = int(parts[1])
    return props


def _kind_from(props: dict[str, int], gfx: str) -> tuple[str, str]:
    if props.get("cpu_cores_count", 0) > 0 and props.get("simd_count", 0) > 0:
        return "igpu", "APU node: KFD reports CPU cores and SIMDs on one node"
    if targets.known(gfx):
        t = targets.get_target(gfx)
        return t.kind, f"target table: {gfx} is an {t.kind}"
    return "dgpu", f"{gfx} is not in the target table; assumed discrete"


def _kfd_gpu(index: int, node: int, props: dict[str, int], name_file: str | None) -> Gpu:
    version = props["gfx_target_version"]
    try:
        gfx = targets.gfx_name(version)
    except ValueError as exc:
        raise DetectionError(
            f"KFD node {node}: gfx_target_version {version} is not a valid encoding",
            "the KFD topology looks corrupt; check the amdgpu driver",
        ) from exc
    kind, reason = _kind_from(props, gfx)
    simd = props.get("simd_count", 0)
    per_cu = props.get("simd_per_cu", 0)
    cus = simd // per_cu if per_cu else None
    uid = props.get("unique_id", 0)
    return Gpu(
        index=index, node=node, gfx=gfx, gfx_target_version=version, kind=kind,
        kind_reason=reason, compute_units=cus, device_id=props.get("device_id"),
        unique_id=f"{uid:016x}" if uid else None,
        marketing_name=name_file or None,
        drm_render_minor=props.get("drm_render_minor"),
        source="kfd", extra={"properties": props},
    )


def discover_kfd(root: Root) -> Discovery | None:
    """GPUs from the KFD topology in `root`; None when there is no topology at all."""
    touch(root.host_str(KFD_NODES))
    if not root.exists(KFD_NODES):
        return None
    try:
        entries = os.listdir(root.host_str(KFD_NODES))
    except OSError as exc:
        raise DetectionError(
            f"cannot read {KFD_NODES}: {errors.reason(exc)}",
            "run as a user who can read /sys, or give the right --root",
        ) from exc
    nodes = sorted(int(e) for e in entries if e.isdigit())
    gpus: list[Gpu] = []
    warnings: list[str] = []
    for node in nodes:
        path = f"{KFD_NODES}/{node}/properties"
        touch(root.host_str(path), content=True)
        try:
            with open_regular(root.host_str(path), "r", encoding="ascii") as fh:
                text = fh.read()
        except PermissionError:
            # amdkfd answers EPERM for GPUs outside the device cgroup (containers).
            warnings.append(f"{path}: permission denied; GPU on KFD node {node} skipped "
                            "(outside this container's device cgroup?)")
            continue
        except (OSError, UnicodeDecodeError) as exc:
            reason = errors.reason(exc)
            raise DetectionError(
                f"cannot read {path}: {reason}",
                "the KFD topology is unreadable; check the amdgpu driver or the --root",
            ) from exc
        props = parse_properties(text, path)
        if props.get("simd_count", 0) == 0 or props.get("gfx_target_version", 0) == 0:
            continue  # a CPU node
        vendor = props.get("vendor_id")
        if vendor not in (None, 0, AMD_VENDOR_ID):
            continue
        name = None
        name_file = root.host_str(f"{KFD_NODES}/{node}/name")
        touch(name_file, content=True)
        try:
            with open_regular(name_file, "r", encoding="ascii") as fh:
                name = fh.read().strip()
        except (OSError, UnicodeDecodeError):
            pass
        gpus.append(_kfd_gpu(len(gpus), node, props, None if name in ("", "ip discovery") else name))
    return Discovery(tuple(gpus), "kfd", tuple(warnings))


# -- rocminfo ----------------------------------------------------------------------------------
# patterns for `re`'s functions (compiled on first use: the rocminfo fallback is rare)
_AGENT = r"(?m)^\*{7}\s*$\n^Agent\s+\d+\s*$\n^\*{7}\s*$"
_FIELD = r"^  ([A-Za-z][A-Za-z0-9 .()/-]*?):\s*(.*?)\s*$"


def parse_rocminfo(text: str) -> list[Gpu]:
    """GPU agents from `rocminfo` output (rocminfo.cc: `  Label:` padded to 25 columns)."""
    blocks = re.split(_AGENT, text)[1:]
    gpus: list[Gpu] = []
    for block in blocks:
        fields: dict[str, str] = {}
        for line in block.splitlines():
            m = re.match(_FIELD, line)
            if m and m.group(1) not in fields:
                fields[m.group(1)] = m.group(2)
        if fields.get("Device Type", "").upper() != "GPU":
            continue
        gfx = fields.get("Name", "").strip()
        try:
            version = targets.gfx_version(gfx)
        except ValueError:
            continue
        apu = fields.get("Memory Properties", "").strip().upper() == "APU"
        if apu:
            kind, reason = "igpu", "rocminfo: Memory Properties: APU"
        elif targets.known(gfx):
            t = targets.get_target(gfx)
            kind, reason = t.kind, f"target table: {gfx} is an {t.kind}"
        else:
            kind, reason = "dgpu", f"{gfx} is not in the target table; assumed discrete"
        uuid = fields.get("Uuid", "")
        uid = uuid[4:].lower() if uuid.startswith("GPU-") and uuid[4:].strip("Xx") else None
        chip = re.match(r"(\d+)", fields.get("Chip ID", ""))
        node = re.match(r"(\d+)", fields.get("Node", ""))
        cus = re.match(r"(\d+)", fields.get("Compute Unit", ""))
        gpus.append(Gpu(
            index=len(gpus), node=int(node.group(1)) if node else None, gfx=gfx,
            gfx_target_version=version, kind=kind, kind_reason=reason,
            compute_units=int(cus.group(1)) if cus else None,
            device_id=int(chip.group(1)) if chip else None, unique_id=uid,
            marketing_name=fields.get("Marketing Name") or None, source="rocminfo",
        ))
    return gpus


def find_rocminfo(environ: dict[str, str] | None = None) -> str | None:
    from rocforge_build.proc import which

    env = os.environ if environ is None else environ
    for base in (env.get("ROCM_PATH"), "/opt/rocm"):
        if base and os.access(os.path.join(base, "bin", "rocminfo"), os.X_OK):
            return os.path.join(base, "bin", "rocminfo")
    return which("rocminfo", env.get("PATH"))


def discover_rocminfo(program: str) -> Discovery:
    from rocforge_build import proc
    from rocforge_build.errors import RocforgeError

    try:
        result = proc.run([program], check=False, timeout=20)
    except (RocforgeError, OSError) as exc:
        return Discovery((), "rocminfo", (f"rocminfo could not run: {errors.reason(exc)}",))
    except Exception as exc:  # subprocess.TimeoutExpired and friends
        return Discovery((), "rocminfo", (f"rocminfo did not finish: {exc}",))
    gpus = parse_rocminfo(result.stdout or "")
    warnings = ()
    if result.returncode != 0 and not gpus:
        last = (result.stdout or "").strip().splitlines()[-1:] or [""]
        last = re.sub(r"\x1b\[[0-9;]*m", "", last[0])[:120]
        warnings = (f"rocminfo failed (exit {result.returncode}): {last}",)
    return Discovery(tuple(gpus), "rocminfo", warnings)


def discover(root: Root, *, environ: dict[str, str] | None = None,
             rocminfo: str | None = None) -> Discovery:
    """KFD topology of `root`; rocminfo only on the host root when KFD is absent."""
    found = discover_kfd(root)
    if found is not None:
        return found
    touch(root.host_str("/dev/kfd"))
    if rocminfo is None and (not root.is_host or not root.exists("/dev/kfd")):
        # rocminfo describes the host, and cannot see a GPU without /dev/kfd anyway.
        return Discovery((), "none", ())
    program = rocminfo or find_rocminfo(environ)
    if program is None:
        return Discovery((), "none", ())
    return discover_rocminfo(program)


def virtual_gpu(gfx: str) -> Gpu:
    """A GPU that is not in this machine, named by `--target` (container builds, CI)."""
    t = targets.get_target(gfx)
    return Gpu(index=-1, node=None, gfx=t.name, gfx_target_version=t.gfx_target_version,
               kind=t.kind, kind_reason=f"target table: {t.name} is an {t.kind}",
               compute_units=t.compute_units, source="--target")
