"""The `fleet` command line."""
