"""Predict stage: annotate each request with a predicted output length."""
