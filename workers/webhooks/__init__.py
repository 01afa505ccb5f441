"""Webhooks: signed delivery of terminal request and batch events, with retries."""
