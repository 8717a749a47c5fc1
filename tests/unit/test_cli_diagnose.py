"""`trainguard diagnose` as a person and a script use it: JSON contract, languages, bad input."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.conftest import trainguard_cmd
from trainguard.errors import InputError
from trainguard.probes.log_files import open_log

OOM_LINE = "RuntimeError: CUDA out of memory. Tried to allocate 7.74 GiB (GPU 0; 23.69 GiB total capacity)\n"


def run(*args: str, stdin: bytes | None = None, env: dict | None = None, stdin_from=None, **kwargs
        ) -> subprocess.CompletedProcess:  # fmt: skip
    environment = {k: v for k, v in os.environ.items() if k not in ("LANG", "LC_ALL", "LC_MESSAGES")}
    environment.update(env or {})
    if stdin_from is not None:
        kwargs["stdin"] = stdin_from
    return subprocess.run(
        [*trainguard_cmd(), "diagnose", *args],
        input=stdin,
        capture_output=True,
        env=environment,
        check=False,
        **{"timeout": 120, **kwargs},
    )


def one_line_error(done: subprocess.CompletedProcess) -> str:
    assert done.returncode == 2, done
    err = done.stderr.decode()
    assert err.count("\n") == 1 and err.startswith("trainguard: "), err
    assert "Traceback" not in err
    return err


def test_json_output_has_exactly_the_contract_fields(tmp_path: Path) -> None:
    log = tmp_path / "train.log"
    log.write_text("step 1\n" + OOM_LINE)
    done = run(str(log), "--json", "--exit-code", "1")
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert set(result) == {"cause", "confidence", "title", "evidence", "fixes", "alternatives"}
    assert result["cause"] == "cuda_oom" and 0 < result["confidence"] <= 1
    assert result["evidence"][0] == {"source": "log", "line": 2, "text": OOM_LINE.strip()}
    assert {e["source"] for e in result["evidence"]} <= {"log", "kernel", "exit", "telemetry"}
    assert all(isinstance(f, str) for f in result["fixes"])
    for alternative in result["alternatives"]:
        assert set(alternative) == {"cause", "confidence"}


def test_the_example_log_is_diagnosed_as_the_oom_of_rank_1() -> None:
    result = json.loads(run("--example", "--json").stdout)
    assert result["cause"] == "cuda_oom"
    assert "[rank1]" in result["evidence"][0]["text"]


def test_chinese_by_flag_and_by_lang(tmp_path: Path) -> None:
    log = tmp_path / "train.log"
    log.write_text(OOM_LINE)
    by_flag = json.loads(run(str(log), "--json", "--lang", "zh").stdout)
    by_env = json.loads(run(str(log), "--json", env={"LANG": "zh_CN.UTF-8"}).stdout)
    assert by_flag["title"] == by_env["title"] == "GPU 显存不足（「CUDA out of memory」）"
    human = run(str(log), env={"LANG": "zh_CN.UTF-8"}).stdout.decode()
    assert "证据" in human and "怎么办" in human


def test_human_output_shows_evidence_with_line_number_then_the_fix(tmp_path: Path) -> None:
    log = tmp_path / "train.log"
    log.write_text("step 1\nstep 2\n" + OOM_LINE)
    out = run(str(log)).stdout.decode()
    assert out.index("Evidence") < out.index("log:3") < out.index("What to do")


def test_stdin_and_several_rank_logs(tmp_path: Path) -> None:
    assert json.loads(run("-", "--json", stdin=OOM_LINE.encode()).stdout)["cause"] == "cuda_oom"
    rank0 = tmp_path / "rank0.log"
    rank1 = tmp_path / "rank1.log"
    rank0.write_text(
        "[E ProcessGroupNCCL.cpp:737] [Rank 0] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=4)\n"
    )
    rank1.write_text(OOM_LINE)
    result = json.loads(run(str(rank0), str(rank1), "--json").stdout)
    assert result["cause"] == "cuda_oom"
    assert result["evidence"][0]["file"] == str(rank1)


def test_a_saved_kernel_log_makes_a_bare_killed_certain(tmp_path: Path) -> None:
    log = tmp_path / "train.log"
    log.write_text("bash: line 1: 31337 Killed                  python train.py\n")
    dmesg = tmp_path / "dmesg.txt"
    dmesg.write_text(
        "[  208.699161] oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset=/,mems_allowed=0,task=python,pid=31337,uid=0\n"
        "[  208.699178] Memory cgroup out of memory: Killed process 31337 (python) total-vm:82132kB, anon-rss:65152kB\n"
    )
    bare = json.loads(run(str(log), "--json").stdout)
    certain = json.loads(run(str(log), "--json", "--kernel-log", str(dmesg)).stdout)
    assert bare["cause"] == certain["cause"] == "host_oom"
    assert bare["confidence"] < 0.7
    assert certain["confidence"] >= 0.99
    assert any(e["source"] == "kernel" for e in certain["evidence"])


def test_unreadable_input_is_one_line_and_exit_2(tmp_path: Path) -> None:
    missing = one_line_error(run(str(tmp_path / "missing.log")))
    assert "no such file" in missing and "no run has that name" in missing
    dangling = tmp_path / "dangling.log"
    dangling.symlink_to(tmp_path / "gone.log")
    assert "no such file" in one_line_error(run(str(dangling))).lower()
    assert "is a directory" in one_line_error(run(str(tmp_path)))
    model = tmp_path / "model.bin"
    model.write_bytes(bytes(range(256)) * 400)
    assert "binary" in one_line_error(run(str(model)))


def test_a_fifo_or_a_device_is_refused_and_never_read_for_ever(tmp_path: Path) -> None:
    """`diagnose /dev/zero` spun for ever, a FIFO without a writer blocked for ever, and so did
    `diagnose - < /dev/zero`, each of them as a log and as --kernel-log."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    log = tmp_path / "train.log"
    log.write_text("step 1\nKilled\n")
    for target in (str(fifo), "/dev/zero"):
        assert "not a regular file" in one_line_error(run(target, timeout=20))
        assert "not a regular file" in one_line_error(run(str(log), "--kernel-log", target, timeout=20))
    with open("/dev/zero", "rb") as zeros:
        assert "is a device" in one_line_error(run("-", stdin=None, stdin_from=zeros))
    assert "binary" in one_line_error(run("-", stdin=b"\x00" * 200_000))


def test_a_kernel_log_that_holds_no_kernel_line_is_refused_not_read_as_no_oom_kill(tmp_path: Path) -> None:
    """As a user without root `dmesg > FILE` writes an empty file: read as a kernel log with no OOM
    kill, it turned a host OOM's `Killed` into someone's kill -9."""
    log = tmp_path / "train.log"
    log.write_text("step 100 loss 0.3\nKilled\n")
    empty, garbage, saved = tmp_path / "empty.txt", tmp_path / "garbage.txt", tmp_path / "dmesg.txt"
    empty.touch()
    garbage.write_bytes(os.urandom(200_000))
    saved.write_text("[ 4711.123456] Out of memory: Killed process 4242 (python) total-vm:1024kB\n")
    for bad in (empty, garbage):
        error = one_line_error(run(str(log), "--exit-code", "137", "--kernel-log", str(bad)))
        assert "holds no kernel log line" in error and "sudo dmesg -T" in error
    read = json.loads(run(str(log), "--exit-code", "137", "--kernel-log", str(saved), "--json").stdout)
    assert read["cause"] == "host_oom" and read["confidence"] >= 0.8


def test_a_file_without_read_permission(tmp_path: Path) -> None:
    log = tmp_path / "secret.log"
    log.write_text("x\n")
    log.chmod(0)
    if os.geteuid() != 0:
        assert "Permission denied" in one_line_error(run(str(log)))
        return
    # Root reads every file (and nobody cannot run this interpreter under /root), so a forked child
    # drops to nobody and opens the file through the same adapter the command uses.
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        os.close(read_end)
        os.setgid(65534)
        os.setuid(65534)
        try:
            open_log(str(log))
            message = "opened"
        except InputError as exc:
            message = exc.message_en
        os.write(write_end, message.encode())
        os._exit(0)
    os.close(write_end)
    os.waitpid(pid, 0)
    with os.fdopen(read_end) as reader:
        assert reader.read() == f"cannot read {log}: Permission denied"


def test_unreadable_saved_kernel_log_and_bad_exit_codes(tmp_path: Path) -> None:
    log = tmp_path / "train.log"
    log.write_text(OOM_LINE)
    assert "kernel log" in one_line_error(run(str(log), "--kernel-log", str(tmp_path / "nope")))
    for bad in ("abc", "256", "-70", "1.5", ""):
        assert "--exit-code" in one_line_error(run(str(log), "--exit-code", bad))


def test_usage_errors_are_one_line(home: Path) -> None:
    assert "--bogus" in one_line_error(run("--bogus"))
    assert "--lang" in one_line_error(run("x", "--lang", "fr"))
    zh = one_line_error(run("/nonexistent/x.log", env={"LANG": "zh_CN.UTF-8"}))
    assert "文件不存在" in zh


def test_readable_but_odd_logs_get_a_diagnosis(tmp_path: Path) -> None:
    empty = tmp_path / "empty.log"
    empty.write_bytes(b"")
    assert json.loads(run(str(empty), "--json").stdout)["cause"] == "unknown"

    latin1 = tmp_path / "latin1.log"
    latin1.write_bytes("Epoch 1 — précision 0.9\n".encode("latin-1", "replace") + b"\xff\xfe\n" + OOM_LINE.encode())
    assert json.loads(run(str(latin1), "--json").stdout)["cause"] == "cuda_oom"

    one_line = tmp_path / "progress.log"
    with one_line.open("wb") as handle:
        handle.write(b"\r 1%|#| 1/100" * 4_000_000)  # ~52 MB, no newline at all
        handle.write(b"\rRuntimeError: CUDA error: an illegal memory access was encountered")
    done = run(str(one_line), "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["cause"] == "cuda_illegal_access"

    nul_tail = tmp_path / "crashed.log"
    nul_tail.write_bytes(b"step 1\n" * 20_000 + OOM_LINE.encode() + b"\x00" * 4096)
    assert json.loads(run(str(nul_tail), "--json").stdout)["cause"] == "cuda_oom"


def test_a_reader_that_leaves_early_is_not_an_error() -> None:
    """`trainguard diagnose LOG | head`: the pipe closes before the output ends; exit 0, no noise."""
    for command in ("diagnose --example", "doctor --only swap,shm_size"):
        done = subprocess.run(["bash", "-c", f"set -o pipefail; {sys.executable} -m trainguard {command} | head -c 10"],
                              capture_output=True, text=True, timeout=120, check=False)  # fmt: skip
        assert done.returncode == 0 and done.stderr == "", (command, done.returncode, done.stderr)


def test_an_output_that_cannot_be_written_is_one_line_not_a_traceback(tmp_path: Path) -> None:
    """`trainguard logs RUN > saved.log` on a full disk: /dev/full is such a disk."""
    env = {**os.environ, "TRAINGUARD_HOME": str(tmp_path / "state")}
    for command in (["diagnose", "--example"], ["diagnose", "--example", "--json"], ["ps"], ["ps", "--json"],
                    ["doctor", "--only", "swap"], ["--help"]):  # fmt: skip
        with open("/dev/full", "w") as full:
            done = subprocess.run([*trainguard_cmd(), *command], stdout=full, stderr=subprocess.PIPE, text=True,
                                  env=env, timeout=120, check=False)  # fmt: skip
        assert done.returncode == 1, (command, done.stderr)
        assert done.stderr == "trainguard: cannot write the output: No space left on device\n", (command, done.stderr)


def test_a_large_log_file_gets_the_same_diagnosis_as_the_same_log_on_stdin(tmp_path: Path) -> None:
    # A file of this size is scanned in ranges by several processes where the machine has the
    # cores; standard input is read in one pass. Lines, evidence and numbers must be the same.
    chatter = (
        b"Epoch 1:  10%|#         | 1000/10000 [01:23<10:12, 14.3it/s, loss=0.4123]\r"
        b"Epoch 1:  10%|#         | 1001/10000 [01:23<10:12, 14.3it/s, loss=0.4120]\n"
        b"gpu-node-07:1402:1405 [3] NCCL WARN NET/IB : Got async event : GID table change\n"
        b"2026-11-29 02:13:55,412 INFO [trainer.py:412] step=1000 loss=0.41230 grad_norm=1.234\n"
    )
    body = chatter * (20 * 1024 * 1024 // len(chatter))
    log = tmp_path / "train.log"
    log.write_bytes(body[: len(body) // 3] + OOM_LINE.encode() + body + OOM_LINE.encode() + b"Killed\n")
    from_file = run(str(log), "--json")
    from_stdin = run("-", "--json", stdin=log.read_bytes())
    assert from_file.returncode == 0, from_file.stderr
    assert json.loads(from_file.stdout) == json.loads(from_stdin.stdout)
    lines = [e["line"] for e in json.loads(from_file.stdout)["evidence"] if "CUDA out of memory" in e["text"]]
    assert lines[-1] == log.read_bytes().count(b"\n") - 1


def test_a_log_that_ends_with_no_error_says_what_its_silence_means(tmp_path: Path) -> None:
    silent = tmp_path / "train.log"
    silent.write_text("".join(f"epoch 1 step {n} loss 0.{n}\n" for n in range(1, 50)))
    found = json.loads(run(str(silent), "--json").stdout)
    # No verdict: of the corpus logs with no error line, fewer than a third were hangs.
    assert (found["cause"], found["confidence"]) == ("unknown", 0.0)
    assert [a["cause"] for a in found["alternatives"]][:2] == ["hang", "host_oom"]
    assert "py-spy dump" in found["evidence"][0]["note"] and found["evidence"][0]["line"] is None
    assert "py-spy dump" in run(str(silent), "--lang", "zh").stdout.decode()  # the command, inside Chinese text
    assert "日志结束时没有任何报错行" in run(str(silent), "--lang", "zh").stdout.decode()

    # The job's end was seen (its exit status), or a line names a failure: the silence says nothing.
    ended = json.loads(run(str(silent), "--json", "--exit-code", "137").stdout)
    assert ended["cause"] == "host_oom" and all(e["source"] != "log" for e in ended["evidence"])
    with silent.open("a") as log:
        log.write("Traceback (most recent call last):\nKeyError: 'labels'\n")
    failed = json.loads(run(str(silent), "--json").stdout)
    assert failed["cause"] == "python_error" and "hang" not in [a["cause"] for a in failed["alternatives"]]


def test_a_log_with_a_crash_s_nul_bytes_is_read_not_refused_as_binary(tmp_path: Path) -> None:
    # A writer killed mid-write leaves the file extended with NULs (8 KB in the first 64 KB here).
    log = tmp_path / "train.log"
    log.write_bytes(b"step 1 loss 2.3\n" * 10 + b"\x00" * 8192 + b"step 2 loss 2.2\n"
                    + b"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity"
                    b" of 79.10 GiB of which 1.06 GiB is free.\n")  # fmt: skip
    done = run(str(log), "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["cause"] == "cuda_oom"
    only_nuls = tmp_path / "empty.log"
    only_nuls.write_bytes(b"\x00" * 70000)
    assert run(str(only_nuls), "--json").returncode == 0


def test_an_empty_standard_input_is_a_one_line_error_not_a_verdict(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "trainguard", "diagnose"], input=b"", capture_output=True, check=False)
    assert done.returncode == 2 and b"empty" in done.stderr and len(done.stderr.strip().splitlines()) == 1
    judged = run("-", "--exit-code", "137", "--json", stdin=b"")  # the exit status alone is something to judge
    assert judged.returncode == 0, judged.stderr
