"""NeuroFed broker: the MQTT coordinator (rounds, selection, aggregation calls, checkpoints, wire protocol)."""

import logging

logger = logging.getLogger("neurofed.broker")
