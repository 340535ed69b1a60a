"""Exchanging two names in one step (renameat2 RENAME_EXCHANGE, rename(2) man page), so at every
instant a complete tree is at the destination: the one primitive `replace.swap` and
`ownership.install_tree` both build on.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

RENAME_EXCHANGE = 2  # linux/fs.h
_AT_FDCWD = -100
_SYS_RENAMEAT2 = {"x86_64": 316, "aarch64": 276, "ppc64le": 357, "s390x": 347}
_UNSUPPORTED = {errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP}


def exchange(a: Path, b: Path) -> bool:
    """Swap the names `a` and `b` in one step (renameat2 RENAME_EXCHANGE, Linux 3.15+); False
    where the file system or kernel cannot (the caller falls back), OSError for anything else."""
    import ctypes
    import platform

    libc = ctypes.CDLL(None, use_errno=True)
    args = (_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), RENAME_EXCHANGE)
    if hasattr(libc, "renameat2"):  # glibc 2.28+
        rc = libc.renameat2(ctypes.c_int(args[0]), ctypes.c_char_p(args[1]), ctypes.c_int(args[2]),
                            ctypes.c_char_p(args[3]), ctypes.c_uint(args[4]))
    elif platform.machine() in _SYS_RENAMEAT2:
        rc = libc.syscall(ctypes.c_long(_SYS_RENAMEAT2[platform.machine()]), *(
            ctypes.c_long(args[0]), ctypes.c_char_p(args[1]), ctypes.c_long(args[2]),
            ctypes.c_char_p(args[3]), ctypes.c_ulong(args[4])))
    else:
        return False
    if rc == 0:
        return True
    err = ctypes.get_errno()
    if err in _UNSUPPORTED:
        return False
    raise OSError(err, os.strerror(err), str(a), None, str(b))
