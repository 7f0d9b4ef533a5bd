"""``onceflow spark finish-decided``: finish a Spark query's decided batch
without Spark.

After the Spark driver of an exactly-once ``onceflow`` sink dies with a batch
decided and not yet wholly committed, that batch's transactions hold the
output's last stable offset until the restarted query's first commit, which
waits for Spark's whole restart. The decision record names every handle, so
this commits them at once (``streaming.spark.sink_driver.finish_decided``):
idempotently, never an undecided batch, and without fencing a live driver.
The sink runs the same completer when a query starts.
"""

from __future__ import annotations


from onceflow.client_commands import CommandError, add_bootstrap_option, reporting_errors, security_options


def add_arguments(parser) -> None:
    actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    finish = actions.add_parser(
        "finish-decided",
        help="commit the open transactions of an exactly-once sink's latest decided batch, without Spark",
        description="commit the open transactions of an exactly-once sink's latest decided batch, without Spark "
        "(after its driver died): the output's last stable offset moves at once instead of at the restarted query's first commit",
    )
    add_bootstrap_option(finish)
    finish.add_argument("--prefix", metavar="P", help="the sink's transactionalIdPrefix")
    finish.add_argument("--checkpoint-location", metavar="DIR", help="the query's checkpointLocation option, when the prefix was derived from it")
    finish.add_argument("--decision-topic", metavar="TOPIC", help="the sink's decisionTopic option, if it set one")


def run(args) -> int:
    def act() -> int:
        from streaming.spark.options import SinkOptions
        from streaming.spark.sink_driver import finish_decided

        if not args.prefix and not args.checkpoint_location:
            raise CommandError("name the sink: --prefix (its transactionalIdPrefix) or --checkpoint-location (the option it was derived from)")
        given = {"kafka.bootstrap.servers": args.bootstrap_server, **{f"kafka.{k}": v for k, v in security_options(args).items()}}
        for option, value in (("transactionalIdPrefix", args.prefix), ("checkpointLocation", args.checkpoint_location), ("decisionTopic", args.decision_topic)):
            if value:
                given[option] = value
        finished = finish_decided(SinkOptions.parse(given))
        print(finished)
        return 1 if finished.lost else 0

    return reporting_errors("spark", args, act)
