"""One module per CLI verb: each exposes ``configure_parser(subparsers)`` and a ``run(args) -> int``.

`t4patch.cli` lists the modules explicitly (no plugin discovery) so `t4patch --help` stays fast and the set
of commands is obvious from one file.
"""
