"""The allocator tuning takes effect on glibc (Linux), is harmless to repeat, and scales its
heap retention with a worker's memory limit; free heap memory goes back only from a worker that
is filling up."""

import platform

from kelr_dist.engine.allocator import (
    TRIM_THRESHOLD,
    release_free_memory,
    release_when_full,
    restore_allocator,
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


def test_free_memory_goes_back_only_above_a_share_of_the_memory_limit():
    assert release_when_full(None) is False  # no limit: the heap is kept for the next task
    assert release_when_full(2**60) is False  # far below the limit
    if platform.system() == "Linux" and platform.libc_ver()[0] == "glibc":
        assert release_when_full(2**20) is True  # every Python process holds more than 0.5 MiB


def test_the_thresholds_go_back_to_glibcs_when_the_tuning_is_removed():
    tuned, restored = tune_allocator(300 * 2**20, one_arena=False), restore_allocator()
    assert tuned == restored
    if platform.system() == "Linux" and platform.libc_ver()[0] == "glibc":
        assert restored is True
