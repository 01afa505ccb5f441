"""Sample job shipped with blockq for the demo."""
