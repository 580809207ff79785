"""Subcommands of the `itune` CLI, one module each (see `itune_hf.cli.COMMANDS`)."""
