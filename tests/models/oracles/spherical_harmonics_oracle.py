"""Oracle for crucible::mace::spherical_harmonics: real spherical harmonics
from SciPy's complex ones (scipy.special.sph_harm, Condon-Shortley phase),
Y_l,-|m| = sqrt(2) (-1)^m Im Y_l^|m|, Y_l0, Y_lm = sqrt(2) (-1)^m Re Y_l^m,
times sqrt(4 pi) (component normalisation).

Usage: spherical_harmonics_oracle.py SEED N LMAX -> JSON {"vectors": [[x,y,z],...],
"values": [[Y_00, Y_1-1, ...], ...]} for N random vectors (random lengths).
"""
import json
import sys

import numpy as np

try:  # SciPy < 1.17 (Debian 12: 1.10)
    from scipy.special import sph_harm

    def complex_sh(l, m, azimuth, polar):
        return sph_harm(m, l, azimuth, polar)
except ImportError:  # SciPy >= 1.17 removed sph_harm; sph_harm_y(n, m, polar, azimuth)
    from scipy.special import sph_harm_y

    def complex_sh(l, m, azimuth, polar):
        return sph_harm_y(l, m, polar, azimuth)


def real_sh(l, m, azimuth, polar):
    if m == 0:
        return complex_sh(l, 0, azimuth, polar).real
    y = complex_sh(l, abs(m), azimuth, polar)
    if m < 0:
        return np.sqrt(2.0) * (-1) ** m * y.imag
    return np.sqrt(2.0) * (-1) ** m * y.real


def main():
    seed, n, lmax = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    rng = np.random.RandomState(seed)
    v = rng.normal(size=(n, 3)) * rng.uniform(0.5, 3.0, size=(n, 1))
    r = np.linalg.norm(v, axis=1)
    polar = np.arccos(np.clip(v[:, 2] / r, -1.0, 1.0))
    azimuth = np.arctan2(v[:, 1], v[:, 0])
    cols = []
    for l in range(lmax + 1):
        for m in range(-l, l + 1):
            cols.append(np.sqrt(4 * np.pi) * real_sh(l, m, azimuth, polar))
    print(json.dumps({"vectors": v.tolist(), "values": np.stack(cols, axis=1).tolist()}))


if __name__ == "__main__":
    main()
