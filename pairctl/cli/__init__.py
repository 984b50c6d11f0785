"""The operator's command line: ``dspark`` (every command group, registered from each
module's ``add_cli_args``/``main``), the pair commands parsed once (frontdoor, from the
option table in pairopts; --help text in usage) and dispatched (main), the commands besides
up/down (ops), the shared options (options) and the flag types every parser uses
(argtypes)."""
