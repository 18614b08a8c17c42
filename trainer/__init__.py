"""NeuroFed trainer: data pipeline, models, BatchNorm modes, SAM/AWP/attacks, strategies, experiments.

This package owns the learning. It never imports a transport (MQTT, LSL): broker/ and edge/
call into it unchanged.
"""

import logging

logger = logging.getLogger("neurofed.trainer")

__all__ = ["logger"]
