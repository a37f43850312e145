"""Where memory is kept: on the fleet's Redis (`redis`), in one process (`memory`)."""
