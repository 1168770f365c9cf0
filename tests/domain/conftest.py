"""The fast tier: the domain through its ports (tests/domain/harness.py), no gRPC, no process."""

from tests.domain.harness import bench

__all__ = ["bench"]
