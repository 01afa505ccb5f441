"""The online-learning loop: request history, the model registry, retraining and promotion of
the length model, refits of execution-time models, and the bias watch."""
