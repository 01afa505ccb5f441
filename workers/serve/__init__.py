"""serve stage of the pipeline."""
