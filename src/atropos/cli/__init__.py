"""The `atropos` command line: noun-verb subcommands (`atropos api serve`, `atropos demo`)."""
