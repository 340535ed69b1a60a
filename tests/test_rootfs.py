import os
from pathlib import PurePosixPath

from rocforge_build.rootfs import Root


def test_absolute_links_stay_inside_the_root(tmp_path):
    (tmp_path / "opt/rocm-6.4.1/bin").mkdir(parents=True)
    os.symlink("/opt/rocm-6.4.1", tmp_path / "opt/rocm")
    root = Root(tmp_path)
    assert root.resolve("/opt/rocm/bin") == PurePosixPath("/opt/rocm-6.4.1/bin")
    assert root.host("/opt/rocm/bin") == tmp_path / "opt/rocm-6.4.1/bin"
    assert root.is_symlink("/opt/rocm")


def test_dotdot_cannot_escape(tmp_path):
    root = Root(tmp_path)
    assert root.resolve("/../../etc/passwd") == PurePosixPath("/etc/passwd")
    assert root.host("/../../etc") == tmp_path / "etc"


def test_link_loop_does_not_hang(tmp_path):
    os.symlink("/b", tmp_path / "a")
    os.symlink("/a", tmp_path / "b")
    root = Root(tmp_path)
    assert not root.exists("/a/x")


def test_inner_inverse(tmp_path):
    root = Root(tmp_path)
    assert root.inner(tmp_path / "usr/lib") == PurePosixPath("/usr/lib")


def _old_resolve(root: Root, inner) -> PurePosixPath:
    """Root.resolve as it was written with pathlib objects (before it worked on strings)."""
    parts = list(PurePosixPath("/", os.fspath(inner)).parts[1:])
    done: list[str] = []
    hops = 0
    while parts:
        part = parts.pop(0)
        if part in ("", "."):
            continue
        if part == "..":
            if done:
                done.pop()
            continue
        candidate = PurePosixPath("/", *done, part)
        rel = str(candidate).lstrip("/")
        host = root.base / rel if rel else root.base
        if host.is_symlink():
            hops += 1
            if hops > 40:
                return candidate
            target = os.readlink(host)
            if target.startswith("/"):
                done = []
            parts = list(PurePosixPath(target).parts) + parts
            if target.startswith("/"):
                parts = parts[1:]
            continue
        done.append(part)
    return PurePosixPath("/", *done)


def test_resolve_as_the_pathlib_walk_did(tmp_path):
    """Links absolute and relative, to links, with `..`, `.` and `//`, dangling, looping and
    through a file: every combination resolves as the former pathlib implementation did."""
    import itertools

    for d in ("opt/rocm-7/lib/llvm/bin", "usr/lib", "etc"):
        (tmp_path / d).mkdir(parents=True)
    (tmp_path / "etc/file").write_text("x")
    links = {"opt/rocm": "/opt/rocm-7", "opt/rel": "rocm-7/lib", "opt/rocm-7/llvm": "lib/llvm",
             "opt/up": "../usr//./lib", "opt/chain": "/opt/rocm", "opt/dangling": "/nowhere/x",
             "loop1": "/loop2", "loop2": "loop1", "opt/deep": "../../../../etc",
             "usr/lib/self": ".", "etc/through": "file/x", "opt/slashes": "//opt///rocm-7/"}
    for name, target in links.items():
        os.symlink(target, tmp_path / name)
    root = Root(tmp_path)
    names = ["opt", "rocm", "rel", "llvm", "bin", "up", "chain", "dangling", "loop1", "deep",
             "self", "through", "slashes", "..", ".", "", "etc", "file", "x", "usr", "lib"]
    checked = 0
    for n in (1, 2, 3):
        for combo in itertools.product(names, repeat=n):
            for inner in ("/".join(combo), "/" + "/".join(combo), "//" + "/".join(combo)):
                assert root.resolve(inner) == _old_resolve(root, inner), inner
                checked += 1
    assert checked > 25000
    assert Root("/").resolve("/usr/../etc//./") == PurePosixPath("/etc")
    for combo in itertools.product(names, repeat=2):  # is_symlink as the pathlib one answered
        inner = PurePosixPath("/", *combo)
        rel = str(root.resolve(inner.parent) / inner.name).lstrip("/")
        old = (root.base / rel if rel else root.base).is_symlink()
        assert root.is_symlink("/".join(combo)) == old, combo


def test_exists_is_dir_and_is_file_answer_as_pathlib_does(tmp_path):
    (tmp_path / "d").mkdir()
    (tmp_path / "d/f").write_text("x")
    os.mkfifo(tmp_path / "d/fifo")
    os.symlink("/d/f", tmp_path / "link")
    os.symlink("/nowhere", tmp_path / "dangling")
    root = Root(tmp_path)
    for inner in ("/", "/d", "/d/f", "/d/fifo", "/link", "/dangling", "/d/f/under-a-file", "/missing"):
        real = root.host(inner)
        assert (root.exists(inner), root.is_dir(inner), root.is_file(inner)) == \
            (real.exists(), real.is_dir(), real.is_file()), inner


def _old_glob(root: Root, base: str, pattern: str) -> list[PurePosixPath]:
    """Root.glob as it was, on pathlib: the reference for the string glob."""
    inner = PurePosixPath("/", base)
    host = root.host(inner)
    return sorted(inner / p.relative_to(host).as_posix() for p in host.glob(pattern))


def test_glob_finds_what_pathlib_glob_found(tmp_path):
    """Hidden names, links to directories and files, broken links, bracket and `?` patterns,
    several wildcard components, a literal last part: the string glob (`rocforge env` imports
    no pathlib) finds what the former `Path.glob` implementation found, in its order."""
    import itertools

    for d in ("opt/rocm-7.1/lib/llvm-21/bin", "opt/rocm-7.1/lib/llvm-9/bin", "opt/rocm-7.1/.kpack",
              "opt/rocm-7.1/lib/rocblas/library/gfx1151", "usr/lib/x86_64-linux-gnu/amdgcn/bitcode",
              "opt/b-c/d", "opt/b/c"):
        (tmp_path / d).mkdir(parents=True)
    for f in ("opt/rocm-7.1/.kpack/blas_gfx1151.kpack", "opt/rocm-7.1/lib/libamdhip64.so.7",
              "opt/rocm-7.1/lib/rocblas/library/TensileLibrary_gfx1151.dat", "opt/[x]", "opt/.hidden",
              "usr/lib/x86_64-linux-gnu/amdgcn/bitcode/oclc_isa_version_1151.bc", "opt/b-c/d/f",
              "opt/b/c/f"):
        (tmp_path / f).write_text("x")
    os.symlink("rocm-7.1", tmp_path / "opt/rocm")  # relative: pathlib's glob follows it too
    os.symlink("lib/llvm-21", tmp_path / "opt/rocm-7.1/llvm")
    os.symlink("nowhere", tmp_path / "opt/rocm-7.1/lib/libbroken.so")
    os.symlink("libamdhip64.so.7", tmp_path / "opt/rocm-7.1/lib/libamdhip64.so")
    root = Root(tmp_path)
    bases = ["/", "/opt", "/opt/rocm", "/opt/rocm-7.1", "/opt/rocm/lib", "/usr", "/missing", "opt"]
    patterns = ["*", ".*", "*/*", "lib/*", "lib/llvm-*/bin", "llvm*/bin", "rocm*", "rocm-*/lib/*.so*",
                ".kpack/*.kpack", "lib/rocblas/library/*", "lib/*/library", "[x]", "[[]x]", "?",
                "b*/*/f", "lib/libbroken.so", "lib/lib*", "lib/x86_64-linux-gnu/amdgcn/bitcode",
                "lib/*/amdgcn/bitcode/oclc_isa_version_*.bc", "bin", "*/bin", "lib/"]
    checked = 0
    for base, pattern in itertools.product(bases, patterns):
        assert root.glob(base, pattern) == _old_glob(root, base, pattern), (base, pattern)
        checked += bool(root.glob_str(base, pattern))
    assert checked > 20  # most pairs find something: the comparison is not of empty lists
    # where the former one escaped the base (`..`) or raised (absolute, `**` aside), nothing
    assert root.glob_str("/opt/rocm", "../*") == [] and root.glob_str("/opt", "/etc/*") == []


def test_inner_join_and_inner_path_are_purepath_joins():
    import itertools

    from rocforge_build.rootfs import inner_join, inner_path

    pieces = ["", ".", "..", "a", "b/c", "/x", "d/", "./e", "f//g", "..."]
    for base in ("/", "/opt", "/opt/rocm", "/a/.."):
        for parts in itertools.product(pieces, repeat=2):
            if any(p.startswith("/") for p in parts):
                continue  # absolute parts are not joined (PurePath would restart at them)
            assert inner_join(base, *parts) == str(PurePosixPath(base, *parts)), (base, parts)
    # PurePosixPath("/", text), except that a leading `//` (POSIX's implementation-defined root)
    # is one `/` here: inner paths have one root
    for text, want in (("opt/rocm", "/opt/rocm"), ("/opt/rocm/", "/opt/rocm"), ("//opt", "/opt"),
                       ("/./a/../b", "/a/../b"), ("", "/"), (".", "/"), ("a//b/.", "/a/b")):
        assert inner_path(text) == want, text
        assert text.startswith("//") or want == str(PurePosixPath("/", text)), text
