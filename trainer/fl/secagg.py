"""Secure aggregation (SecAgg, Bonawitz et al., CCS 2017; SecAgg+, Bell et al., CCS 2020): the server learns only the sum.

Pure and transport-free: the messages of the four protocol steps are plain dataclasses; an orchestrator
(in-process :func:`secure_weighted_mean`, or the MQTT coordinator ``broker/secagg_round.py`` with the client
side ``edge/secagg_client.py``) moves them.

**SecAgg+ neighbour graph.** With ``k`` neighbours (:func:`neighbour_graph`: a Harary graph ``H(k, n)`` over a
seeded random permutation of the clients, i.e. a ring where each client is linked to the ``k/2`` nearest on each
side) a client masks and shares only with its ``k`` neighbours: ``O(n k)`` work and bytes instead of ``O(n^2)``.
``k = n - 1`` is the complete graph of the original SecAgg. Shares are ``t``-of-``k`` among the neighbours. Cryptography comes from well-kept libraries:
X25519 key agreement and HKDF-SHA256 from ``cryptography``, ChaCha20 as the mask generator (``cryptography``),
Shamir t-of-n secret sharing in ``pycryptodome``'s GF(2^128) (its field, polynomial and share format;
:func:`split16` / :func:`combine16` compute them several times faster and are tested equal to its ``Shamir``).

Steps (``n`` clients of a round, threshold ``t``):

1. **advertise**: every client draws an X25519 masking key pair and publishes the public key.
2. **share**: each client draws a 16-byte self-mask seed ``b_u`` and Shamir-shares ``b_u`` and the 16-byte
   seed of its masking private key (:func:`mask_key`) among its neighbours (t-of-k, 16-byte secrets). On the wire each share travels encrypted to its recipient
   (ChaCha20-Poly1305 under an HKDF key of a second, *channel* X25519 pair: :meth:`SecAggClient.seal` /
   :meth:`SecAggClient.open`), so the server that routes them cannot read them.
3. **masked input**: the client sends ``y_u = q(w_u) + PRG(b_u) + sum_{v>u} PRG(s_uv) - sum_{v<u} PRG(s_uv)``
   (``v`` over its neighbours that delivered their shares)
   (mod 2^32), with ``s_uv`` the HKDF of the X25519 shared secret and ``q`` a fixed-point encoding of its
   trial-weighted update. Pairwise masks cancel in the sum; the server sees only uniformly masked vectors.
4. **unmask**: survivors reveal, for each other client, either the share of its ``b_u`` (it survived) or of
   its private key (it dropped); from ``t`` shares the server removes the self masks of the survivors and
   the dangling pairwise masks of the dropped clients, and recovers ``sum_u q(w_u)`` exactly.

Fixed point: each coordinate is scaled by ``2^frac_bits`` and rounded, the trial-weighted values
``n_k * x_k`` and the counts ``n_k`` are summed, so the weighted mean (FedAvg's aggregation weights) is
``sum / sum n_k`` after decoding. The encoding must not overflow: ``|sum n_k x_k| * 2^frac_bits < 2^31``
(checked, with a clear error). Over MQTT :func:`encode_update` sends the *update* ``x_k - global`` clamped to
``[-bound, bound]``, weighted by ``n_k / n_ref`` (``n_ref``: the selected clients' joined trials), so the sum
never exceeds ``bound * 2^frac_bits`` and ``frac_bits = 30 - ceil(log2 bound)`` (27 for the default bound 8).
"""

from __future__ import annotations

import base64
import functools
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from Crypto.Protocol.SecretSharing import _Element
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms
from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from neurofed.trainer.errors import NeuroFedError

MOD = 1 << 32
KEY_LEN = 32          # an X25519 public key
SEALED_LEN = 33 + 16  # a sealed share: index, b share, key-seed share (33 bytes) + the Poly1305 tag
B_SHARE_LEN = 17      # a revealed self-mask share: index + 16 bytes
KEY_SHARE_LEN = 17    # a revealed key-seed share: index + 16 bytes


class SecAggError(NeuroFedError):
    """The secure aggregation round cannot complete (too few survivors, overflow, bad share)."""


def prg(seed: bytes, n: int) -> np.ndarray:
    """``n`` pseudo-random uint32 from a 16- or 32-byte seed (ChaCha20 keystream, zero nonce: one use per seed).

    A 16-byte seed (the self mask ``b_u``) is stretched to a ChaCha20 key with HKDF-SHA256.
    """
    if len(seed) == 16:
        seed = HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=b"neurofed-secagg-self").derive(seed)
    enc = Cipher(algorithms.ChaCha20(seed, b"\0" * 16), mode=None).encryptor()
    return np.frombuffer(enc.update(b"\0" * (4 * n)), dtype=np.uint32).copy()


def _pair_seed(private: X25519PrivateKey, public: bytes, round_id: bytes, info: bytes = b"neurofed-secagg-pair") -> bytes:
    try:
        shared = private.exchange(X25519PublicKey.from_public_bytes(public))
    except ValueError as exc:  # wrong length, or a low-order point (all-zero shared secret)
        raise SecAggError(f"unusable X25519 public key ({exc})") from None
    return HKDF(algorithm=hashes.SHA256(), length=32, salt=round_id, info=info).derive(shared)


def _ring(n: int, seed: int) -> list[int]:
    return [int(i) + 1 for i in np.random.default_rng(seed).permutation(n)]


def neighbour_graph(n: int, k: int, seed: int) -> dict[int, frozenset[int]]:
    """SecAgg+'s communication graph over clients ``1..n``: each client's ``k`` neighbours.

    A Harary graph ``H(k, n)`` on a seeded random permutation: the clients sit on a ring in the order of
    ``default_rng(seed).permutation(n)`` and each is linked to the ``k // 2`` next and previous ones (``k`` odd
    is rounded up; ``k >= n - 1`` is the complete graph). Every client has the same degree; the graph is
    ``k``-connected, and which clients are neighbours is unpredictable without the seed.
    """
    if n < 1:
        raise SecAggError("a secure aggregation round needs at least one client")
    if k < 1 and n > 1:
        raise SecAggError(f"neighbours must be >= 1, got {k}")
    if k + (k % 2) >= n - 1:
        ids = frozenset(range(1, n + 1))
        return {c: ids - {c} for c in ids}
    h = (k + 1) // 2
    ring = _ring(n, seed)
    return {c: frozenset(ring[(p + d) % n] for d in range(-h, h + 1) if d) for p, c in enumerate(ring)}


def neighbours_of(n: int, k: int, seed: int, c: int) -> frozenset[int]:
    """Client ``c``'s row of :func:`neighbour_graph` (what one client needs: ``O(n)`` instead of ``O(n k)``)."""
    if not 1 <= c <= n:
        raise SecAggError(f"client index {c} is not in 1..{n}")
    if k < 1 and n > 1:
        raise SecAggError(f"neighbours must be >= 1, got {k}")
    if k + (k % 2) >= n - 1:
        return frozenset(range(1, n + 1)) - {c}
    h = (k + 1) // 2
    ring = _ring(n, seed)
    p = ring.index(c)
    return frozenset(ring[(p + d) % n] for d in range(-h, h + 1) if d)


def graph_params(n: int, neighbours: int = 0, threshold: float = 0.5) -> tuple[int, int]:
    """``(k, t)`` for a round of ``n`` clients.

    ``neighbours = 0`` picks SecAgg+'s logarithmic degree, ``k = 2 ceil(1.5 log2 n)`` (14 at n = 24, 20 at
    n = 100, 28 at n = 500), capped at ``n - 1`` (the complete graph); odd ``k`` is rounded up. The threshold is
    ``t = floor(threshold * k) + 1`` shares out of ``k`` (a strict majority for the default 0.5), at least 2
    when ``k >= 2``: a client's secrets are recovered as long as ``t`` of its neighbours survive.
    """
    if n < 2:
        raise SecAggError(f"secure aggregation needs at least 2 clients in a round, got {n}")
    if not 0 < threshold < 1:
        raise SecAggError(f"threshold must be in (0, 1), got {threshold}")
    k = neighbours or 2 * int(np.ceil(1.5 * np.log2(n)))
    k = min(k + (k % 2), n - 1)
    t = min(k, max(2 if k >= 2 else 1, int(np.floor(threshold * k)) + 1))
    return k, t


def mask_key(seed: bytes) -> X25519PrivateKey:
    """The masking X25519 private key of a 16-byte seed (HKDF-SHA256): sharing the seed shares the key."""
    return X25519PrivateKey.from_private_bytes(
        HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=b"neurofed-secagg-mask-key").derive(seed))


# GF(2^128) as pycryptodome's Shamir uses it (bit i of an int = coefficient of x^i, modulus
# x^128 + x^7 + x^2 + x + 1, elements as 16 big-endian bytes), with fast multiplication: its ``_Element``
# multiplies bit by bit through strings (~15 us per multiplication by a share index, ~250 us for a full
# one), which made Shamir the largest cost of a round on both sides. Same field, same shares (tested equal).
_M128 = (1 << 128) - 1
_RED4 = tuple(functools.reduce(lambda acc, i: acc ^ ((0x87 << i) if h >> i & 1 else 0), range(4), 0)
              for h in range(16))  # h * x^128 mod the modulus, for the 4 bits shifted out at a time


def _xtime(a: int) -> int:
    """``a * x`` (branch-free reduction)."""
    return ((a << 1) & _M128) ^ (0x87 * (a >> 127))


def _gf_mul(a: int, b: int) -> int:
    """``a * b`` in GF(2^128): 4-bit window over ``b`` with a table of ``a``'s 16 multiples."""
    tab = [0, a]
    for i in range(2, 16):
        tab.append(_xtime(tab[i >> 1]) if i % 2 == 0 else tab[i - 1] ^ a)
    acc = 0
    for shift in range(124, -4, -4):
        acc = ((acc << 4) & _M128) ^ _RED4[acc >> 124] ^ tab[(b >> shift) & 15]
    return acc


def _gf_mul_small(a: int, x: int) -> int:
    """``a * x`` for a small public ``x`` (a share index): one step per bit of ``x``."""
    z = 0
    while x:
        if x & 1:
            z ^= a
        a = ((a << 1) & _M128) ^ (0x87 * (a >> 127))  # _xtime, inlined (the hot loop of split16)
        x >>= 1
    return z


def split16(t: int, n: int, secret: bytes, draw: Callable[[int], bytes] = os.urandom) -> list[tuple[int, bytes]]:
    """``Shamir.split(t, n, secret)`` (pycryptodome, ``ssss=False``): ``n`` shares ``(i, 16 bytes)``, any ``t`` recover.

    The same polynomial in the same field (random coefficients, the secret as the constant term, evaluated at
    ``1..n``; tested to combine with the library's ``Shamir.combine``), with the fast multiplication above.
    """
    if len(secret) != 16:
        raise SecAggError(f"a Shamir secret is 16 bytes, got {len(secret)}")
    if not 1 <= t <= n <= 255:
        raise SecAggError(f"threshold {t} does not fit {n} share holders (at most 255)")
    rnd = draw(16 * (t - 1))
    coeffs = [int.from_bytes(rnd[16 * i:16 * i + 16], "big") for i in range(t - 1)] + [int.from_bytes(secret, "big")]
    out = []
    for x in range(1, n + 1):
        acc = 0
        for c in coeffs:  # Horner
            acc = _gf_mul_small(acc, x) ^ c
        out.append((x, acc.to_bytes(16, "big")))
    return out


@functools.lru_cache(maxsize=4096)
def _lagrange0(xs: tuple[int, ...]) -> tuple[int, ...]:
    """Lagrange coefficients at 0 for the points ``xs`` in GF(2^128) (pycryptodome's inversion)."""
    out = []
    for j, xj in enumerate(xs):
        num, den = 1, 1
        for m, xm in enumerate(xs):
            if m != j:
                num = _gf_mul_small(num, xm)
                den = _gf_mul_small(den, xj ^ xm)
        out.append(_gf_mul(num, int(_Element(den).inverse())))
    return tuple(out)


def combine16(shares: Sequence[tuple[int, bytes]]) -> bytes:
    """``Shamir.combine`` (pycryptodome, ``ssss=False``) with the Lagrange coefficients cached per index set.

    The same maths and field as the library's ``combine`` (tested equal); the coefficients' inversions,
    which dominate its cost, are computed once per set of share indices instead of once per secret, so a server
    recovering hundreds of secrets from the same holders' shares pays ``t`` multiplications for each.
    """
    coeffs = _lagrange0(tuple(i for i, _ in shares))
    acc = 0
    for c, (_, y) in zip(coeffs, shares):
        acc ^= _gf_mul(c, int.from_bytes(y, "big"))
    return acc.to_bytes(16, "big")


def _check_shares(shares: Sequence[tuple], what: str) -> None:
    idx = [s[0] for s in shares]
    if len(set(idx)) != len(idx) or any(not 1 <= i <= 255 for i in idx):
        raise SecAggError(f"shares of {what} have repeated or invalid indices {sorted(idx)[:8]}")
    if any(len(part) != 16 for s in shares for part in s[1:]):
        raise SecAggError(f"a share of {what} is not 16 bytes")


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
    """What client ``sender`` gives client ``to``: its shares of ``sender``'s self-mask seed and private key.

    Both are ``(index, 16 bytes)``: shares of the 16-byte self-mask seed and of the 16-byte seed of the
    masking private key (:func:`mask_key`).
    """

    sender: int
    to: int
    b_share: tuple[int, bytes]
    key_share: tuple[int, bytes]

    def to_bytes(self) -> bytes:
        """``index | b share | key-seed share`` (33 bytes; the plaintext of a sealed share)."""
        return bytes([self.b_share[0]]) + self.b_share[1] + self.key_share[1]

    @classmethod
    def from_bytes(cls, sender: int, to: int, data: bytes) -> Shares:
        if len(data) != 33 or not 1 <= data[0] <= 255:
            raise SecAggError(f"a share from client {sender} is malformed ({len(data)} bytes)")
        i = data[0]
        return cls(sender, to, (i, data[1:17]), (i, data[17:33]))


@dataclass
class SecAggClient:
    """One client's side of a round. ``cid`` is its index 1..n in the round (Shamir x-coordinate)."""

    cid: int
    round_id: bytes
    rng: np.random.Generator | None = None  # None: os.urandom (a deployment); a Generator only for reproducible tests

    def __post_init__(self) -> None:
        draw = os.urandom if self.rng is None else self.rng.bytes
        self._kseed = draw(16)  # 128-bit seed of the masking key: what is Shamir-shared for dropout recovery
        self._key = mask_key(self._kseed)
        self._ckey = X25519PrivateKey.from_private_bytes(draw(32))  # channel key: encrypts shares
        self._b = draw(16)
        self._draw = draw  # the Shamir polynomials' coefficients
        self._channels: dict[bytes, ChaCha20Poly1305] = {}

    def public_key(self) -> bytes:
        """Step 1: the masking public key to advertise."""
        return self._key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)

    def channel_public_key(self) -> bytes:
        """Step 1: the public key others encrypt their shares to this client with."""
        return self._ckey.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)

    def shares(self, clients: Sequence[int], t: int) -> list[Shares]:
        """Step 2: one :class:`Shares` per holder in ``clients`` (its neighbours, or everyone), t-of-len(clients)."""
        n = len(clients)
        if not 1 <= t <= n:
            raise SecAggError(f"threshold {t} does not fit {n} share holders")
        bs, ks = split16(t, n, self._b, self._draw), split16(t, n, self._kseed, self._draw)
        return [Shares(self.cid, v, bs[j], ks[j]) for j, v in enumerate(sorted(clients))]

    def _channel(self, peer_channel_pk: bytes) -> ChaCha20Poly1305:
        """The AEAD shared with one peer (one X25519 exchange per peer: sealing to it and opening from it)."""
        if peer_channel_pk not in self._channels:
            self._channels[peer_channel_pk] = ChaCha20Poly1305(_pair_seed(self._ckey, peer_channel_pk, self.round_id,
                                                                          b"neurofed-secagg-share"))
        return self._channels[peer_channel_pk]

    def seal(self, share: Shares, peer_channel_pk: bytes, aad: bytes) -> bytes:
        """Encrypt a share to its holder (``share.to``): ChaCha20-Poly1305, the direction in the nonce."""
        nonce = (b"\x01" if self.cid < share.to else b"\x02") + b"\0" * 11
        return self._channel(peer_channel_pk).encrypt(nonce, share.to_bytes(), aad)

    def open(self, sender: int, ciphertext: bytes, sender_channel_pk: bytes, aad: bytes) -> Shares:
        """Decrypt a share ``sender`` sealed to this client; a forged or altered one raises SecAggError."""
        nonce = (b"\x01" if sender < self.cid else b"\x02") + b"\0" * 11
        try:
            plain = self._channel(sender_channel_pk).decrypt(nonce, ciphertext, aad)
        except InvalidTag:
            raise SecAggError(f"the share from client {sender} does not authenticate (forged or altered)") from None
        return Shares.from_bytes(sender, self.cid, plain)

    def masked_input(self, vector: np.ndarray, public_keys: Mapping[int, bytes]) -> np.ndarray:
        """Step 3: ``vector`` (already fixed-point uint32) masked with the self mask and every pairwise mask."""
        n = len(vector)
        y = vector.astype(np.uint32) + prg(self._b, n)
        for v, pk in public_keys.items():
            if v == self.cid:
                continue
            m = prg(_pair_seed(self._key, pk, self.round_id), n)
            if self.cid < v:
                y += m
            else:
                y -= m
        return y


def unmask(masked: Mapping[int, np.ndarray], public_keys: Mapping[int, bytes],
           revealed: Mapping[int, Sequence[Shares]], t: int, round_id: bytes,
           neighbours: Mapping[int, frozenset[int]] | None = None) -> np.ndarray:
    """Step 4 at the server: the exact sum (uint32) of the survivors' vectors.

    Parameters
    ----------
    masked : {client: masked vector}
        The inputs that arrived (the survivors).
    public_keys : {client: public key}
        Every client whose shares were delivered (survivors and clients dropped after sharing).
    revealed : {survivor: [Shares, ...]}
        What each survivor reveals in step 4: for a surviving sender the ``b`` share, for a dropped sender the key
        share (the orchestrator asks each survivor for the right one; both fields are read accordingly).
    neighbours : {client: its neighbours}, optional
        SecAgg+'s graph (:func:`neighbour_graph`); None is the complete graph.
    """
    survivors = sorted(masked)
    dropped = sorted(set(public_keys) - set(survivors))
    if neighbours is None and len(survivors) < t:
        raise SecAggError(f"{len(survivors)} survivors, the threshold is {t}: the round's sum cannot be unmasked")
    n = len(next(iter(masked.values())))
    total = np.zeros(n, np.uint32)
    for y in masked.values():
        total = total + y
    by_sender: dict[int, list[Shares]] = {}
    for lst in revealed.values():
        for s in lst:
            by_sender.setdefault(s.sender, []).append(s)
    for lst in by_sender.values():  # the t lowest holder indices: the same index sets recur (cached coefficients)
        lst.sort(key=lambda s: max(s.b_share[0], s.key_share[0]))
    for u in survivors:  # remove self masks
        got = by_sender.get(u, [])
        if len(got) < t:
            raise SecAggError(f"only {len(got)} shares of client {u}'s self mask, need {t}")
        _check_shares([s.b_share for s in got[:t]], f"client {u}'s self mask")
        total = total - prg(combine16([s.b_share for s in got[:t]]), n)
    for u in dropped:  # cancel the pairwise masks the survivors added with the dropped client
        got = by_sender.get(u, [])
        if len(got) < t:
            raise SecAggError(f"only {len(got)} shares of dropped client {u}'s key, need {t}")
        _check_shares([s.key_share for s in got[:t]], f"dropped client {u}'s key")
        key = mask_key(combine16([s.key_share for s in got[:t]]))
        for v in survivors if neighbours is None else sorted(neighbours[u] & set(survivors)):
            m = prg(_pair_seed(key, public_keys[v], round_id), n)
            # survivor v added +m if v < u, -m if v > u: undo it
            total = total - m if v < u else total + m
    return total.astype(np.uint32)


def secure_weighted_mean(updates: Mapping[int, tuple[np.ndarray, int]], t: int, frac_bits: int = 16,
                         dropout: Sequence[int] = (), seed: int = 0, neighbours: int | None = None) -> np.ndarray:
    """In-process reference run of the whole protocol: the trial-weighted mean of the survivors' vectors.

    ``updates`` maps client index (1..n) to ``(flat float vector, n_trials)``; ``dropout`` clients advertise and
    share but never send their masked input (they vanish mid-round). ``neighbours``: SecAgg+'s degree ``k``
    (shares t-of-k among the neighbours); None is the complete graph (t-of-(n-1)).
    """
    round_id = np.random.default_rng(seed).bytes(16)
    ids = sorted(updates)
    if ids != list(range(1, len(ids) + 1)):
        raise SecAggError("clients must be numbered 1..n")
    graph = neighbour_graph(len(ids), len(ids) - 1 if neighbours is None else neighbours, seed)
    clients = {c: SecAggClient(c, round_id, np.random.default_rng([seed, c])) for c in ids}
    pks = {c: cl.public_key() for c, cl in clients.items()}
    cpks = {c: cl.channel_public_key() for c, cl in clients.items()}
    inbox: dict[int, list[Shares]] = {c: [] for c in ids}
    aad = b"neurofed-test"
    for cl in clients.values():
        for s in cl.shares(sorted(graph[cl.cid]), t):  # sealed to the holder, opened by it: the wire path
            inbox[s.to].append(clients[s.to].open(cl.cid, cl.seal(s, cpks[s.to], aad), cpks[cl.cid], aad))
    masked = {}
    for c in ids:
        if c in dropout:
            continue
        x, n_k = updates[c]
        masked[c] = clients[c].masked_input(np.concatenate([encode(np.asarray(x) * n_k, frac_bits),
                                                            encode(np.array([float(n_k)]), 0)]),
                                            {v: pks[v] for v in graph[c]})
    for c in masked:
        if sum(1 for v in graph[c] if v in masked) < t:
            raise SecAggError(f"client {c} has fewer than {t} surviving neighbours, the threshold is {t}: "
                              "the round's sum cannot be unmasked")
    revealed = {c: [reveal_share(s, s.sender in masked) for s in inbox[c]] for c in masked}
    total = unmask(masked, pks, revealed, t, round_id, graph)
    weight = float(decode(total[-1:], 0)[0])
    return decode(total[:-1], frac_bits) / weight


def reveal_share(s: Shares, sender_survived: bool) -> Shares:
    """Step 4 at a holder: ONE share per sender, ``b`` for a survivor, the key for a dropped client (never both)."""
    if sender_survived:
        return Shares(s.sender, s.to, s.b_share, (0, b""))
    return Shares(s.sender, s.to, (0, b""), s.key_share)


# ----------------------------------------------------------------------------- the update vector on the wire
def frac_bits_for(bound: float) -> int:
    """Fractional bits of :func:`encode_update` for coordinates clamped to ``[-bound, bound]`` (sum < 2^30).

    The weight coordinate is up to 1 whatever the bound (weights sum to 1), so a bound under 1 scales as 1 does
    (issue 54: ``bound`` 0.01 gave 36 bits and the weights' sum 2^36 wrapped around 2^32)."""
    if not 0 < bound <= 2**20:
        raise SecAggError(f"secure aggregation bound must be in (0, 2^20], got {bound}")
    return 30 - max(0, int(np.ceil(np.log2(bound))))


def encode_update(delta: np.ndarray, loss: float, n_samples: int, n_ref: int, bound: float) -> tuple[np.ndarray, int]:
    """A client's fixed-point vector: ``[delta * w, loss * w, w]`` with ``w = n_samples / n_ref``, then scaled.

    ``delta`` (the update ``x_k - global``, flat) and ``loss`` are clamped to ``[-bound, bound]`` first, and
    ``n_samples <= n_ref`` is required, so any sum of such vectors over clients whose trials add up to at most
    ``n_ref`` stays under ``2^30`` (no wrap-around). Returns ``(vector, coordinates clamped)``.
    """
    if not 1 <= n_samples <= n_ref:
        raise SecAggError(f"n_samples {n_samples} must be in [1, n_ref = {n_ref}]")
    f = frac_bits_for(bound)
    d = np.asarray(delta, np.float64)
    if not np.isfinite(d).all() or not np.isfinite(loss):
        raise SecAggError("the update has NaN or inf")
    clamped = int((np.abs(d) > bound).sum())
    w = n_samples / n_ref
    x = np.concatenate([np.clip(d, -bound, bound) * w, [min(max(float(loss), -bound), bound) * w, w]])
    return encode(x, f), clamped


def max_weight_sum(n_clients: int, bound: float) -> float:
    """The largest unmasked weight sum that honest :func:`encode_update` vectors of ``n_clients`` clients give.

    Proof. Let ``f = frac_bits_for(bound)``, ``q = 2^f``, ``w_k = n_k / n_ref`` (exact). Client k sends
    ``Q_k = rint(c_k)`` with ``c_k = fl(n_k / n_ref) * q``: the division is rounded (relative error
    <= 2^-53, ``w_k <= 1``), the scaling by a power of two is exact, so ``c_k <= w_k q + q 2^-53``, and
    rounding to the nearest integer adds at most 1/2: ``Q_k <= w_k q + 1/2 + q 2^-53``. Honest clients have
    ``sum n_k <= n_ref`` (the task's n_ref is their trials), i.e. ``sum w_k <= 1``, hence
    ``sum Q_k <= q + n/2 + x`` with ``x = n q 2^-53``. The sum is an integer (the uint32 sum is exact: no
    wrap-around below 2^30), so ``sum Q_k <= q + floor(n/2) + floor(1/2 + x) <= q + floor(n/2) + 1 + floor(2x)``,
    and decoding divides by ``q`` exactly: the weight sum is at most
    ``1 + (floor(n/2) + 1 + floor(n q 2^-52)) / q``. The old fixed ``1 + 1e-6`` is below that once n/2 quanta pass
    1e-6 (1,000 clients at bound 8, f = 27: 500 * 2^-27 = 3.7e-6). A sum more than that many quanta over 1 (a
    client claiming more trials than it has, or a garbled input) is still refused.
    """
    if n_clients < 1:
        raise SecAggError(f"a weight sum over {n_clients} clients")
    q = 1 << frac_bits_for(bound)
    return 1.0 + (n_clients // 2 + 1 + (n_clients * q >> 52)) / q


def decode_update_sum(total: np.ndarray, bound: float) -> tuple[np.ndarray, float, float]:
    """Inverse of the sum of :func:`encode_update` vectors: ``(weighted mean delta, weighted mean loss, sum w)``."""
    x = decode(total, frac_bits_for(bound))
    w = float(x[-1])
    if w <= 0:
        raise SecAggError(f"the unmasked weight sum is {w}: the masked inputs were inconsistent")
    return x[:-2] / w, float(x[-2] / w), w


# ----------------------------------------------------------------------------- wire helpers
def masked_keys(state: Mapping[str, Any]) -> list[str]:
    """The state entries secure aggregation sums, in wire order: the floating ones, sorted by name."""
    return sorted(k for k, v in state.items() if v.is_floating_point())


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def unb64_records(text: str, size: int, count: int, what: str) -> list[bytes]:
    """Split base64 ``text`` into exactly ``count`` records of ``size`` bytes, else SecAggError naming ``what``."""
    raw = unb64(text, size * count, f"{what} ({count} x {size} bytes)")
    return [raw[i:i + size] for i in range(0, len(raw), size)]


def unb64(text: str, n: int, what: str) -> bytes:
    """Decode base64 ``text`` of exactly ``n`` bytes, else SecAggError naming ``what``."""
    try:
        raw = base64.b64decode(text, validate=True)
    except ValueError:
        raise SecAggError(f"{what} is not base64") from None
    if len(raw) != n:
        raise SecAggError(f"{what} is {len(raw)} bytes, expected {n}")
    return raw
