"""The trainer's LR schedules are transformers' own, step for step, without importing transformers' trainer (and
with it peft and bitsandbytes) in every rank."""

import subprocess
import sys

import pytest
from conftest import import_when_run

from scaletrain.engine.request.options import LR_SCHEDULES
from scaletrain.trainer.schedules import SCHEDULES, lr_scheduler

_libs = import_when_run("torch")


def _lrs(scheduler, optimizer, steps):
    out = []
    for _ in range(steps):
        out.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    return out


@pytest.mark.parametrize("name", sorted(LR_SCHEDULES))
@pytest.mark.parametrize("warmup,total", [(0, 1), (0, 10), (1, 1), (3, 10), (10, 10), (12, 10), (7, 200), (0, 37)])
def test_each_schedule_is_transformers_own(name, warmup, total):
    from transformers import get_scheduler

    def opt():
        return torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=3e-4)

    mine, theirs = opt(), opt()
    ours = _lrs(lr_scheduler(name, mine, warmup, total), mine, total + 5)
    ref = _lrs(get_scheduler(LR_SCHEDULES[name], theirs, num_warmup_steps=warmup, num_training_steps=total),
               theirs, total + 5)
    assert ours == pytest.approx(ref, abs=1e-15, rel=1e-12)


def test_every_accepted_schedule_has_one():
    assert set(SCHEDULES) == set(LR_SCHEDULES)


def test_a_schedule_resumes_from_its_state():
    """A checkpoint's scheduler state (accelerate saves LambdaLR.state_dict) restores the same position."""
    def opt():
        return torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)

    a = opt()
    first = lr_scheduler("cosine", a, 2, 10)
    _lrs(first, a, 4)
    b = opt()
    second = lr_scheduler("cosine", b, 2, 10)
    second.load_state_dict(first.state_dict())
    b.param_groups[0]["lr"] = a.param_groups[0]["lr"]
    assert _lrs(second, b, 3) == _lrs(first, a, 3)


@pytest.mark.long
def test_the_trainer_does_not_import_peft_for_a_full_run():
    """The modules a full fine-tuning rank imports (train's own imports and the scheduler) leave peft and
    bitsandbytes unimported: they cost every rank seconds of start-up."""
    code = ("import sys, torch; import scaletrain.trainer.train as t; from scaletrain.trainer.schedules import "
            "lr_scheduler; lr_scheduler('linear', torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1), 1, 2);"
            " print(sorted(m for m in ('peft', 'bitsandbytes', 'transformers.trainer_utils') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, stdin=subprocess.DEVNULL,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
