"""The start-up version gate of the kernel stack (SPEC C-KERNEL): Triton's version and cpkv's kernel ABI.

Imports Triton only when asked (``require_kernel_version``), so ``import cpkv`` never needs it.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass

import numpy as np

from ..errors import ConfigError, KernelVersionError

KERNEL_ABI = 2
"""cpkv's kernel ABI number: bumped whenever a kernel's arguments or results change. A caller written
against ABI n passes ``minimum=n`` to ``require_kernel_version``. 2: ``fill_out_cache_loc_kernel`` takes
``num_blocks`` and a row per program in its run table (``slots.fill_table``)."""

TRITON_MINIMUM = (3, 2, 0)
"""Oldest Triton release cpkv's kernels are written for. The kernel tests pass in the interpreter of 3.2.0
(numpy 2.3 and 1.26), 3.7.1, 3.8.0 and 3.9.0 (numpy 2.4); the compiled kernels await a GPU run."""

INTERPRETER_MINIMUM = (3, 7, 0)
"""Oldest Triton whose CPU interpreter runs the kernels under numpy >= 2.4: older interpreters turn a loop
bound into a one-element array, which numpy 2.4 no longer converts to an int (with numpy <= 2.3 they
work, from ``TRITON_MINIMUM`` on)."""

_INSTALL_HINT = (
    "install the kernel stack with `pip install '.[gpu]'` in a cpkv checkout (Triton), or set CPKV_KERNELS=off "
    "to use the numpy/torch path"
)


@dataclass(frozen=True)
class KernelStack:
    """What ``require_kernel_version`` found: ``triton`` (version string, e.g. ``"3.9.0"``) and ``abi``
    (cpkv's ``KERNEL_ABI``)."""

    triton: str
    abi: int


def require_kernel_version(minimum: int = KERNEL_ABI, *, interpreter: bool = False) -> KernelStack:
    """Check at start-up that the kernel stack is present and new enough (SPEC C-KERNEL, the version gate).

    Two checks: Triton imports and is at least ``TRITON_MINIMUM`` (``INTERPRETER_MINIMUM`` for Triton's
    CPU interpreter under numpy >= 2.4); cpkv's ``KERNEL_ABI`` is at least ``minimum`` (the ABI the
    caller was written against).

    Args:
        minimum: the oldest kernel ABI the caller accepts, an int >= 1 (default: this cpkv's own).
        interpreter: check for running the kernels in Triton's CPU interpreter (``TRITON_INTERPRET=1``).

    Returns:
        ``KernelStack(triton=<version>, abi=KERNEL_ABI)``.

    Raises:
        ConfigError: ``minimum`` not an integer >= 1.
        KernelVersionError: Triton missing, unimportable or older than ``TRITON_MINIMUM``, or
            ``KERNEL_ABI < minimum``; one message naming found and required versions of both, e.g.
            ``"cpkv kernel stack: found triton 3.1.0 (required >= 3.2.0) and cpkv kernel ABI 1 (required
            >= 1); ..."``.
    """
    if isinstance(minimum, bool) or not hasattr(minimum, "__index__") or int(minimum) < 1:
        raise ConfigError(f"minimum kernel ABI must be an integer >= 1, got {minimum!r}")
    minimum = int(minimum)
    found, why = triton_version()
    floor, context = TRITON_MINIMUM, ""
    if interpreter and parse_version(np.__version__) >= (2, 4, 0):
        floor, context = INTERPRETER_MINIMUM, f" for Triton's interpreter under numpy {np.__version__}"
    triton_ok = found is not None and parse_version(found) >= floor
    if triton_ok and KERNEL_ABI >= minimum:
        return KernelStack(triton=found, abi=KERNEL_ABI)  # type: ignore[arg-type]
    required = ".".join(map(str, floor))
    shown = f"triton {found}" if found is not None else f"no usable triton ({why})"
    raise KernelVersionError(
        f"cpkv kernel stack: found {shown} (required >= {required}{context}) and cpkv kernel ABI "
        f"{KERNEL_ABI} (required >= {minimum}); "
        + (_INSTALL_HINT if not triton_ok else "upgrade cpkv to a release with that kernel ABI")
    )


@functools.cache
def triton_version() -> tuple[str | None, str]:
    """``(version, "")`` of the importable Triton, or ``(None, reason)`` when it is missing or broken.

    Cached: importing Triton takes about a second and happens once per process.
    """
    try:
        import triton
    except Exception as e:  # ImportError, or a broken install raising anything at import
        return None, f"import triton failed: {type(e).__name__}: {e}"
    return str(getattr(triton, "__version__", "0")), ""


def parse_version(text: str) -> tuple[int, int, int]:
    """The leading ``major.minor[.patch]`` of a version string as ints; ``(0, 0, 0)`` when there is none.

    Examples: ``"3.9.0" -> (3, 9, 0)``, ``"3.2.0+git4a3f" -> (3, 2, 0)``, ``"3.10" -> (3, 10, 0)``.
    """
    m = re.match(r"\s*(\d+)\.(\d+)(?:\.(\d+))?", text)
    if m is None:
        return (0, 0, 0)
    return (int(m.group(1)), int(m.group(2)), int(m.group(3) or 0))
