"""Independent slow reference (oracle) for the cpkv planner, layout and slot assignment.

Plain Python, token by token, written from the SPEC text alone (sections 3-7 and 9). It imports nothing
from ``cpkv`` and shares no helper with it, so a property test that compares the two can catch a wrong
vectorisation. Everything here is lists and ints; speed is not a goal.

Names follow the SPEC: C = cp_size, P = page_size, Q = pages_per_lane, L0 = prefix_len, E = extend_len,
i = req_index. Positions are absolute token positions of the request (the prefix occupies 0 .. L0-1,
the extend L0 .. L0+E-1).
"""

from __future__ import annotations

POLICIES = ("rotation", "legacy", "balanced")
STRATEGIES = ("zigzag", "interleave")


class OracleError(ValueError):
    """The oracle was asked for a plan the SPEC does not define (e.g. head tokens without head owner)."""


def ceil_div(a: int, b: int) -> int:
    """ceil(a / b) for a >= 0, b >= 1, in integers."""
    return -(-a // b)


# --------------------------------------------------------------------------------------------------
# C-PHASE
# --------------------------------------------------------------------------------------------------


def phase(prefix_len: int, page_size: int, req_index: int, cp_size: int, policy: str = "rotation") -> int:
    """Rotation phase of one request (SPEC C-PHASE).

    rotation (and balanced without explicit phases): ((prefix_len // page_size) + req_index) % cp_size;
    legacy: 0.
    """
    if policy not in POLICIES:
        raise OracleError(f"unknown policy {policy!r}")
    if policy == "legacy":
        return 0
    return ((prefix_len // page_size) + req_index) % cp_size


_phase_rule = phase  # plan_request's ``phase`` argument shadows the name inside it


# --------------------------------------------------------------------------------------------------
# C-ZIGZAG, C-HEAD, C-OWNER-EQ-COMPUTE: one request
# --------------------------------------------------------------------------------------------------


def zigzag_rank(segment: int, cp_size: int) -> int:
    """z(s) = s if s < C else 2C-1-s (SPEC C-ZIGZAG)."""
    if segment < cp_size:
        return segment
    return 2 * cp_size - 1 - segment


def segment_sizes(num_pages: int, cp_size: int) -> list[int]:
    """Pages in each of the 2C segments: m // 2C each, the first m % 2C segments one more."""
    n_seg = 2 * cp_size
    return [num_pages // n_seg + (1 if s < num_pages % n_seg else 0) for s in range(n_seg)]


def page_segments(prefix_len: int, extend_len: int, cp_size: int, page_size: int) -> list[int]:
    """Segment index (0 .. 2C-1) of each new page of the request, in page order; length m."""
    first_new = ceil_div(prefix_len, page_size)
    end = ceil_div(prefix_len + extend_len, page_size)
    m = end - first_new
    segs: list[int] = []
    for s, size in enumerate(segment_sizes(m, cp_size)):
        for _ in range(size):
            segs.append(s)
    assert len(segs) == m
    return segs


def plan_request(
    prefix_len: int,
    extend_len: int,
    cp_size: int,
    page_size: int,
    req_index: int = 0,
    head_owner: int | None = None,
    phase: int | None = None,
    policy: str = "rotation",
    strategy: str = "zigzag",
) -> dict:
    """Plan one request token by token; ``strategy`` ``zigzag`` (C-ZIGZAG) or ``interleave`` (C-INTERLEAVE:
    new page k, counted from 0 in position order, on lane (phase + k) % C).

    Returns a dict with ``phase`` (int), ``head_tokens`` (int h), ``page_owners`` (list, one per new page),
    ``page_segments`` (list, the zigzag segment of each new page; under interleave the page's own index k),
    ``token_owner`` (list, one per extend
    token), ``per_rank_tokens`` (list of C counts) and ``last_token_owner`` (-1 when E == 0).
    Raises OracleError for negative lengths, an out-of-range phase/head owner, or head tokens without a
    head owner.
    """
    C, P, L0, E = cp_size, page_size, prefix_len, extend_len
    if L0 < 0 or E < 0 or C < 1 or P < 1:
        raise OracleError(f"bad sizes L0={L0} E={E} C={C} P={P}")
    ph = _phase_rule(L0, P, req_index, C, policy) if phase is None else phase
    if not 0 <= ph < C:
        raise OracleError(f"phase {ph} out of range")
    if strategy not in STRATEGIES:
        raise OracleError(f"unknown strategy {strategy!r}")

    # C-HEAD: tokens that land in the partly filled last prefix page.
    h = min(E, P - L0 % P) if L0 % P != 0 else 0
    if h > 0:
        if head_owner is None:
            raise OracleError("head tokens need a head owner")
        if not 0 <= head_owner < C:
            raise OracleError(f"head owner {head_owner} out of range")

    # C-ZIGZAG / C-INTERLEAVE: owner of each new page.
    first_new = ceil_div(L0, P)
    if strategy == "zigzag":
        segs = page_segments(L0, E, C, P)
        page_owners = [(zigzag_rank(s, C) + ph) % C for s in segs]
    else:
        segs = list(range(ceil_div(L0 + E, P) - first_new))  # each page its own piece
        page_owners = [(ph + k) % C for k in segs]

    # C-OWNER-EQ-COMPUTE: owner of each extend token, one token at a time.
    token_owner: list[int] = []
    n_head = 0
    for t in range(E):
        pos = L0 + t
        page = pos // P  # request-relative logical page of this position
        if page < first_new:
            # The only pre-existing page an extend token can land in is the partial last prefix page.
            assert page == L0 // P and L0 % P != 0
            token_owner.append(head_owner)
            n_head += 1
        else:
            token_owner.append(page_owners[page - first_new])
    assert n_head == h

    per_rank_tokens = [0] * C
    for r in token_owner:
        per_rank_tokens[r] += 1

    return {
        "phase": ph,
        "head_tokens": h,
        "head_owner": head_owner,
        "page_owners": page_owners,
        "page_segments": segs,
        "token_owner": token_owner,
        "per_rank_tokens": per_rank_tokens,
        "last_token_owner": token_owner[-1] if E > 0 else -1,
    }


def balanced_phase(
    prefix_len: int,
    extend_len: int,
    cp_size: int,
    page_size: int,
    req_index: int,
    free: list[int],
    transient: list[int] | None = None,
    strategy: str = "zigzag",
) -> int:
    """C-BALANCED (amended) phase of one request, by brute force over every phase.

    ``free``: each lane's free pages before this request (after the batch's earlier requests);
    ``transient``: the partly filled last pages those earlier requests took per lane (t_r; default none).
    For each phase f the request is planned with it; n_r(f) counts its new pages on lane r and k_r(f)
    those it fills completely (all but a last page left partly filled, (L0 + E) % P != 0). With
    g_r = free_r + t_r the chosen f maximises, in order: (0) whether min_r(free_r - n_r(f)) >= 0;
    (1) when sum_r k_r(f) > 0: min_r(g_r - k_r(f)), then sum_r k_r(f) * g_r; otherwise
    min_r(free_r - n_r(f)), then sum_r n_r(f) * free_r; (2) then it minimises (f - rotation phase) mod C.
    Written from the SPEC text, one candidate at a time, with the project's one recorded deviation
    (gov C-BALANCED): a request of one new page that it keeps, when some lane is short (free < 0, left by
    an earlier request of the batch) and some lane has a free page, fits where its own page's lane does.
    """
    C, P = cp_size, page_size
    t = list(transient) if transient is not None else [0] * C
    g = [free[r] + t[r] for r in range(C)]
    rotation = _phase_rule(prefix_len, P, req_index, C, "rotation")
    partial = (prefix_len + extend_len) % P != 0
    best_key, best_f = None, None
    for f in range(C):
        # Head pages already exist and are not counted; any head owner gives the same new-page owners.
        owners = plan_request(
            prefix_len, extend_len, C, P, req_index, head_owner=0, phase=f, strategy=strategy
        )["page_owners"]
        n = [owners.count(r) for r in range(C)]
        kept = list(owners[:-1]) if (partial and owners) else list(owners)
        k = [kept.count(r) for r in range(C)]
        fits = min(free[r] - n[r] for r in range(C)) >= 0
        if sum(n) == 1 and sum(k) == 1 and min(free) < 0 < max(free):  # the recorded deviation
            fits = free[owners[0]] - 1 >= 0
        if sum(k) > 0:
            crit = (min(g[r] - k[r] for r in range(C)), sum(k[r] * g[r] for r in range(C)))
        else:
            crit = (min(free[r] - n[r] for r in range(C)), sum(n[r] * free[r] for r in range(C)))
        key = (fits, *crit, -((f - rotation) % C))
        if best_key is None or key > best_key:
            best_key, best_f = key, f
    return best_f


def balanced_phases(
    prefix_lens: list[int],
    extend_lens: list[int],
    cp_size: int,
    page_size: int,
    free: list[int],
    strategy: str = "zigzag",
) -> list[int]:
    """C-BALANCED phases of a batch, requests in batch order: each sees the free pages the earlier ones
    left and the partly filled last pages they took (``balanced_phase``'s ``transient``)."""
    C, P = cp_size, page_size
    left, transient, phases = list(free), [0] * C, []
    for i, (L0, E) in enumerate(zip(prefix_lens, extend_lens, strict=True)):
        f = balanced_phase(L0, E, C, P, i, left, transient, strategy)
        owners = plan_request(L0, E, C, P, i, head_owner=0, phase=f, strategy=strategy)["page_owners"]
        for r in owners:
            left[r] -= 1
        if owners and (L0 + E) % P:
            transient[owners[-1]] += 1
        phases.append(f)
    return phases


# --------------------------------------------------------------------------------------------------
# C-BATCH, C-GATHER
# --------------------------------------------------------------------------------------------------


def gather_index(token_owner_flat: list[int], cp_size: int) -> list[int]:
    """gather_index[t] = owner * M + (rank of t among its owner's tokens), M = max tokens on one rank."""
    counts = [0] * cp_size
    for r in token_owner_flat:
        counts[r] += 1
    M = max(counts) if counts else 0
    seen = [0] * cp_size
    out = []
    for r in token_owner_flat:
        out.append(r * M + seen[r])
        seen[r] += 1
    return out


def plan_batch(
    prefix_lens: list[int],
    extend_lens: list[int],
    cp_size: int,
    page_size: int,
    head_owners: list[int | None] | None = None,
    phases: list[int] | None = None,
    policy: str = "rotation",
    strategy: str = "zigzag",
) -> dict:
    """Plan every request with req_index = its batch position, then flatten in request order.

    head_owners entries may be None or -1 (no head owner). Returns a dict with ``requests`` (list of
    plan_request dicts), ``page_owners``, ``token_owner``, ``per_rank_tokens``, ``request_phases``,
    ``last_token_owner``, ``max_rank_tokens`` and ``gather_index``.
    """
    B = len(prefix_lens)
    if len(extend_lens) != B:
        raise OracleError("length mismatch")
    requests = []
    for i in range(B):
        ho = None if head_owners is None else head_owners[i]
        if ho is not None and ho == -1:
            ho = None
        ph = None if phases is None else phases[i]
        requests.append(
            plan_request(prefix_lens[i], extend_lens[i], cp_size, page_size, i, ho, ph, policy, strategy)
        )
    page_owners: list[int] = []
    token_owner: list[int] = []
    for req in requests:
        page_owners.extend(req["page_owners"])
        token_owner.extend(req["token_owner"])
    per_rank_tokens = [0] * cp_size
    for req in requests:
        for r in range(cp_size):
            per_rank_tokens[r] += req["per_rank_tokens"][r]
    return {
        "requests": requests,
        "page_owners": page_owners,
        "token_owner": token_owner,
        "per_rank_tokens": per_rank_tokens,
        "request_phases": [req["phase"] for req in requests],
        "last_token_owner": [req["last_token_owner"] for req in requests],
        "max_rank_tokens": max(per_rank_tokens),
        "gather_index": gather_index(token_owner, cp_size),
    }


# --------------------------------------------------------------------------------------------------
# C-ESTIMATE
# --------------------------------------------------------------------------------------------------


def _runs(positions: list[int]) -> list[tuple[int, int]]:
    """Maximal contiguous runs [a, b) of a sorted list of distinct positions."""
    runs: list[tuple[int, int]] = []
    for pos in positions:
        if runs and runs[-1][1] == pos:
            runs[-1] = (runs[-1][0], pos + 1)
        else:
            runs.append((pos, pos + 1))
    return runs


def mqa_logits_elements(
    prefix_lens: list[int],
    extend_lens: list[int],
    cp_size: int,
    page_size: int,
    head_owners: list[int | None] | None = None,
    phases: list[int] | None = None,
    policy: str = "rotation",
    strategy: str = "zigzag",
) -> list[int]:
    """Per-rank sum over requests and maximal runs [a, b) (absolute positions) of (b - a) * b."""
    batch = plan_batch(prefix_lens, extend_lens, cp_size, page_size, head_owners, phases, policy, strategy)
    out = [0] * cp_size
    for req, L0 in zip(batch["requests"], prefix_lens, strict=True):
        for r in range(cp_size):
            mine = [L0 + t for t, owner in enumerate(req["token_owner"]) if owner == r]
            for a, b in _runs(mine):
                out[r] += (b - a) * b
    return out


def local_mqa_logits_elements(
    prefix_lens: list[int],
    extend_lens: list[int],
    cp_size: int,
    page_size: int,
    page_lanes: list[list[int]],
    head_owners: list[int | None] | None = None,
    phases: list[int] | None = None,
    policy: str = "rotation",
    strategy: str = "zigzag",
) -> list[int]:
    """Logits elements per rank under kv_access = local (docs/distributed.md).

    For every maximal run [a, b) of one request's positions computed by any rank, rank r materialises
    (b - a) * k_r(b) elements, k_r(b) = positions s < b whose page (page_lanes[i][s // P]) is on lane r.
    """
    batch = plan_batch(prefix_lens, extend_lens, cp_size, page_size, head_owners, phases, policy, strategy)
    out = [0] * cp_size
    for i, (req, L0) in enumerate(zip(batch["requests"], prefix_lens, strict=True)):
        for owner in range(cp_size):
            mine = [L0 + t for t, o in enumerate(req["token_owner"]) if o == owner]
            for a, b in _runs(mine):
                for r in range(cp_size):
                    out[r] += (b - a) * sum(1 for s in range(b) if page_lanes[i][s // page_size] == r)
    return out


def mqa_logits_elements_per_segment(
    prefix_lens: list[int],
    extend_lens: list[int],
    cp_size: int,
    page_size: int,
    head_owners: list[int | None] | None = None,
    phases: list[int] | None = None,
    policy: str = "rotation",
    strategy: str = "zigzag",
) -> list[int]:
    """Lower estimate: the head run and every zigzag segment (every page under interleave) are counted as
    separate runs (no merging)."""
    batch = plan_batch(prefix_lens, extend_lens, cp_size, page_size, head_owners, phases, policy, strategy)
    out = [0] * cp_size
    for req, L0, E in zip(batch["requests"], prefix_lens, extend_lens, strict=True):
        P = page_size
        first_new = ceil_div(L0, P)
        # pieces: key (segment id or "head") -> (owner, positions)
        pieces: dict[object, tuple[int, list[int]]] = {}
        for t in range(E):
            pos = L0 + t
            page = pos // P
            key = "head" if page < first_new else req["page_segments"][page - first_new]
            owner = req["token_owner"][t]
            pieces.setdefault(key, (owner, []))[1].append(pos)
        for owner, positions in pieces.values():
            a, b = positions[0], positions[-1] + 1
            assert b - a == len(positions)  # a segment is contiguous
            out[owner] += (b - a) * b
    return out


# --------------------------------------------------------------------------------------------------
# C-LAYOUT
# --------------------------------------------------------------------------------------------------


def lane_of(s: int, C: int, P: int) -> int:
    """Owner lane of slot s ((s // P) % C); negative slots pass through."""
    if s < 0:
        return s
    return (s // P) % C


def write_slot(s: int, C: int, P: int) -> int:
    """Slot in the owner's own segment: (p // C) * P + o; negative slots pass through."""
    if s < 0:
        return s
    p, o = s // P, s % P
    return (p // C) * P + o


def read_slot(s: int, C: int, P: int, Q: int) -> int:
    """Slot in the rank-major view: ((p % C) * Q + p // C) * P + o; negative slots pass through."""
    if s < 0:
        return s
    p, o = s // P, s % P
    return ((p % C) * Q + p // C) * P + o


def owned(s: int, rank: int, C: int, P: int) -> bool:
    """s >= 0 and (s // P) % C == rank."""
    return s >= 0 and (s // P) % C == rank


# --------------------------------------------------------------------------------------------------
# C-ALLOC: slots of the extend tokens, and a fresh allocator's first pages
# --------------------------------------------------------------------------------------------------


def out_cache_loc(
    prefix_len: int, extend_len: int, last_loc: int, new_pages: list[int], page_size: int
) -> list[int]:
    """Slot of each extend token: head tokens take last_loc+1, ...; then new page p gives p*P + offset."""
    L0, E, P = prefix_len, extend_len, page_size
    first_new = ceil_div(L0, P)
    if len(new_pages) != ceil_div(L0 + E, P) - first_new:
        raise OracleError("wrong number of new pages")
    out = []
    for t in range(E):
        pos = L0 + t
        page = pos // P
        if page < first_new:
            out.append(last_loc + 1 + t)
        else:
            out.append(new_pages[page - first_new] * P + pos % P)
    return out


def fresh_alloc_pages(owners: list[int], cp_size: int, pages_per_lane: int) -> list[int]:
    """Pages a fresh allocator hands out for ``owners``: per lane, lowest free id first; page 0 reserved."""
    C, Q = cp_size, pages_per_lane
    free = {r: [p for p in range(C * Q) if p % C == r and p != 0] for r in range(C)}
    out = []
    for r in owners:
        if not free[r]:
            raise OracleError(f"lane {r} exhausted")
        out.append(free[r].pop(0))
    return out
