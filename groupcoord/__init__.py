"""The group coordinator: the ``__consumer_offsets`` log's records
(``records``), offset commit and fetch, transactional offset commits,
classic group membership (join/sync/heartbeat/leave), rebalances and
generation fencing (``coordinator``), over one state table (``state``) and
the frozen value it writes before applying (``metadata``).
"""
