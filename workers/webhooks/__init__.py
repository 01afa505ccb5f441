"""Webhooks: signed delivery of terminal request events, with retries."""
