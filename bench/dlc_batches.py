"""draftline's micro-batches and anchors, in Python (bench code for the PyTorch
comparison of issue 14; bench/pytorch_dflash.py uses it).

Reads a prepared cache (.dlc, common/data/prepare.h) and reproduces, bit for bit,
what `draftline run` trains on with the same flags:
  - the micro-batch plan of common/data/batcher.c (truncate to max_len, Fisher-Yates
    shuffle seeded rng_mix(seed, epoch, 0), striped first-fit decreasing per window of
    4096 sequences, shuffle of the epoch's micro-batches), micro-batches numbered on
    across epochs;
  - the anchors of drafter_worker (drafter_sample_anchors seeded
    rng_mix(seed, mb, 0xA17C)): positions a >= 1 whose next B-1 tokens are all
    assistant tokens, else the fallback a >= 1 with an assistant token at a + 1; at most
    --num-anchors per sequence, drawn without replacement, sorted.
The random numbers are common/base/rng.c's (xoshiro256** seeded by splitmix64,
Lemire's unbiased bounded draw), integer-exact.
"""
import mmap
import struct

import numpy as np

M64 = (1 << 64) - 1
SHUFFLE_BUFFER = 4096


def _splitmix(x):
    x = (x + 0x9E3779B97F4A7C15) & M64
    z = x
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    return x, z ^ (z >> 31)


def rng_mix(seed, a, b):
    """common/base/rng.c rng_mix: stateless hash of (seed, a, b), all uint64."""
    _, h = _splitmix(seed & M64)
    _, h = _splitmix(h ^ (a & M64))
    _, h = _splitmix(h ^ (b & M64))
    return h


def _rotl(x, k):
    return ((x << k) | (x >> (64 - k))) & M64


class Rng:
    """common/base/rng.c rng_t (xoshiro256**), seeded like rng_seed."""

    def __init__(self, seed):
        x, self.s = seed & M64, []
        for _ in range(4):
            x, z = _splitmix(x)
            self.s.append(z)

    def u64(self):
        s = self.s
        result = (_rotl((s[1] * 5) & M64, 7) * 9) & M64
        t = (s[1] << 17) & M64
        s[2] ^= s[0]
        s[3] ^= s[1]
        s[1] ^= s[2]
        s[0] ^= s[3]
        s[2] ^= t
        s[3] = _rotl(s[3], 45)
        return result

    def below(self, n):
        """Uniform in [0, n) (Lemire), as rng_below."""
        if n <= 1:
            return 0
        m = self.u64() * n
        low = m & M64
        if low < n:
            t = ((1 << 64) - n) % n
            while low < t:
                m = self.u64() * n
                low = m & M64
        return m >> 64

    def shuffle(self, idx):
        """rng_shuffle_u32 on a Python list, in place."""
        for i in range(len(idx), 1, -1):
            j = self.below(i)
            idx[i - 1], idx[j] = idx[j], idx[i - 1]


class Dlc:
    """A prepared cache, memory-mapped: ids (int32), mask (uint8), index (uint64)."""

    def __init__(self, path):
        with open(path, "rb") as f:
            self._mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        h = self._mm[:128]
        if h[:8] != b"DLCACHE\0":
            raise ValueError(f"{path}: not a draftline cache (magic {h[:8]!r})")
        (self.version, _, self.n_samples, self.n_tokens, self.n_assistant, _, _, ids_off, mask_off,
         index_off, self.n_vocab, _, self.max_sample_len) = struct.unpack_from("<IIQQQQQQQQiII", h, 8)
        self.ids = np.frombuffer(self._mm, np.int32, self.n_tokens, ids_off)
        self.mask = np.frombuffer(self._mm, np.uint8, self.n_tokens, mask_off)
        self.index = np.frombuffer(self._mm, np.uint64, self.n_samples + 1, index_off).astype(np.int64)

    def sample_len(self, i):
        return int(self.index[i + 1] - self.index[i])


class Batcher:
    """common/data/batcher.c with split_long off (what `draftline run` uses)."""

    def __init__(self, dlc, seed, token_budget, max_len, epochs=1):
        if max_len <= 0 or max_len > token_budget:
            max_len = token_budget
        self.dlc, self.seed, self.budget, self.epochs = dlc, seed, token_budget, epochs
        self.segs = []  # (sample, len)
        for i in range(dlc.n_samples):
            n = dlc.sample_len(i)
            if n >= 2:
                self.segs.append((i, min(n, max_len)))
        self._plans = {}

    def plan(self, e):
        """List of micro-batches of epoch e, each a list of segment indices."""
        if e in self._plans:
            return self._plans[e]
        n, W, budget = len(self.segs), SHUFFLE_BUFFER, self.budget
        r = Rng(rng_mix(self.seed, e, 0))
        perm = list(range(n))
        r.shuffle(perm)
        mbs = []
        for w0 in range(0, n, W):
            win = sorted(perm[w0:w0 + W], key=lambda s: (self.segs[s][1], s))
            wt = sum(self.segs[s][1] for s in win)
            M = max(1, (wt + budget - 1) // budget)
            fill, members, cur = [0] * M, [[] for _ in range(M)], 0
            for s in reversed(win):  # longest first
                ln, j = self.segs[s][1], -1
                for t in range(M):
                    c = cur + t if cur + t < M else cur + t - M
                    if fill[c] + ln <= budget:
                        j = c
                        break
                if j < 0:
                    j, M = M, M + 1
                    fill.append(0)
                    members.append([])
                fill[j] += ln
                members[j].append(s)
                cur = j + 1 if j + 1 < M else 0
            mbs.extend(members)
        order = list(range(len(mbs)))
        r.shuffle(order)
        self._plans = {e: [mbs[k] for k in order]}
        return self._plans[e]

    def get(self, mb):
        """Micro-batch mb -> (ids int32, mask uint8, cu_seqlens int32) packed, or None past the end."""
        e, base = 0, 0
        while True:
            if self.epochs and e >= self.epochs:
                return None
            p = self.plan(e)
            if mb < base + len(p):
                break
            base += len(p)
            e += 1
        segs = [self.segs[s] for s in p[mb - base]]
        idx = self.dlc.index
        ids = np.concatenate([self.dlc.ids[idx[s]:idx[s] + ln] for s, ln in segs])
        mask = np.concatenate([self.dlc.mask[idx[s]:idx[s] + ln] for s, ln in segs])
        cu = np.zeros(len(segs) + 1, np.int32)
        cu[1:] = np.cumsum([ln for _, ln in segs])
        return ids, mask, cu


def sample_anchors(cu, mask, B, max_per_seq, seed, mb):
    """drafter_sample_anchors for micro-batch mb: packed anchor indices (int64, sorted per sequence)."""
    r = Rng(rng_mix(seed, mb, 0xA17C))
    out = []
    for s in range(len(cu) - 1):
        s0, ln = int(cu[s]), int(cu[s + 1] - cu[s])
        m = mask[s0:s0 + ln].astype(np.int64)
        # run[a] = assistant tokens in a row starting at a + 1
        run = np.zeros(ln + 1, np.int64)
        for a in range(ln - 2, -1, -1):
            run[a] = run[a + 1] + 1 if m[a + 1] else 0
        cand = [a for a in range(1, ln) if run[a] >= B - 1]
        if not cand:
            cand = [a for a in range(1, ln - 1) if m[a + 1]]
        take = min(len(cand), max_per_seq)
        for i in range(take):
            k = i + r.below(len(cand) - i)
            cand[i], cand[k] = cand[k], cand[i]
        out.extend(sorted(s0 + a for a in cand[:take]))
    return np.asarray(out, np.int64)
