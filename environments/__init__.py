"""Task environments (star count, ...)."""
