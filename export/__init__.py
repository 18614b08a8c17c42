"""NeuroFed export: ONNX export of trained models and verification against torch."""

import logging

logger = logging.getLogger("neurofed.export")
