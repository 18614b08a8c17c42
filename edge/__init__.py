"""NeuroFed edge: the headset-side client (LSL ingestion, local store, federation client, inference)."""

import logging

logger = logging.getLogger("neurofed.edge")
