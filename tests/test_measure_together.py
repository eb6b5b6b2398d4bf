"""Several proven programs timed in one fresh training process (``jaxfit tune --one-process``):
real pins, a real script, the real start-up hook (CPU)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import FIXTURES, REPO

from jaxfit._probe.jaxfit_trust import signing_key_path

pytestmark = pytest.mark.slow  # real subprocesses and compiles

MINI = str(FIXTURES / "mini_train.py")
SMALL = ["--device-memory", "64MiB", "--mem-fraction", "0.5"]


def _pin(run_cli, tmp_path: Path, name: str, *flags: str, batch: int = 16) -> str:
    """The pin of mini_train.py's step at ``batch`` with ``flags``, proved by ``jaxfit fit``."""
    proc = run_cli(
        "fit", "--script", *SMALL, "--min-batch", str(batch), "--max-batch", str(batch), "--quiet", "--json", name,
        "--", sys.executable, MINI, "--steps", "1", *flags,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads((tmp_path / name).read_text())["pin"]["path"]


def signing_key(pin_path: str) -> str:
    key = signing_key_path(pin_path)
    assert key, f"no key of this user's signed {pin_path}"
    return key


def test_the_hook_loads_each_proven_program_in_turn_and_refuses_one_of_other_arguments(tmp_path, run_cli):
    """mini_train.py at learning rate 0.1 runs its pin, then the pin proved at learning rate 0 (the
    same arguments, another program: the weights stop changing, which shows it really runs), then
    is offered a pin of batch 8, which takes other arguments: refused with why, nothing breaks."""
    learning = _pin(run_cli, tmp_path, "a.json")
    frozen = _pin(run_cli, tmp_path, "b.json", "--lr", "0")
    other = _pin(run_cli, tmp_path, "c.json", batch=8)
    programs = tmp_path / "programs.json"
    programs.write_text(json.dumps([frozen, other]))
    env = {k: v for k, v in os.environ.items() if not k.startswith("JAXFIT_")}
    env.update(
        PYTHONPATH=str(REPO / "jaxfit" / "_probe"),
        JAXFIT_PIN_KEY=signing_key(learning),  # as jaxfit's run environment names it: the test's own cache
        JAXFIT_PIN=learning,
        JAXFIT_PIN_REPORT=str(tmp_path / "pin.json"),
        JAXFIT_MEASURE="1,2",
        JAXFIT_MEASURE_REPORT=str(tmp_path / "measure.json"),
        JAXFIT_MEASURE_STEP_NAME="train_step",
        JAXFIT_MEASURE_PROGRAMS=str(programs),
        XLA_PYTHON_CLIENT_MEM_FRACTION="0.5",
    )
    proc = subprocess.run(
        [sys.executable, MINI, "--steps", "20", "--print-norm"],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    norms = [float(line.split()[2]) for line in proc.stdout.splitlines() if line.startswith("norm ")]
    # 3 calls of the learning program (1 warm-up, 2 timed) change the weights; the frozen one's 3 do not
    # (the last call ends the process before the script prints)
    assert len(norms) == 5, proc.stdout
    assert len(set(norms[:3])) == 3 and norms[2] == norms[3] == norms[4], norms
    report = json.loads((tmp_path / "measure.json").read_text())
    first, second, refused = report["programs"]
    assert len(first["step_seconds"]) == 2 and len(second["step_seconds"]) == 2 and second["pin"] == frozen
    assert refused["pin"] == other and "other arguments" in refused["error"]
    assert "now runs another proven program" in proc.stderr
    pinned = json.loads((tmp_path / "pin.json").read_text())
    assert pinned["program_pinned"] is True and [d["program_pinned"] for d in pinned["shapes"]] == [True, True]


def test_a_process_on_standby_waits_at_its_first_step_then_measures_the_pin_it_is_given(tmp_path, run_cli):
    """``$JAXFIT_MEASURE_WAIT``: mini_train.py starts before its pin exists and waits at its first
    step call (no step runs: no report); the orders name the pin and it runs it, pinned, timed. A
    second process told to stop ends with code 0, its step never run."""
    pin = _pin(run_cli, tmp_path, "a.json")
    env = {k: v for k, v in os.environ.items() if not k.startswith("JAXFIT_")}
    env.update(
        PYTHONPATH=str(REPO / "jaxfit" / "_probe"),
        JAXFIT_PIN_KEY=signing_key(pin),
        JAXFIT_MEASURE="1,2",
        JAXFIT_MEASURE_STEP_NAME="train_step",
        XLA_PYTHON_CLIENT_MEM_FRACTION="0.5",
    )
    procs = {}
    for name in ("go", "stop"):
        folder = tmp_path / name
        folder.mkdir()
        env.update(
            JAXFIT_MEASURE_WAIT=str(folder / "orders.json"),
            JAXFIT_MEASURE_REPORT=str(folder / "measure.json"),
            JAXFIT_PIN_REPORT=str(folder / "pin.json"),
        )
        with open(folder / "out.txt", "w") as out, open(folder / "err.txt", "w") as err:
            procs[name] = subprocess.Popen(
                [sys.executable, MINI, "--steps", "20", "--print-norm"], env=dict(env), cwd=tmp_path, stdout=out,
                stderr=err,
            )  # fmt: skip

    def said(name: str) -> str:
        return (tmp_path / name / "err.txt").read_text()

    try:
        deadline = time.monotonic() + 120
        while not all("waiting for orders" in said(n) for n in procs):  # both reached their first step call
            assert all(p.poll() is None for p in procs.values()), [said(n)[-2000:] for n in procs]
            assert time.monotonic() < deadline, [said(n)[-2000:] for n in procs]
            time.sleep(0.2)
        time.sleep(1)
        assert all(p.poll() is None for p in procs.values())  # still waiting: no step ran, no report
        assert not (tmp_path / "go" / "measure.json").exists()
        (tmp_path / "go" / "orders.json").write_text(json.dumps({"env": {"JAXFIT_PIN": pin}}))
        (tmp_path / "stop" / "orders.json").write_text(json.dumps({"stop": True, "why": "not needed"}))
        assert procs["go"].wait(timeout=120) == 0, said("go")[-3000:]
        assert "has its orders" in said("go") and "runs the program jaxfit proved" in said("go")
        report = json.loads((tmp_path / "go" / "measure.json").read_text())
        assert len(report["step_seconds"]) == 2
        assert json.loads((tmp_path / "go" / "pin.json").read_text())["program_pinned"] is True
        assert procs["stop"].wait(timeout=60) == 0 and "ends before its first step: not needed" in said("stop")
        out = (tmp_path / "stop" / "out.txt").read_text()
        assert not [line for line in out.splitlines() if line.startswith("norm ")], out  # no step ran
        assert not (tmp_path / "stop" / "measure.json").exists()
    finally:
        for proc in procs.values():
            proc.kill()


def test_a_script_that_refuses_to_start_beside_a_standby_makes_it_stand_down(tmp_path, run_cli):
    """train.py without --overwrite refuses to start over a checkpoint folder that exists, as openpi
    does. One probe at a time: the standby starts after the search, beside the proof's probe, and
    whichever makes the folder first, the other refuses. Either the proof's probe refused (then
    the standby stands down, its folder is taken away and the proof runs again, alone) or the
    standby did (then the row is measured in a process started for it). The row is measured at
    2 x 2, not called unfit, and standby is off for the rest of the tune."""
    command = [
        "--", sys.executable, str(REPO / "scripts" / "train.py"), "debug", "--exp-name=ts",
        f"--checkpoint-base-dir={tmp_path / 'ck'}", "--no-wandb-enabled",
    ]  # fmt: skip
    args = ["tune", "--script", "--global-batch", "4", "--micro-batches", "1", "--max-batch", "2", "--device-memory",
            "1GiB", "--mem-fraction", "0.3", "--warmup", "1", "--steps", "2", "--input-steps", "0", "--no-cache"]  # fmt: skip
    proc = run_cli(*args, "--json", "t.json", *command)
    assert proc.returncode == 0, proc.stderr[-3000:]
    said = " ".join(proc.stderr.split())
    assert "starts up on standby" in said and "standby is off for the rest of the tune" in said, said[-3000:]
    (row,) = json.loads((tmp_path / "t.json").read_text())["rows"]
    assert row["status"] == "measured" and (row["micro_batch"], row["accum_steps"]) == (2, 2), row
    assert row["standby_seconds"] is None  # measured in a process started for it
    assert not (tmp_path / "ck" / "debug" / "ts").exists()  # nothing of the tune's runs is left


def test_a_tune_times_a_settings_accumulations_in_one_process(tmp_path, run_cli, monkeypatch):
    """train.py debug, global batch 4 at 2 x 2 and 1 x 4: both rows come from one fresh process
    (measured_together 2), each with its own times. With --parallel 2 both settings' searches ran
    side by side, and so did the two proofs of remat none (their probes overlap in time). The
    script's processes shared the tune's JAX compilation cache (every compile counts here: a
    CPU's init compiles in well under the 1 s that JAX caches by default)."""
    monkeypatch.delenv("JAX_COMPILATION_CACHE_DIR", raising=False)
    monkeypatch.setenv("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
    command = [
        "--", sys.executable, str(REPO / "scripts" / "train.py"), "debug", "--exp-name=tq",
        f"--checkpoint-base-dir={tmp_path / 'ck'}", "--no-wandb-enabled", "--overwrite",
    ]  # fmt: skip
    # (--overwrite: one process runs both programs' steps, 12 loop iterations with the input's,
    # past debug's save interval of 10: its checkpoint holds data, which jaxfit never deletes)
    args = ["tune", "--script", "--global-batch", "4", "--micro-batches", "2", "--max-batch", "2", "--device-memory",
            "1GiB", "--mem-fraction", "0.3", "--warmup", "1", "--steps", "3", "--no-cache", "--parallel", "2",
            "--axis=--remat=none,full"]  # fmt: skip
    proc = run_cli(*args, "--json", "t.json", *command)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads((tmp_path / "t.json").read_text())
    rows = [r for r in result["rows"] if r["status"] == "measured"]
    assert sorted((r["micro_batch"], r["accum_steps"]) for r in rows) == [(1, 4), (2, 2)]
    assert all(r["setting"] == "--remat=none" for r in rows)
    first, second = sorted(rows, key=lambda r: r["prove_started_at"])
    assert second["prove_started_at"] < first["prove_started_at"] + first["prove_seconds"], rows  # side by side
    # remat full: its twin fits micro-batch 2, the largest asked for (--max-batch 2): nothing above it
    assert [r["status"] for r in result["rows"] if r["setting"] == "--remat=full"] == ["cannot win"]
    assert result["phase_seconds"]["search"] > 0 and result["phase_seconds"]["prove"] > 0
    assert all(r["measured_together"] == 2 and r["measured_in"] == "process" for r in rows), rows
    assert rows[0]["step_seconds"] != rows[1]["step_seconds"]
    said = " ".join(proc.stderr.split())  # the progress, wrapped
    assert "in one process" in said
    # the process that measured them started on standby as soon as the search answered (2 x 2, the
    # first proved), and waited beside the proofs
    assert "--remat=none at 2 x 2 starts up on standby" in said, said[-3000:]
    assert all(r["standby_seconds"] > 0 for r in rows), rows
    assert result["shared_cache_entries"] > 0


def test_parallel_probes_that_cannot_start_side_by_side_are_searched_again_alone(tmp_path, run_cli):
    """--parallel 2 over a script that refuses to start beside itself (a lock, as openpi refuses its
    own checkpoint folder): one setting's search fails beside the other's and is searched again
    alone; both settings are measured, nothing is called out of memory."""
    shaped = str(FIXTURES / "shaped_train.py")
    proc = run_cli(
        "tune", "--script", "--axis=--input-seconds=0,0.01", "--max-batch", "8", *SMALL, "--warmup", "1",
        "--steps", "2", "--batch-flag", "--bs", "--parallel", "2", "--no-cache", "--json", "t.json",
        "--", sys.executable, shaped, "--steps", "30", "--startup-seconds", "1", "--exclusive", str(tmp_path / "lock"),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    said = " ".join(proc.stderr.split())
    assert "its search failed beside the others" in said and "searched again alone" in said, said[-3000:]
    rows = json.loads((tmp_path / "t.json").read_text())["rows"]
    assert sorted(r["status"] for r in rows) == ["measured", "measured"], rows


def test_an_inline_tune_proves_every_setting_in_one_wave_and_confirms_the_fastest_fresh(tmp_path, run_cli):
    """--measure inline --parallel 2 over two settings of train.py debug (float32, bfloat16):
    their searches, then their proofs, run side by side (one wave: the second setting's proof
    starts before the first's ends), each proof timed in its probe, one timing at a time
    (:mod:`jaxfit.fit.gpu_turns`). Then the fastest probe row runs in a fresh process, and the
    other only when its calibrated estimate could beat it."""
    command = [
        "--", sys.executable, str(REPO / "scripts" / "train.py"), "debug", "--exp-name=tw",
        f"--checkpoint-base-dir={tmp_path / 'ck'}", "--no-wandb-enabled", "--overwrite",
    ]  # fmt: skip
    args = ["tune", "--script", "--global-batch", "4", "--micro-batches", "1", "--max-batch", "2", "--device-memory",
            "1GiB", "--mem-fraction", "0.3", "--warmup", "1", "--steps", "3", "--no-cache", "--parallel", "2",
            "--measure", "inline", "--axis=--precision=float32,bfloat16"]  # fmt: skip
    proc = run_cli(*args, "--json", "t.json", *command)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads((tmp_path / "t.json").read_text())
    rows = result["rows"]
    assert sorted(r["setting"] for r in rows) == ["--precision=bfloat16", "--precision=float32"], rows
    assert all(r["status"] == "measured" and (r["micro_batch"], r["accum_steps"]) == (2, 2) for r in rows), rows
    first, second = sorted(rows, key=lambda r: r["prove_started_at"])
    assert second["prove_started_at"] < first["prove_started_at"] + first["prove_seconds"], rows  # one wave
    assert all(r["timing_seconds"] for r in rows), rows  # each timed in its probe
    fresh = [r for r in rows if r["measured_in"] == "process"]
    fastest = max(rows, key=lambda r: r["inline_samples_per_second"] or r["samples_per_second"])
    assert fastest in fresh and len(fresh) in (1, 2), rows
    assert result["best"]["measured_in"] == "process"
    assert all(r["standby_seconds"] for r in fresh), rows  # each started on standby beside the proofs
