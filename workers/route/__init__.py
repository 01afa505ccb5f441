"""Route stage: choose the instance for each request with a configured policy."""
