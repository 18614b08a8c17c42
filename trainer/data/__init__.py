"""Data pipeline: EEGMMIDB/MNE-readable recordings -> epochs -> band-pass/resample/channels -> EA.

Filtering, resampling and alignment are pure numpy functions over epoch arrays
(:mod:`trainer.data.preprocess`), so edge/ runs exactly the same code on epochs cut from a
live LSL stream as trainer/ runs on files.
"""

from trainer.data.config import SENSORIMOTOR_21, PreprocessConfig
from trainer.data.dataset import SubjectData, load_eegmmidb_subject, load_subjects
from trainer.data.eegmmidb import list_subjects, resolve_data_dir

__all__ = [
    "SENSORIMOTOR_21",
    "PreprocessConfig",
    "SubjectData",
    "list_subjects",
    "load_eegmmidb_subject",
    "load_subjects",
    "resolve_data_dir",
]
