"""Test helper: an independent checker of the KV slots live requests hold (nothing handed out twice).

It never reads the allocator's bookkeeping: it learns slots only from what ``allocate`` / ``alloc_extend``
returned (``out_cache_loc``) and forgets them when the test frees a request. A slot ``s`` lies on page
``s // page_size``; a request's pages are those of its slots, in position order.
"""

from __future__ import annotations


class HeldSlots:
    """The slots each live request holds, in position order; ``take`` refuses a slot held already.

    Args:
        page_size: P, tokens per page.
    """

    def __init__(self, page_size: int) -> None:
        self.P = page_size
        self.requests: dict[int, list[int]] = {}  # request id -> its slots, position order
        self.owner: dict[int, int] = {}  # slot -> the request holding it

    def take(self, rid: int, slots: list[int]) -> None:
        """Request ``rid`` (new or live) now holds ``slots`` after its earlier ones; AssertionError when a
        slot is held already (by any request) or listed twice, or lies on a page another request holds."""
        assert len(set(slots)) == len(slots), f"slots listed twice in one allocation: {slots}"
        for s in slots:
            assert s not in self.owner, (
                f"slot {s} handed out twice: request {self.owner[s]} holds it, now {rid}"
            )
        others = {s // self.P for r, held in self.requests.items() if r != rid for s in held}
        shared = sorted(others & {s // self.P for s in slots})
        assert not shared, f"pages {shared} of request {rid} are held by another request"
        self.requests.setdefault(rid, []).extend(slots)
        self.owner.update(dict.fromkeys(slots, rid))

    def pages(self, rid: int) -> list[int]:
        """Pages of request ``rid``, position order, each once."""
        return list(dict.fromkeys(s // self.P for s in self.requests[rid]))

    def last_loc(self, rid: int) -> int:
        """Slot of the request's last position."""
        return self.requests[rid][-1]

    def release(self, rid: int) -> list[int]:
        """Forget request ``rid``; its pages (to free), position order."""
        pages = self.pages(rid)
        for s in self.requests.pop(rid):
            del self.owner[s]
        return pages

    def num_pages(self) -> int:
        """Pages held by all live requests."""
        return len({s // self.P for s in self.owner})
