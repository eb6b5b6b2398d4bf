"""jaxfit tune for real: compiles, pinned programs, measuring processes (CPU)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from helpers import REPO, error_line, process_environ, processes_with

pytestmark = pytest.mark.slow  # real subprocesses and compiles

TRAIN = str(REPO / "scripts" / "train.py")
TINY = ["--device-memory", "1GiB", "--mem-fraction", "0.3", "--warmup", "1", "--steps", "2"]
SMALL_GPT = {"n_layers": "1", "vocab_size": "256"}
"""gpt-tiny of one layer and a vocabulary of 256 (its own is 8192): for tests where the model's size
is not the point, the same programs (remat, accumulation) compiled and timed in less time."""


def _result(tmp_path, name="t.json") -> dict:
    return json.loads((tmp_path / name).read_text())


def _tune_slow_loader(run_cli, *tune_args, micro_batches, max_batch, steps, input_seconds):
    """``jaxfit tune --script`` (``TINY``, ``--json t.json``) of the shaped fixture, a script of
    ``steps`` steps whose loader sleeps ``input_seconds`` a batch."""
    shaped = str(REPO / "tests" / "fixtures" / "shaped_train.py")
    return run_cli(
        "tune", "--script", *tune_args, "--micro-batches", str(micro_batches), "--max-batch", str(max_batch), *TINY,
        "--batch-flag", "--bs", "--json", "t.json", "--", sys.executable, shaped,
        "--steps", str(steps), "--input-seconds", str(input_seconds),
    )  # fmt: skip


def test_tune_of_an_example_measures_what_fits_and_ranks_it(tmp_path, run_cli):
    args = [
        "tune",
        "--example",
        "gpt-tiny",
        "--set",
        "n_layers=1",
        "--set",
        "vocab_size=256",  # (SMALL_GPT)
        "--global-batch",
        "8",
        "--remat",
        "none,full",
        "--precision",
        "float32",
        "--micro-batches",
        "2",
        *TINY,
    ]
    proc = run_cli(*args, "--json", "t.json", "--png", "t.png")
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = _result(tmp_path)
    rows = result["rows"]
    assert {r["setting"] for r in rows} == {"remat=none,precision=float32", "remat=full,precision=float32"}
    measured = [r for r in rows if r["status"] == "measured"]
    assert measured and all(r["fits"] and r["peak_bytes"] <= r["budget_bytes"] for r in measured)
    assert all(r["micro_batch"] * r["accum_steps"] == 8 for r in rows)
    # An accumulated step does the work of all its micro-batches: XLA counts a loop body once, so
    # its FLOPs come from plain steps; per sample they agree with the plain step's own count.
    plain = [r for r in rows if r["fits"] and not r["remat"]]
    assert len({r["accum_steps"] for r in plain}) == 2, plain
    per_sample = [r["flops_per_step"] / r["global_batch"] for r in plain]
    assert max(per_sample) < 1.25 * min(per_sample), plain
    assert result["best"]["samples_per_second"] == max(r["samples_per_second"] for r in measured)
    assert rows[0] == result["best"]  # ranked fastest first
    assert sum(c["bytes"] for c in result["breakdown"]) == result["best"]["peak_bytes"]
    assert (tmp_path / "t.png").read_bytes()[:4] == b"\x89PNG"
    said = " ".join(proc.stdout.split())  # the summary wraps at the terminal's width
    assert "fastest:" in said and "(search " in said and ", prove " in said
    phases = result["phase_seconds"]
    assert phases["prove"] > 0 and phases["measure"] > 0
    assert phases["search"] > 0
    assert phases["search"] + phases["prove"] + phases["measure"] <= result["wall_seconds"] + 0.1

    again = run_cli(*args, "--json", "t2.json")  # every program and measurement comes from the caches
    assert again.returncode == 0, again.stderr[-2000:]
    assert all(r["cached"] for r in _result(tmp_path, "t2.json")["rows"] if r["status"] == "measured")


def test_tune_of_train_py_over_two_axes(tmp_path, run_cli):
    proc = run_cli(
        "tune",
        "--script",
        "--global-batch",
        "2",
        "--micro-batches",
        "1",
        "--axis=--remat=none,full",
        "--axis=--precision=float32,bfloat16",
        *TINY,
        "--json",
        "t.json",
        "--",
        sys.executable,
        TRAIN,
        "debug",
        "--exp-name=tune",
        f"--checkpoint-base-dir={tmp_path / 'ck'}",
        "--no-wandb-enabled",
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = _result(tmp_path)
    settings = {r["setting"] for r in result["rows"]}
    assert settings == {f"--remat={r} --precision={p}" for r in ("none", "full") for p in ("float32", "bfloat16")}
    measured = [r for r in result["rows"] if r["status"] == "measured"]
    assert {r["setting"] for r in measured} == {f"--remat=none --precision={p}" for p in ("float32", "bfloat16")}
    assert all(r["fits"] for r in measured)
    # --remat=full: its twin --remat=none fits the whole global batch (2) at once, so neither is searched
    cannot = [r for r in result["rows"] if r["status"] == "cannot win"]
    assert {r["setting"] for r in cannot} == {f"--remat=full --precision={p}" for p in ("float32", "bfloat16")}
    assert all("the whole global batch" in r["note"] for r in cannot)
    assert result["best"] == max(measured, key=lambda r: r["samples_per_second"])
    assert "--batch-size=2" in result["command"] and result["best"]["setting"].split()[0] in result["command"]
    # the last line is the script's own command with the winning flags, in the shell's words
    line = next(line for line in proc.stdout.splitlines() if line.startswith("train with: "))
    assert "XLA_PYTHON_CLIENT_MEM_FRACTION=0.3 " in line and f"{TRAIN} debug --exp-name=tune" in line, line
    assert ("JAXFIT_PIN=" in line) == ("JAXFIT_PIN" in result["env"]), line
    assert not (tmp_path / "ck").exists(), sorted(
        str(p) for p in (tmp_path / "ck").rglob("*")
    )  # nothing the measuring left


def test_a_budget_counts_measuring_only_and_the_rows_past_it_say_so(tmp_path, run_cli):
    """--budget covers measuring, not the fits before it (a 600 s budget once measured 1 of 12
    candidates because fitting took most of it): the first candidate is measured, the rest say why not."""
    proc = run_cli(
        "tune",
        "--example",
        "gpt-tiny",
        "--set",
        "n_layers=1",
        "--set",
        "vocab_size=256",  # (SMALL_GPT)
        "--global-batch",
        "4",
        "--remat",
        "none",
        "--precision",
        "float32",
        *TINY,
        "--budget",
        "0.001",
        "--json",
        "t.json",
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = [r for r in _result(tmp_path)["rows"] if r["fits"]]
    assert len(rows) > 1 and [r["status"] for r in rows].count("measured") == 1
    assert all(r["status"] == "budget spent" for r in rows if r["status"] != "measured")
    assert any("s of measuring was spent" in r["note"] for r in rows)


@pytest.mark.parametrize(
    "args,message",
    [
        (
            ["tune", "--script", "--axis=--nosuch=1,2", "--", sys.executable, TRAIN, "debug", "--exp-name=x"],
            "--axis names --nosuch, which the script does not take",
        ),
        (
            ["tune", "--script", "--axis=remat", "--", sys.executable, TRAIN, "debug", "--exp-name=x"],
            "must look like --FLAG=VALUE1,VALUE2",
        ),
        (["tune", "--example", "gpt-tiny", "--remat", "sometimes"], "--remat 'sometimes' is not one of"),
        (["tune", "--example", "gpt-tiny", "--axis=--a=1"], "--axis applies to scripts"),
        (["tune", "--global-batch", "0"], "--global-batch 0 must be at least 1"),
        (["tune", "--steps", "0"], "--warmup and --steps must be at least 1"),
        (["tune", "--parallel", "0"], "--parallel 0 must be at least 1"),
    ],
)
def test_tune_bad_input_is_one_line(run_cli, args, message):
    assert message in error_line(run_cli(*args))


def test_an_example_tune_ends_with_its_settings_and_its_pin_is_stored(tmp_path, run_cli):
    """An example no training script trains as tuned (gpt-tiny with --set) ends with its settings,
    never a private process's command; the winner's pin is stored, and claimed only while it is.
    --max-batch caps the micro-batch under a global batch (it was ignored: the H200 check of
    benchmarks/JOURNAL.md section 27 searched up to 64 under --max-batch 16)."""
    proc = run_cli(
        "tune", "--example", "gpt-tiny", "--set", "n_layers=1", "--set", "vocab_size=256", "--global-batch", "4",
        "--remat", "none",
        "--precision", "float32", "--micro-batches", "1", "--max-batch", "2", *TINY, "--json", "t.json",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert max(r["micro_batch"] for r in _result(tmp_path)["rows"]) == 2
    assert (_result(tmp_path)["best"]["micro_batch"], _result(tmp_path)["best"]["accum_steps"]) == (2, 2)
    said = " ".join(proc.stdout.split())
    assert "train with:" not in said and "jaxfit.tune.trial" not in said, said
    assert "settings: remat=none,precision=float32, micro-batch 2 x 2 accumulation steps (global batch 4)" in said
    assert "XLA_PYTHON_CLIENT_MEM_FRACTION=0.3 (no training script trains this example as tuned)" in said
    result = _result(tmp_path)
    assert result["command"] is None and result["env"] == {}
    pin = Path(result["best"]["pin"])
    assert pin.is_file()
    from jaxfit.fit.pin import EXECUTABLE_FILE
    from jaxfit.tune.engine import winner_environment

    summary = json.loads(pin.read_text())["summary"]
    env = winner_environment(summary, 0.3)
    assert env["JAXFIT_PIN"] == str(pin) and env["PYTHONPATH"].endswith("_probe")
    assert env["XLA_PYTHON_CLIENT_MEM_FRACTION"] == "0.3"
    (pin.parent / EXECUTABLE_FILE).unlink()  # pruned since: the line must not claim it
    assert winner_environment(summary, 0.3) == {"XLA_PYTHON_CLIENT_MEM_FRACTION": "0.3"}
    assert winner_environment(None, 0.3) == {"XLA_PYTHON_CLIENT_MEM_FRACTION": "0.3"}


def test_sigterm_while_measuring_leaves_no_process_and_no_temporary_folder(tmp_path):
    """SIGTERM (timeout, CI, kill) during a measurement: jaxfit exits 143 and the measuring
    process, started in its own session, ends with it; no jaxfit-tune-* folder is left."""
    import os
    import signal
    import subprocess
    import tempfile
    import time

    marker = f"JAXFIT_TEST_MARKER={tmp_path.name}"
    env = dict(os.environ, JAXFIT_TEST_MARKER=tmp_path.name, TMPDIR=str(tmp_path))
    # one candidate (2 x 1, proved by its search): the measuring starts after one probe, not after four
    command = [sys.executable, "-m", "jaxfit.cli", "tune", "--script", "--global-batch", "2", "--micro-batches", "1"]
    command += [*TINY, "--", sys.executable, TRAIN, "debug", "--exp-name=tune", "--no-wandb-enabled"]
    command += [f"--checkpoint-base-dir={tmp_path / 'ck'}"]
    proc = subprocess.Popen(command, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 240
        while not _measuring(marker) and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert _measuring(marker), proc.communicate(timeout=30)
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=60)
        assert proc.returncode == 143, stderr[-2000:]
        deadline = time.monotonic() + 3
        while (live := processes_with(marker)) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not live, "the measuring process outlived jaxfit"
        assert not [p for p in Path(tmp_path).iterdir() if p.name.startswith("jaxfit-tune-")]
        assert tempfile.gettempdir() != str(tmp_path)  # (this process's own temp folder is untouched)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for pid in processes_with(marker):
            try:
                os.kill(int(pid), signal.SIGKILL)
            except OSError:
                pass


def _measuring(marker: str) -> bool:
    return any("JAXFIT_MEASURE=" in process_environ(pid) for pid in processes_with(marker))


def test_a_script_that_ends_before_the_measured_steps_is_not_called_crashed(tmp_path, run_cli):
    proc = run_cli(
        "tune", "--script", "--global-batch", "2", "--micro-batches", "1", *TINY, "--json", "t.json", "--",
        sys.executable, TRAIN, "debug", "--exp-name=tune", "--num-train-steps=1", "--no-wandb-enabled", "--overwrite",
        f"--checkpoint-base-dir={tmp_path / 'ck'}",
    )  # fmt: skip
    rows = [r for r in _result(tmp_path)["rows"] if r["fits"]]
    assert rows and all(r["status"] == "ended early" for r in rows), proc.stderr[-2000:]
    assert "--warmup + --steps" in rows[0]["note"]


def test_a_script_whose_loader_is_slow_is_named_input_bound(tmp_path, run_cli):
    """0.3 s per batch from the loader against a step of milliseconds: every measured row says the
    input limits it, its rate counts the time between steps, the loader's own rate is measured with
    the step skipped, and the summary says so."""
    proc = _tune_slow_loader(run_cli, micro_batches=2, max_batch=64, steps=8, input_seconds=0.3)
    assert proc.returncode == 0, proc.stderr[-2000:]
    measured = [r for r in _result(tmp_path)["rows"] if r["status"] == "measured"]
    assert measured
    for r in measured:
        assert r["limited_by"] == "input" and r["outside_step_seconds"] >= 0.25
        assert r["samples_per_second"] < r["step_samples_per_second"] / 5
        assert abs(r["samples_per_second"] - r["global_batch"] / (r["step_seconds"] + r["outside_step_seconds"])) < 1e-6
        # the loop timed with the step skipped (--input-steps 3): the loader's own 0.3 s a batch
        assert 0.3 <= r["input_seconds"] < 0.6, r
        assert r["input_samples_per_second"] == pytest.approx(r["global_batch"] / r["input_seconds"])
    said = " ".join(proc.stdout.split())  # the summary wraps at the terminal's width
    assert "limited by its input" in said and "its input alone gives" in said


def test_inline_measurement_ranks_as_fresh_processes_do():
    """--measure inline times each proven program in the compile process that proved it: no start-up
    per candidate. On two settings far apart (one layer against four: four times the work), it ranks
    them as fresh training processes do, with step times of the same order. (float32 against
    bfloat16 was not far apart: on jax 0.10.2's CPU they came within 25 % and swapped places
    between runs.) A vocabulary of 256 (gpt-tiny's is 8192) keeps the output layer from evening
    out the layers' work: at batch 2 the two steps are about 4x apart (2x at batch 16 with the
    whole vocabulary, which took more than twice as long to tune)."""
    from jaxfit.fit import FitOptions
    from jaxfit.fit.sources import example_source
    from jaxfit.tune import Setting, Target, TuneOptions, tune

    settings = [Setting("one layer", (("n_layers", "1"),)), Setting("four layers", (("n_layers", "4"),))]
    results = {}
    for mode in ("inline", "process"):
        results[mode] = tune(
            Target(example=example_source("gpt-tiny", {"vocab_size": "256"})),
            settings,
            FitOptions(mem_fraction=0.3, device_memory_bytes=4 << 30, max_batch=2, use_cache=False),
            TuneOptions(global_batch=2, warmup=1, steps=3, micro_batches=1, measure=mode, drop_margin=None),
        )
    inline, process = results["inline"], results["process"]
    assert inline.best is not None and process.best is not None
    assert inline.best.setting == process.best.setting == "one layer"
    assert all(r.status == "measured" for res in (inline, process) for r in res.rows)
    assert all(r.measured_in == "compile process" for r in inline.rows)
    assert not [r.note for r in process.rows if r.note]  # every fresh process ran its pinned program
    assert inline.phase_seconds["measure"] < 1  # the programs were timed while they were proven
    for a, b in zip(sorted(inline.rows, key=lambda r: r.setting), sorted(process.rows, key=lambda r: r.setting)):
        assert a.step_seconds and b.step_seconds and 0.33 < a.step_seconds / b.step_seconds < 3, (a, b)


def test_a_script_measured_inline_is_timed_in_its_probe_and_its_fastest_again_in_a_fresh_process(tmp_path, run_cli):
    """--measure inline on a script: each proof's program is timed in the script's own probe (the
    step alone, on the state the script built), then the fastest rows run again in a fresh process
    of the script with their pinned program, which also sees its loader: 0.3 s a batch here, so the
    winner's rate there is far below its step alone, and it is named input-limited."""
    proc = _tune_slow_loader(run_cli, "--measure", "inline", micro_batches=2, max_batch=64, steps=8, input_seconds=0.3)
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = _result(tmp_path)
    best = result["best"]  # timed in the probe (step alone), then in a fresh process
    assert best["measured_in"] == "process" and best["limited_by"] == "input"
    assert best["inline_samples_per_second"] > 5 * best["samples_per_second"]
    assert 0.3 <= best["input_seconds"] < 0.6
    assert "in a fresh process of the script" in proc.stderr


def test_a_script_probe_times_its_step_twice_on_the_state_it_donated():
    """The probe's timings run the script's own state through the program, which donates it: a
    second timing in the same process starts from the state the first left (the compile server's
    keep_arguments), not from the donated, deleted one."""
    import io

    import jax
    import jax.numpy as jnp

    from jaxfit._probe import jaxfit_compile_server as server_mod

    step = jax.jit(lambda state, batch: (state + batch.sum(), batch.mean()), donate_argnums=0)
    live = {"args": [jnp.ones((256,)), jnp.ones((4, 3))]}

    def concrete(batch: int) -> tuple:
        return (live["args"][0], server_mod.real_arguments(jax.ShapeDtypeStruct((batch, 3), jnp.float32)))

    def keep(final: list) -> None:
        live["args"] = [final[0], live["args"][1]]

    def lower(batch: int):
        return step.lower(jax.ShapeDtypeStruct((256,), jnp.float32), jax.ShapeDtypeStruct((batch, 3), jnp.float32))

    server = server_mod.Server(
        lower, io.StringIO(), {"name": "step"}, concrete=concrete, donated=(0,), keep_arguments=keep
    )
    first, second = server.time_step(8, 1, 2), server.time_step(16, 1, 2)
    assert first["ok"] and second["ok"], (first, second)
    server.keep_arguments = None  # without it, the second timing would find its state deleted
    assert server.time_step(8, 1, 2)["ok"]
    assert not server.time_step(8, 1, 2)["ok"]


def test_a_candidate_clearly_slower_than_the_best_is_dropped_after_a_short_look(tmp_path, run_cli):
    """Successive halving, measured as it runs: the second setting's loader takes 0.4 s a batch on
    purpose; after a quarter of --steps it is far below the first setting's rate and is stopped
    there (dropped, not measured longer), and the summary says so. --drop-margin None measures it whole."""
    shaped = str(REPO / "tests" / "fixtures" / "shaped_train.py")
    args = [
        "tune", "--script", "--axis=--input-seconds=0,0.4", "--max-batch", "8", "--device-memory", "1GiB",
        "--mem-fraction", "0.3", "--warmup", "1", "--steps", "8", "--batch-flag", "--bs",
    ]  # fmt: skip
    command = ["--", sys.executable, shaped, "--steps", "30"]
    proc = run_cli(*args, "--json", "t.json", *command)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = {r["setting"]: r for r in _result(tmp_path)["rows"]}
    fast, slow = rows["--input-seconds=0"], rows["--input-seconds=0.4"]
    assert fast["status"] == "measured" and fast["timed_steps"] == 8
    assert slow["status"] == "dropped" and slow["timed_steps"] == 2, slow  # a quarter of 8
    assert slow["samples_per_second"] < 0.9 * fast["samples_per_second"]
    assert slow["note"].startswith("after 2 timed steps: ")
    assert _result(tmp_path)["best"]["setting"] == "--input-seconds=0"
    assert "1 dropped after 2 timed step(s) as clearly slower" in " ".join(proc.stdout.split())  # wrapped

    whole = run_cli(*args, "--drop-margin", "None", "--json", "w.json", *command)
    assert whole.returncode == 0, whole.stderr[-2000:]
    slow = next(r for r in _result(tmp_path, "w.json")["rows"] if r["setting"] == "--input-seconds=0.4")
    assert slow["status"] == "measured" and slow["timed_steps"] == 8


def test_inline_measurement_drops_a_setting_made_slow_on_purpose():
    """--measure inline: the compile process that proves a program times it, and stops timing one
    that is clearly slower (eight layers against one) after a quarter of the steps. (A vocabulary
    of 256, not gpt-tiny's 8192, at batch 2: the layers are most of the work, about 8x apart.)"""
    from jaxfit.fit import FitOptions
    from jaxfit.fit.sources import example_source
    from jaxfit.tune import Setting, Target, TuneOptions, tune

    fast, slow = Setting("one layer", (("n_layers", "1"),)), Setting("eight layers", (("n_layers", "8"),))
    result = tune(
        Target(example=example_source("gpt-tiny", {"vocab_size": "256"})),
        [fast, slow],
        FitOptions(mem_fraction=0.3, device_memory_bytes=4 << 30, max_batch=2),
        TuneOptions(global_batch=2, warmup=1, steps=8, micro_batches=1, measure="inline"),
    )
    rows = {r.setting: r for r in result.rows}
    assert rows["one layer"].status == "measured" and rows["one layer"].timed_steps == 8
    assert rows["eight layers"].status == "dropped" and rows["eight layers"].timed_steps == 2
    assert rows["eight layers"].measured_in == "compile process"
    assert result.best is rows["one layer"]


def test_a_tune_of_an_example_proves_every_setting_in_one_compile_process(monkeypatch):
    """Two settings, two micro-batches each (accumulated programs): one compile process is started
    and switches workloads for every other fit; each proven peak is the one a fit in its own fresh
    process gives, and the programs it timed inline ran."""
    import dataclasses

    import jaxfit
    from jaxfit.fit import FitOptions
    from jaxfit.fit.compiler import CompileChild
    from jaxfit.fit.sources import example_source
    from jaxfit.tune import Target, TuneOptions, example_settings, tune

    starts: list = []
    loads: list = []
    real_start, real_load = CompileChild.start, CompileChild.load

    def start(self):
        starts.append(self.source)
        return real_start(self)

    def load(self, source):
        loads.append(source)
        return real_load(self, source)

    monkeypatch.setattr(CompileChild, "start", start)
    monkeypatch.setattr(CompileChild, "load", load)
    target = Target(example=example_source("gpt-tiny", SMALL_GPT))
    # two remat policies, neither the other's twin without remat: both are proved
    settings = example_settings(["full", "dots"], ["float32"])
    options = FitOptions(mem_fraction=0.3, device_memory_bytes=1 << 30, use_cache=False)
    result = tune(
        target, settings, options, TuneOptions(global_batch=8, micro_batches=2, warmup=1, steps=2, measure="inline")
    )
    fitted = [r for r in result.rows if r.fits]
    # four fits (per setting: its largest micro-batch, 8 x 1, and the proof of 4 x 2): one start, three loads
    assert len(fitted) == 4 and (len(starts), len(loads)) == (1, 3)
    assert all(r.status == "measured" for r in fitted)
    # what each proof cost: the 4 x 2 rows were proved on their own, the 8 x 1 rows by their search
    for row in fitted:
        if row.accum_steps == 1:
            assert row.prove_seconds is None, row
        else:
            assert row.prove_seconds and row.compile_seconds and row.timing_seconds, row
            assert row.compile_seconds + row.timing_seconds <= row.prove_seconds, row
    monkeypatch.setattr(CompileChild, "load", real_load)
    by_name = {s.name: s for s in settings}
    for row in fitted[:2]:
        exact = dataclasses.replace(options, min_batch=row.global_batch, max_batch=row.global_batch)
        exact = dataclasses.replace(exact, multiple_of=row.accum_steps)
        own = jaxfit.fit_batch(target.source(by_name[row.setting], row.accum_steps, row.global_batch), exact)
        assert own.peak_bytes == row.peak_bytes, row


def test_on_a_gpu_each_micro_batch_is_proved_as_it_runs_and_one_that_does_not_fit_gives_way(monkeypatch):
    """On a GPU (emulated: real CPU compiles under a pretend 599 MB card at 0.5, a 299.5 MB budget)
    the search for the largest micro-batch is untuned and proves nothing: every micro-batch
    measured is proved by one compile of its accumulated program as it runs. Plain 8 fits (297.8
    MB) but 8 x 2 does not (301.3 MB: the gradient accumulator), so it gives way to the next two
    divisors of the global batch, 4 x 4 and 2 x 8. By default (``--measure auto``) a GPU times them
    in that process."""
    from jaxfit.fit import FitOptions
    from jaxfit.fit.sources import example_source
    from jaxfit.tune import Target, TuneOptions, example_settings, tune

    monkeypatch.setenv("JAXFIT_EMULATE_GPU_TOTAL", str(599_000_000))
    events: list = []
    result = tune(
        Target(example=example_source("gpt-tiny", {"n_layers": "1"})),
        example_settings(["none"], ["float32"]),
        FitOptions(mem_fraction=0.5, use_cache=False),
        TuneOptions(global_batch=16, micro_batches=2, warmup=1, steps=2, drop_margin=None),
        progress=lambda e, d: events.append((e, d)),
    )
    rows = {r.micro_batch: r for r in result.rows}
    assert sorted(rows) == [2, 4, 8], rows
    assert rows[8].status == "does not fit" and rows[8].accum_steps == 2
    assert rows[8].note.startswith("8 x 2 does not fit the budget of 285.63 MiB"), rows[8].note
    assert rows[4].status == rows[2].status == "measured"
    # --measure auto on a GPU: timed in the process that proved them, no training process started
    assert rows[4].measured_in == rows[2].measured_in == "compile process"
    assert all(r.peak_bytes is not None and r.peak_bytes <= r.budget_bytes for r in (rows[4], rows[2]))
    tuned = [d["batches"] for e, d in events if e == "round" and d["autotune"]]
    assert tuned == [[16], [16], [16]], tuned  # the three proofs, and nothing autotuned in the search
    assert result.phase_seconds["search"] > 0


def test_a_program_the_compile_process_cannot_hold_inline_is_measured_in_a_fresh_process(monkeypatch):
    """On four H100s (benchmarks/JOURNAL.md section 15) the compile process ran out of memory timing
    the proved winner (remat none 4 x 16 of gpt-small: peak 5.15 GiB of a 5.59 GiB budget), which
    a fresh process runs: that process holds every program it compiled and a pool its compiles have
    cut up. Such a row is measured in a fresh process, as the proof is for one. (The reply is the
    compile process's, with the H100's message: a CPU has no pool to run out of.)"""
    from jaxfit.fit import FitOptions
    from jaxfit.fit.compiler import CompileChild
    from jaxfit.fit.sources import example_source
    from jaxfit.tune import Target, TuneOptions, example_settings, tune

    real_time = CompileChild.time
    calls: list[int] = []

    def time_in_child(self, batch, *args, **kwargs):
        calls.append(batch)
        if len(calls) == 1:
            return {
                "op": "timed",
                "ok": False,
                "batch": batch,
                "error": "JaxRuntimeError: RESOURCE_EXHAUSTED: Out of memory while trying to allocate 4.40GiB "
                "with allocator GPU_0_bfc on device 0.",
                "oom": True,
            }
        return real_time(self, batch, *args, **kwargs)

    monkeypatch.setattr(CompileChild, "time", time_in_child)
    result = tune(
        Target(example=example_source("gpt-tiny", SMALL_GPT)),
        example_settings(["none"], ["float32"]),
        FitOptions(mem_fraction=0.3, device_memory_bytes=1 << 30, use_cache=False),
        TuneOptions(global_batch=8, micro_batches=2, warmup=1, steps=2, measure="inline", drop_margin=None),
    )
    assert len(calls) == 2, calls
    where = {(r.micro_batch, r.accum_steps): (r.status, r.measured_in) for r in result.rows}
    assert where == {(8, 1): ("measured", "process"), (4, 2): ("measured", "compile process")}, where
    fresh = next(r for r in result.rows if r.measured_in == "process")
    assert "fresh process" in fresh.note and fresh.samples_per_second


def test_on_a_gpu_micro_batches_are_ranked_untuned_and_a_clearly_slower_setting_is_never_proved(monkeypatch):
    """With --rank-untuned on a GPU (emulated: real CPU compiles) and inline measuring, every micro-batch of every
    setting is compiled untuned as its accumulation to the global batch (one stacked workload per
    setting) and run a few steps in the compile process; proofs go fastest first, and a setting
    eight times deeper, far more than --drop-margin below, is left out without one autotuned
    compile. Its rows say why, with the rate they were ranked by. (A vocabulary of 256, not
    gpt-tiny's 8192: the layers are most of the work.)"""
    from jaxfit.fit import FitOptions
    from jaxfit.fit.sources import example_source
    from jaxfit.tune import Setting, Target, TuneOptions, tune

    monkeypatch.setenv("JAXFIT_EMULATE_GPU_TOTAL", str(2_000_000_000))
    events: list = []
    fast, slow = Setting("one layer", (("n_layers", "1"),)), Setting("eight layers", (("n_layers", "8"),))
    result = tune(
        Target(example=example_source("gpt-tiny", {"vocab_size": "256"})),
        [fast, slow],
        FitOptions(mem_fraction=0.5, use_cache=False),
        TuneOptions(global_batch=4, micro_batches=1, warmup=1, steps=2, rank_untuned=True),
        progress=lambda e, d: events.append((e, d)),
    )
    rows = {(r.setting, r.micro_batch): r for r in result.rows}
    # the searches: the divisors 1, 2, 4 of each setting, untuned, in one round each
    assert [(d["batches"], d["autotune"]) for e, d in events if e == "round"][:2] == [([1, 2, 4], False)] * 2
    # --micro-batches 1: one micro-batch of the fast setting is proved, none of the slow one
    assert {m for s, m in rows if s == "eight layers"} == {1, 2, 4}
    assert all(r.untuned_samples_per_second for r in rows.values())
    proved = [r for r in result.rows if r.status not in ("ranked out", "not run")]
    assert [r.setting for r in proved] == ["one layer"], [(r.setting, r.micro_batch, r.status) for r in result.rows]
    tuned = [d for e, d in events if e == "round" and d["autotune"]]
    assert len(tuned) == 1  # one autotuned compile: the one proof
    best = result.best
    assert best is not None and best.setting == "one layer" and best.measured_in == "compile process"
    assert best.untuned_samples_per_second == max(r.untuned_samples_per_second or 0 for r in result.rows)
    out = rows[("eight layers", 4)]
    assert out.status == "ranked out" and out.peak_bytes is None and out.pin is None
    assert out.note.startswith(f"untuned it ran at {out.untuned_samples_per_second:.1f} samples/s, more than 10% below")
    assert "not proved as clearly slower untuned" in result.message
    assert result.phase_seconds["rank"] > 0


def test_a_remat_setting_is_not_proved_where_its_twin_without_remat_fits():
    """remat=full listed first: the tune proves remat=none first, and since none fits micro-batch 8
    (the whole global batch), remat=full at 8 or below can only be slower (the same work and a
    recompute): it is not proved, and its one row says why. Real compiles, timed inline."""
    from jaxfit.fit import FitOptions
    from jaxfit.fit.sources import example_source
    from jaxfit.tune import Target, TuneOptions, example_settings, tune

    settings = example_settings(["full", "none"], ["float32"])
    result = tune(
        Target(example=example_source("gpt-tiny", SMALL_GPT)),
        settings,
        FitOptions(mem_fraction=0.3, device_memory_bytes=1 << 30, use_cache=False),
        TuneOptions(global_batch=8, micro_batches=2, warmup=1, steps=2, measure="inline"),
    )
    full = [r for r in result.rows if r.setting == "remat=full,precision=float32"]
    none = [r for r in result.rows if r.setting == "remat=none,precision=float32"]
    assert [(r.micro_batch, r.status) for r in full] == [(8, "cannot win")], full
    assert "remat=none,precision=float32 fits micro-batch 8" in full[0].note
    assert {(r.micro_batch, r.status) for r in none} == {(8, "measured"), (4, "measured")}, none
    assert result.best is not None and result.best.setting == "remat=none,precision=float32"


def test_a_script_too_short_for_its_input_to_be_timed_says_so_in_its_row(tmp_path, run_cli):
    """--warmup 1 --steps 2 --input-steps 3 needs 7 steps of the script (the first loop iteration
    after the timed steps overlaps the last step): a script of 5 steps gets its rate, and a row note
    that its input alone was not measured and what it needs."""
    proc = _tune_slow_loader(run_cli, micro_batches=1, max_batch=16, steps=5, input_seconds=0.05)
    assert proc.returncode == 0, proc.stderr[-2000:]
    measured = [r for r in _result(tmp_path)["rows"] if r["status"] == "measured"]
    assert measured and all(r["input_seconds"] is None for r in measured)
    assert all("its input alone was not measured" in r["note"] and "7 steps or more" in r["note"] for r in measured)
