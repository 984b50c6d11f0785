"""The operator's command line: parsed once (frontdoor), dispatched (main), the commands
besides up/down (ops), and the flag types every package's parser uses (argtypes)."""
