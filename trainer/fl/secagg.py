"""Secure aggregation (the masking core of SecAgg, Bonawitz et al., CCS 2017): the server learns only the sum.

Pure and transport-free: the messages of the four protocol steps are plain dataclasses; an orchestrator
(in-process, or later the MQTT coordinator) moves them. Cryptography comes from well-kept libraries:
X25519 key agreement and HKDF-SHA256 from ``cryptography``, ChaCha20 as the mask generator (``cryptography``),
Shamir t-of-n secret sharing from ``pycryptodome`` (16-byte secrets, so 32-byte values travel as two shares).

Steps (``n`` clients of a round, threshold ``t``):

1. **advertise**: every client draws an X25519 masking key pair and publishes the public key.
2. **share**: each client draws a self-mask seed ``b_u`` and Shamir-shares ``b_u`` and its private key among
   the round's clients (t-of-n). In the full protocol each share is encrypted to its recipient with a pairwise
   key; here :meth:`SecAggClient.shares` returns them per recipient for the orchestrator to deliver.
3. **masked input**: the client sends ``y_u = q(w_u) + PRG(b_u) + sum_{v>u} PRG(s_uv) - sum_{v<u} PRG(s_uv)``
   (mod 2^32), with ``s_uv`` the HKDF of the X25519 shared secret and ``q`` a fixed-point encoding of its
   trial-weighted update. Pairwise masks cancel in the sum; the server sees only uniformly masked vectors.
4. **unmask**: survivors reveal, for each other client, either the share of its ``b_u`` (it survived) or of
   its private key (it dropped); from ``t`` shares the server removes the self masks of the survivors and
   the dangling pairwise masks of the dropped clients, and recovers ``sum_u q(w_u)`` exactly.

Fixed point: each coordinate is scaled by ``2^frac_bits`` and rounded, the trial-weighted values
``n_k * x_k`` and the counts ``n_k`` are summed, so the weighted mean (FedAvg's aggregation weights) is
``sum / sum n_k`` after decoding. The encoding must not overflow: ``|sum n_k x_k| * 2^frac_bits < 2^31``
(checked, with a clear error).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
from Crypto.Protocol.SecretSharing import Shamir
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from trainer.errors import NeuroFedError

MOD = 1 << 32


class SecAggError(NeuroFedError):
    """The secure aggregation round cannot complete (too few survivors, overflow, bad share)."""


def prg(seed: bytes, n: int) -> np.ndarray:
    """``n`` pseudo-random uint32 from a 32-byte seed (ChaCha20 keystream, zero nonce: one use per seed)."""
    enc = Cipher(algorithms.ChaCha20(seed, b"\0" * 16), mode=None).encryptor()
    return np.frombuffer(enc.update(b"\0" * (4 * n)), dtype=np.uint32).copy()


def _pair_seed(private: X25519PrivateKey, public: bytes, round_id: bytes) -> bytes:
    shared = private.exchange(X25519PublicKey.from_public_bytes(public))
    return HKDF(algorithm=hashes.SHA256(), length=32, salt=round_id, info=b"neurofed-secagg-pair").derive(shared)


def _split32(secret: bytes, t: int, n: int) -> list[tuple[int, bytes, bytes]]:
    """Shamir t-of-n of a 32-byte secret as two 16-byte halves: ``[(index, share_lo, share_hi)]``."""
    lo, hi = Shamir.split(t, n, secret[:16]), Shamir.split(t, n, secret[16:])
    return [(i, a, b) for (i, a), (_, b) in zip(lo, hi)]


def _combine32(shares: Sequence[tuple[int, bytes, bytes]]) -> bytes:
    return (Shamir.combine([(i, a) for i, a, _ in shares]) + Shamir.combine([(i, b) for i, _, b in shares]))


def encode(x: np.ndarray, frac_bits: int) -> np.ndarray:
    """Fixed-point ``round(x * 2^frac_bits)`` as uint32 (two's complement mod 2^32)."""
    q = np.rint(np.asarray(x, np.float64) * (1 << frac_bits))
    if np.abs(q).max(initial=0) >= 1 << 31:
        raise SecAggError(f"update too large for {frac_bits} fractional bits (|value| >= {2 ** (31 - frac_bits)})")
    return q.astype(np.int64).astype(np.uint32)


def decode(q: np.ndarray, frac_bits: int) -> np.ndarray:
    return q.astype(np.uint32).view(np.int32).astype(np.float64) / (1 << frac_bits)


@dataclass
class Shares:
    """What client ``sender`` gives client ``to``: its shares of ``sender``'s self-mask seed and private key."""

    sender: int
    to: int
    b_share: tuple[int, bytes, bytes]
    key_share: tuple[int, bytes, bytes]


@dataclass
class SecAggClient:
    """One client's side of a round. ``cid`` is its index 1..n in the round (Shamir x-coordinate)."""

    cid: int
    round_id: bytes
    rng: np.random.Generator = field(default_factory=np.random.default_rng)

    def __post_init__(self) -> None:
        self._key = X25519PrivateKey.from_private_bytes(self.rng.bytes(32))
        self._b = self.rng.bytes(32)

    def public_key(self) -> bytes:
        """Step 1: the masking public key to advertise."""
        return self._key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)

    def shares(self, clients: Sequence[int], t: int) -> list[Shares]:
        """Step 2: one :class:`Shares` per client of the round (itself included), t-of-n."""
        n = len(clients)
        key = self._key.private_bytes(serialization.Encoding.Raw, serialization.PrivateFormat.Raw,
                                      serialization.NoEncryption())
        bs, ks = _split32(self._b, t, n), _split32(key, t, n)
        return [Shares(self.cid, v, bs[j], ks[j]) for j, v in enumerate(sorted(clients))]

    def masked_input(self, vector: np.ndarray, public_keys: Mapping[int, bytes]) -> np.ndarray:
        """Step 3: ``vector`` (already fixed-point uint32) masked with the self mask and every pairwise mask."""
        n = len(vector)
        y = vector.astype(np.uint32) + prg(self._b, n)
        for v, pk in public_keys.items():
            if v == self.cid:
                continue
            m = prg(_pair_seed(self._key, pk, self.round_id), n)
            y = y + m if self.cid < v else y - m
        return y.astype(np.uint32)


def unmask(masked: Mapping[int, np.ndarray], public_keys: Mapping[int, bytes],
           revealed: Mapping[int, Sequence[Shares]], t: int, round_id: bytes) -> np.ndarray:
    """Step 4 at the server: the exact sum (uint32) of the survivors' vectors.

    Parameters
    ----------
    masked : {client: masked vector}
        The inputs that arrived (the survivors).
    public_keys : {client: public key}
        Every client that advertised (survivors and dropped).
    revealed : {survivor: [Shares, ...]}
        What each survivor reveals in step 4: for a surviving sender the ``b`` share, for a dropped sender the key
        share (the orchestrator asks each survivor for the right one; both fields are read accordingly).
    """
    survivors = sorted(masked)
    dropped = sorted(set(public_keys) - set(survivors))
    if len(survivors) < t:
        raise SecAggError(f"{len(survivors)} survivors, the threshold is {t}: the round's sum cannot be unmasked")
    n = len(next(iter(masked.values())))
    total = np.zeros(n, np.uint32)
    for y in masked.values():
        total = total + y
    by_sender: dict[int, list[Shares]] = {}
    for lst in revealed.values():
        for s in lst:
            by_sender.setdefault(s.sender, []).append(s)
    for u in survivors:  # remove self masks
        got = by_sender.get(u, [])
        if len(got) < t:
            raise SecAggError(f"only {len(got)} shares of client {u}'s self mask, need {t}")
        total = total - prg(_combine32([s.b_share for s in got[:t]]), n)
    for u in dropped:  # cancel the pairwise masks the survivors added with the dropped client
        got = by_sender.get(u, [])
        if len(got) < t:
            raise SecAggError(f"only {len(got)} shares of dropped client {u}'s key, need {t}")
        key = X25519PrivateKey.from_private_bytes(_combine32([s.key_share for s in got[:t]]))
        for v in survivors:
            m = prg(_pair_seed(key, public_keys[v], round_id), n)
            # survivor v added +m if v < u, -m if v > u: undo it
            total = total - m if v < u else total + m
    return total.astype(np.uint32)


def secure_weighted_mean(updates: Mapping[int, tuple[np.ndarray, int]], t: int, frac_bits: int = 16,
                         dropout: Sequence[int] = (), seed: int = 0) -> np.ndarray:
    """In-process reference run of the whole protocol: the trial-weighted mean of the survivors' vectors.

    ``updates`` maps client index (1..n) to ``(flat float vector, n_trials)``; ``dropout`` clients advertise and
    share but never send their masked input (they vanish mid-round).
    """
    round_id = np.random.default_rng(seed).bytes(16)
    ids = sorted(updates)
    clients = {c: SecAggClient(c, round_id, np.random.default_rng([seed, c])) for c in ids}
    pks = {c: cl.public_key() for c, cl in clients.items()}
    inbox: dict[int, list[Shares]] = {c: [] for c in ids}
    for cl in clients.values():
        for s in cl.shares(ids, t):
            inbox[s.to].append(s)
    masked = {}
    for c in ids:
        if c in dropout:
            continue
        x, n_k = updates[c]
        masked[c] = clients[c].masked_input(np.concatenate([encode(np.asarray(x) * n_k, frac_bits),
                                                            encode(np.array([float(n_k)]), 0)]), pks)
    none = (0, b"", b"")  # a survivor reveals ONE share per sender: b for survivors, the key for dropped clients
    revealed = {c: [Shares(s.sender, s.to, s.b_share if s.sender in masked else none,
                           s.key_share if s.sender not in masked else none) for s in inbox[c]] for c in masked}
    total = unmask(masked, pks, revealed, t, round_id)
    weight = float(decode(total[-1:], 0)[0])
    return decode(total[:-1], frac_bits) / weight
