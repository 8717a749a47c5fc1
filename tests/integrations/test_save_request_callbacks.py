"""The Hugging Face and Lightning callbacks obey a save request (issue 20): "then": "continue" makes
the framework save at the end of the current step and train on, "then": "stop" saves and stops as
SIGUSR1 does; ``save_request_done`` is reported once the framework's save returned. Driven here
through stand-ins of the frameworks' classes (the callbacks touch only the attributes used below), so
this runs without transformers or lightning; the real frameworks are tests/integrations/test_frameworks.py."""

from __future__ import annotations

import importlib
import json
import sys
import time
import types
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.checkpoint.test_save_requests import write_request
from trainguard import progress

FAKES = {
    "transformers": {"TrainerCallback": type("TrainerCallback", (), {})},
    "lightning": {},
    "lightning.pytorch": {},
    "lightning.pytorch.callbacks": {
        "Callback": type("Callback", (), {}),
        "ModelCheckpoint": type("ModelCheckpoint", (), {}),
    },
}
ADAPTERS = ("trainguard.integrations.huggingface", "trainguard.integrations.lightning")


@pytest.fixture
def adapters(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[types.ModuleType, types.ModuleType]]:
    """Both adapter modules imported against the stand-ins, and the request and progress files."""
    saved = {name: sys.modules.get(name) for name in (*FAKES, *ADAPTERS, "pytorch_lightning")}
    for name, attributes in FAKES.items():
        sys.modules[name] = types.SimpleNamespace(**attributes)
    sys.modules.pop("pytorch_lightning", None)
    for name in ADAPTERS:
        sys.modules.pop(name, None)
    monkeypatch.setenv("TRAINGUARD_SAVE_REQUEST_FILE", str(tmp_path / "request.json"))
    monkeypatch.setenv("TRAINGUARD_PROGRESS_FILE", str(tmp_path / "progress.json"))
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.setattr(progress, "_record", {})
    try:
        yield importlib.import_module(ADAPTERS[0]), importlib.import_module(ADAPTERS[1])
    finally:
        for name, module in saved.items():
            if module is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = module


def reported(tmp_path: Path) -> dict:
    return json.loads((tmp_path / "progress.json").read_text())


def ask(tmp_path: Path, request_id: int, then: str) -> None:
    write_request(tmp_path / "request.json", request_id, then)
    time.sleep(0.6)  # the file is looked at every 0.5 s


def test_the_hf_callback_saves_on_a_request_and_trains_on_then_stops_on_one_that_says_so(
    tmp_path: Path, adapters
) -> None:
    huggingface, _ = adapters
    callback = huggingface.TrainguardCallback(exit_after_save=False)
    state, args = SimpleNamespace(global_step=0), SimpleNamespace()
    callback.on_train_begin(args, state, SimpleNamespace())

    def step(n: int) -> SimpleNamespace:
        state.global_step = n
        control = SimpleNamespace(should_save=False, should_training_stop=False)
        callback.on_step_end(args, state, control)
        if control.should_save:  # what Trainer._maybe_log_save_evaluate does, then its on_save
            callback.on_save(args, state, control)
        return control

    assert not step(1).should_save
    ask(tmp_path, 1, "continue")
    control = step(2)
    assert control.should_save and not control.should_training_stop
    assert (reported(tmp_path)["save_request_done"], reported(tmp_path)["save_request_step"]) == (1, 2)
    assert not step(3).should_save
    ask(tmp_path, 2, "stop")
    control = step(4)
    assert control.should_save and control.should_training_stop
    assert callback.stopped and callback.stop_signal == 10
    assert reported(tmp_path)["save_request_done"] == 2 and reported(tmp_path)["stop_signal"] == 10
    callback.on_train_end(args, state, control)


def test_the_lightning_callback_saves_a_ckpt_on_a_request_and_trains_on_then_stops(tmp_path: Path, adapters) -> None:
    _, lightning = adapters
    callback = lightning.TrainguardCallback(exit_after_save=False)
    decisions = []

    def decide(value: bool, all: bool) -> bool:  # every rank's vote: here the only rank's
        decisions.append(value)
        return value

    trainer = SimpleNamespace(global_step=0, current_epoch=0, callbacks=[], default_root_dir=str(tmp_path),
                              strategy=SimpleNamespace(reduce_boolean_decision=decide), should_stop=False,
                              save_checkpoint=lambda path: Path(path).write_bytes(b"ckpt"))  # fmt: skip
    callback.on_fit_start(trainer, None)

    def batch(n: int) -> None:
        trainer.global_step = n
        callback.on_train_batch_end(trainer, None, None, None, n)

    batch(1)
    assert decisions == [False]  # an ordinary batch: one collective, as before
    ask(tmp_path, 1, "continue")
    batch(2)
    assert (tmp_path / "epoch=0-step=2.ckpt").exists() and not trainer.should_stop
    assert reported(tmp_path)["save_request_done"] == 1
    ask(tmp_path, 2, "stop")
    batch(3)
    assert (tmp_path / "epoch=0-step=3.ckpt").exists() and trainer.should_stop
    assert callback.stopped and callback.stop_signal == 10
    assert (reported(tmp_path)["save_request_done"], reported(tmp_path)["save_request_step"]) == (2, 3)
    callback.teardown(trainer, None, "fit")
