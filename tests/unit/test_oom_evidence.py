"""A SIGKILL where the kernel log cannot be read (a user without root): the OOM counters of the
machine and of the job's memory cgroup, read at the attempt's start and its death, decide it; where
nothing can be read both readings stand, with how to tell them apart. On the shell's real 'Killed'
line and exit status 137."""

from __future__ import annotations

from trainguard.diagnosis.evidence import ExitStatus
from trainguard.diagnosis.oom_evidence import OomDeltas
from trainguard.postmortem import LogSource, investigate
from trainguard.probes import oom_counters

LOG = b"epoch 3 step 1200 loss 0.71\nepoch 3 step 1210 loss 0.70\ntrain.sh: line 4: 31337 Killed                  python train.py\n"
SIGKILL = ExitStatus(signal=9)


def judged(deltas: OomDeltas | None):
    return investigate([LogSource(None, [LOG])], exit_status=SIGKILL, oom_deltas=deltas).diagnosis


def test_an_oom_kill_counted_in_the_job_s_cgroup_is_host_oom_with_certainty():
    diagnosis = judged(OomDeltas(system=1, cgroup=1, cgroup_file="/sys/fs/cgroup/memory/memory.oom_control"))
    assert diagnosis.cause == "host_oom" and diagnosis.confidence >= 0.99
    assert any("counted 1 OOM kill" in o.text for o in diagnosis.evidence)


def test_no_oom_kill_in_the_job_s_cgroup_makes_a_sigkill_a_kill_from_outside():
    diagnosis = judged(OomDeltas(system=3, cgroup=0, cgroup_file="/sys/fs/cgroup/user.slice/memory.events"))
    assert diagnosis.cause == "killed"
    assert any(o.note and "no OOM kill" in o.note.en for o in diagnosis.evidence)


def test_no_oom_kill_on_the_machine_makes_a_sigkill_a_kill_from_outside():
    assert judged(OomDeltas(system=0, cgroup=None)).cause == "killed"


def test_nothing_readable_gives_no_confident_wrong_cause_and_says_how_to_decide():
    diagnosis = judged(OomDeltas(system=None, cgroup=None))
    readings = {diagnosis.cause: diagnosis.confidence, **dict(diagnosis.alternatives)}
    assert {"host_oom", "killed"} <= set(readings), readings
    assert diagnosis.confidence < 0.7
    assert any(o.note and "dmesg" in o.note.en for o in diagnosis.evidence)


def test_an_oom_kill_elsewhere_on_the_machine_leans_to_host_oom_without_deciding():
    diagnosis = judged(OomDeltas(system=2, cgroup=None))
    assert diagnosis.cause == "host_oom" and diagnosis.confidence < 0.99


def test_a_log_alone_is_judged_as_before():
    assert judged(None).cause == "host_oom"


def test_the_counters_of_this_machine_are_read_without_root():
    counts = oom_counters.read()
    assert isinstance(counts.system, int)  # /proc/vmstat is world-readable
    if counts.cgroup_path is not None:
        assert isinstance(counts.cgroup, int)
