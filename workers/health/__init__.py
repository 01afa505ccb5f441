"""Health stage: find requests stranded by dead instances or lost messages, and re-enqueue them."""
