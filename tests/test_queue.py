"""Tests of the queue file of ``jaxfit schedule`` (pure: no JAX, no processes)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from jaxfit.errors import ConfigError
from jaxfit.examples.configs import list_examples
from jaxfit.fit.budget import GiB, MiB
from jaxfit.schedule.queue_file import (
    EXPERIMENT_KEYS,
    TOP_LEVEL_KEYS,
    Experiment,
    Queue,
    load_queue,
    parse_duration,
    parse_queue,
)

REPO = Path(__file__).resolve().parents[1]
DEBUG_QUEUE = REPO / "configs" / "queue-debug.yaml"
QUEUE_96GB = REPO / "configs" / "queue-96gb.yaml"
TRAIN_SCRIPT_CONFIGS = set(re.findall(r'name="([a-z0-9_]+)"', (REPO / "scripts" / "train.py").read_text()))


def _one_line(err: pytest.ExceptionInfo[ConfigError]) -> str:
    message = str(err.value)
    assert message and "\n" not in message
    return message


def _experiment(**overrides: Any) -> dict[str, Any]:
    data: dict[str, Any] = {"name": "run-a", "command": ["python", "scripts/train.py", "debug", "--exp-name=a"]}
    data.update(overrides)
    return data


# ---------------------------------------------------------------------------------------------
# The shipped queue files.


@pytest.mark.parametrize("path", [DEBUG_QUEUE, QUEUE_96GB], ids=lambda p: p.name)
def test_shipped_queue_files_load(path: Path) -> None:
    queue = load_queue(path)
    assert queue.source == str(path)
    assert queue.device_memory_bytes is not None  # both plan without GPUs
    assert len({e.name for e in queue.experiments}) == len(queue.experiments)
    raw = yaml.safe_load(path.read_text())
    assert "family" not in raw  # a top-level family: key would make it an example
    for experiment in queue.experiments:
        assert experiment.command[1] == "scripts/train.py"
        assert experiment.command[2] in TRAIN_SCRIPT_CONFIGS, experiment.command
        assert f"--exp-name={experiment.name}" in experiment.command


def test_shipped_queue_files_are_not_examples() -> None:
    names = list_examples()
    assert "queue-debug" not in names and "queue-96gb" not in names
    assert "gpt-tiny" in names


def test_debug_queue_mixes_fixed_and_auto_tiny_runs() -> None:
    queue = load_queue(DEBUG_QUEUE)
    assert len(queue.experiments) >= 4
    assert {e.command[2] for e in queue.experiments} <= {"debug", "debug_vit"}
    assert any(e.auto_batch and e.auto_fraction for e in queue.experiments)
    assert any(not e.auto_batch for e in queue.experiments)
    assert any(not e.auto_fraction for e in queue.experiments)
    for experiment in queue.experiments:
        steps = [a for a in experiment.command if a.startswith("--num-train-steps=")]
        assert steps and int(steps[0].split("=")[1]) <= 50


def test_96gb_queue_shares_one_96gb_card() -> None:
    queue = load_queue(QUEUE_96GB)
    assert queue.device_memory_bytes == 96 * GiB
    assert queue.gpus == 1
    assert queue.reserve_bytes > 0
    assert queue.process_overhead_bytes == 618 * MiB
    assert len(queue.experiments) >= 3
    assert {"gpt_small", "gpt_small_bf16_remat", "vit_small"} <= {e.command[2] for e in queue.experiments}
    fixed = sum(e.fraction for e in queue.experiments if e.fraction is not None)
    assert fixed < 1


# ---------------------------------------------------------------------------------------------
# Parsing good input.


def test_defaults() -> None:
    queue = parse_queue({"experiments": [_experiment()]}, "q.yaml")
    assert isinstance(queue, Queue)
    assert queue.gpus == "all" and queue.reserve_bytes == 0
    assert queue.device_memory_bytes is None and queue.process_overhead_bytes is None
    (experiment,) = queue.experiments
    assert isinstance(experiment, Experiment)
    assert experiment.batch is None and experiment.fraction is None and experiment.auto_batch
    assert experiment.global_batch is None and experiment.retries == 1 and experiment.priority == 0
    assert experiment.timeout is None and dict(experiment.env) == {} and experiment.index == 0


def test_full_experiment_and_top_level() -> None:
    data = {
        "gpus": [0, 2],
        "reserve": "2GiB",
        "device_memory": "96GiB",
        "process_overhead": "618MiB",
        "experiments": [
            _experiment(
                batch=16,
                fraction=0.25,
                global_batch=64,
                retries=0,
                priority=-3,
                timeout="1h30m",
                env={"WANDB_MODE": "offline", "SEED": 7},
            )
        ],
    }
    queue = parse_queue(data, "q.yaml")
    assert queue.gpus == (0, 2) and queue.reserve_bytes == 2 * GiB
    assert queue.device_memory_bytes == 96 * GiB and queue.process_overhead_bytes == 618 * MiB
    e = queue.experiments[0]
    assert (e.batch, e.fraction, e.global_batch, e.retries, e.priority) == (16, 0.25, 64, 0, -3)
    assert e.timeout == 5400.0
    assert dict(e.env) == {"WANDB_MODE": "offline", "SEED": "7"}
    with pytest.raises(TypeError):
        e.env["X"] = "1"  # type: ignore[index]
    assert queue.to_dict()["experiments"][0]["env"] == ["SEED", "WANDB_MODE"]  # names only: values may be secrets
    hash(e)  # frozen and hashable despite the env mapping


def test_string_commands_are_split_with_shlex() -> None:
    command = "python scripts/train.py debug --exp-name='my run' --model-overrides n_layers 2"
    queue = parse_queue({"experiments": [_experiment(command=command)]}, "q.yaml")
    assert queue.experiments[0].command == (
        "python",
        "scripts/train.py",
        "debug",
        "--exp-name=my run",
        "--model-overrides",
        "n_layers",
        "2",
    )


def test_list_commands_keep_arguments_and_write_numbers() -> None:
    queue = parse_queue({"experiments": [_experiment(command=["python", "t.py", "--steps", 10])]}, "q.yaml")
    assert queue.experiments[0].command == ("python", "t.py", "--steps", "10")


@pytest.mark.parametrize(
    ("gpus", "expected", "available", "selected"),
    [("all", "all", 3, (0, 1, 2)), (2, 2, 3, (0, 1)), ([2, 0], (2, 0), 3, (2, 0)), ("ALL", "all", 1, (0,))],
)
def test_gpu_selection(gpus: Any, expected: Any, available: int, selected: tuple[int, ...]) -> None:
    queue = parse_queue({"gpus": gpus, "experiments": [_experiment()]}, "q.yaml")
    assert queue.gpus == expected
    assert queue.select_gpus(available) == selected


@pytest.mark.parametrize(("gpus", "selected"), [("all", (0,)), (3, (0, 1, 2)), ([1, 4], (1, 4))])
def test_logical_gpus_without_a_visible_gpu(gpus: Any, selected: tuple[int, ...]) -> None:
    queue = parse_queue({"gpus": gpus, "device_memory": "96GiB", "experiments": [_experiment()]}, "q.yaml")
    assert queue.select_gpus(0) == selected


@pytest.mark.parametrize(
    ("gpus", "available", "match"), [(4, 2, "asks for 4 GPUs"), ([0, 3], 2, "GPU 3"), ("all", 0, "no GPU")]
)
def test_gpu_selection_beyond_the_visible(gpus: Any, available: int, match: str) -> None:
    queue = parse_queue({"gpus": gpus, "experiments": [_experiment()]}, "q.yaml")
    with pytest.raises(ConfigError, match=match) as err:
        queue.select_gpus(available)
    _one_line(err)


@pytest.mark.parametrize("reserve", [0, "0", "0GiB", "0.0 MiB"])
def test_zero_reserve(reserve: Any) -> None:
    assert parse_queue({"reserve": reserve, "experiments": [_experiment()]}, "q.yaml").reserve_bytes == 0


def test_experiment_lookup() -> None:
    queue = parse_queue({"experiments": [_experiment(), _experiment(name="run-b")]}, "q.yaml")
    assert queue.experiment("run-b").index == 1
    with pytest.raises(ConfigError, match=r"no experiment named 'zz'.*run-a, run-b"):
        queue.experiment("zz")


# ---------------------------------------------------------------------------------------------
# Durations.


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        (90, 90.0),
        (1.5, 1.5),
        ("90", 90.0),
        ("90s", 90.0),
        ("30m", 1800.0),
        ("2h", 7200.0),
        ("1d", 86400.0),
        ("1.5h", 5400.0),
        ("1h30m", 5400.0),
        ("1h 30m 10s", 5410.0),
        ("45 min", 2700.0),
        ("2 hours", 7200.0),
        ("10S", 10.0),
    ],
)
def test_parse_duration(text: Any, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "abc", "2x", "h", "-5", "0", 0, -1, True, None, "1h-30m", "1e999", float("inf")])
def test_parse_duration_rejects(text: Any) -> None:
    with pytest.raises(ConfigError) as err:
        parse_duration(text)
    assert "duration" in _one_line(err)


# ---------------------------------------------------------------------------------------------
# Bad input: one line each, naming the file, the experiment and the key.

BAD: list[tuple[str, dict[str, Any], list[str]]] = [
    (
        "unknown top-level key",
        {"gpu": 1, "experiments": [_experiment()]},
        ["unknown top-level key 'gpu'", "valid keys: gpus"],
    ),
    ("family key", {"family": "gpt", "experiments": [_experiment()]}, ["'family'", "example"]),
    (
        "unknown experiment key",
        {"experiments": [_experiment(batch_size=3)]},
        ["experiment 'run-a'", "'batch_size'", "global_batch"],
    ),
    ("missing name", {"experiments": [{"command": "python x.py"}]}, ["experiments[0]", "no name"]),
    ("bad name", {"experiments": [_experiment(name="a b")]}, ["experiments[0]", "name='a b'"]),
    ("numeric name", {"experiments": [_experiment(name=12)]}, ["name=12", "quote"]),
    ("missing command", {"experiments": [{"name": "x"}]}, ["experiment 'x'", "no command"]),
    ("empty command list", {"experiments": [_experiment(command=[])]}, ["experiment 'run-a'", "command is empty"]),
    ("empty command string", {"experiments": [_experiment(command="  ")]}, ["command is empty"]),
    ("unbalanced quotes", {"experiments": [_experiment(command="python 'x.py")]}, ["cannot be split"]),
    ("nested command", {"experiments": [_experiment(command=["python", ["x"]])]}, ["not a string"]),
    ("command mapping", {"experiments": [_experiment(command={"a": 1})]}, ["not a list or a string"]),
    ("duplicate names", {"experiments": [_experiment(), _experiment()]}, ["'run-a' appears twice", "[0] and [1]"]),
    ("fraction zero", {"experiments": [_experiment(fraction=0)]}, ["experiment 'run-a'", "fraction=0", "(0, 1]"]),
    ("fraction above one", {"experiments": [_experiment(fraction=1.2)]}, ["fraction=1.2"]),
    ("fraction string", {"experiments": [_experiment(fraction="half")]}, ["fraction='half'"]),
    ("batch zero", {"experiments": [_experiment(batch=0)]}, ["batch=0", "positive integer"]),
    ("batch negative", {"experiments": [_experiment(batch=-4)]}, ["batch=-4"]),
    ("batch float", {"experiments": [_experiment(batch=2.5)]}, ["batch=2.5"]),
    ("batch bool", {"experiments": [_experiment(batch=True)]}, ["batch=True"]),
    (
        "global batch not a multiple",
        {"experiments": [_experiment(batch=24, global_batch=64)]},
        ["global_batch=64", "multiple of batch=24"],
    ),
    ("global batch smaller", {"experiments": [_experiment(batch=64, global_batch=32)]}, ["global_batch=32"]),
    (
        "global batch auto",
        {"experiments": [_experiment(global_batch="auto")]},
        ["global_batch='auto'", "a positive integer"],
    ),
    ("global batch zero", {"experiments": [_experiment(global_batch=0)]}, ["global_batch=0"]),
    ("negative retries", {"experiments": [_experiment(retries=-1)]}, ["retries=-1", ">= 0"]),
    ("priority float", {"experiments": [_experiment(priority=1.5)]}, ["priority=1.5"]),
    ("bad timeout", {"experiments": [_experiment(timeout="2 fortnights")]}, ["timeout='2 fortnights'", "duration"]),
    ("zero timeout", {"experiments": [_experiment(timeout=0)]}, ["timeout=0", "positive"]),
    ("env not a mapping", {"experiments": [_experiment(env=["A=1"])]}, ["env=", "not a mapping"]),
    ("env bad name", {"experiments": [_experiment(env={"1A": "x"})]}, ["env key '1A'"]),
    ("env bool", {"experiments": [_experiment(env={"FLAG": True})]}, ["env FLAG=True", "quote"]),
    (
        "env sets the fraction",
        {"experiments": [_experiment(env={"XLA_CLIENT_MEM_FRACTION": 0.5})]},
        ["env XLA_CLIENT_MEM_FRACTION is the scheduler's to set", "write fraction: 0.5 instead"],
    ),
    (
        "env allocator without a limit",
        {"experiments": [_experiment(env={"XLA_PYTHON_CLIENT_ALLOCATOR": "platform"})]},
        ["XLA_PYTHON_CLIENT_ALLOCATOR=platform", "no cap", "remove it"],
    ),
    ("experiment not a mapping", {"experiments": ["python x.py"]}, ["experiments[0] is str"]),
    ("no experiments key", {"gpus": 1}, ["no experiments"]),
    ("empty experiments", {"experiments": []}, ["no experiments"]),
    ("experiments mapping", {"experiments": {"a": 1}}, ["is not a list"]),
    ("bad reserve", {"reserve": "12XB", "experiments": [_experiment()]}, ["reserve='12XB'", "memory size"]),
    ("negative reserve", {"reserve": -5, "experiments": [_experiment()]}, ["reserve=-5", "0 or more"]),
    ("negative reserve string", {"reserve": "-1GiB", "experiments": [_experiment()]}, ["reserve='-1GiB'", "0 or more"]),
    ("reserve bool", {"reserve": True, "experiments": [_experiment()]}, ["reserve=True"]),
    (
        "reserve above memory",
        {"reserve": "100GiB", "device_memory": "96GiB", "experiments": [_experiment()]},
        ["lower the reserve"],
    ),
    ("bad device memory", {"device_memory": "lots", "experiments": [_experiment()]}, ["device_memory='lots'"]),
    ("zero device memory", {"device_memory": 0, "experiments": [_experiment()]}, ["device_memory=0"]),
    (
        "bad overhead",
        {"process_overhead": "618 apples", "experiments": [_experiment()]},
        ["process_overhead='618 apples'"],
    ),
    ("gpus zero", {"gpus": 0, "experiments": [_experiment()]}, ["gpus=0", "at least 1"]),
    ("gpus empty list", {"gpus": [], "experiments": [_experiment()]}, ["gpus=[]"]),
    ("gpus negative index", {"gpus": [0, -1], "experiments": [_experiment()]}, ["-1", "GPU index"]),
    ("gpus repeated", {"gpus": [1, 1], "experiments": [_experiment()]}, ["GPU 1 twice"]),
    ("gpus word", {"gpus": "some", "experiments": [_experiment()]}, ["gpus='some'"]),
]


@pytest.mark.parametrize(("data", "expected"), [(d, e) for _, d, e in BAD], ids=[i for i, _, _ in BAD])
def test_bad_queue_raises_one_line(data: dict[str, Any], expected: list[str]) -> None:
    with pytest.raises(ConfigError) as err:
        parse_queue(data, "bad-queue.yaml")
    message = _one_line(err)
    assert message.startswith("bad-queue.yaml"), message
    for part in expected:
        assert part in message, (part, message)


def test_second_experiment_is_named_in_messages() -> None:
    data = {"experiments": [_experiment(), _experiment(name="run-b", fraction=3)]}
    with pytest.raises(ConfigError, match=r"experiment 'run-b': fraction=3") as err:
        parse_queue(data, "q.yaml")
    _one_line(err)
    with pytest.raises(ConfigError, match=r"experiments\[1\]") as err:
        parse_queue({"experiments": [_experiment(), {"command": "x"}]}, "q.yaml")
    _one_line(err)


def test_valid_key_lists_are_complete() -> None:
    assert set(TOP_LEVEL_KEYS) == {"gpus", "reserve", "device_memory", "process_overhead", "experiments"}
    assert set(EXPERIMENT_KEYS) == {
        "name",
        "command",
        "batch",
        "fraction",
        "global_batch",
        "retries",
        "priority",
        "timeout",
        "env",
        "gpus",
    }


def test_an_experiment_on_several_gpus() -> None:
    queue = parse_queue({"experiments": [_experiment(gpus=2), _experiment(name="b")]}, "q.yaml")
    assert [e.gpus for e in queue.experiments] == [2, 1]
    assert queue.experiments[0].to_dict()["gpus"] == 2
    for bad in (0, "two", 1.5):
        with pytest.raises(ConfigError, match=r"gpus=.* must be an integer >= 1") as err:
            parse_queue({"experiments": [_experiment(gpus=bad)]}, "q.yaml")
        _one_line(err)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("experiments: [\n", "not valid YAML (line"),
        ("- a\n- b\n", "must be a mapping"),
        ("", "empty"),
        ("just a string\n", "must be a mapping"),
    ],
)
def test_bad_files(tmp_path: Path, text: str, expected: str) -> None:
    path = tmp_path / "queue.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as err:
        load_queue(path)
    message = _one_line(err)
    assert str(path) in message and expected in message


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read queue file") as err:
        load_queue(tmp_path / "nope.yaml")
    _one_line(err)


def test_load_queue_reads_yaml(tmp_path: Path) -> None:
    path = tmp_path / "q.yaml"
    path.write_text(
        "gpus: [0]\nreserve: 1GiB\nexperiments:\n"
        "  - name: a\n    command: python scripts/train.py debug --exp-name=a\n    batch: 8\n"
        "    global_batch: 32\n    timeout: 90s\n"
    )
    queue = load_queue(path)
    assert queue.gpus == (0,) and queue.reserve_bytes == GiB
    (e,) = queue.experiments
    assert e.command[-1] == "--exp-name=a" and e.batch == 8 and e.global_batch == 32 and e.timeout == 90.0
