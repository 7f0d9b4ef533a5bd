"""The group coordinator (not built yet).

Will own the ``__consumer_offsets`` log, offset commit and fetch, transactional
offset commits, group membership (join/sync/heartbeat/leave), rebalances and
generation fencing.
"""
