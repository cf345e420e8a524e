"""Star-count task environment."""
