"""The CPU's theoretical peak (cores x FLOP/cycle x clock) from lscpu's text."""
from composer_jax.train.mfu import cpu_theoretical_peak


def test_theoretical_peak_from_lscpu_text():
    text = "CPU(s): 4\nCPU max MHz: 3000.0000\nBogoMIPS: 5200.00\nFlags: fpu avx2 fma avx512f\n"
    peak, src = cpu_theoretical_peak(text)
    assert peak == 4 * 64 * 3000e6 and "AVX-512" in src and "CPU max MHz" in src
    peak, src = cpu_theoretical_peak("CPU(s): 2\nBogoMIPS: 5200.00\nFlags: avx2 fma\n")
    assert peak == 2 * 32 * 2600e6 and "BogoMIPS/2" in src
