"""Autoscaling: size each model's instances from its recent demand (`decide`, pure), and start or
drain engine workers to match (the local stack's actuator, `app/cli/autoscaler.py`)."""
