"""The assign_cores pass: each task's core, fixed to the dispatcher's choice on the timing model."""
import re

import numpy as np
import pytest

import pypto
from pypto import Program
from pypto.ir.pto_text import PTOSyntaxError
from pypto.sim import simulate

from common import matmul, matmul_bias_gelu, softmax

T, F16, F32 = pypto.Tensor, pypto.DT_FP16, pypto.DT_FP32
OFF = {"core_assignment": False}

KERNELS = {
    "softmax on teach": (softmax, (T([256, 1024], F32),) * 2, "teach"),
    "matmul+bias+gelu on a2a3": (matmul_bias_gelu, (T([1024, 1024], F16), T([1024, 1024], F16), T([1024], F16),
                                                    T([1024, 1024], F16)), "a2a3"),
}


def _timing(program, machine, engine="python"):
    return simulate(program, machine=machine, mode="timing", trace=False, progress=False, engine=engine)


@pytest.mark.parametrize("name", list(KERNELS))
def test_pinned_tasks_keep_the_dispatchers_schedule(name):
    kernel, specs, machine = KERNELS[name]
    pinned = kernel.compile(*specs, machine=machine)
    free = kernel.compile(*specs, machine=machine, options=OFF)
    assert all(t.core is not None for t in pinned.program.tasks)
    assert all(t.core is None for t in free.program.tasks) and " core=" not in free.program.text()
    runs = {engine: _timing(pinned.program, machine, engine) for engine in ("python", "compiled")}
    dynamic = _timing(free.program, machine)
    assert runs["python"].cycles == runs["compiled"].cycles == dynamic.cycles
    assert runs["python"].task_times == dynamic.task_times


def test_paired_epilogues_sit_on_their_cube_tasks_aic():
    kernel, specs, machine = KERNELS["matmul+bias+gelu on a2a3"]
    tasks = kernel.compile(*specs, machine=machine).program.tasks
    paired = [t for t in tasks if t.pair]
    assert paired and all(t.core == 2 * tasks[t.pair[0]].core + t.pair[1] for t in paired)


def test_cores_print_parse_and_can_be_edited():
    ck = matmul.compile(T([256, 512], F16), T([512, 512], F16), T([256, 512], F16), machine="teach",
                        snapshots=True)
    text = ck.program.text()
    assert [t.core for t in ck.program.tasks] == [0, 1]
    assert "+  launch task 1 on AIC1 after []" in ck.diff("assign_cores").text
    assert ".task 1 AIC group=0 deps=[] core=1" in text
    assert Program.parse(text).text() == text
    both = _timing(ck.program, "teach")
    # both tasks on AIC0: the second waits for the first
    serial = _timing(Program.parse(text.replace("core=1", "core=0")), "teach")
    assert serial.cycles > 1.8 * both.cycles
    assert {name for name, _, _ in serial.task_times.values()} == {"AIC0"}


def test_a_core_the_machine_lacks_is_an_error():
    ck = matmul.compile(T([256, 512], F16), T([512, 512], F16), T([256, 512], F16), machine="teach")
    bad = Program.parse(ck.program.text().replace("core=1", "core=5"))
    with pytest.raises(PTOSyntaxError, match=re.escape("task 1 is assigned to AIC5, which machine teach does not have")):
        _timing(bad, "teach")
    _timing(bad, "a2a3")                   # 24 AIC cores: fine there


def test_a_paired_task_off_its_aiv_is_an_error(rng):
    a, b = rng.standard_normal((256, 128)).astype(np.float16), rng.standard_normal((128, 256)).astype(np.float16)
    bias, c = rng.standard_normal(256).astype(np.float16), np.zeros((256, 256), np.float16)
    ck = matmul_bias_gelu.compile(a, b, bias, c, machine="teach", VM=32, VN=64)
    text = ck.program.text()
    t = next(t for t in ck.program.tasks if t.pair)
    head = re.search(rf"^\.task {t.id} .*$", text, re.M).group(0)
    wrong = 2 * ck.program.tasks[t.pair[0]].core + 1 - t.pair[1]
    bad = Program.parse(text.replace(head, head.replace(f"core={t.core}", f"core={wrong}")))
    with pytest.raises(PTOSyntaxError, match=f"so it runs on AIV{t.core}"):
        _timing(bad, "teach")
