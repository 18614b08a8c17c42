"""Pure preprocessing functions over epoch arrays ``(n_trials, n_channels, n_times)``.

The same functions run offline (files) and online (epochs cut from an LSL stream on the
edge device), so a captured epoch equals its offline twin to float tolerance.
"""

from __future__ import annotations

from collections.abc import Sequence
from fractions import Fraction
from functools import lru_cache

import numpy as np

from neurofed.trainer.data.config import PreprocessConfig
from neurofed.trainer.data.units import norm_label
from neurofed.trainer.errors import DataError


def bandpass(x: np.ndarray, sfreq: float, fmin: float, fmax: float, order: int = 4) -> np.ndarray:
    """Zero-phase Butterworth band-pass along the last axis (``scipy.signal.sosfiltfilt``).

    Parameters
    ----------
    x : ndarray, shape (..., n_times)
    sfreq : float
        Sampling rate in Hz.
    fmin, fmax : float
        Pass band in Hz; ``fmax`` must be below Nyquist.
    order : int
        Order of the Butterworth design.
    """
    if fmax >= sfreq / 2:
        raise DataError(f"band-pass upper edge {fmax} Hz is not below Nyquist ({sfreq / 2} Hz)")
    from scipy import signal  # here, not at import: the edge recorder imports this module and never filters

    return signal.sosfiltfilt(butter_sos(order, fmin, fmax, sfreq).copy(), np.asarray(x, dtype=np.float64), axis=-1)


@lru_cache(maxsize=32)
def butter_sos(order: int, fmin: float, fmax: float, sfreq: float) -> np.ndarray:
    """The band-pass design, computed once per setting (designing costs ~3 ms, more than filtering a window).

    Callers get the cached array: pass a copy to anything that may write to it.
    """
    from scipy import signal

    sos = signal.butter(order, [fmin, fmax], btype="bandpass", fs=sfreq, output="sos")
    return sos


def resample(x: np.ndarray, sfreq: float, new_sfreq: float) -> np.ndarray:
    """Polyphase resampling along the last axis (``scipy.signal.resample_poly``)."""
    if new_sfreq == sfreq:
        return x
    frac = Fraction(new_sfreq / sfreq).limit_denominator(1000)
    x = np.asarray(x, dtype=np.float64)
    from scipy import signal

    return signal.resample_poly(x, frac.numerator, frac.denominator, axis=-1,
                                window=resample_fir(frac.numerator, frac.denominator))


@lru_cache(maxsize=32)
def resample_fir(up: int, down: int) -> np.ndarray:
    """The anti-aliasing FIR ``resample_poly`` designs by default (Kaiser, beta 5), computed once per ratio.

    Passing it as ``window`` gives the default result exactly; ``resample_poly`` copies it before use.
    """
    g = np.gcd(up, down)
    max_rate = max(up, down) // g
    from scipy import signal

    return signal.firwin(2 * 10 * max_rate + 1, 1.0 / max_rate, window=("kaiser", 5.0))


def pick_channels(x: np.ndarray, ch_names: Sequence[str], wanted: Sequence[str]) -> np.ndarray:
    """Reorder/select channels by label (:func:`neurofed.trainer.data.units.norm_label`: case-insensitive, ``Fc5.`` ~
    ``FC5``); a clear error lists the missing ones."""
    index: dict[str, int] = {}
    for i, c in enumerate(ch_names):
        index.setdefault(norm_label(c), i)
    missing = [c for c in wanted if norm_label(c) not in index]
    if missing:
        raise DataError(f"missing channels {missing}; available: {list(ch_names)}")
    return x[..., [index[norm_label(c)] for c in wanted], :]


def ea_matrix(x: np.ndarray) -> np.ndarray:
    """Euclidean-alignment matrix ``R^{-1/2}``, R the mean trial covariance ``X X^T / T``.

    Parameters
    ----------
    x : ndarray, shape (n_trials, n_channels, n_times)
        One subject's trials (only that subject's).
    """
    if x.ndim != 3 or x.shape[0] == 0:
        raise DataError(f"EA needs a non-empty (trials, channels, times) array, got shape {x.shape}")
    x64 = np.asarray(x, dtype=np.float64)
    r = np.einsum("nct,ndt->cd", x64, x64) / (x.shape[0] * x.shape[2])
    return ea_inv_sqrt(r)


def ea_inv_sqrt(r: np.ndarray) -> np.ndarray:
    """``R^{-1/2}`` of an EA reference covariance (eigendecomposition, eigenvalues floored at 1e-10 x the largest).

    The one inverse square root of Euclidean alignment: offline (:func:`ea_matrix`) and online (the edge's
    running reference) both use it.

    Raises
    ------
    DataError
        If ``R`` is not positive (all-zero or non-finite trials).
    """
    w, v = np.linalg.eigh(np.asarray(r, dtype=np.float64))
    if not np.all(np.isfinite(w)) or w.max() <= 0:
        raise DataError("EA reference covariance is not positive: are the trials all zero or non-finite?")
    w = np.clip(w, w.max() * 1e-10, None)
    return (v / np.sqrt(w)) @ v.T


def apply_ea(x: np.ndarray, r_inv_sqrt: np.ndarray) -> np.ndarray:
    """Apply an EA matrix to every trial: ``R^{-1/2} X_i``."""
    return np.einsum("cd,ndt->nct", r_inv_sqrt, np.asarray(x, dtype=np.float64))


def euclidean_alignment(x: np.ndarray) -> np.ndarray:
    """Align one subject's trials with their own reference (He & Wu, 2019)."""
    return apply_ea(x, ea_matrix(x))


def output_sfreq(sfreq: float, cfg: PreprocessConfig) -> float:
    """Sampling rate after preprocessing."""
    return float(cfg.resample) if cfg.resample else float(sfreq)


def n_times_for(sfreq: float, cfg: PreprocessConfig) -> int:
    """Number of raw samples in one epoch window at ``sfreq``."""
    return int(round((cfg.tmax - cfg.tmin) * sfreq))


def preprocess_epochs(
    x: np.ndarray, sfreq: float, ch_names: Sequence[str], cfg: PreprocessConfig
) -> tuple[np.ndarray, float, list[str]]:
    """Channel selection, band-pass and resampling of raw epochs (EA is per subject, separate).

    Parameters
    ----------
    x : ndarray, shape (n_trials, n_channels, n_times)
        Raw epochs in microvolts, exactly the [tmin, tmax) window after each cue.
    sfreq : float
    ch_names : sequence of str
        Labels of ``x``'s channels (standard 10-05 names).
    cfg : PreprocessConfig

    Returns
    -------
    x : ndarray, float64
    sfreq : float
        Rate after resampling.
    ch_names : list of str
    """
    x = np.asarray(x)
    if x.ndim != 3:
        raise DataError(f"expected epochs (trials, channels, times), got shape {x.shape}")
    if x.shape[1] != len(ch_names):
        raise DataError(f"epochs have {x.shape[1]} channels but {len(ch_names)} labels were given")
    if not np.all(np.isfinite(x)):
        raise DataError("epochs contain NaN or infinite samples")
    names = list(ch_names)
    if cfg.channels is not None:
        x = pick_channels(x, names, cfg.channels)
        names = list(cfg.channels)
    x = bandpass(x, sfreq, cfg.fmin, cfg.fmax, cfg.filter_order)
    new_sfreq = output_sfreq(sfreq, cfg)
    x = resample(x, sfreq, new_sfreq)
    return x, new_sfreq, names
