"""Suite-wide settings.

Tiny random models gain nothing from a second thread, and on a shared 2-core machine two OpenMP
threads per test process stall at every barrier whenever another process holds a core (see
engine/loader.configure_threads). Tests that load the real model set their own thread count.

The suite runs on its own specchat cache folder, never the user's (tests/suite_cache.py).
"""

import torch

torch.set_num_threads(1)


import warnings  # noqa: E402
from collections.abc import Iterator  # noqa: E402

import pytest  # noqa: E402

from tests import suite_cache  # noqa: E402

VARIANT_PARAMS = ["cpu", "avx512", "avxvnni", "avx2"]


def pytest_configure(config: pytest.Config) -> None:
    """The suite's cache is in place before collection: test modules build the kernel at import."""
    suite_cache.start()


def pytest_unconfigure(config: pytest.Config) -> None:
    suite_cache.stop()


@pytest.fixture(scope="session", autouse=True)
def _own_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """After the last test: what the run made of files outside the temp folders goes to the user's
    cache (the next run reuses it); a leak this run provably made fails the run, by name, and a
    change it cannot tell from another program's (tests/suite_cache.py: finish) is a warning."""
    yield
    leaked, others = suite_cache.finish(tmp_path_factory.getbasetemp())
    user = suite_cache.user_cache()
    if others:
        warnings.warn(f"the user's specchat cache {user} changed during the run (another specchat process, "
                      f"or a test that left the suite's cache): "
                      f"{', '.join(others)}", stacklevel=1)
    if leaked:
        shown = "\n  ".join(leaked[:20]) + (f"\n  ... and {len(leaked) - 20} more" if len(leaked) > 20 else "")
        pytest.fail(f"the tests wrote into the user's specchat cache {user}:\n  {shown}", pytrace=False)


@pytest.fixture(params=VARIANT_PARAMS)
def kernel_variant(request: pytest.FixtureRequest) -> Iterator[str]:
    """Run a kernel test with the tiles this CPU picks, then without AMX (the VNNI tiles), then as an
    AVX2 CPU with AVX-VNNI, then with the AVX2 tiles, so every variant's exactness is checked on
    whatever machine runs the suite (a run that would repeat the CPU's own pick, or that needs
    instructions it lacks, is skipped). Yields the stored-weight variant in force."""
    yield from _variant(request.param, without_kernel="skip")


@pytest.fixture(params=VARIANT_PARAMS)
def each_variant(request: pytest.FixtureRequest) -> Iterator[str]:
    """``kernel_variant`` for tests that also hold without the native kernel (torch's products on
    both sides of the comparison): there the "cpu" run goes ahead and yields "torch". Why: a test
    that runs only on the CPU's own pick checks the AVX-512 tiles on one machine and the AVX2 ones
    on another, so a bug in one variant passes or fails by the machine."""
    yield from _variant(request.param, without_kernel="torch")


def _variant(param: str, without_kernel: str) -> Iterator[str]:
    """Put the tiles ``param`` names in force for one test (or skip it), and the default back after."""
    from engine.kernels import native

    kernel = native.load()
    if kernel is None:
        if without_kernel == "torch" and param == "cpu":
            yield "torch"
            return
        pytest.skip(f"no native kernel here: {native.why_not}")
    kernel.choose_variant("")
    own = (kernel.variant, kernel.fast_variant)
    if param == "avx512" and kernel.fast_variant != "amx":
        pytest.skip("this CPU has no AMX: its own pick is the VNNI or AVX2 tiles")
    if param == "avx2" and own == ("avx2", "avx2"):
        pytest.skip("this CPU runs the AVX2 tiles already")
    if param == "avxvnni":
        kernel.choose_variant("avxvnni")
        if kernel.fast_variant != "avxvnni" or own == ("avx2", "avxvnni"):
            kernel.choose_variant(native.forced_variant())
            pytest.skip("this CPU has no AVX-VNNI, or runs those tiles already")
    kernel.choose_variant("" if param == "cpu" else param)
    try:
        yield kernel.variant
    finally:
        kernel.choose_variant(native.forced_variant())
