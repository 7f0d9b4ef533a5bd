"""``onceflow dump-log FILE...``: print ``.log``, ``.index`` and ``.timeindex``
files the way Kafka's DumpLogSegments does (``storage.dump_log``); exit 1 if
any file is missing or damaged (after printing everything valid before the
damage).
"""

from __future__ import annotations


def add_arguments(parser) -> None:
    parser.add_argument("files", nargs="+", metavar="FILE", help="segment files (.log, .index, .timeindex); no broker needed, a damaged or live directory is fine")
    parser.add_argument("--print-data-log", action="store_true", help="print every record too (keys, values, markers)")


def run(args) -> int:
    from storage.dump_log import dump

    return dump(args.files, print_data_log=args.print_data_log)
