"""``cpkv sweep``: one workload replayed at every point of a grid of ``cpkv simulate`` settings, on a
process pool or a Ray cluster, resumable, with a designs table and figures (docs/sweep.md).

``grid`` reads the grid file (its keys: ``sim.settings.SETTINGS``), ``points`` makes each point's config
(through ``cpkv simulate``'s own ``sim.settings.config_of``) and key, ``point`` replays one point, ``groups`` splits a workload over N CP groups and
combines their reports, ``executors`` runs points locally or on Ray, ``results`` / ``plots`` write the
outputs, ``run`` ties them together.
"""
