"""The probe against what real training scripts do (the failing shapes met on the real openpi).

``tests/fixtures/shaped_train.py`` reproduces each shape with one flag: data-loader workers
(spawned and forked), a run-time type-checked train state and batch (jaxtyping + beartype, as
openpi's ``@at.typecheck``), JAX's persistent compilation cache turned on by the script, a step
not named ``train_step``, and state written before the first step.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import FIXTURES, REPO, error_line, processes_with

from jaxfit.cli.output import ProgressPrinter
from jaxfit.fit.compiler import CompileOutcome
from jaxfit.fit.memory import MemoryReport

pytestmark = pytest.mark.slow  # real subprocesses and compiles

SHAPED = str(FIXTURES / "shaped_train.py")
TRAIN = str(REPO / "scripts" / "train.py")
SMALL = ["--device-memory", "64MiB", "--mem-fraction", "0.5", "--max-batch", "256"]


def _fit(run_cli, tmp_path: Path, *flags: str, args: tuple[str, ...] = ()) -> dict:
    proc = run_cli("fit", "--script", *SMALL, *args, "--json", "fit.json", "--", sys.executable, SHAPED, *flags)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads((tmp_path / "fit.json").read_text())


def _start_up_stand_in(runs_out_when: str, allocation: str = "7.98GiB", record: Path | None = None) -> str:
    """A script (for ``python -c``) that stands in for a GPU allocator: when ``runs_out_when`` (a
    Python expression) holds, its start-up prints XLA's BFC out-of-memory line for ``allocation``
    and exits, as openpi's init did on an H100 under a 24 GiB card's limit; else it runs
    ``mini_train.py`` with its arguments. ``record``: each start appends its
    ``XLA_PYTHON_CLIENT_PREALLOCATE`` there."""
    mini = str(FIXTURES / "mini_train.py")
    noted = (
        f"open({str(record)!r}, 'a').write(os.environ.get('XLA_PYTHON_CLIENT_PREALLOCATE', 'unset') + chr(10))\n"
        if record
        else ""
    )
    return (
        "import os, runpy, sys\n"
        f"{noted}"
        f"if {runs_out_when}:\n"
        "    import jax\n"
        "    jax.jit(lambda k: k + 1)(1)\n"
        f"    print('jax.errors.JaxRuntimeError: RESOURCE_EXHAUSTED: Out of memory while trying to allocate {allocation} "
        "with allocator GPU_0_bfc on device 0.', file=sys.stderr)\n"
        "    sys.exit(1)\n"
        f"sys.argv = [{mini!r}] + sys.argv[1:]\n"
        f"runpy.run_path({mini!r}, run_name='__main__')\n"
    )


@pytest.mark.parametrize("start", ["spawn", "fork"])
def test_data_loader_workers_leave_the_probe_alone(tmp_path, run_cli, start):
    """Workers inherit the start-up hook (PYTHONPATH) but not its descriptors: they must stay inert."""
    fit = _fit(run_cli, tmp_path, "--workers", start)
    assert fit["outcome"] == "max" and fit["workload"]["name"] == "train_step"


def test_a_type_checked_state_and_step_are_probed_without_settings(tmp_path, run_cli):
    fit = _fit(run_cli, tmp_path, "--typecheck")
    plain = json.loads(json.dumps(_fit(run_cli, tmp_path)))
    assert [c["peak_bytes"] for c in fit["candidates"]] == [c["peak_bytes"] for c in plain["candidates"]]


def test_a_type_checked_state_is_probed_in_an_old_jax(tmp_path, run_cli, old_jax_python):
    """jax 0.5 rebuilds the argument pytrees while lowering (openpi's TypeCheckError on TrainState)."""
    proc = run_cli("fit", "--script", *SMALL, "--json", "fit.json", "--", old_jax_python, SHAPED, "--typecheck")
    assert proc.returncode == 0, proc.stderr[-3000:]
    fit = json.loads((tmp_path / "fit.json").read_text())
    assert fit["device"]["jax_version"] == "0.5.0" and fit["pin"] is not None


def test_a_type_checked_step_runs_its_pinned_program(tmp_path, run_cli):
    proc = run_cli("run", *SMALL, "--json", "plan.json", "--", sys.executable, SHAPED, "--typecheck", "--steps", "2")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads((tmp_path / "plan.json").read_text())["program_pinned"] is True


def test_a_compile_error_is_reported_as_what_it_is_in_the_progress_line():
    lines: list[str] = []

    class Console:
        def print(self, text, **_kwargs):
            lines.append(str(text))

    printer = ProgressPrinter(Console())  # type: ignore[arg-type]
    printer("compiled", {"outcome": CompileOutcome(3, None, 1.0, error="TypeCheckError: bad leaf\nmore"), "budget": 1})
    printer("compiled", {"outcome": CompileOutcome(4, None, 1.0, oom=True, error="RESOURCE_EXHAUSTED"), "budget": 1})
    printer("compiled", {"outcome": CompileOutcome(5, MemoryReport(1, 1, 0, 1), 1.0), "budget": 10})
    assert "batch 3: failed to compile: TypeCheckError: bad leaf" in lines[0] and "memory" not in lines[0]
    assert "batch 4: out of memory while compiling" in lines[1]
    assert "batch 5: peak 3 B fits" in lines[2]


def test_peaks_do_not_depend_on_the_scripts_persistent_compilation_cache(tmp_path, run_cli):
    """The script turns JAX's persistent cache on: the probe neither reads nor fills it."""
    cache = tmp_path / "jax-cache"
    first = _fit(run_cli, tmp_path, "--cache-dir", str(cache), args=("--no-cache",))
    assert not [p for p in cache.glob("*") if "train_step" in p.name], sorted(os.listdir(cache))
    again = _fit(run_cli, tmp_path, "--cache-dir", str(cache), args=("--no-cache",))
    assert [c["peak_bytes"] for c in again["candidates"]] == [c["peak_bytes"] for c in first["candidates"]]
    assert all(c["alias_bytes"] > 0 for c in again["candidates"])  # the donated state, read from the program


def test_run_is_offline_without_credentials(tmp_path, run_cli, monkeypatch):
    """No WANDB_MODE, no API key, no ~/.netrc: the script's wandb run is offline, not an error."""
    for var in ("WANDB_MODE", "WANDB_API_KEY", "WANDB_SILENT"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    proc = run_cli(
        "run",
        "--batch-size",
        "8",
        "--mem-fraction",
        "0.3",
        "--",
        sys.executable,
        TRAIN,
        "debug",
        "--exp-name=offline",
        f"--checkpoint-base-dir={tmp_path / 'ck'}",
        "--num-train-steps=2",
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert list((tmp_path / "wandb").glob("offline-run-*"))


def test_a_step_that_is_never_called_stops_the_script_before_it_trains(tmp_path, run_cli):
    checkpoints = tmp_path / "ck"
    proc = run_cli(
        "fit",
        "--script",
        "--step-name",
        "nosuch_step",
        *SMALL,
        "--probe-timeout",
        "120",
        "--",
        sys.executable,
        SHAPED,
        "--steps",
        "50",
        "--checkpoint-dir",
        "ck",
    )
    line = error_line(proc)
    assert "it never called the jitted function named 'nosuch_step' before" in line
    assert "was about to train with 'train_step' (a train step: it returns " in line
    assert "arrays of argument 0 updated" in line
    assert "train_step (1, train step)" in line and "--step-name train_step" in line
    assert not list(checkpoints.glob("*/1")), "the probe let the script train"
    assert not checkpoints.exists() and "removed what the probe's start-up created: ck" in line


def test_a_step_with_another_name_is_found_and_said(tmp_path, run_cli):
    proc = run_cli("fit", "--script", *SMALL, "--json", "fit.json", "--", sys.executable, SHAPED, "--step-fn", "update")
    assert proc.returncode == 0, proc.stderr[-3000:]
    said = proc.stderr.replace("\n", " ")
    assert "the probe took 'update' as the train step (found: it returns " in said
    assert "updated (computed, same shapes and dtypes)" in " ".join(said.split())
    fit = json.loads((tmp_path / "fit.json").read_text())
    assert fit["workload"]["name"] == "update" and fit["pin"]["step_name"] == "update"


def test_state_written_before_the_first_step_is_removed_or_named(tmp_path, run_cli):
    checkpoints = tmp_path / "ck"
    empty = run_cli("fit", "--script", *SMALL, "--", sys.executable, SHAPED, "--checkpoint-dir", "ck")
    assert empty.returncode == 0, empty.stderr[-2000:]
    assert "removed what the probe's start-up created: ck" in empty.stdout.replace("\n", " ")
    assert not checkpoints.exists()
    step0 = _fit(run_cli, tmp_path, "--checkpoint-dir", "ck", "--step0-checkpoint")
    assert "removed what the probe's start-up created: ck" in step0["message"], step0["message"]
    assert not checkpoints.exists()  # the probe's step-0 checkpoint, data and all
    # written by a writer no audit event tells of (a shell the script starts, as C++ writers such as
    # tensorstore write): in a folder the probe created, it goes with the folder
    unseen = _fit(run_cli, tmp_path, "--checkpoint-dir", "ck", "--step0-checkpoint", "--step0-writer", "shell")
    assert "removed what the probe's start-up created: ck" in unseen["message"], unseen["message"]
    assert not checkpoints.exists()


def test_a_step0_checkpoint_outside_the_working_folder_is_removed_and_not_restored(tmp_path, run_cli):
    """A trainer's --config.workdir: the probe's step-0 checkpoint there was restored by the real run."""
    cwd, workdir = tmp_path / "cwd", tmp_path / "workdir"
    cwd.mkdir()
    script = [sys.executable, SHAPED, "--checkpoint-dir", str(workdir), "--step0-checkpoint"]
    fit = run_cli("fit", "--script", *SMALL, "--json", str(tmp_path / "fit.json"), "--", *script, cwd=cwd)
    assert fit.returncode == 0, fit.stderr[-2000:]
    message = json.loads((tmp_path / "fit.json").read_text())["message"]
    assert f"removed what the probe's start-up created: {workdir}" in message, message
    assert not workdir.exists() and not list(cwd.iterdir())
    run = run_cli("run", *SMALL, "--", *script, "--steps", "2", cwd=cwd)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "Restoring checkpoint 0" not in run.stdout + run.stderr
    assert (workdir / "run" / "2" / "state.txt").read_text() == "step 2\n"


OPENPI = [sys.executable, SHAPED, "--openpi-checkpoints", "--exp-name", "exp"]
"""openpi with its defaults: checkpoints/<exp>/wandb_id.txt at start-up, and no start over an existing folder."""


def test_an_openpi_checkpoint_folder_is_removed_so_the_real_run_starts(tmp_path, run_cli):
    checkpoints = tmp_path / "checkpoints"
    fit = _fit(run_cli, tmp_path, *OPENPI[2:])
    assert "removed what the probe's start-up created: checkpoints" in fit["message"], fit["message"]
    assert not checkpoints.exists()
    run = run_cli("run", *SMALL, "--", *OPENPI, "--steps", "2")
    assert run.returncode == 0, run.stderr[-3000:]
    assert "FileExistsError" not in run.stderr
    assert (checkpoints / "exp" / "wandb_id.txt").exists() and (checkpoints / "exp" / "2" / "state.txt").exists()


def test_what_another_process_writes_in_the_probes_folder_is_kept_and_named(tmp_path):
    """The probe created checkpoints/exp; while it ran, another process wrote there and holds its file
    open: that file stays (a folder the probe made goes whole only when no other process is in it)."""
    folder = tmp_path / "checkpoints" / "exp"
    command = [sys.executable, "-m", "jaxfit.cli", "fit", "--script", *SMALL, "--json", "fit.json", "--"]
    proc = subprocess.Popen(
        [*command, *OPENPI, "--startup-seconds", "4"], cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    deadline = time.monotonic() + 120
    while not (folder / "wandb_id.txt").exists():
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.05)
    other_run = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; f = open(sys.argv[1], 'a'); f.write('another run\\n'); f.flush(); time.sleep(600)",
         str(folder / "other.txt")]
    )  # fmt: skip
    try:
        _out, err = proc.communicate(timeout=300)
    finally:
        other_run.kill()
        other_run.wait()
    assert proc.returncode == 0, err[-2000:]
    message = json.loads((tmp_path / "fit.json").read_text())["message"]
    other = os.path.join("checkpoints", "exp", "other.txt")
    assert f"{other} appeared with data in it and was left in place" in message, message
    assert f"removed what the probe's start-up created: {os.path.join('checkpoints', 'exp', 'wandb_id.txt')}" in message
    assert sorted(p.name for p in folder.iterdir()) == ["other.txt"]


def test_a_folder_that_existed_keeps_what_it_held(tmp_path, run_cli):
    run = tmp_path / "ck" / "run"
    (run / "old").mkdir(parents=True)
    (run / "old" / "state.txt").write_text("old\n")
    (run / "notes.txt").write_text("")
    fit = _fit(run_cli, tmp_path, "--checkpoint-dir", "ck", "--step0-checkpoint")
    assert f"removed what the probe's start-up created: {os.path.join('ck', 'run', '0')}" in fit["message"]
    assert sorted(p.name for p in run.iterdir()) == ["notes.txt", "old"]
    assert (run / "old" / "state.txt").read_text() == "old\n"


def test_the_record_follows_renames_and_removals(tmp_path):
    """An atomic checkpoint write (a temporary folder renamed), a file removed, a folder moved in."""
    record = tmp_path / "record"
    record.mkdir()
    (tmp_path / "before").mkdir()
    code = (
        "import os, shutil\n"
        "os.makedirs('out/0.tmp/d')\n"
        "open('out/0.tmp/d/a', 'w').write('x')\n"
        "os.rename('out/0.tmp', 'out/0')\n"
        "open('gone', 'w').close(); os.remove('gone')\n"
        "os.rename('before', 'out/moved')\n"
        "open('new_file', 'a').close()\n"
    )
    env = dict(os.environ, JAXFIT_PROBE_WRITES=str(record), PYTHONPATH=str(REPO / "jaxfit" / "_probe"))
    subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, check=True)
    from jaxfit._probe import jaxfit_writes

    created = {os.path.relpath(p, tmp_path): kind for p, kind in jaxfit_writes.created(str(record)).items()}
    assert created == {"out": "dir", "out/0": "dir", "out/0/d": "dir", "out/0/d/a": "file", "new_file": "file"}


def test_the_missing_step_error_lists_called_functions_before_jitted_ones(tmp_path, run_cli):
    proc = run_cli(
        "fit",
        "--script",
        "--step-name",
        "nosuch",
        "--probe-timeout",
        "15",  # the script imports jax and calls f twice in about 2 s (more on a busy 2-core runner), then sleeps
        *SMALL,
        "--",
        sys.executable,
        "-c",
        "import time, jax, jax.numpy as jnp\n"
        "f = jax.jit(lambda x: x + 1)\n"
        "def helper(x): return x * 2\n"
        "g = jax.jit(helper)\n"
        "f(jnp.ones(2)); f(jnp.ones(2)); time.sleep(60)",
        "--batch-size=1",  # carried: no --help check (the script parses no flags)
    )
    line = error_line(proc)
    assert "timed out after 15 s" in line
    assert "jitted functions it called (times, at least; what they do): <lambda> (2)" in line
    assert "jitted but not called: helper" in line and "gammasgn" not in line


def test_the_tail_of_a_failed_probe_keeps_the_scripts_error_line(tmp_path, run_cli):
    code = (
        "import sys\n"
        "print('error: config nosuch_config not found; available: debug, gpt_small', file=sys.stderr)\n"
        "for i in range(40): print('detail line', i, file=sys.stderr)\n"
        "sys.exit(2)"
    )
    proc = run_cli("fit", "--script", *SMALL, "--", sys.executable, "-c", code)
    assert proc.returncode == 2
    assert "config nosuch_config not found" in proc.stderr


def test_run_with_a_custom_batch_flag_prints_it(tmp_path, run_cli):
    proc = run_cli("fit", "--script", *SMALL, "--batch-flag=--bs", "--", sys.executable, SHAPED, "--bs", "4")
    assert proc.returncode == 0, proc.stderr[-2000:]
    run_with = [line for line in proc.stdout.replace("\n", " ").split("run with: ")[1:]][0]
    assert "--bs=" in run_with and "--batch-size" not in run_with


@pytest.mark.parametrize(
    "flags,given,expected",
    [((), (), "--batch-size=8"), (("--batch-flag=--bs",), ("--bs", "4"), "--bs=8")],
)
def test_the_inverse_run_line_carries_the_batch_it_was_asked_for(tmp_path, run_cli, flags, given, expected):
    """The pin is made for batch 8: the printed command must run batch 8, not the script's default or 4."""
    proc = run_cli(
        "fit", "--script", "--device-memory", "64MiB", "--batch-size", "8", *flags, "--", sys.executable, SHAPED, *given
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    run_with = next(line for line in proc.stdout.replace("\n ", " ").splitlines() if line.startswith("run with: "))
    command, _, comment = run_with.partition("  # ")  # the comment names the proven step
    assert "JAXFIT_PIN=" in command and command.split()[-1] == expected
    assert comment == "loads the proven program of 'train_step'"
    assert " ".join(given or ("--batch-size",)) not in run_with.replace(expected, "")


@pytest.mark.parametrize("start", ["spawn", "fork"])
def test_no_worker_of_the_probed_script_outlives_the_probe(tmp_path, run_cli, monkeypatch, start):
    marker = f"JAXFIT_TEST_MARKER={tmp_path.name}"
    monkeypatch.setenv("JAXFIT_TEST_MARKER", tmp_path.name)  # every process of the probe inherits it
    proc = run_cli("fit", "--script", *SMALL, "--", sys.executable, SHAPED, "--workers", start)
    assert proc.returncode == 0, proc.stderr[-2000:]
    time.sleep(1)
    live = processes_with(marker)
    assert not live, "the probe left its workers running"


def test_a_probes_links_are_removed_not_followed_and_late_changes_kept(tmp_path):
    """In a fit (:func:`cleaned`), a probe makes a folder outside the working one with a link to a file
    it did not create; a file it created shows a change after the probes ended (the clock set back)."""
    from jaxfit.fit import leftovers

    cwd, out, target = tmp_path / "cwd", tmp_path / "out", tmp_path / "precious.txt"
    cwd.mkdir()
    target.write_text("keep me\n")
    code = (
        "import os\n"
        f"os.makedirs({str(out / 'run')!r})\n"
        f"os.symlink({str(target)!r}, {str(out / 'run' / 'link')!r})\n"
        f"open({str(out / 'late.txt')!r}, 'w').write('x')\n"
    )
    with leftovers.cleaned(cwd) as left:
        env = dict(os.environ, PYTHONPATH=str(REPO / "jaxfit" / "_probe"), **leftovers.probe_environment())
        subprocess.run([sys.executable, "-c", code], cwd=cwd, env=env, check=True)
        os.utime(out / "late.txt", (time.time() + 60, time.time() + 60))  # changed "after" the end
    assert target.read_text() == "keep me\n" and not (out / "run").exists()
    assert left.removed == [str(out / "run")] and left.kept == [str(out / "late.txt")], left
    assert not leftovers.probe_environment()


def test_a_second_probe_of_a_fit_finds_the_folders_as_the_first_did(tmp_path, monkeypatch):
    """A fit that starts its probes one after another (a GPU planning for another card's size, a
    fraction fit): each start-up of openpi must find no checkpoint folder, as the first did."""
    from jaxfit.fit import leftovers
    from jaxfit.fit.compiler import CompileChild
    from jaxfit.fit.sources import script_source

    monkeypatch.chdir(tmp_path)
    source = script_source(OPENPI)
    with leftovers.cleaned(tmp_path) as left:
        for _ in range(2):
            with CompileChild(source, 0.5, start_timeout=120) as child:
                assert child.info is not None  # reached the step: no FileExistsError
    assert not (tmp_path / "checkpoints").exists() and left.removed == ["checkpoints"], left


@pytest.mark.parametrize("sig,code,said", [(signal.SIGINT, 130, "interrupted"), (signal.SIGTERM, 143, "terminated")])
def test_an_interrupt_during_the_scripts_start_up_leaves_none_of_it_running(tmp_path, monkeypatch, sig, code, said):
    """Ctrl-C (or SIGTERM) while the probed script still starts: jaxfit stops it and its workers."""
    marker_env = f"JAXFIT_TEST_MARKER={tmp_path.name}"
    monkeypatch.setenv("JAXFIT_TEST_MARKER", tmp_path.name)  # every process of the probe inherits it
    marker = tmp_path / "started"
    command = [sys.executable, "-m", "jaxfit.cli", "fit", "--script", "--"]
    command += [sys.executable, str(FIXTURES / "slow_start.py"), f"--marker={marker}"]
    proc = subprocess.Popen(
        command,
        cwd=tmp_path,
        env=dict(os.environ),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        # as from a terminal: a test run started in the background inherits SIGINT ignored
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        deadline = time.monotonic() + 120
        while not marker.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert marker.exists(), proc.communicate(timeout=30)[1].decode()[-2000:]
        proc.send_signal(sig)
        _, stderr = proc.communicate(timeout=30)
        assert proc.returncode == code, stderr.decode()[-2000:]
        assert stderr.decode().strip().splitlines()[-1] == f"jaxfit: {said}" and b"Traceback" not in stderr
        deadline = time.monotonic() + 3
        while (live := processes_with(marker_env)) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not live, "the probed script or its worker outlived jaxfit"
    finally:  # whatever a failure left: ended here, not 2 minutes later
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for pid in processes_with(marker_env):
            try:
                os.kill(int(pid), signal.SIGKILL)
            except OSError:
                pass


def test_a_start_up_that_runs_out_of_memory_is_a_does_not_fit_answer(tmp_path, run_cli):
    """openpi's LoRA config on a 24 GiB card at 0.9 (H100, benchmarks/results/h100/openpi): its
    ``jit_init`` ran out of memory before the train step; the answer is "does not fit", not a crash."""
    code = (
        "import sys, jax, jax.numpy as jnp\n"
        "def init(k): return {'w': jax.random.normal(k, (4, 4))}\n"
        "jax.jit(init)(jax.random.key(0))\n"
        "print('jax.errors.JaxRuntimeError: RESOURCE_EXHAUSTED: Out of memory while trying to allocate 7.98GiB "
        "with allocator GPU_0_bfc on device 0. [executable_name=\\'jit_init\\']', file=sys.stderr)\n"
        "sys.exit(1)\n"
    )
    proc = run_cli("fit", "--script", *SMALL, "--", sys.executable, "-c", code, "--batch-size=1")
    line = error_line(proc)
    assert "the script ran out of memory (RESOURCE_EXHAUSTED) before it called its train step" in line
    assert "init (1)" in line and "none of them updates" not in line
    assert "allocate 7.98GiB" in line and "raise --mem-fraction" in line
    # tried both ways: a GPU pool that grows, then preallocated as a training run takes it
    assert "started again with the pool preallocated" in line and "it ran out again" in line


def test_a_start_up_that_fits_only_a_preallocated_pool_is_started_so(tmp_path, run_cli):
    """On an H100 under a 24 GiB card's limit, openpi's pi0 LoRA init ran out of memory in a pool
    that grows (allocating 7.98 GiB: one buffer cannot span two of its regions) and finished in a
    preallocated one, as training runs it (benchmarks/results/h100/init-24gib/). The script here
    stands in for that allocator: it runs out of memory only with preallocation off. The fit starts
    it again preallocated and answers, and says the run must preallocate."""
    code = _start_up_stand_in("os.environ.get('XLA_PYTHON_CLIENT_PREALLOCATE') == 'false'")
    out = tmp_path / "fit.json"
    proc = run_cli("fit", "--script", *SMALL, "--json", str(out), "--", sys.executable, "-c", code, "--batch-size=1")
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(out.read_text())
    assert result["batch_size"] >= 1 and result["outcome"] in ("boundary", "max")
    assert "ran out of memory in a pool that grows" in result["message"]
    assert "allocate 7.98GiB" in result["message"] and "XLA_PYTHON_CLIENT_PREALLOCATE" in result["message"]
    assert "starting it again with the pool preallocated" in " ".join(proc.stderr.split())  # said while waiting


def test_sigterm_during_a_probe_takes_away_the_folder_its_start_up_made(tmp_path):
    """openpi's start-up makes its checkpoint folder before it reaches the step: a fit stopped by
    SIGTERM while the script still starts removes it, as a finished fit does."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "jaxfit.cli", "fit", "--script", "--batch-flag", "--bs", "--",
         sys.executable, SHAPED, "--openpi-checkpoints", "--startup-seconds", "30"],
        cwd=tmp_path, env=dict(os.environ), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while not (tmp_path / "checkpoints").exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert (tmp_path / "checkpoints").exists(), proc.communicate(timeout=30)
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=60)
        assert proc.returncode == 143, stderr[-2000:]
        assert not (tmp_path / "checkpoints").exists()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_a_shared_working_folder_keeps_what_other_programs_made_during_a_probe(tmp_path):
    """A script run from /tmp: an empty folder another program made there while the probe ran (as
    pytest makes its next test's folder) is not the probe's and stays; what the probe itself made
    there goes."""
    from jaxfit.fit import leftovers

    shared = tmp_path / "tmp"
    shared.mkdir()
    shared.chmod(0o1777)  # sticky and open to all, as /tmp
    with leftovers.cleaned(shared) as left:
        (shared / "other-program").mkdir()  # made by this process, which is no probe
        env = dict(os.environ, PYTHONPATH=str(REPO / "jaxfit" / "_probe"), **leftovers.probe_environment())
        subprocess.run([sys.executable, "-c", "import os; os.makedirs('probe-made')"], cwd=shared, env=env, check=True)
    assert (shared / "other-program").is_dir() and not (shared / "probe-made").exists()
    assert left.removed == ["probe-made"] and "shared folder" in left.note, left


@pytest.mark.slow  # real subprocesses and compiles
def test_a_fraction_too_small_for_the_start_up_is_one_that_does_not_fit(tmp_path, run_cli, monkeypatch):
    """``fit --batch-size N`` of a script compiles the step under each fraction tried, each in a
    process of its own that runs the script's start-up first. openpi's pi0 LoRA init takes 18.52 GiB
    (H100, benchmarks/results/h100/init-24gib/), more than its step needs at a small batch: a fraction
    whose pool the start-up does not fit is a fraction too small, not the end of the fit. Here (an
    emulated 64 MiB GPU) the start-up runs out of memory below fraction 0.5."""
    monkeypatch.setenv("JAXFIT_EMULATE_GPU_TOTAL", str(64 << 20))
    code = _start_up_stand_in("float(os.environ.get('XLA_PYTHON_CLIENT_MEM_FRACTION', '1')) < 0.5", "31.00MiB")
    out = tmp_path / "fit.json"
    proc = run_cli("fit", "--script", "--batch-size", "8", "--json", str(out), "--", sys.executable, "-c", code)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["mode"] == "fraction" and result["mem_fraction"] == 0.5, result["message"]
    assert result["peak_bytes"] < 0.1 * (64 << 20)  # the step alone would take far less
    assert "start-up" in result["message"] and "allocate 31.00MiB" in result["message"], result["message"]
    small = [c for c in result["candidates"] if c["mem_fraction"] is not None and c["mem_fraction"] < 0.5]
    assert small and all(not c["fits"] and c["peak_bytes"] is None and "31.00MiB" in c["start_up_oom"] for c in small)
    assert "start-up ran out of memory before its step" in " ".join(proc.stderr.split())  # said as it happens


@pytest.mark.slow  # real subprocesses and compiles
def test_a_fraction_fit_starts_a_start_up_that_needs_preallocation_so_once_for_each_fraction(
    tmp_path, run_cli, monkeypatch
):
    """openpi's LoRA init under a 24 GiB card's limit ran out of a pool that grows and finished in a
    preallocated one (H100, benchmarks/results/h100/restart-24gib/). A fraction fit learns that from
    its first child and starts every other child preallocated, instead of twice each, fewer at a
    time when their pools would not fit the GPU together; the answer says the run must preallocate.
    The script stands in for the allocator: it runs out only with preallocation off."""
    monkeypatch.setenv("JAXFIT_EMULATE_GPU_TOTAL", str(64 << 20))
    starts = tmp_path / "starts.txt"
    code = _start_up_stand_in("os.environ.get('XLA_PYTHON_CLIENT_PREALLOCATE') == 'false'", record=starts)
    out = tmp_path / "fit.json"
    proc = run_cli(
        "fit", "--script", "--batch-size", "8", "--no-cache", "--json", str(out), "--", sys.executable, "-c", code,
        "--width", "40000",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["mode"] == "fraction" and result["peak_bytes"] <= result["budget_bytes"]
    assert "XLA_PYTHON_CLIENT_PREALLOCATE" in result["message"], result["message"]
    launched = [x for x in starts.read_text().split() if x != "unset"]  # (not the `--help` check of the flag)
    tried = [c for c in result["candidates"] if c["mem_fraction"] is not None and c["mem_fraction"] < 1.0]
    assert len(tried) >= 2, [c["mem_fraction"] for c in tried]
    # the first child (the whole device) grew, then ran preallocated; every fraction after it: preallocated, once
    assert launched == ["false"] + ["true"] * (1 + len(tried)), (launched, [c["mem_fraction"] for c in tried])
