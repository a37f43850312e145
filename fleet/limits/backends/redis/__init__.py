"""The limits on Redis: the Lua scripts every limit runs (`scripts`)."""
