"""The learning tests reuse the length-predictor fixtures (tiny encoder, token counter)."""

from tests.workers.predict.conftest import counter, tiny_encoder, tiny_encoder_dir  # noqa: F401
