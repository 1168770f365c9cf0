"""The fast tier: the domain through its ports (tests/domain/harness.py), no gRPC, no process.
Its fixtures are registered here, once, for every test of the tier."""

from tests.domain.harness import bench
from tests.domain.kit_suspension import stage
from tests.domain.kit_turns import benches

__all__ = ["bench", "benches", "stage"]
