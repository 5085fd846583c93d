"""Every numba kernel of harness/ and systems/ against its plain numpy/Python twin, bit for
bit. The twins (`*_reference`) live in these test modules: test-only reference definitions
that state each kernel's rule plainly. The folder also passes with NUMBA_DISABLE_JIT=1
(the kernels then run as Python)."""
