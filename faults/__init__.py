"""The fault-injection harness (not built yet).

Will hold named crash points, process kill/pause, a TCP proxy that cuts and
delays, disk faults, workloads, and the exactly-once checker with its reports.
"""
