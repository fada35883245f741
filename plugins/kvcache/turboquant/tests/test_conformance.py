"""The turbo codecs against tallow's KV-codec conformance suite (the Triton backend stores them
in its own suite, plugins/attention/triton/tests/conformance_cases.py).

What each codec promises per head vector, ``||read - wrote|| <= tol * ||wrote||``, follows
from its quantizer. A rotated vector ``y`` of D coordinates keeps one scale, and the rotation
is orthogonal, so the error of ``y`` is the error of the vector:

- turbo8, ``scale = max|y| / 127.5``: no coordinate is off by more than half a step, so
  ``||err|| <= sqrt(D) * max|y| / 255 <= sqrt(D) / 255 * ||y||``: 0.0351 at D = 80, the
  largest head size checked; a hard bound.
- turbo4 (``max|y| / 7.5``) has the same form, ``sqrt(D) / 15``, which at 0.6 would let a
  scale off by two pass; the suite's vectors are Gaussian (as rotated coordinates are), for
  which the error is that of a uniform quantizer, ``step / sqrt(12)``: with ``max|y|`` of 64
  to 80 Gaussian coordinates at 2.4 to 3.5 standard deviations, 0.09 to 0.13 of ``||y||``
  (measured over 6,480 such vectors: mean 0.10, largest 0.17). 0.25 catches a step off by
  half.
- turbo3 (``0.586 * rms(y)``, the step of the least-squares uniform quantizer of a Gaussian,
  outer coordinates clipped): its mean squared error is 0.0345 of the variance, 0.186 of
  ``||y||`` in root mean square (measured: mean 0.19, largest 0.33 of 6,480 vectors, the
  vectors with a far outlier clipped); 0.4.
"""

from __future__ import annotations

from tallow.plugin.testing import KVCodecConformance


class TestTurbo8Conformance(KVCodecConformance):
    distribution = "tallow-kvcache-turboquant"
    component = "turbo8"
    vector_tolerance = 0.036


class TestTurbo4Conformance(KVCodecConformance):
    distribution = "tallow-kvcache-turboquant"
    component = "turbo4"
    vector_tolerance = 0.25


class TestTurbo3Conformance(KVCodecConformance):
    distribution = "tallow-kvcache-turboquant"
    component = "turbo3"
    vector_tolerance = 0.4


class TestTurbo4WithoutRotationConformance(KVCodecConformance):
    """Plain per-token quantization (the setting that measures what the rotation buys): the
    same format without the rotation, the same promise on Gaussian vectors."""

    distribution = "tallow-kvcache-turboquant"
    component = "turbo4"
    vector_tolerance = 0.25
    settings = {"rotation": False}
