"""Data pipeline: EEGMMIDB/MNE-readable recordings -> epochs -> band-pass/resample/channels -> EA.

Filtering, resampling and alignment are pure numpy functions over epoch arrays
(:mod:`neurofed.trainer.data.preprocess`), so edge/ runs exactly the same code on epochs cut from a
live LSL stream as trainer/ runs on files.
"""

from importlib import import_module
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from neurofed.trainer.data.config import SENSORIMOTOR_21, PreprocessConfig
    from neurofed.trainer.data.dataset import SubjectData, load_eegmmidb_subject, load_subjects
    from neurofed.trainer.data.eegmmidb import list_subjects, resolve_data_dir

#: Where each public name lives. Imported on first use (PEP 562), so a light submodule such as
#: ``neurofed.trainer.data.units`` (the edge recorder's unit table) does not pull scipy and mne in with the package.
_WHERE = {"SENSORIMOTOR_21": "config", "PreprocessConfig": "config", "SubjectData": "dataset",
          "load_eegmmidb_subject": "dataset", "load_subjects": "dataset", "list_subjects": "eegmmidb",
          "resolve_data_dir": "eegmmidb"}


def __getattr__(name: str):
    if name in _WHERE:
        return getattr(import_module(f"neurofed.trainer.data.{_WHERE[name]}"), name)
    raise AttributeError(f"module 'neurofed.trainer.data' has no attribute {name!r}")


__all__ = [
    "SENSORIMOTOR_21",
    "PreprocessConfig",
    "SubjectData",
    "list_subjects",
    "load_eegmmidb_subject",
    "load_subjects",
    "resolve_data_dir",
]
