"""The host's CPU over a real run (:mod:`wansim.real.host_load`): the counters' parsing, the
arithmetic by hand, and a process that burns a known CPU time is counted as the run's own."""

from __future__ import annotations

import multiprocessing
import os
import sys
import time

import pytest

from wansim.real.host_load import (
    HostLoad,
    Snapshot,
    cpu_states,
    host_load,
    measured,
    process_jiffies,
    role,
    run_delay_ns,
    snapshot,
)

STAT = """cpu  1000 10 300 5000 40 0 6 50 0 0
cpu0 500 5 150 2500 20 0 3 25 0 0
cpu1 500 5 150 2500 20 0 3 25 0 0
intr 12345
"""


def test_the_summed_cpu_line_is_read_and_a_short_one_refused():
    assert cpu_states(STAT) == (1000, 10, 300, 5000, 40, 0, 6, 50, 0, 0)
    with pytest.raises(ValueError, match="expected >= 8"):
        cpu_states("cpu  1 2 3 4\n")
    with pytest.raises(ValueError, match="no summed cpu line"):
        cpu_states("cpu0 1 2 3 4 5 6 7 8\n")


def test_a_command_name_with_spaces_and_parentheses_does_not_shift_the_fields():
    fields = ["S", "1", "2", "3", "4", "5", "6", "7", "8", "9", "10", "123", "45", "0", "0"]
    text = "4242 (python (stage 1)) " + " ".join(fields) + " 20 1 0 99 1000\n"
    assert process_jiffies(text) == 123 + 45


def test_busy_own_others_and_steal_by_hand():
    """Two CPUs, 2 s: 400 jiffies in all at 100 per second; 100 idle + 20 iowait leave 280
    busy = 1.4 cores; the run's two processes took 60 + 40 jiffies = 1 s of CPU over 2 s =
    0.5 cores; others 0.9; steal 20 of 400 = 5%. A pid that has exited is not counted."""
    if os.sysconf("SC_CLK_TCK") != 100:
        pytest.skip("the hand-worked numbers take 100 jiffies per second")
    before = Snapshot(10.0, (1000, 0, 0, 1000, 0, 0, 0, 0), {1: 10, 2: 0, 3: 5})
    after = Snapshot(12.0, (1250, 0, 10, 1100, 20, 0, 0, 20), {1: 70, 2: 40, 3: 0})
    load = host_load(before, after, cpus=2)
    assert load == HostLoad(2.0, pytest.approx(1.4), pytest.approx(0.5), pytest.approx(0.9), 0.05)
    assert load.as_dict()["others_cores"] == 0.9


def test_nothing_is_recorded_without_counters_or_time():
    s = Snapshot(1.0, (1, 0, 0, 1, 0, 0, 0, 0), {})
    assert host_load(None, s) is None and host_load(s, None) is None
    assert host_load(s, s) is None  # no time passed


def _burn(cpu_s: float) -> None:
    end = time.process_time() + cpu_s
    while time.process_time() < end:
        pass


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc is Linux's")
def test_a_process_that_burns_cpu_is_counted_as_the_runs_own():
    """A child spins for 0.4 s of CPU time (CPU time, not wall: however loaded the host, it
    has used 0.4 s when it exits); read just before it exits, at least 0.3 s are counted as
    the run's own (the kernel's tick rounds), never more than the window's wall time."""
    ctx = multiprocessing.get_context("fork")
    ready, done = ctx.Event(), ctx.Event()

    def child():
        ready.set()
        _burn(0.4)
        done.set()
        time.sleep(30)  # stays alive to be read; killed below

    proc = ctx.Process(target=child, daemon=True)
    proc.start()
    try:
        assert ready.wait(30)
        before = snapshot([proc.pid])
        assert done.wait(60)
        after = snapshot([proc.pid])
    finally:
        proc.kill()
        proc.join()
    load = host_load(before, after)
    own_s = load.own_cores * load.seconds
    assert 0.3 <= own_s <= load.seconds + 0.02, load
    assert 0.0 <= load.steal_fraction <= 1.0 and load.others_cores >= 0.0
    assert load.busy_cores <= (os.cpu_count() or 1) + 1e-9


def test_the_runs_own_cores_are_split_by_role_by_hand():
    """Named pids: ``stage0`` and ``stage1`` are one role, ``link0`` another; 100 jiffies a
    second over 2 s: stages (60 + 40) / 200 = 0.5 cores, the link 20 / 200 = 0.1."""
    if os.sysconf("SC_CLK_TCK") != 100:
        pytest.skip("the hand-worked numbers take 100 jiffies per second")
    before = Snapshot(10.0, (1000, 0, 0, 1000, 0, 0, 0, 0), {1: 10, 2: 0, 3: 5})
    after = Snapshot(12.0, (1250, 0, 10, 1100, 20, 0, 0, 20), {1: 70, 2: 40, 3: 25})
    roles = {1: role("stage0"), 2: role("stage1"), 3: role("link0")}
    load = host_load(before, after, cpus=2, roles=roles)
    assert dict(load.own_cores_by_role) == {
        "link": pytest.approx(0.1),
        "stage": pytest.approx(0.5),
    }
    assert load.own_cores == pytest.approx(0.6)
    assert load.as_dict()["own_cores_by_role"] == {"link": 0.1, "stage": 0.5}
    assert "own_cores_by_role" not in host_load(before, after, cpus=2).as_dict()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc is Linux's")
def test_measured_names_the_calling_process_the_coordinator():
    """The caller burns 0.2 s of CPU inside ``work``: counted under ``coordinator``; a named
    pid that does nothing counts ~0 under its role."""
    _, load = measured({"link0": os.getppid()}, lambda: _burn(0.2))
    by_role = dict(load.own_cores_by_role)
    assert set(by_role) == {"coordinator", "link"}
    assert by_role["coordinator"] * load.seconds >= 0.15, load
    assert by_role["coordinator"] + by_role["link"] == pytest.approx(load.own_cores)


def test_a_process_wait_for_a_core_is_summed_over_its_threads():
    """schedstat is ``cpu_ns run_delay_ns timeslices``: two threads waited 300 and 1,200 ns;
    a short or empty text is skipped; nothing readable is None."""
    assert run_delay_ns(["5000 300 2\n", "9000 1200 7\n", "", "17\n"]) == 1500
    assert run_delay_ns(["", "1\n"]) is None


def test_each_named_process_wait_by_hand():
    """Named pids' run delay over the window, in ms (1.5e6 ns -> 1.5 ms), by name; a pid
    whose counter could not be read at either end is left out, as is everything unnamed."""
    before = Snapshot(
        10.0, (1000, 0, 0, 1000, 0, 0, 0, 0), {1: 0, 2: 0, 3: 0}, {1: 0, 2: 7, 3: None}
    )
    after = Snapshot(
        12.0, (1250, 0, 0, 1150, 0, 0, 0, 0), {1: 0, 2: 0, 3: 0}, {1: 1_500_000, 2: 7, 3: 9}
    )
    load = host_load(before, after, cpus=2, names={1: "stage1", 2: "stage0", 3: "link0"})
    assert load.wait_ms_by_process == (("stage0", 0.0), ("stage1", 1.5))
    assert load.as_dict()["wait_ms_by_process"] == {"stage0": 0.0, "stage1": 1.5}
    assert "wait_ms_by_process" not in host_load(before, after, cpus=2).as_dict()


@pytest.mark.skipif(
    not os.path.exists("/proc/self/schedstat"), reason="the kernel keeps no schedstats"
)
def test_measured_records_each_named_process_wait():
    """Two spinning children on however many cores, named: each one's wait is read at both
    ends (>= 0 ms, at most the window's wall time per thread)."""
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_burn, args=(0.3,), daemon=True) for _ in range(2)]
    for p in procs:
        p.start()
    try:
        _, load = measured(
            {f"stage{i}": p.pid for i, p in enumerate(procs)}, lambda: time.sleep(0.2)
        )
    finally:
        for p in procs:
            p.kill()
            p.join()
    waits = dict(load.wait_ms_by_process)
    assert set(waits) == {"stage0", "stage1"}
    assert all(0.0 <= w <= load.seconds * 1e3 + 1.0 for w in waits.values()), waits
