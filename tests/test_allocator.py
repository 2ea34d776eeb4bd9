"""The allocator tuning takes effect on glibc (Linux) and is harmless to repeat."""

import platform

from kelr_dist.allocator import tune_allocator


def test_tune_allocator_is_idempotent_and_works_on_glibc():
    first, second = tune_allocator(), tune_allocator()
    assert first == second
    if platform.system() == "Linux" and platform.libc_ver()[0] == "glibc":
        assert first is True
