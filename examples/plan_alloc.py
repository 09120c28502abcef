"""Plan -> allocate -> slots: the README's 30-second example as a script.

    .venv/bin/python examples/plan_alloc.py

One request with 100 tokens cached and 200 new on 4 ranks of 64-token pages: which lane computes (and
stores) each token; then a fresh 1,000-token prompt allocated on owner lanes, its slots, and the
MQA-logits elements each rank would hold (the admission budget, SPEC C-ESTIMATE).
"""

from cpkv import CPConfig, OwnerLaneAllocator, mqa_logits_elements, plan_request

cfg = CPConfig(cp_size=4, page_size=64, owner_policy="balanced")  # the default policy; rotation | legacy
plan = plan_request(100, 200, cfg, head_owner=1)  # 100 tokens cached (last page on lane 1), 200 new
print(
    "phase",
    plan.phase,
    "page owners",
    plan.page_owners.tolist(),
    "tokens per rank",
    plan.per_rank_tokens.tolist(),
)
print("logits elements per rank", mqa_logits_elements(plan).tolist())

alloc = OwnerLaneAllocator(cfg, pages_per_lane=8)
a = alloc.alloc_extend(prefix_lens=[0], extend_lens=[1000], last_locs=[-1])
print("new pages", a.new_pages.tolist())
print("first slots", a.out_cache_loc_cpu[:3].tolist(), "on lane", int(a.new_pages[0]) % cfg.cp_size)
print("logits elements per rank", mqa_logits_elements(a.plan).tolist())
print("free pages per lane", alloc.free_pages_per_lane().tolist())
alloc.free(a.new_pages)
print("after free", alloc.free_pages_per_lane().tolist())
