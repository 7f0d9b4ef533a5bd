"""The server and composition root: the asyncio TCP listener, request dispatch
to the other rooms, topic and partition management, configuration, the
embedded in-process broker, and the ``onceflow`` command line.
"""
