"""Data pipeline: EEGMMIDB/MNE-readable recordings -> epochs -> band-pass/resample/channels -> EA.

Filtering, resampling and alignment are pure numpy functions over epoch arrays
(:mod:`trainer.data.preprocess`), so edge/ runs exactly the same code on epochs cut from a
live LSL stream as trainer/ runs on files.
"""

from trainer.data.config import PreprocessConfig, SENSORIMOTOR_21
from trainer.data.dataset import SubjectData, load_subjects, load_eegmmidb_subject
from trainer.data.eegmmidb import resolve_data_dir, list_subjects

__all__ = [
    "PreprocessConfig",
    "SENSORIMOTOR_21",
    "SubjectData",
    "load_subjects",
    "load_eegmmidb_subject",
    "resolve_data_dir",
    "list_subjects",
]
