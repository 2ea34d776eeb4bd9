"""The allocator tuning takes effect on glibc (Linux), is harmless to repeat, and scales its
heap retention with a worker's memory limit."""

import platform

from kelr_dist.engine.allocator import (
    TRIM_THRESHOLD,
    release_free_memory,
    thresholds,
    tune_allocator,
)


def test_tune_allocator_is_idempotent_and_works_on_glibc():
    first, second = tune_allocator(), tune_allocator(300 * 2**20)
    assert first == second
    if platform.system() == "Linux" and platform.libc_ver()[0] == "glibc":
        assert first is True


def test_heap_retention_scales_with_the_memory_limit():
    assert thresholds(None) == (TRIM_THRESHOLD // 2, TRIM_THRESHOLD)
    mmap, trim = thresholds(300 * 2**20)
    assert trim == 300 * 2**20 // 16 and mmap == trim // 2
    assert thresholds(64 * 2**30)[1] == TRIM_THRESHOLD


def test_release_free_memory_on_glibc():
    released = release_free_memory()
    if platform.system() == "Linux" and platform.libc_ver()[0] == "glibc":
        assert released is True
