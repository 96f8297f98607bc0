"""One module per `anatomy` subcommand: add_parser(subparsers) registers it, and the parser's
`run` default is called with the parsed arguments."""
