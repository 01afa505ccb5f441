"""Instance simulator: vLLM scheduling model, execution-time model, what-if predictions (pure)."""

from .block_pool import BlockPool
from .exec_model import (
                         BatchStats,
                         ExecModel,
                         bundled_model,
                         bundled_model_names,
                         evaluate_on_step_samples,
                         exec_model_of,
                         fit_from_step_samples,
                         step_sample,
)
from .future_load import FutureLoad, estimate_future_load
from .profiling import AttentionScale, fit_from_vidur_profile
from .result import WhatIf
from .scheduler import Scheduler, SchedulerOutput, SeqState, SeqStatus, StepResult
from .snapshot import (
                         InstanceConfig,
                         InstanceSnapshot,
                         OverrunPolicy,
                         PreparedInstance,
                         SeqSpec,
                         SimRequest,
                         engine_priority,
                         is_batch_priority,
                         prepare,
                         request_priority,
                         target_output_tokens,
)
from .whatif import predict_what_if, predict_what_if_prepared, predict_what_if_stepwise

__all__ = [
    "AttentionScale",
    "BatchStats",
    "BlockPool",
    "ExecModel",
    "FutureLoad",
    "InstanceConfig",
    "InstanceSnapshot",
    "OverrunPolicy",
    "PreparedInstance",
    "Scheduler",
    "SchedulerOutput",
    "SeqSpec",
    "SeqState",
    "SeqStatus",
    "SimRequest",
    "StepResult",
    "WhatIf",
    "bundled_model",
    "engine_priority",
    "bundled_model_names",
    "exec_model_of",
    "fit_from_step_samples",
    "estimate_future_load",
    "evaluate_on_step_samples",
    "is_batch_priority",
    "fit_from_vidur_profile",
    "predict_what_if",
    "predict_what_if_prepared",
    "predict_what_if_stepwise",
    "prepare",
    "request_priority",
    "step_sample",
    "target_output_tokens",
]
