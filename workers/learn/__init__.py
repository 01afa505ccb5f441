"""The online-learning loop: request history, retraining and promotion of the length model and
refits of execution-time models through the model registry (`domain/model_registry.py`)."""
