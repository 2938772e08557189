"""The command line: fast --help, documented options, one-line errors naming what the user typed."""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from gp_couple import settings
from gp_couple.cli import _MALLOC_VARIABLES, COMMANDS, _on_glibc, as_typed, build_parser, error_line, main


def subcommand_parsers() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def test_top_level_help_imports_no_heavy_module() -> None:
    code = ("import sys\nfrom gp_couple.cli import main\ntry:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
            "print(sorted(m for m in ('torch', 'gpytorch', 'numba', 'scipy', 'matplotlib') if m in sys.modules))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().endswith("[]"), result.stdout
    for name in COMMANDS:
        assert name in result.stdout


def _transparent_huge_pages_mode() -> str | None:
    try:
        modes = Path("/sys/kernel/mm/transparent_hugepage/enabled").read_text()
    except OSError:
        return None
    chosen = re.search(r"\[(\w+)\]", modes)
    return chosen.group(1) if chosen else None


def _after_main(body: str, *, unset: tuple[str, ...], user: dict[str, str] | None = None,
                as_program: bool = False) -> list[str]:
    """Words of what ``body`` prints in a fresh interpreter once ``gp_couple.cli.main`` has set up
    the process for ``--help``, run as the program (no argv) or called with arguments, with
    the environment variables ``unset`` removed and ``user``'s set."""
    call = "sys.argv = ['gp-couple', '--help']\n    main()" if as_program else "main(['--help'])"
    code = f"import os, sys\nfrom gp_couple.cli import main\ntry:\n    {call}\nexcept SystemExit:\n    pass\n{body}"
    env = {name: value for name, value in os.environ.items() if name not in unset}
    env.update(user or {})
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert result.returncode == 0, result.stderr[-2000:]
    return result.stdout.split()


@pytest.mark.skipif(_transparent_huge_pages_mode() != "madvise",
                    reason="needs Linux transparent huge pages in madvise mode (the mode where a process must ask)")
@pytest.mark.parametrize("user_value", [None, "0"])
def test_commands_back_large_tensors_with_huge_pages_unless_the_user_says_otherwise(user_value: str | None) -> None:
    # main() sets the allocator's switch before torch loads; a 64 MB tensor made afterwards in
    # the same process is then backed by 2 MB pages (AnonHugePages), and a value the user set
    # is kept.
    body = ("import re, torch\nx = torch.ones(1 << 24)\nrollup = open('/proc/self/smaps_rollup').read()\n"
            "print(os.environ.get('THP_MEM_ALLOC_ENABLE'), "
            "int(re.search(r'AnonHugePages:\\s+(\\d+)', rollup).group(1)))")
    words = _after_main(body, unset=("THP_MEM_ALLOC_ENABLE",),
                        user=None if user_value is None else {"THP_MEM_ALLOC_ENABLE": user_value})
    value, huge_kb = words[-2:]
    if user_value is None:
        assert value == "1" and int(huge_kb) >= 32 * 1024, words[-2:]
    else:
        assert value == user_value and int(huge_kb) < 32 * 1024, words[-2:]


def _gnu_openmp_torch() -> bool:
    """Whether torch's intra-op threads are GNU OpenMP's (Linux wheels): GOMP_SPINCOUNT applies."""
    import torch

    return sys.platform.startswith("linux") and "OpenMP" in torch.__config__.parallel_info()


@pytest.mark.skipif(not hasattr(os, "sched_getaffinity") or len(os.sched_getaffinity(0)) < 2,
                    reason="needs two CPUs for a two-thread pool")
@pytest.mark.skipif(not _gnu_openmp_torch(), reason="torch's thread pool is not GNU OpenMP's")
@pytest.mark.parametrize("user_policy", [None, "PASSIVE"])
def test_commands_let_openmp_workers_spin_briefly_unless_the_user_sets_a_policy(user_policy: str | None) -> None:
    # After main() sets up the process, batches of 300 back-to-back parallel regions of a
    # two-thread pool. A worker that sleeps at once (the user's PASSIVE policy, which is
    # kept) sleeps after every region, so every batch costs at least 300 voluntary context
    # switches. A worker that spins briefly finds the next region before it sleeps, unless
    # other processes took a CPU: the quietest of up to 200 short batches (a few
    # milliseconds each, so some run between two preemptions on a loaded test machine;
    # it stops at the first quiet one) shows it. Where other work keeps every CPU busy
    # throughout (the commands then run on one thread: settings.threads_for_load), no batch
    # is quiet and the check skips.
    body = ("import torch\ntorch.set_num_threads(2)\nx = torch.ones(1 << 18)\n"
            "def switches():\n    return sum(int(line.split()[1]) for task in os.listdir('/proc/self/task')\n"
            "               for line in open(f'/proc/self/task/{task}/status')\n"
            "               if line.startswith('voluntary_ctxt_switches'))\n"
            "for _ in range(200):\n    x.add_(1.0)\ncounts = []\nfor _ in range(200):\n"
            "    before = switches()\n    for _ in range(300):\n        x.add_(1.0)\n"
            "    counts.append(switches() - before)\n    if counts[-1] < 150:\n        break\n"
            "from gp_couple.settings import threads_for_load\n"
            "print(os.environ.get('OMP_WAIT_POLICY'), os.environ.get('GOMP_SPINCOUNT'), min(counts), "
            "threads_for_load())")
    words = _after_main(body, unset=("OMP_WAIT_POLICY", "GOMP_SPINCOUNT"),
                        user=None if user_policy is None else {"OMP_WAIT_POLICY": user_policy})
    policy, spin_count, quietest, busy_threads = words[-4:]
    assert policy == "PASSIVE", words[-4:]
    if user_policy is None:
        assert spin_count == "1000", words[-4:]
        if int(quietest) >= 150 and busy_threads == "1":
            pytest.skip("other work kept every CPU busy: no parallel region could follow another undisturbed")
        assert int(quietest) < 150, words[-4:]
    else:
        assert spin_count == "None" and int(quietest) >= 300, words[-4:]


@pytest.mark.skipif(not _on_glibc(), reason="the allocator setting is glibc's")
@pytest.mark.parametrize(("as_program", "user_setting"), [(True, None), (True, "65536"), (False, None)])
def test_the_command_process_reuses_freed_memory_unless_the_user_tuned_malloc(as_program: bool,
                                                                               user_setting: str | None) -> None:
    # main() run as the program (no argv) has glibc reuse freed blocks: 64 MB tensors made
    # and freed one after another fault in no fresh page once the heap has settled (the
    # first few grow it, while small blocks made between them take parts of the freed
    # ones; measured settled within 8). With the user's MALLOC_MMAP_MAX_ (here glibc's
    # default), or with main() called with arguments in a caller's process, malloc is left
    # alone: each block is a fresh mapping that faults in at least 32 pages (of 2 MB; more
    # of 4 kB).
    body = ("import resource, torch\nfor _ in range(30):\n    torch.ones(1 << 24)\n"
            "before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt\n"
            "for _ in range(10):\n    torch.ones(1 << 24)\n"
            "print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)")
    words = _after_main(body, as_program=as_program,
                        unset=_MALLOC_VARIABLES,
                        user=None if user_setting is None else {"MALLOC_MMAP_MAX_": user_setting})
    faults = int(words[-1])
    if as_program and user_setting is None:
        assert faults < 32, faults
    else:
        assert faults >= 10 * 32, faults


def test_command_help_and_argument_errors_import_no_torch() -> None:
    # python -X importtime lists every module the interpreter imported, on stderr.
    result = subprocess.run([sys.executable, "-X", "importtime", "-m", "gp_couple", "demo", "--help"],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and "--train-iterations" in result.stdout
    imported = {line.rsplit("|", 1)[-1].strip() for line in result.stderr.splitlines() if "|" in line}
    assert "gp_couple.cli" in imported and not {"torch", "gpytorch", "numba"} & imported
    # Every command's --help, and an argument error, in one interpreter.
    code = ("import sys\nfrom gp_couple.cli import COMMANDS, main\n"
            "for name in COMMANDS:\n"
            "    for argv in ([name, '--help'], [name, '--seed', '-1']):\n"
            "        try:\n            main(argv)\n        except SystemExit:\n            pass\n"
            "print(sorted(m for m in ('torch', 'gpytorch', 'numba', 'scipy') if m in sys.modules))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.stdout.strip().endswith("[]"), result.stdout[-500:] + result.stderr[-2000:]
    assert result.stderr.count("error: argument --seed") == len(COMMANDS)


def test_every_option_has_help_and_descriptions_are_plain_text() -> None:
    parsers = subcommand_parsers()
    assert set(parsers) == set(COMMANDS)
    for name, parser in parsers.items():
        for action in parser._actions:
            assert action.help and action.help != argparse.SUPPRESS, (name, action.option_strings)
        for markup in ("``", ":math:", ":mod:"):
            assert markup not in (parser.description or ""), (name, parser.description)
        assert parser.epilog and f"gp-couple {name}" in parser.epilog  # an example


def test_help_shows_defaults(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["grf-gram", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "(default: 2 16)" in text and "(default: 30)" in text and "example:" in text


def test_os_error_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                              capsys: pytest.CaptureFixture[str]) -> None:
    # On a busy machine the command logs that it runs on one thread before the error: the
    # load is fixed here (idle) so that stderr holds the error alone.
    monkeypatch.setattr(settings, "threads_for_load", lambda: None)
    not_a_directory = tmp_path / "file"
    not_a_directory.write_text("x")
    assert main(["grf-gram", "--graph", "karate", "--data-dir", str(not_a_directory)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith("gp-couple grf-gram: error:") and str(not_a_directory) in err


@pytest.mark.parametrize("argv, option", [
    (["mesh", "--lr", "nan"], "--lr"),
    (["demo", "--seed", "-1"], "--seed"),
    (["grf-gram", "--repeats", "0"], "--repeats"),
    (["traffic", "--train-iterations", "-5"], "--train-iterations"),
    (["grf-gram", "--gamma", "inf"], "--gamma"),
    # Unbounded work is refused by the parser, not run until killed.
    (["grf-gram", "--repeats", "1000000000000"], "--repeats: expected at most"),
    (["attention", "--draws", "1000000000000"], "--draws: expected at most"),
    (["pagerank", "--walkers", "1000000000000"], "--walkers: expected at most"),
    (["copula-learning", "--iterations", "1000000000000"], "--iterations: expected at most"),
    (["kernel-estimation", "--dataset", "boston", "--splits", "1000000000000"], "--splits: expected at most"),
    (["traffic-nuts", "--max-tree-depth", "100"], "--max-tree-depth: expected at most"),
])
def test_bad_option_values_name_the_option(argv: list[str], option: str,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"argument {option}" in err


def test_library_errors_are_one_line_and_debug_shows_the_traceback(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    import gp_couple.experiments.attention as attention

    def fail(args: argparse.Namespace) -> None:
        raise RuntimeError("solver failed\nwith details on a second line")

    monkeypatch.setattr(attention, "run", fail)
    assert main(["attention"]) == 1
    assert capsys.readouterr().err == "gp-couple attention: error: RuntimeError: solver failed ...\n"
    with pytest.raises(RuntimeError, match="solver failed"):
        main(["attention", "--debug"])
    with pytest.raises(RuntimeError, match="solver failed"):
        main(["--debug", "attention"])  # before the command too


def test_interrupt_exits_130(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    import gp_couple.experiments.attention as attention

    def interrupted(args: argparse.Namespace) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(attention, "run", interrupted)
    assert main(["attention"]) == 130
    assert "interrupted" in capsys.readouterr().err


def test_errors_name_options_as_typed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.delenv("GP_COUPLE_DATA", raising=False)
    assert main(["kernel-estimation", "--dataset", "boston"]) == 2
    err = capsys.readouterr().err
    assert "pass --data-dir=... or set the environment variable GP_COUPLE_DATA" in err and "data_dir" not in err
    missing = tmp_path / "data_dir" / "nowhere"  # a path is left as it is
    assert main(["copula-learning", "--data-dir", str(missing)]) == 2
    err = capsys.readouterr().err
    assert f"{missing} (from --data-dir) does not exist" in err
    assert as_typed("max_train and rff_lengthscale, seed", {"max_train": "--max-train", "seed": "--seed"}) == \
        "--max-train and rff_lengthscale, seed"


def test_error_line() -> None:
    assert error_line(FileNotFoundError(2, "No such file or directory", "/x/y")) == \
        "No such file or directory: /x/y"
    assert error_line(ValueError("bad value")) == "bad value"
    assert error_line(KeyError("weights")) == "KeyError: missing key 'weights'"


def test_threads_option_bounds_the_run_and_restores_the_pools(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    import gp_couple.settings as settings
    from gp_couple.experiments import grf_gram

    seen: list[int] = []
    monkeypatch.setattr(grf_gram, "run", lambda args: seen.append(torch.get_num_threads()) or {})
    monkeypatch.setattr(settings, "threads_for_load", lambda: None)  # an idle machine
    before = torch.get_num_threads()
    assert main(["grf-gram", "--graph", "grid:3x3", "--threads", "1"]) == 0
    assert seen == [1] and torch.get_num_threads() == before
    assert main(["grf-gram", "--graph", "grid:3x3"]) == 0
    assert seen[-1] == before  # without --threads the pools are left as they are
    # CPUs busy with other work: one thread unless --threads says otherwise.
    monkeypatch.setattr(settings, "threads_for_load", lambda: 1)
    assert main(["grf-gram", "--graph", "grid:3x3"]) == 0
    assert seen[-1] == 1 and torch.get_num_threads() == before
    assert main(["grf-gram", "--graph", "grid:3x3", "--threads", "2"]) == 0
    assert seen[-1] == min(2, settings.available_cpus())


def test_threads_for_load_reads_the_runnable_tasks(monkeypatch: pytest.MonkeyPatch) -> None:
    import gp_couple.settings as settings

    busy = settings.busy_cpus(samples=3, interval=0.0)
    assert busy is None or busy >= 0
    monkeypatch.setattr(settings, "available_cpus", lambda: 2)
    for runnable, expected in ((0, None), (1, None), (2, 1), (9, 1)):
        monkeypatch.setattr(settings, "busy_cpus", lambda runnable=runnable: runnable)
        assert settings.threads_for_load() == expected
    monkeypatch.setattr(settings, "busy_cpus", lambda: None)  # no /proc/loadavg
    assert settings.threads_for_load() is None


# ------------------------------------------------------------------ output paths, before any work
def _never_run(monkeypatch: pytest.MonkeyPatch, module: str) -> list[argparse.Namespace]:
    """Replace a command's run by one that records its calls (it must not be reached)."""
    import importlib

    calls: list[argparse.Namespace] = []
    monkeypatch.setattr(importlib.import_module(f"gp_couple.experiments.{module}"), "run",
                        lambda args: calls.append(args) or {"experiment": "x", "results": []})
    return calls


@pytest.mark.parametrize("command, module", [("attention", "attention"), ("grf-gram", "grf_gram"),
                                             ("traffic-nuts", "traffic_nuts"), ("pagerank", "pagerank")])
def test_unusable_output_paths_fail_before_the_run(command: str, module: str, tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    calls = _never_run(monkeypatch, module)
    regular = tmp_path / "out.json"
    regular.write_text("previous results\n")
    for argv, message in [
        (["--plot", str(regular)], "--plot '.*out.json' is an existing file, not a folder"),
        (["--plot", str(regular / "figures")], "cannot be created"),
        (["--json", str(tmp_path)], "--json '.*' is a folder, not a file"),
        (["--json", str(tmp_path / "report.json"), "--plot", str(tmp_path / "report.json")],
         "--plot and --json name the same path"),
    ]:
        assert main([command, *argv]) == 2
        err = capsys.readouterr().err
        assert re.search(message, err) and err.count("\n") == 1, err
    assert calls == [] and regular.read_text() == "previous results\n"


def test_save_couplings_is_checked_before_the_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    calls = _never_run(monkeypatch, "grf_gram")
    regular = tmp_path / "couplings"
    regular.write_text("x")
    assert main(["grf-gram", "--save-couplings", str(regular)]) == 2
    assert "--save-couplings" in capsys.readouterr().err and calls == []


def test_json_file_is_written_atomically_at_the_end(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    import json

    from gp_couple.experiments import attention

    target = tmp_path / "reports" / "attention.json"
    monkeypatch.setattr(attention, "run", lambda args: {"experiment": "attention", "results": [{"a": 1}]})
    assert main(["attention", "--json", str(target)]) == 0
    assert json.loads(target.read_text()) == {"experiment": "attention", "results": [{"a": 1}]}
    assert capsys.readouterr().out == ""  # the report went to the file only

    def unserialisable(args: argparse.Namespace) -> dict:
        return {"experiment": "attention", "results": [{"a": object()}]}

    monkeypatch.setattr(attention, "run", unserialisable)
    assert main(["attention", "--json", str(target)]) == 2
    assert json.loads(target.read_text())["results"] == [{"a": 1}]  # the previous report survives
    assert [path.name for path in target.parent.iterdir()] == ["attention.json"]


def test_huge_thread_counts_are_capped_at_the_cpus(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    from gp_couple.experiments import grf_gram
    from gp_couple.settings import available_cpus

    seen: list[int] = []
    monkeypatch.setattr(grf_gram, "run", lambda args: seen.append(torch.get_num_threads()) or {})
    with pytest.warns(RuntimeWarning, match="more than the .* CPUs"):
        assert main(["grf-gram", "--graph", "grid:3x3", "--threads", "100000"]) == 0
    assert seen == [available_cpus()]


def test_plot_onto_the_redirected_standard_output_fails_at_once(tmp_path: Path) -> None:
    report = tmp_path / "out.json"
    with report.open("w") as stdout:  # gp-couple attention --json --plot out.json > out.json
        result = subprocess.run([sys.executable, "-m", "gp_couple", "attention", "--json", "--plot", str(report)],
                                stdout=stdout, stderr=subprocess.PIPE, text=True, timeout=300)
    assert result.returncode == 2
    assert "--plot" in result.stderr and "standard output is redirected to" in result.stderr
