"""Input coercion and range checks for the whole library, each written once (SPEC C-FAIL-FAST, section 10).

Every check raises a typed error naming the offending value; the error type is a parameter where more
than one layer uses the check (``error=AllocatorError``, ``PrefixCacheError``, ``KernelError``...), so a
caller never catches one error to raise another. Two families:

- scalars: ``as_int``, ``check_int``, ``check_lane``, ``check_cp_size``, ``per_lane_ints`` (sizes, lanes,
  capacities), ``check_scalar`` / ``check_len`` (lengths and batch indices), ``parse_pages_per_lane`` (the
  flag's text) and ``check_name`` / ``expand_all`` (names a run selects, ``all`` expanded);
- JSON input: ``duplicate_key`` (a key written twice in one object, which JSON readers take silently);
- arrays: ``as_int_array`` (lists, numpy, tensors on any device that hold data), ``lengths`` (a batch's
  ``prefix_lens`` and ``extend_lens``), ``optional_lanes`` (head owners, phases) and the plan-size bound
  ``plan_bytes`` / ``check_plan_size``.

Each array check first tries a fast accept of the common valid input (``int64_fast``, ``int64_copy``) and
only on a miss runs the slow checks that explain what is wrong: the same result either way.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any, Protocol, SupportsIndex, cast

import numpy as np

from . import limits
from .errors import ConfigError, CpkvError, InputError, PlanError

if TYPE_CHECKING:
    from torch import Tensor

_I64 = np.int64

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
"""The int64 range. ``INT64_MAX`` is the largest value ``check_int`` accepts by default: every checked int
fits the int64 arrays it sizes or indexes (a larger one would overflow numpy with a bare ``OverflowError``)."""

MAX_POSITION = 2**53
"""Largest ``prefix_len + extend_len`` (tokens) the planner accepts: positions, slots and the MQA-logits
estimate stay exact in int64 (and in float64 for the cost model)."""


# ------------------------------------------------------------------------------------------ scalars
def is_bool(value: object) -> bool:
    """Whether ``value`` is a bool (Python, numpy, or a bool array / tensor), which is never an integer here."""
    return isinstance(value, (bool, np.bool_)) or str(getattr(value, "dtype", "")) in ("bool", "torch.bool")


def as_int(name: str, value: object, error: type[CpkvError] = ConfigError) -> int:
    """``value`` as an ``int`` when it is an integer (Python, numpy or 0-d tensor; not a bool), else ``error``
    (``"{name} must be an integer, got {value!r}"``)."""
    if isinstance(value, bool) or not hasattr(value, "__index__"):
        raise error(f"{name} must be an integer, got {value!r}")
    return int(value)


def check_int(
    name: str,
    value: object,
    minimum: int,
    maximum: int | None = INT64_MAX,
    error: type[CpkvError] = ConfigError,
) -> int:
    """Return ``value`` as an ``int`` when it is an integer in ``[minimum, maximum]``, else raise ``error``.

    Accepts Python and numpy integers; rejects ``bool``, floats and strings, naming ``name`` and the value.
    ``maximum`` defaults to ``INT64_MAX`` (the int64 range); ``None`` leaves the value unbounded (a seed,
    which sizes nothing). ``error`` is the typed error raised (default ``ConfigError``).
    """
    value = as_int(name, value, error)
    if value < minimum:
        raise error(f"{name} must be >= {minimum}, got {value}")
    if maximum is not None and value > maximum:
        bound = f"{maximum} (the int64 maximum)" if maximum == INT64_MAX else f"{maximum}"
        raise error(f"{name} must be <= {bound}, got {value}")
    return value


def check_lane(name: str, value: object, cp_size: int, error: type[CpkvError] = ConfigError) -> int:
    """Return ``value`` as an ``int`` lane (or rank) in ``[0, cp_size)``, else raise ``error`` naming ``name``.

    A bool or non-integer is refused as such (``"rank must be an integer, got True"``), not as a lane out
    of range; an integer outside the lanes gives ``"rank=9 out of range [0, 8)"``.
    """
    if (
        type(value) is int and 0 <= value < cp_size
    ):  # the common case (an eviction per lane and step), at once
        return value
    lane = as_int(name, value, error)
    if not 0 <= lane < cp_size:
        raise error(f"{name}={lane} out of range [0, {cp_size})")
    return lane


def check_cp_size(value: object) -> int:
    """Return ``value`` as an ``int`` cp_size in ``[1, cpkv.limits.MAX_CP_SIZE]``, else raise ``ConfigError``
    naming the value (and the limit when it is above it). Every CP group of cpkv checks its cp_size here:
    ``CPConfig`` (so the planner, allocator, ``cpkv plan`` and ``cpkv run-dist``), ``SharedKVLayout``,
    ``HostTier`` and ``SimConfig``."""
    cp_size = check_int("cp_size", value, 1, None)
    if cp_size > limits.MAX_CP_SIZE:
        raise ConfigError(
            f"cp_size={cp_size} is above cpkv's limit of {limits.MAX_CP_SIZE} ranks (cpkv.limits.MAX_CP_SIZE)"
        )
    return cp_size


def per_lane_ints(name: str, value: object, cp_size: int, minimum: int) -> list[int]:
    """A per-lane capacity: one int for every lane, or a sequence of ``cp_size`` ints, each ``>= minimum``.

    Example ``per_lane_ints("pages_per_lane", 8, 4, 1) -> [8, 8, 8, 8]``. Raises ``ConfigError`` naming
    ``name`` (and the lane index) for a non-integer, a value below ``minimum`` or a wrong length.
    """
    if hasattr(value, "__index__") and not isinstance(value, bool):
        return [check_int(name, value, minimum)] * cp_size
    if not hasattr(value, "__iter__") or isinstance(value, (str, bytes)):
        raise ConfigError(f"{name} must be an integer or a sequence of {cp_size} integers, got {value!r}")
    caps = [check_int(f"{name}[{r}]", q, minimum) for r, q in enumerate(value)]
    if len(caps) != cp_size:
        raise ConfigError(f"{name} has {len(caps)} entries, cp_size={cp_size} needs {cp_size}")
    return caps


def check_scalar(name: str, value: object, *, optional: bool = False) -> None:
    """PlanError naming ``name`` unless ``value`` is an integer (Python, numpy or 0-d tensor; not a bool),
    or None when ``optional``."""
    if optional and value is None:
        return
    if is_bool(value) or not hasattr(value, "__index__"):
        raise PlanError(f"{name} must be an integer{' or None' * optional}, got {value!r}")


def check_len(name: str, value: object) -> int:
    """``value`` as an int in ``[0, MAX_POSITION]`` (a length or a batch index), else PlanError naming it."""
    check_scalar(name, value)
    n = int(cast("SupportsIndex", value))  # check_scalar: an integer (has __index__)
    if n < 0:
        raise PlanError(f"{name}={n} must be >= 0")
    if n > MAX_POSITION:
        raise PlanError(f"{name} must be <= {MAX_POSITION}, got {n}")
    return n


EMPTY_PATH = "the path is empty; give a file or directory name"
"""Why an empty path text is refused (``Path("")`` is ``.``, the current directory): ``--out ""``, a grid's ``trace = ""``."""


def parse_pages_per_lane(text: str | None) -> int | tuple[int, ...] | None:
    """``--pages-per-lane`` as written (``simulate``, ``run-dist``, a sweep's grid): ``"16384"`` -> 16384 (every
    lane), ``"9,10,10,10"`` -> (9, 10, 10, 10) (one per lane), None and ``"auto"`` give None (the default:
    what the GPU holds under the measured model, ``SimConfig.for_workload``); the count and range are the
    config's to check.

    Raises:
        InputError: a part that is not an integer (``'x,1' is not an int or a comma-separated list of ints``).
    """
    if text is None or text == "auto":
        return None
    try:
        parts = [int(v) for v in text.split(",")]
    except ValueError:
        raise InputError(f"{text!r} is not an int or a comma-separated list of ints") from None
    return parts[0] if len(parts) == 1 else tuple(parts)


def check_name(name: object, allowed: tuple[str, ...], what: str) -> str:
    """``name`` when it is one of ``allowed``, else ConfigError naming it: ``check_name("ring", CP_STRATEGIES,
    "cp_strategy")`` -> ``cp_strategy 'ring' is unknown; use one of zigzag, interleave or all``."""
    if name not in allowed:
        raise ConfigError(f"{what} {name!r} is unknown; use one of {', '.join(allowed)} or all")
    return name


def expand_all(names: Sequence[str], allowed: tuple[str, ...], what: str) -> list[str]:
    """The names a run selects (``--policy``, ``--kv-storage``, ``--cp-strategy``; repeatable): ``all`` expands
    to every name of ``allowed`` in its order, each name is checked (``check_name``: ConfigError naming an
    unknown one as ``what``), and kept once, in the order first given. ``expand_all(["interleave", "all"],
    ("zigzag", "interleave"), "cp_strategy")`` -> ``["interleave", "zigzag"]``."""
    out: list[str] = []
    for given in names:
        for name in allowed if given == "all" else (given,):
            if check_name(name, allowed, what) not in out:
                out.append(name)
    return out


# ------------------------------------------------------------------------------------------- arrays
def as_int_array(
    name: str,
    values: object,
    n: int | None = None,
    *,
    error: type[CpkvError] = PlanError,
    flatten: bool = False,
    count_of: str = "prefix_lens",
) -> np.ndarray:
    """``values`` as a 1-D int64 numpy array of length ``n`` (when given), else ``error`` naming ``name``.

    Accepts a list or tuple of ints (bools are refused, though numpy would take them as 0 and 1), an
    integer numpy array or a tensor on any device that holds data (a ``meta`` tensor holds none).
    ``flatten``: an array of any shape is read in C order (SGLang hands over ``[B, 1]`` tensors); else a
    shape other than 1-D is refused. ``count_of`` names what ``n`` counts in the length-mismatch message
    (``"last_locs has 3 entries but prefix_lens has 2"``). The result may be ``values`` itself (an int64
    1-D array): copy it before writing.
    """
    fast = int64_fast(values)  # the common valid inputs, without the checks below (same result)
    if fast is not None and (n is None or fast.shape[0] == n):
        return fast
    if hasattr(values, "detach"):  # torch tensor
        values = tensor_values(name, values, error)
    elif isinstance(values, (list, tuple)) and any(is_bool(v) for v in values):
        i = next(i for i, v in enumerate(values) if is_bool(v))
        raise error(f"{name}[{i}] is a bool ({bool(values[i])}), not an integer")
    arr = np.asarray(values)
    if flatten:
        arr = arr.reshape(-1)
    if arr.ndim != 1:
        raise error(f"{name} must be 1-D, got shape {arr.shape}")
    if arr.size and arr.dtype == object:  # Python ints (of any size) or anything else, one by one
        items = arr.tolist()
        for i, v in enumerate(items):
            if is_bool(v) or not isinstance(v, (int, np.integer)):
                raise error(f"{name}[{i}] is {v!r} ({type(v).__name__}), not an integer")
            if not INT64_MIN <= int(v) <= INT64_MAX:
                raise error(f"{name} holds {int(v)}, outside the int64 range")
        arr = np.array([int(v) for v in items], dtype=np.int64)
    if arr.size and not np.issubdtype(arr.dtype, np.integer):
        raise error(f"{name} must hold integers, got dtype {arr.dtype}: {arr[:8].tolist()}")
    if arr.size and arr.dtype == np.uint64 and int(arr.max()) > INT64_MAX:
        raise error(f"{name} holds {int(arr.max())}, outside the int64 range")
    if n is not None and arr.shape[0] != n:
        raise error(f"{name} has {arr.shape[0]} entries but {count_of} has {n}")
    return arr.astype(_I64, copy=False)


def int64_fast(values: object) -> np.ndarray | None:
    """``values`` as ``as_int_array`` returns them when they are a 1-D int64 numpy array (itself) or a list
    or tuple of Python ints within int64 (a new array); None for anything else (then the full checks run)."""
    if type(values) is np.ndarray:
        return values if values.dtype == _I64 and values.ndim == 1 else None
    if type(values) is list or type(values) is tuple:
        if not all(type(v) is int for v in values):  # bools, numpy scalars, nesting: the full checks
            return None
        try:
            return np.array(values, dtype=_I64)
        except OverflowError:  # outside int64: the full checks name it
            return None
    return None


def int64_copy(values: object) -> np.ndarray | None:
    """A private 1-D int64 copy of ``values`` when they are an int64 numpy array, an int64 CPU tensor (torch
    already loaded, no grad) or a list of ints; None for anything else, valid or not (a fast path that
    declines hands the input to the full checks of ``as_int_array``)."""
    if type(values) is np.ndarray:
        arr = values.copy() if values.dtype == _I64 else None
    elif (torch := sys.modules.get("torch")) is not None and type(values) is torch.Tensor:  # torch loaded
        tensor = cast("Tensor", values)
        ok = tensor.dtype == torch.int64 and tensor.device.type == "cpu" and not tensor.requires_grad
        arr = tensor.numpy().copy() if ok else None
    elif type(values) is list:
        try:
            arr = np.array(values)
        except (OverflowError, ValueError, TypeError):
            return None
    else:
        return None
    return arr if arr is not None and arr.dtype == _I64 and arr.ndim == 1 else None


def tensor_values(name: str, tensor: Any, error: type[CpkvError] = PlanError) -> np.ndarray:
    """A tensor's values as numpy, or ``error`` naming ``name`` (no data, or a dtype numpy lacks)."""
    device = getattr(tensor, "device", None)
    if getattr(device, "type", None) == "meta":
        raise error(
            f"{name} is a tensor on device meta, which holds no values; pass a CPU tensor, array or list"
        )
    try:
        values: np.ndarray = tensor.detach().cpu().numpy()
        return values
    except TypeError:  # e.g. bfloat16: numpy has no such dtype
        raise error(f"{name} must hold integers, got dtype {tensor.dtype}") from None
    except (RuntimeError, NotImplementedError) as e:
        raise error(f"{name}: cannot read the tensor on device {device}: {e}") from None


def optional_lanes(name: str, values: object, n: int, cp_size: int) -> np.ndarray:
    """Head owners or phases as int64 ``[n]`` with -1 for None; PlanError when out of ``[0, C)``."""
    if values is None:
        return np.full(n, -1, dtype=_I64)
    if not isinstance(values, np.ndarray) and not hasattr(values, "detach"):
        values = [-1 if v is None else v for v in cast("Iterable[object]", values)]
    arr = as_int_array(name, values, n)
    if not arr.shape[0] or (arr.min() >= -1 and arr.max() < cp_size):
        return arr
    bad = np.flatnonzero((arr < -1) | (arr >= cp_size))
    if bad.size:
        i = int(bad[0])
        lanes = (
            f"[0, {cp_size}), or -1 (or None) for no head owner"
            if name == "head_owners"
            else f"[0, {cp_size})"
        )
        raise PlanError(f"request {i}: {name[:-1]}={int(arr[i])} out of range {lanes}")
    return arr


def lengths(prefix_lens: object, extend_lens: object, first_index: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """``(prefix_lens, extend_lens)`` as int64 ``[B]`` arrays; PlanError naming the request and value.

    Valid: both >= 0 and ``prefix_len + extend_len <= MAX_POSITION``; ``first_index`` is the batch
    position of entry 0 (named in messages)."""
    L0 = as_int_array("prefix_lens", prefix_lens, None)
    E = as_int_array("extend_lens", extend_lens, L0.shape[0])
    # All valid (else the checks below find the first bad request): both >= 0, then their sum, exact as uint64
    # (two int64 values >= 0 add up below 2**64), at most MAX_POSITION.
    if not L0.shape[0] or ((L0 | E).min() >= 0 and (L0 + E).view(np.uint64).max() <= MAX_POSITION):
        return L0, E
    for name, arr in (("prefix_len", L0), ("extend_len", E)):
        i = first_bad(arr < 0)
        if i is not None:
            raise PlanError(f"request {i + first_index}: {name}={int(arr[i])} must be >= 0")
    i = first_bad((L0 > MAX_POSITION) | (E > MAX_POSITION) | (L0 + E > MAX_POSITION))
    if i is not None:
        raise PlanError(
            f"request {i + first_index}: prefix_len + extend_len = {int(L0[i]) + int(E[i])} exceeds {MAX_POSITION} "
            f"(prefix_len={int(L0[i])}, extend_len={int(E[i])})"
        )
    return L0, E


def first_bad(mask: np.ndarray) -> int | None:
    """Index of the first True of the bool ``mask``, None when there is none."""
    return int(mask.argmax()) if np.count_nonzero(mask) else None


def exact_sum(values: np.ndarray) -> int:
    """Sum of non-negative int64 values as a Python int, without int64 overflow."""
    total = float(values.sum(dtype=np.float64))
    return int(values.sum()) if total < 2**62 else int(total)


# ------------------------------------------------------------------------------------------ JSON input
class _Twice(Exception):
    def __init__(self, key: str) -> None:
        self.key = key


def _no_twice(pairs: list[tuple[str, object]]) -> dict[str, object]:
    seen: dict[str, object] = {}
    for key, value in pairs:
        if key in seen:
            raise _Twice(key)
        seen[key] = value
    return seen


def duplicate_key(text: str | bytes) -> str | None:
    """The first key written twice in one JSON object of ``text`` (at any depth), else None (also for text
    that is not JSON: the caller's parser names that). JSON readers keep the last value of a repeated key
    without a word, so cpkv's inputs refuse it (C-FAIL-FAST)."""
    try:
        json.loads(text, object_pairs_hook=_no_twice)
    except _Twice as e:
        return e.key
    except (ValueError, RecursionError):
        return None
    return None


def duplicate_key_line(text: str, start: int, end: int, key: str) -> int:
    """1-based line of the second ``"key":`` in ``text[start:end]`` (one JSON object that holds it twice)."""
    pattern = re.compile(re.escape(json.dumps(key)) + r"\s*:")
    hits = [m.start() for m in pattern.finditer(text, start, end)]
    pos = hits[1] if len(hits) > 1 else start
    return text.count("\n", 0, pos) + 1


# ---------------------------------------------------------------------------------------- plan size
class PlanShape(Protocol):
    """What the plan-size checks read of a ``CPConfig`` (``config`` imports this module)."""

    @property
    def cp_size(self) -> int: ...
    @property
    def page_size(self) -> int: ...
    @property
    def cp_strategy(self) -> str: ...


def plan_bytes(prefix_lens: np.ndarray, extend_lens: np.ndarray, config: PlanShape) -> tuple[int, int, int]:
    """``(tokens, new pages, bytes)`` of a batch's plan with its allocation, from the lengths alone.

    Bytes: 8 per token for each of ``token_owner``, ``gather_index`` and ``out_cache_loc``, 8 per new page
    for each of ``page_owners`` and ``new_pages``, and about 80 per request and segment (``B x (2C + 1)``
    segment tables and token runs); under ``cp_strategy="interleave"`` 32 more per new page (its token runs,
    one per page, C-INTERLEAVE). ``prefix_lens``, ``extend_lens``: int64 ``[B]`` (checked lengths);
    ``config``: the ``CPConfig``. Example C=4, P=64, one request of 1000 tokens: 16 pages,
    8 * (3000 + 32) + 80 * 9 = 24,976 bytes (interleave: 25,488).
    """
    P, C = config.page_size, config.cp_size
    pages = -(-(prefix_lens + extend_lens) // P) - -(-prefix_lens // P)  # [B], each <= 2**53
    tokens, n_pages = exact_sum(extend_lens), exact_sum(pages)
    per_page = 48 if config.cp_strategy == "interleave" else 16
    return tokens, n_pages, 24 * tokens + per_page * n_pages + 80 * extend_lens.shape[0] * (2 * C + 1)


def plan_bytes_bound(num_requests: int, max_extend: int, max_pages: int, cp_size: int) -> int:
    """An upper bound of ``plan_bytes`` (either CP strategy) for ``num_requests`` requests of at most
    ``max_extend`` tokens and ``max_pages`` new pages each, in bytes (one product: no pass over the lengths)."""
    B = num_requests
    return 8 * B * (3 * max_extend + 6 * max_pages) + 80 * B * (2 * cp_size + 1)


def check_plan_size(prefix_lens: np.ndarray, extend_lens: np.ndarray, config: PlanShape) -> None:
    """PlanError naming the bytes when a plan of these lengths would exceed ``cpkv.limits.MAX_ARRAY_BYTES``
    (checked before any array of the plan exists). Arguments as ``plan_bytes``. A bound from the longest
    extend (every request at most ``E_max`` tokens and ``E_max // P + 2`` pages) settles most calls with
    one reduction; only near or above the limit are the exact bytes computed."""
    B, P, C = extend_lens.shape[0], config.page_size, config.cp_size
    e = int(extend_lens.max()) if B else 0
    if plan_bytes_bound(B, e, e // P + 2, C) <= limits.MAX_ARRAY_BYTES:
        return
    tokens, pages, nbytes = plan_bytes(prefix_lens, extend_lens, config)
    limits.check_bytes(
        f"a plan of {extend_lens.shape[0]:,} request(s), {tokens:,} tokens and {pages:,} new pages at cp_size="
        f"{config.cp_size}",
        nbytes,
        PlanError,
        "split the batch or prefill in chunks",
    )
