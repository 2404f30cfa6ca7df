"""A test plugin: the real PyTorch backend, except that rank GPUBENCH_TEST_FAIL_RANK of a
distributed config fails right after building its trainer (with its process group up, so the
other ranks are left waiting in a collective: the launcher must stop them)."""

from __future__ import annotations

from gpubench.backends import register_backend
from gpubench.backends.pytorch.backend import TorchBackend
from tests.plugins.fake import fail_rank


class FailingRankTorchBackend(TorchBackend):
    def build(self, spec, config, batches):
        trainer = super().build(spec, config, batches)
        fail_rank(config)
        return trainer


register_backend("torch", "tests.plugins.failing_torch:FailingRankTorchBackend")
