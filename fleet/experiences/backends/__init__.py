"""Where experiences are kept: on the fleet's Redis (`redis`); the memory twin is in `store`."""
