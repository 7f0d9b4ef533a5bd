"""One module per ``onceflow`` command, each offering ``add_arguments(parser)``
(the command's options; imports nothing heavy) and ``run(args) -> int`` (the
exit status; imports what the command needs). ``onceflow.cli.COMMANDS`` lists
them.
"""
