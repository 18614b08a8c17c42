"""Simulated headsets: replay recorded EEG as LSL streams (EEG + cue markers) like headset firmware."""

import logging

logger = logging.getLogger("neurofed.firmware_sim")
