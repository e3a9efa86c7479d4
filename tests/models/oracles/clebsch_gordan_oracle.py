"""Oracle for crucible::mace::clebsch_gordan: every non-zero Clebsch-Gordan
coefficient <l1 m1 l2 m2 | l3 m3> with l1, l2, l3 <= LMAX from SymPy
(sympy.physics.quantum.cg.CG, Condon-Shortley convention), as JSON rows
[l1, m1, l2, m2, l3, m3, value].

Usage: clebsch_gordan_oracle.py LMAX
"""
import json
import sys

from sympy.physics.quantum.cg import CG


def main():
    lmax = int(sys.argv[1])
    rows = []
    for l1 in range(lmax + 1):
        for l2 in range(lmax + 1):
            for l3 in range(abs(l1 - l2), min(l1 + l2, lmax) + 1):
                for m1 in range(-l1, l1 + 1):
                    for m2 in range(-l2, l2 + 1):
                        m3 = m1 + m2
                        if abs(m3) > l3:
                            continue
                        v = float(CG(l1, m1, l2, m2, l3, m3).doit())
                        if v != 0.0:
                            rows.append([l1, m1, l2, m2, l3, m3, v])
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
