"""The server and composition root: the asyncio TCP listener, request dispatch
to the other rooms, topic and partition management, configuration, and the
embedded in-process broker. (The command line that runs it is ``onceflow``.)
"""
