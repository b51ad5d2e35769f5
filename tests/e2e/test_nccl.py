"""NCCL on real GPUs: skipped unless CUDA GPUs are visible (scripts/gpu_check.sh runs these)."""
import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA GPU visible", allow_module_level=True)

from parasim.engine.launch import RealOptions  # noqa: E402
from parasim.lesson import get_lesson  # noqa: E402
from parasim.engine.real import run_real  # noqa: E402

GPUS = torch.cuda.device_count()
pytestmark = pytest.mark.nccl


@pytest.mark.parametrize("world", sorted({1, min(GPUS, 2), min(GPUS, 4), min(GPUS, 8)}))
def test_collectives_on_nccl_matches_virtual(world):
    lesson = get_lesson("collectives")
    report = run_real(lesson.target, world, RealOptions("nccl", lesson.seed, lesson.keep_values))
    assert report.match, report.differences


def test_every_op_on_nccl():
    if GPUS < 2:
        pytest.skip("needs two GPUs")
    from helpers_real import every_op
    report = run_real(every_op, min(GPUS, 4), RealOptions("nccl", keep_values=16))
    assert report.match, report.differences
